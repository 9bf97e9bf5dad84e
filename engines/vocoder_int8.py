"""An int8 SoVITS vocoder for CPUs (``engine.vocoder_precision: int8``, the onnx engine), made once per model.

Why: the HiFi-GAN of a v2 SoVITS does about 42 GFLOP per second of audio (measured with hooks on every convolution at
the real size: 40.7 in its resblocks and upsamplers, 1.6 elsewhere), so on a 2-core AVX2 CPU that multiplies fp32 at
126-164 GFLOP/s at best (torch sgemm, measured on an AMD EPYC Zen 3) the fp32 vocoder cannot go below an RTF of
about 0.26, and ONNX Runtime measures 0.34 there. int8 products run about twice as many operations per cycle on
AVX2 (ONNX Runtime's u8 x s8 kernels): the same graph with its resblock convolutions in int8 measured RTF 0.18.

What is quantised: only the Conv nodes of the decoder's residual blocks (90 % of the work), as QDQ pairs that ONNX
Runtime fuses into int8 convolutions: weights symmetric int8 per output channel, activations uint8 per tensor with
ranges calibrated (min/max) on synthetic decodes of the model itself (random semantic tokens and phones, a style
vector from a synthetic harmonic reference, the prior noise at its default scale). The input and output layers,
upsamplers, text encoder and flow stay fp32: quantising every decoder convolution measured 26 dB SNR against fp32,
the resblocks alone 32 dB (real-size random weights). That error is why it is not the default: the fp32 vocoder
stays the default until int8 is measured on trained voices (tests bound it on the golden checkpoints).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from engines.base import EngineError

log = logging.getLogger(__name__)

__all__ = ["INT8_VOCODER", "quantize_vocoder_int8", "QUANTISED_BLOCKS"]

INT8_VOCODER = "sovits_decode.int8"  # graph file written next to sovits_decode.onnx
QUANTISED_BLOCKS = "/resblocks"  # Conv nodes whose name contains this are quantised (the decoder's residual blocks)
CALIBRATION_DECODES = 4  # synthetic decodes the activation ranges are measured on
CALIBRATION_TOKENS = 40  # semantic tokens per calibration decode (1.6 s of audio)
NOISE_SCALE = 0.5  # the prior noise scale of the calibration decodes (the API's default)
SEED = 0


def quantize_vocoder_int8(folder: str | os.PathLike[str]) -> Path:
    """``sovits_decode.int8.onnx`` in ``folder`` (an export folder of :func:`engines.export.ensure_onnx`), written
    once; returns its path. Takes a few seconds per model at the real size."""
    folder = Path(folder)
    out = folder / f"{INT8_VOCODER}.onnx"
    if out.is_file():
        return out
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, \
        quantize_static

    src = folder / "sovits_decode.onnx"
    model = onnx.load(str(src), load_external_data=False)
    convs = [n.name for n in model.graph.node if n.op_type == "Conv" and QUANTISED_BLOCKS in n.name]
    if not convs:
        raise EngineError(f"{src} has no decoder residual-block convolutions to quantise; export it again")
    feeds = _calibration_feeds(folder, model)

    class _Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    log.info("making the int8 vocoder (%d convolutions, calibrated on %d synthetic decodes)", len(convs), len(feeds))
    tmp = out.with_suffix(".tmp.onnx")
    try:
        quantize_static(str(src), str(tmp), _Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, nodes_to_quantize=convs,
                        calibrate_method=CalibrationMethod.MinMax, extra_options={"ActivationSymmetric": False})
        os.replace(tmp, out)  # complete or absent: a crash mid-write leaves no half file under the final name
    finally:
        tmp.unlink(missing_ok=True)
        for leftover in folder.glob("*augmented_model*.onnx"):  # the calibrator's scratch graph
            leftover.unlink(missing_ok=True)
    return out


def _calibration_feeds(folder: Path, model: Any) -> list[dict[str, np.ndarray]]:
    """Inputs of ``sovits_decode`` for the calibration decodes (see the module notes)."""
    import onnxruntime as ort

    from engines.export import load_manifest
    from engines.gpt_sovits.spectrogram import reference_spec_input

    manifest = load_manifest(folder)
    vocab, symbols = int(manifest["gpt"]["vocab"]) - 1, int(manifest["sovits"]["n_symbols"])
    channels = int(manifest["sovits"]["inter_channels"])
    rng = np.random.default_rng(SEED)
    style = ort.InferenceSession(str(folder / "ref_style.onnx"), providers=["CPUExecutionProvider"])
    feeds = []
    for i in range(CALIBRATION_DECODES):
        t = np.arange(32000 * 3) / 32000  # 3 s of a harmonic "voice" at 100-250 Hz with a slow vibrato
        f0 = 100 + 50 * i + 5 * np.sin(2 * np.pi * 5 * t)
        wav = sum(np.sin(2 * np.pi * np.cumsum(f0 * h) / 32000) / h for h in range(1, 12)).astype(np.float32) * 0.1
        spec = reference_spec_input(wav).numpy()
        style_in = {}
        for inp in style.get_inputs():  # v2Pro's graph also takes speaker features: zeros of their shape
            style_in[inp.name] = spec if inp.name == "spec" else np.zeros(
                [d if isinstance(d, int) else 1 for d in inp.shape], np.float32)
        ge = style.run(None, style_in)[0]
        text = rng.integers(1, symbols, (1, 30 + 10 * i)).astype(np.int64)
        codes = rng.integers(0, vocab, (1, 1, CALIBRATION_TOKENS)).astype(np.int64)
        noise = (rng.standard_normal((1, channels, 2 * CALIBRATION_TOKENS)) * NOISE_SCALE).astype(np.float32)
        names = {i.name for i in model.graph.input}
        feed = {"codes": codes, "text": text, "ge": ge, "noise": noise}
        if set(feed) != names:
            raise EngineError(f"sovits_decode takes {sorted(names)}, the int8 calibration feeds {sorted(feed)}")
        feeds.append(feed)
    return feeds
