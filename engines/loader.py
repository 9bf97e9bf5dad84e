"""``load_engine``: plan the engine (:mod:`engines.plan`) and build the backend the plan names."""

from __future__ import annotations

import logging
from pathlib import Path

from engines.base import DIFFUSION_FAMILIES, ModelPaths, Engine, EngineError, ModelFormatError
from engines.plan import (EnginePlan, EngineSettings, MachineProbe, Settings, plan_engine, probe_machine,
                          resolve_device as _plan_device, resolve_precision)
from engines.runtime import set_cpu_threads

log = logging.getLogger(__name__)

__all__ = ["EngineSettings", "build_engine", "choose_backend", "load_engine", "resolve_device", "resolve_precision"]


def resolve_device(device: str) -> str:
    """The device ``engine.device`` resolves to on this machine (the benchmarks' view; engines follow the plan)."""
    return _plan_device(device, probe_machine())


def choose_backend(backend: str, device: str, precision: str, tensorrt_installed: bool) -> str:
    """The backend :func:`~engines.plan.plan_engine` picks for these settings on a machine with that device and
    TensorRT (the benchmarks' view; engines follow the plan)."""
    probe = MachineProbe(gpus=("",) * (int(device.partition(":")[2] or 0) + 1) if device != "cpu" else (),
                         tensorrt=tensorrt_installed, onnxruntime=True, onnxruntime_cuda=True)
    return plan_engine(Settings(backend=backend, device=device, precision=precision), probe).backend


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


def load_engine(engine: EngineSettings, models: ModelPaths, probe: MachineProbe | None = None) -> Engine:
    """Plan the engine for ``engine`` on this machine (``probe``: :func:`~engines.plan.probe_machine` by default),
    log the plan once, and build it; a v3/v4/v5 SoVITS gets the diffusion engine. Where ``auto`` chose a backend
    that cannot be built for this model, its fallback plan (torch) is built instead, logged."""
    diffusion = diffusion_family(models)
    plan = plan_engine(engine, probe or probe_machine(), diffusion=diffusion is not None)
    if plan.device == "cpu":
        # Only the device worker's thread may own a multi-threaded OpenMP pool. Once a second thread has run torch
        # work with 2+ threads, libgomp manages more threads than there are cores and cuts its spin-wait, so every
        # small GEMV pays a futex wake-up, for good: the idle pool stays, and the GPT step took twice as long (see
        # FINDINGS.md#openmp-pool-on-one-thread). The loading thread stays single-threaded; the engine's thread
        # count applies where it runs (bind_thread). The onnx engine's torch work (sampling, the GPT prefill) runs
        # on the device thread too, its graphs on ONNX Runtime's own non-spinning pool and its GPT steps on the
        # fused step's team.
        set_cpu_threads(1)
    log.info("engine plan: %s", plan.describe())
    try:
        return build_engine(plan, engine, models, diffusion)
    except Exception as e:  # auto's fallback: any failure to build it, reported
        if plan.fallback is None:
            raise
        # auto chose this backend for speed; a model it cannot export or build must not keep the bot from speaking.
        # Not only EngineError: an unexpected error from ONNX Runtime or TensorRT (an API of another version, a
        # driver) falls back too, with its traceback in the log.
        log.warning("%s engine unavailable (%s); using the torch engine instead",
                    {"onnx": "ONNX", "tensorrt": "TensorRT"}.get(plan.backend, plan.backend), e,
                    exc_info=not isinstance(e, EngineError))
        log.info("engine plan: %s", plan.fallback.describe())
        return build_engine(plan.fallback, engine, models, diffusion)


def build_engine(plan: EnginePlan, dirs: EngineSettings, models: ModelPaths, diffusion: str | None = None) -> Engine:
    """The backend ``plan`` names, built as it says (``dirs``: the settings' export and engine folders;
    ``diffusion``: :func:`diffusion_family` of ``models``)."""
    if diffusion is not None:
        from engines.diffusion_engine import DiffusionEngine

        return DiffusionEngine.from_files(models, vocoder_path(models, diffusion),
                                          family=None if diffusion == "auto" else diffusion, plan=plan,
                                          cache_dir=Path(dirs.onnx_dir) / "diffusion")  # beside v2's kept proofs
    if plan.backend == "torch":
        from engines.torch_engine import TorchEngine

        return TorchEngine.from_files(models, plan=plan, proofs=Path(dirs.onnx_dir) / "torch")  # beside the others
    if plan.backend == "onnx":
        from engines.onnx_engine import OnnxEngine

        return OnnxEngine.from_files(models, dirs.onnx_dir, plan=plan)
    from engines.tensorrt_engine import TensorRTEngine

    return TensorRTEngine.from_files(models, dirs.onnx_dir, dirs.tensorrt_dir, device=plan.device,
                                     workspace_mb=dirs.tensorrt_workspace_mb, max_batch=plan.max_batch, plan=plan)
