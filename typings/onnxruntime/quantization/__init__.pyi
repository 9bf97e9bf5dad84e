# The part of onnxruntime.quantization that voicebot uses (see ../__init__.pyi for why this file exists).
import os
from enum import Enum
from typing import Any, Sequence

class QuantType(Enum):
    QInt8 = 0
    QUInt8 = 1
    QFLOAT8E4M3FN = 2
    QInt16 = 3
    QUInt16 = 4
    QInt4 = 5
    QUInt4 = 6

class QuantFormat(Enum):
    QOperator = 0
    QDQ = 1

class CalibrationMethod(Enum):
    MinMax = 0
    Entropy = 1
    Percentile = 2
    Distribution = 3

class CalibrationDataReader:
    def get_next(self) -> dict[str, Any] | None: ...

def quantize_dynamic(model_input: str | os.PathLike[str], model_output: str | os.PathLike[str],
                     op_types_to_quantize: Sequence[str] | None = None, per_channel: bool = False,
                     reduce_range: bool = False, weight_type: QuantType = ...,
                     nodes_to_quantize: Sequence[str] | None = None, nodes_to_exclude: Sequence[str] | None = None,
                     use_external_data_format: bool = False, extra_options: dict[str, Any] | None = None) -> None: ...

def quantize_static(model_input: str | os.PathLike[str], model_output: str | os.PathLike[str],
                    calibration_data_reader: CalibrationDataReader | None = None, quant_format: QuantFormat = ...,
                    op_types_to_quantize: Sequence[str] | None = None, per_channel: bool = False,
                    reduce_range: bool = False, activation_type: QuantType = ..., weight_type: QuantType = ...,
                    nodes_to_quantize: Sequence[str] | None = None, nodes_to_exclude: Sequence[str] | None = None,
                    use_external_data_format: bool = False, calibrate_method: CalibrationMethod = ...,
                    calibration_providers: Sequence[str] | None = None, extra_options: dict[str, Any] | None = None,
                    calibration_cache_path: str | os.PathLike[str] | None = None) -> None: ...
