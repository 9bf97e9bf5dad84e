"""``python -m bot engines build``: export the ONNX graphs, check them, quantise the int8 step graph, and build the
TensorRT engines where TensorRT and a GPU exist. The one module that drives both the exporter and the TensorRT
builder (so neither imports the other).

A v3/v4/v5 SoVITS gets its own two graphs instead, exported and checked (the DiT's sampling step and the vocoder);
TensorRT engines for them are not built yet, which the build says in one line.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from engines.base import EngineError, ModelPaths
from engines.export import GRAPHS, INT8_STEP, check_graphs, ensure_onnx, quantize_step_int8
from engines.plan import EngineSettings, plan_engine, probe_machine

log = logging.getLogger(__name__)

__all__ = ["build_engines"]


def build_engines(engine_cfg: EngineSettings, models_cfg: ModelPaths, backend: str | None = None) -> dict[str, Path]:
    """``python -m bot engines build``: export the ONNX graphs if missing, check them, build TensorRT engines.

    Parameters
    ----------
    engine_cfg:
        the ``engine`` config section (``onnx_dir``, ``tensorrt_dir``, ``tensorrt_workspace_mb``, ``max_batch``...).
    models_cfg:
        the ``models`` config section (``gpt``, ``sovits``).
    backend:
        ``"onnx"``: graphs only; ``"tensorrt"``: graphs and engines (fails if TensorRT is missing);
        None: graphs, and engines when TensorRT is installed and a CUDA GPU is usable.

    Returns
    -------
    dict
        what was produced: graph names -> ONNX paths, and ``"trt:<graph>"`` -> engine paths.
    """
    from tqdm import tqdm

    from engines.loader import diffusion_family

    family = diffusion_family(models_cfg)
    if family is not None:
        return _build_diffusion(engine_cfg, models_cfg, family, backend)
    steps = ["export", "check"]
    probe = probe_machine()
    try:
        plan = plan_engine(engine_cfg, probe)
    except EngineError:
        plan = None  # settings for another machine: the graphs are exported here all the same
    # the int8 step graph where it is asked for or the plan runs it (int8 without the fused step)
    want_int8 = engine_cfg.precision == "int8" or (plan is not None and plan.gpt_weights == "int8-dynamic"
                                                   and plan.gpt_runner == "graphs")
    if want_int8:
        steps.append("int8")
    produced: dict[str, Path] = {}
    with tqdm(total=len(steps), desc="ONNX", unit="step") as bar:
        bar.set_postfix_str("exporting (once per model pair)")
        folder = ensure_onnx(models_cfg, engine_cfg.onnx_dir)
        bar.update()
        bar.set_postfix_str("checking graphs")
        check_graphs(folder)
        bar.update()
        if want_int8:
            bar.set_postfix_str("int8 step graph")
            produced[INT8_STEP] = quantize_step_int8(folder)
            bar.update()
    produced.update({n: folder / f"{n}.onnx" for n in GRAPHS})
    log.info("ONNX graphs ready in %s", folder)
    if backend == "onnx":
        return produced
    if not probe.tensorrt:
        msg = (f"TensorRT is not installed, so no TensorRT engines were built (the ONNX graphs are ready in {folder} "
               "and run with engine.backend: onnx). To build engines: on a machine with an NVIDIA GPU and CUDA 12, "
               "`pip install tensorrt` (10.x), then run `python -m bot engines build --backend tensorrt`.")
        if backend == "tensorrt":
            raise EngineError(msg) from None
        log.warning("%s", msg)
        return produced
    if not probe.gpus:
        msg = f"no CUDA GPU is usable here, so no TensorRT engines were built (the ONNX graphs are ready in {folder})"
        if backend == "tensorrt":
            raise EngineError(msg + "; build on the machine that will run them")
        log.warning("%s", msg)
        return produced
    from engines.tensorrt_engine import build_trt_engines  # tensorrt: imported only where it is installed

    device = engine_cfg.device if engine_cfg.device.startswith("cuda:") else "cuda:0"
    engines = build_trt_engines(folder, engine_cfg.tensorrt_dir, device=device,
                                workspace_mb=engine_cfg.tensorrt_workspace_mb, max_batch=engine_cfg.max_batch,
                                progress=True)
    produced.update({f"trt:{k}": v for k, v in engines.items()})
    return produced


def _build_diffusion(engine_cfg: EngineSettings, models_cfg: ModelPaths, family: str,
                     backend: str | None) -> dict[str, Path]:
    """A v3/v4/v5 SoVITS (``family``: configured, or ``auto``): ``dit_step.onnx`` and ``vocoder.onnx`` exported
    into ``<onnx_dir>/diffusion-<model id>`` and checked; no TensorRT engines yet (EngineError where asked for)."""
    from engines.diffusion_engine import require_vocoder, vocoder_fingerprint
    from engines.gpt_sovits.checkpoint import model_id, require_model_files
    from engines.gpt_sovits.diffusion import DiffusionDecoder
    from engines.gpt_sovits.dit_onnx import GRAPH, export_dit_step
    from engines.gpt_sovits.vocoder_ort import export_graph as export_vocoder
    from engines.loader import vocoder_path
    from torch import nn

    require_model_files(models_cfg)
    vocoder = vocoder_path(models_cfg, family)
    require_vocoder(vocoder)
    # naive: the modules as loaded (the fp32 DiT, the torch vocoder), with nothing proven or traced at load
    decoder = DiffusionDecoder.load(models_cfg.sovits, vocoder, None if family == "auto" else family, path="naive",
                                    sovits_base=getattr(models_cfg, "sovits_base", None))
    name = decoder.family.name
    folder = Path(engine_cfg.onnx_dir) / f"diffusion-{model_id(models_cfg, vocoder_fingerprint(vocoder), name)}"
    folder.mkdir(parents=True, exist_ok=True)
    log.info("exporting the %s DiT step and vocoder graphs to %s", name, folder)
    module = decoder.vocoder
    assert isinstance(module, nn.Module)  # the naive path keeps the torch vocoder
    produced: dict[str, Path] = {}
    for graph, data in ((GRAPH, export_dit_step(decoder.sovits.dit)), ("vocoder", export_vocoder(module))):
        path, tmp = folder / f"{graph}.onnx", folder / f"{graph}.onnx.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, path)  # whole or not at all
        produced[graph] = path
    check_graphs(folder, tuple(produced))
    log.info("%s ONNX graphs ready in %s", name, folder)
    msg = (f"TensorRT engines for the diffusion families (here {name}) are not built yet; their ONNX graphs are "
           f"checked and ready in {folder}")
    if backend == "tensorrt":
        raise EngineError(msg)
    if backend is None:
        log.warning("%s", msg)
    return produced
