# Type information for the part of ONNX Runtime that voicebot uses. onnxruntime ships none (its core is a C
# extension), so to pyright every call into it was Unknown. Written from ONNX Runtime's Python API reference;
# extend it when code starts using more of the API (pyright then names the missing attribute).
import os
from enum import Enum
from typing import Any, Mapping, Sequence

__version__: str

def get_available_providers() -> list[str]: ...

class GraphOptimizationLevel(Enum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_ALL = 99

class ExecutionMode(Enum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1

class SessionOptions:
    graph_optimization_level: GraphOptimizationLevel
    execution_mode: ExecutionMode
    intra_op_num_threads: int
    inter_op_num_threads: int
    log_severity_level: int
    enable_cpu_mem_arena: bool
    enable_mem_pattern: bool
    def __init__(self) -> None: ...
    def add_session_config_entry(self, key: str, value: str) -> None: ...

class RunOptions:
    def __init__(self) -> None: ...
    def add_run_config_entry(self, key: str, value: str) -> None: ...

class NodeArg:
    name: str
    shape: list[int | str | None]
    type: str

class IOBinding:
    def bind_input(self, name: str, device_type: str, device_id: int, element_type: Any, shape: Sequence[int],
                   buffer_ptr: int) -> None: ...
    def bind_output(self, name: str, device_type: str = ..., device_id: int = ..., element_type: Any = ...,
                    shape: Sequence[int] | None = ..., buffer_ptr: int | None = ...) -> None: ...
    def synchronize_outputs(self) -> None: ...

class InferenceSession:
    def __init__(self, path_or_bytes: str | bytes | os.PathLike[str], sess_options: SessionOptions | None = None,
                 providers: Sequence[str | tuple[str, dict[str, Any]]] | None = None,
                 provider_options: Sequence[dict[str, Any]] | None = None, **kwargs: Any) -> None: ...
    def get_inputs(self) -> list[NodeArg]: ...
    def get_outputs(self) -> list[NodeArg]: ...
    def get_providers(self) -> list[str]: ...
    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: Any = None) -> list[Any]: ...
    def io_binding(self) -> IOBinding: ...
    def run_with_iobinding(self, iobinding: IOBinding, run_options: RunOptions | None = None) -> None: ...
