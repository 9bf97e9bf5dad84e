"""The ONNX Runtime backend: the exported graphs (see :mod:`engines.export`) run with I/O binding, under the
:class:`~engines.graph_engine.GraphEngine` both graph backends share.

What runs is the engine plan's (:mod:`engines.plan`): with the GPT runner ``fused`` (``auto`` on a CPU where the
fused decode step builds, :mod:`engines.gpt_sovits.cpu_step`) the GPT is the torch model with that step, one C call
per step, which beats the step graph (ONNX Runtime spent half of its int8 step outside the matrix products), while
the vocoder and the reference graphs stay on ONNX Runtime, whose vocoder is the faster one on CPUs. With ``graphs``
the GPT runs as the exported graphs too (what TensorRT builds from, so the tests verify them through ONNX Runtime).
Either way an int8 GPT serves once its proof holds on the loaded model (:mod:`engines.gpt_int8_proof`, kept in the
export folder), else the GPT runs in fp32 and the engine's plan says so.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from engines.base import EngineError, ModelPaths
from engines.export import GRAPHS, INT8_STEP, ensure_onnx, load_manifest, quantize_step_int8
from engines.gpt_int8_proof import GptProof, kept_proof, prove_int8_gpt, proven
from engines.graph_engine import GraphEngine, GraphGpt, graph_model
from engines.gpt_runner import load_gpt
from engines.plan import EnginePlan, Settings, plan_engine, probe_machine
from engines.vocoder_int8 import choose_vocoder

if TYPE_CHECKING:
    import onnxruntime

    # per graph: its I/O binding and what each name is bound to (data pointer, shape, dtype)
    _Bindings = dict[str, tuple[onnxruntime.IOBinding, dict[str, tuple[int, tuple[int, ...], torch.dtype]]]]

log = logging.getLogger(__name__)

__all__ = ["OnnxEngine"]

GPT_GRAPHS = ("gpt_prefill", "gpt_step")
# the plan's vocoder -> choose_vocoder's request
_VOCODER_REQUEST = {"ort-fp32": "fp32", "ort-int8-if-proven": "auto", "ort-int8": "int8"}
_GPT_RUNNERS = {"auto": "auto", "fused": "fused", "graph": "graphs"}  # from_files' gpt keyword -> engine.gpt_runner
GRAPH_INT8 = "onnx-dynamic"  # the int8 step graph's method in its proof (engines.gpt_int8_proof)
_NP_TYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64, torch.int32: np.int32}


# ------------------------------------------------------------------------------------------- ONNX Runtime runner


class _OrtRunner:
    """ONNX Runtime sessions with I/O binding by pointer; bindings are re-made only when a buffer changes."""

    kv_dtype = torch.float32

    def __init__(self, files: dict[str, Path], device: str, threads: int) -> None:
        import onnxruntime as ort

        self.device = torch.device(device)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.intra_op_num_threads = threads or len(os.sched_getaffinity(0))
        opts.inter_op_num_threads = 1
        # torch samples between graph runs on the same cores: idle ORT workers spinning on them made a step several
        # times slower beside other processes (see FINDINGS.md#ort-workers-not-spinning).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if self.device.type == "cuda":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise EngineError("engine.backend onnx on a GPU needs onnxruntime-gpu (pip install onnxruntime-gpu); "
                                  "or use engine.backend: tensorrt / torch on GPUs")
            providers: list[Any] = [("CUDAExecutionProvider", {"device_id": self.device.index or 0})]
            self._ort_device = ("cuda", self.device.index or 0)
        else:
            providers = ["CPUExecutionProvider"]
            self._ort_device = ("cpu", 0)
        self.sessions: dict[str, onnxruntime.InferenceSession] = {}
        for name, path in files.items():
            try:
                self.sessions[name] = ort.InferenceSession(str(path), opts, providers=providers)
            except Exception as e:  # ORT raises its own exception types
                raise EngineError(f"ONNX Runtime cannot load {path} ({e}); delete its folder to export again") from e
        self._local = threading.local()  # IOBinding objects are per thread
        self._shrink = ort.RunOptions()
        self._shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage",
                                          "cpu:0" if self._ort_device[0] == "cpu" else f"gpu:{self._ort_device[1]}")

    def close(self, graph: str) -> None:
        """Drop ``graph``'s session and this thread's binding of it (a graph the engine will not run)."""
        self.sessions.pop(graph, None)
        bindings: _Bindings | None = getattr(self._local, "bindings", None)
        if bindings is not None:
            bindings.pop(graph, None)

    def run(self, graph: str, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor], *,
            large: bool = False) -> None:
        bindings: _Bindings | None = getattr(self._local, "bindings", None)
        if bindings is None:
            bindings = self._local.bindings = {}
        if graph not in bindings:
            bindings[graph] = (self.sessions[graph].io_binding(), {})
        io, bound = bindings[graph]
        kind, index = self._ort_device
        for is_input, tensors in ((True, inputs), (False, outputs)):
            for name, t in tensors.items():
                assert t.is_contiguous() and t.device == self.device, name
                key = (t.data_ptr(), tuple(t.shape), t.dtype)
                if bound.get(name) == key:
                    continue
                bind = io.bind_input if is_input else io.bind_output
                bind(name, kind, index, _NP_TYPES[t.dtype], list(t.shape), t.data_ptr())
                bound[name] = key
        if kind == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        # a large run's memory goes back from the arena when it ends (LARGE_DECODE_FRAMES says why and what it costs)
        self.sessions[graph].run_with_iobinding(io, self._shrink if large else None)
        if kind == "cuda":
            io.synchronize_outputs()


def _proven_step(runner: _OrtRunner, spec: dict[str, Any], gpt_path: Path, folder: Path,
                 plan: EnginePlan) -> tuple[str, EnginePlan]:
    """The step graph to run under a plan of the int8 step graph: that graph where its proof holds on this model (kept
    in ``folder``), else the fp32 one, and the plan as it then runs; the other graph's session is closed."""
    def prove() -> GptProof:
        return prove_int8_gpt(GraphGpt(runner, spec, "gpt_step"), GraphGpt(runner, spec, INT8_STEP), GRAPH_INT8)

    proof = proven(gpt_path, GRAPH_INT8, folder, prove)
    if not proof.passed:
        runner.close(INT8_STEP)
        return "gpt_step", plan.gpt_in_fp32(f"the int8 GPT missed its proof on this model ({proof.reason}): the "
                                            "fp32 step graph runs")
    runner.close("gpt_step")
    return INT8_STEP, plan


class OnnxEngine(GraphEngine):
    """GPT-SoVITS v2/v2Pro/v2ProPlus on ONNX Runtime (CPU; CUDA with onnxruntime-gpu). Precisions: fp32, int8 (CPU,
    step graph)."""

    name = "onnx"

    @classmethod
    def from_files(cls, models: ModelPaths, onnx_dir: str | os.PathLike[str], plan: EnginePlan | None = None, *,
                   device: str = "cpu", precision: str = "fp32", threads: int = 0, max_batch: int = 8,
                   gpt: str = "auto", vocoder: str = "auto") -> OnnxEngine:
        """Export the graphs once per model pair (under ``onnx_dir``), then open them in ONNX Runtime.

        Parameters
        ----------
        models: checkpoint paths (``gpt``, ``sovits``; ``hubert``, ``bert`` load on first use).
        onnx_dir: export cache folder (``engine.onnx_dir``).
        plan: what to build (:func:`engines.loader.load_engine` passes it); None: planned here from the keywords
            below (tests and benchmarks).
        device: ``"cpu"`` or ``"cuda:N"``.
        precision: ``"fp32"``, or ``"int8"`` (CPU only).
        threads: ORT intra-op threads and the fused step's (0: every core this process may use).
        max_batch: rows decoded together.
        gpt: ``"auto"``, ``"fused"`` or ``"graph"`` (``engine.gpt_runner`` auto, fused, graphs).
        vocoder: ``"auto"``, ``"fp32"`` or ``"int8"`` (``engine.vocoder_precision``; see :mod:`engines.vocoder_int8`).
        """
        if plan is None:
            if gpt not in _GPT_RUNNERS:
                raise EngineError(f"gpt must be one of {', '.join(_GPT_RUNNERS)}, got {gpt!r}")
            plan = plan_engine(Settings(backend="onnx", device=device, precision=precision, vocoder_precision=vocoder,
                                        gpt_runner=_GPT_RUNNERS[gpt], threads=threads, max_batch=max_batch),
                               probe_machine())
        ident, sv_path = graph_model(models, onnx_dir)  # v2Pro: its SV model, before any export
        folder = ensure_onnx(models, onnx_dir)
        manifest = load_manifest(folder)
        fused = plan.gpt_runner == "fused"
        files = {name: folder / f"{name}.onnx" for name in GRAPHS if not (fused and name in GPT_GRAPHS)}
        torch_gpt = None
        if fused:
            torch_gpt, plan = load_gpt(Path(models.gpt), plan, folder)  # (fp32 where its int8 missed its proof)
        int8_graph = not fused and plan.gpt_weights == "int8-dynamic"
        kept = kept_proof(folder, Path(models.gpt), GRAPH_INT8) if int8_graph else None
        if int8_graph and (kept is None or kept.passed):
            files[INT8_STEP] = quantize_step_int8(folder)
            if kept is not None:  # proven before: the fp32 step graph is not needed
                del files["gpt_step"]
        files["sovits_decode"], vocoder_runs = choose_vocoder(folder, _VOCODER_REQUEST[plan.vocoder])
        runner = _OrtRunner(files, plan.device, plan.threads)
        step = "gpt_step"
        if int8_graph:
            step, plan = _proven_step(runner, manifest["gpt"], Path(models.gpt), folder, plan)
        log.info("onnx engine: graphs from %s (GPT: %s, vocoder %s)", folder, "fused CPU step" if fused else step,
                 vocoder_runs)
        int8_bert = (Path(models.gpt), folder / "bert_int8") if plan.bert == "int8-if-proven" else None
        return cls(runner, manifest, plan, model_id=ident, hubert_path=Path(models.hubert),
                   bert_path=Path(models.bert), step_graph=step, gpt=torch_gpt, sv_path=sv_path,
                   vocoder_precision=vocoder_runs, int8_bert=int8_bert)
