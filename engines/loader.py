"""``load_engine``: pick and build a backend from the engine and model settings."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Protocol

from engines.base import DIFFUSION_FAMILIES, ModelPaths, Engine, EngineError, ModelFormatError
from engines.runtime import cpu_threads, set_cpu_threads

log = logging.getLogger(__name__)

BACKENDS = ("torch", "onnx", "tensorrt")


class EngineSettings(Protocol):
    """The engine options (``bot.config.EngineConfig`` satisfies it); read-only, as a frozen dataclass is."""

    @property
    def backend(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def precision(self) -> str: ...
    @property
    def vocoder_precision(self) -> str: ...
    @property
    def threads(self) -> int: ...
    @property
    def max_batch(self) -> int: ...
    @property
    def cuda_graphs(self) -> bool: ...
    @property
    def onnx_dir(self) -> Path: ...
    @property
    def tensorrt_dir(self) -> Path: ...
    @property
    def tensorrt_workspace_mb(self) -> int: ...



def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda:0`` when a CUDA GPU is usable, else ``cpu``; ``cuda`` -> ``cuda:0``."""
    import torch

    if device == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise EngineError(f"engine.device is {device!r} but no CUDA GPU is usable here; set engine.device: cpu "
                              f"(or auto)")
        return "cuda:0" if device == "cuda" else device
    return device


# What ``auto`` runs on a CPU, chosen by measurement (``python -m bot bench``; AVX2 figures from a 2-core AMD EPYC
# Zen 3, the machine kind of issue 13):
# - backend onnx: the vocoder and reference graphs on ONNX Runtime (its vocoder is the faster one on CPUs: RTF 0.29
#   vs torch 0.42 on the AVX2 EPYC), and the GPT decoded by the fused CPU step (engines/gpt_sovits/cpu_step.py: all
#   layers in one C call, weights read once per step) where a C compiler exists, else by the GPT step graphs. The
#   fused step beat every library product tried for the batch-1 step (MKL, oneDNN, OpenBLAS, fbgemm, ONNX Runtime's
#   graphs: see cpu_step.py), and it falls back to one thread by itself when another process takes a core (two
#   threads that wait for each other at every product collapse there, as torch's OpenMP pool did: 555-611 ms per
#   fp32 step with 2 threads on 2 loaded cores, against 69-91 ms with one).
# - precision int8: the GPT's linears int8 per output channel, weight-only (activations stay fp32), a bf16 KV cache.
#   Proven along upstream's greedy paths on the golden data with a logit bound of 0.15
#   (measured 0.107, its prefill's rows in dynamic int8 but the last; tests/engines/test_int8_proof.py), tighter
#   than the all-dynamic int8 it replaces (0.17).
# - vocoder_precision auto, with the int8 GPT on the onnx engine: the int8 vocoder (engines/vocoder_int8.py: its
#   residual blocks' convolutions in int8, RTF 0.34 -> 0.21 on the AVX2 EPYC, where fp32 cannot go below ~0.26 by
#   its FLOPs), where its proof holds on the loaded model (int8 audio within 20 dB SNR of fp32 on held-out decodes;
#   else the fp32 vocoder runs, logged). precision fp32 keeps the fp32 vocoder: it asks for upstream's exact decode.
# What lost (Zen 4, step at 320 cached positions, one process, best round): OpenVINO 2026.4 fp32 17.1 ms and int8
# weights (per-channel, Convert+Multiply decompression) 10.8 ms against ONNX Runtime 17.4 / 10.8 ms, no faster;
# ONNX Runtime MatMulNBits 8-bit (block 32, accuracy level 4) 10.4 vs 10.9 ms, within the noise, and another
# rounding to prove; bf16 (OpenVINO, native avx512_bf16) 13.5 ms, slower than int8 and absent on AVX2 CPUs.
CPU_AUTO_BACKEND = "onnx"
CPU_AUTO_PRECISION = "int8"


def resolve_precision(precision: str, device: str) -> str:
    """``auto`` -> fp16 on GPU, int8 on CPU (see :data:`CPU_AUTO_PRECISION`); a precision the device cannot run is
    an error that says what can."""
    if precision == "auto":
        return "fp16" if device.startswith("cuda") else CPU_AUTO_PRECISION
    if device == "cpu" and precision in ("fp16", "bf16"):
        raise EngineError(f"engine.precision {precision} is for GPUs; on the CPU use fp32 (or int8)")
    if device.startswith("cuda") and precision == "int8":
        raise EngineError("engine.precision int8 is a CPU speed path; on a GPU use fp16 (or bf16, fp32)")
    return precision


def choose_backend(backend: str, device: str, precision: str, tensorrt_installed: bool) -> str:
    """The backend to build: ``auto`` is onnx on a CPU (see :data:`CPU_AUTO_BACKEND`), TensorRT for fp16 on an
    NVIDIA GPU where it is installed, else torch; an explicit choice the device or precision cannot serve is an
    error that says what can."""
    if backend == "auto":
        if device == "cpu":
            return CPU_AUTO_BACKEND
        return "tensorrt" if device.startswith("cuda") and precision == "fp16" and tensorrt_installed else "torch"
    if backend not in BACKENDS:
        raise EngineError(f"unknown engine.backend {backend!r}: expected auto, {', '.join(BACKENDS)}")
    if backend == "tensorrt":
        if not device.startswith("cuda"):
            raise EngineError("engine.backend tensorrt needs an NVIDIA GPU (engine.device: cuda or auto on a machine "
                              "with one); on the CPU use torch or onnx")
        if precision != "fp16":
            raise EngineError(f"the tensorrt backend builds fp16 engines; set engine.precision: fp16 (or auto), or "
                              f"use engine.backend: torch for {precision}")
    return backend


# upstream's file names beside the SoVITS file: gsv-v4-pretrained/ and gsv-v5-pretrained/ hold s2G*.pth and
# vocoder.pth; s2Gv3.pth sits beside the BigVGAN folder
DEFAULT_VOCODERS = {"v4": "vocoder.pth", "v5turbo": "vocoder.pth", "v5dev": "vocoder.pth",
                    "v3": "models--nvidia--bigvgan_v2_24khz_100band_256x"}


def diffusion_family(models: ModelPaths) -> str | None:
    """The configured diffusion family when the SoVITS is one ("auto": detected later, from the file), else None.

    ``models.family`` (when the paths have one): a diffusion family, ``auto``, or a v2 family; a v2 family named
    for a v3/v4/v5 file is a one-line ModelFormatError.
    """
    from engines.gpt_sovits.dit_checkpoint import is_dit_sovits

    configured = getattr(models, "family", None)  # like models.sv, optional in a ModelPaths
    family = None if configured in (None, "auto") else str(configured)
    if family in DIFFUSION_FAMILIES:
        return family
    if not is_dit_sovits(models.sovits):
        return None
    if family is not None:
        raise ModelFormatError(f"{models.sovits} is a v3/v4/v5 SoVITS but models.family is {family}; set "
                               "models.family to the file's family (v4, v5turbo, v5dev, v3) or auto")
    return "auto"


def vocoder_path(models: ModelPaths, family: str) -> Path:
    """``models.vocoder``, else upstream's vocoder beside the SoVITS file (``family`` "auto": whichever is there,
    the v4/v5 one first)."""
    configured = getattr(models, "vocoder", None)
    if configured is not None:
        return Path(configured)
    folder = Path(models.sovits).parent
    if family == "auto":
        there = [folder / name for name in dict.fromkeys(DEFAULT_VOCODERS.values()) if (folder / name).exists()]
        return there[0] if there else folder / DEFAULT_VOCODERS["v4"]
    return folder / DEFAULT_VOCODERS[family]


def load_engine(engine: EngineSettings, models: ModelPaths) -> Engine:
    """Build the configured backend (see :func:`choose_backend`); a v3/v4/v5 SoVITS gets the diffusion engine."""
    device = resolve_device(engine.device)
    precision = resolve_precision(engine.precision, device)
    backend = choose_backend(engine.backend, device, precision, importlib.util.find_spec("tensorrt") is not None)
    diffusion = diffusion_family(models)
    if diffusion is not None and backend == "tensorrt":
        if engine.backend != "auto":
            raise EngineError("engine.backend tensorrt does not run the v3/v4/v5 models yet; set engine.backend: "
                              "torch (or auto)")
        backend = "torch"
    threads = cpu_threads(engine.threads)
    if device == "cpu":
        # Only the device worker's thread may own a multi-threaded OpenMP pool. Once a second thread has run torch
        # work with 2+ threads, libgomp manages more threads than there are cores and cuts its spin-wait, so every
        # small GEMV pays a futex wake-up (measured on 2 cores: GPT step 13.8 -> 28 ms, for good: the idle pool
        # stays). The loading thread stays single-threaded; the engine's thread count applies where it runs
        # (bind_thread). Kept: the same spin-wait is what collapses a torch engine when another process shares the
        # cores (see CPU_AUTO_BACKEND); the onnx engine's torch work (sampling, the GPT prefill) runs on the device
        # thread too, its graphs on ONNX Runtime's own non-spinning pool and its GPT steps on the fused step's team.
        set_cpu_threads(1)
    log.info("loading the %s engine on %s (%s)", backend, device, precision)

    if diffusion is not None:
        if engine.vocoder_precision == "int8":
            raise EngineError("engine.vocoder_precision int8 is the v2 vocoder's; the v3/v4/v5 vocoders run in the "
                              "engine's precision: set it to auto or fp32")
        from engines.diffusion_engine import DiffusionEngine

        return DiffusionEngine.from_files(models, vocoder_path(models, diffusion),
                                          family=None if diffusion == "auto" else diffusion, name=backend,
                                          device=device, precision=precision, max_batch=engine.max_batch,
                                          cuda_graphs=engine.cuda_graphs, threads=threads)

    if engine.vocoder_precision == "int8" and (device != "cpu" or backend != "onnx"):
        raise EngineError(f"engine.vocoder_precision: {engine.vocoder_precision} runs on the onnx engine on a CPU "
                          f"(this configuration runs {backend} on {device}); set it to auto or fp32")

    def torch_engine() -> Engine:
        from engines.torch_engine import TorchEngine

        return TorchEngine.from_files(models, device=device, precision=precision, max_batch=engine.max_batch,
                                      cuda_graphs=engine.cuda_graphs, threads=threads)

    def graph_engine() -> Engine:
        if backend == "onnx":
            from engines.onnx_engine import OnnxEngine

            return OnnxEngine.from_files(models, engine.onnx_dir, device=device, precision=precision,
                                         threads=engine.threads, max_batch=engine.max_batch,
                                         vocoder=engine.vocoder_precision)
        from engines.tensorrt_engine import TensorRTEngine

        return TensorRTEngine.from_files(models, engine.onnx_dir, engine.tensorrt_dir, device=device,
                                         workspace_mb=engine.tensorrt_workspace_mb, max_batch=engine.max_batch)

    if backend == "torch":
        return torch_engine()
    try:
        return graph_engine()
    except Exception as e:  # auto's fallback: any failure to build it, reported
        if engine.backend != "auto":
            raise
        # auto chose this backend for speed; a model it cannot export or build must not keep the bot from speaking.
        # Not only EngineError: an unexpected error from ONNX Runtime or TensorRT (an API of another version, a
        # driver) falls back too, with its traceback in the log.
        log.warning("%s engine unavailable (%s); using the torch engine instead",
                    {"onnx": "ONNX", "tensorrt": "TensorRT"}[backend], e, exc_info=not isinstance(e, EngineError))
        return torch_engine()
