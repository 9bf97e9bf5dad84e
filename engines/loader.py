"""``load_engine``: pick and build a backend from the engine and model settings."""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import Protocol

from engines.base import ModelPaths, Engine, EngineError

log = logging.getLogger(__name__)

BACKENDS = ("torch", "onnx", "tensorrt")


class EngineSettings(Protocol):
    backend: str
    device: str
    precision: str
    threads: int
    max_batch: int
    cuda_graphs: bool
    onnx_dir: Path
    tensorrt_dir: Path
    tensorrt_workspace_mb: int



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


def resolve_precision(precision: str, device: str) -> str:
    """``auto`` -> fp16 on GPU, fp32 on CPU."""
    if precision == "auto":
        return "fp16" if device.startswith("cuda") else "fp32"
    if device == "cpu" and precision in ("fp16", "bf16"):
        raise EngineError(f"engine.precision {precision} is for GPUs; on the CPU use fp32 (or int8)")
    return precision


def cpu_threads(threads: int) -> int:
    """``threads``, or one per core the process may use when 0."""
    return threads or len(os.sched_getaffinity(0))


def set_cpu_threads(threads: int) -> int:
    """Use ``threads`` CPU threads in the calling thread (0: one per core the process may use)."""
    import torch

    n = cpu_threads(threads)
    torch.set_num_threads(n)
    return n


def load_engine(engine: EngineSettings, models: ModelPaths) -> Engine:
    """Build the configured backend; ``auto`` picks TensorRT on NVIDIA when available, else torch."""
    device = resolve_device(engine.device)
    precision = resolve_precision(engine.precision, device)
    backend = engine.backend
    if backend == "auto":
        backend = "tensorrt" if device.startswith("cuda") and importlib.util.find_spec("tensorrt") else "torch"
    threads = cpu_threads(engine.threads)
    if device == "cpu":
        # Only the device worker's thread may own a multi-threaded BLAS/OpenMP pool: when two threads own one,
        # the OpenMP runtime sees more threads than cores and throttles, and the GPT's GEMVs run ~3x slower.
        # The loading thread stays single-threaded; the engine's thread count applies where it runs (bind_thread).
        set_cpu_threads(1)
    log.info("loading the %s engine on %s (%s)", backend, device, precision)

    def torch_engine() -> Engine:
        from engines.torch_engine import TorchEngine

        return TorchEngine.from_files(models, device=device, precision=precision, max_batch=engine.max_batch,
                                      cuda_graphs=engine.cuda_graphs, threads=threads)

    if backend == "torch":
        return torch_engine()
    if backend == "onnx":
        from engines.onnx_engine import OnnxEngine

        return OnnxEngine.from_files(models, engine.onnx_dir, device=device, precision=precision,
                                     threads=engine.threads, max_batch=engine.max_batch)
    if backend == "tensorrt":
        from engines.tensorrt_engine import TensorRTEngine

        try:
            return TensorRTEngine.from_files(models, engine.onnx_dir, engine.tensorrt_dir, device=device,
                                             workspace_mb=engine.tensorrt_workspace_mb, max_batch=engine.max_batch)
        except EngineError as e:
            if engine.backend != "auto":
                raise
            # auto chose TensorRT because it is installed; a failed build must not keep the bot from speaking
            log.warning("TensorRT engine unavailable (%s); using the torch engine instead", e)
            return torch_engine()
    raise EngineError(f"unknown engine.backend {backend!r}: expected auto, {', '.join(BACKENDS)}")
