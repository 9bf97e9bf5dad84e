"""The ONNX Runtime backend: the exported graphs (see :mod:`engines.export`) run with I/O binding, under the
:class:`~engines.graph_engine.GraphEngine` both graph backends share.

On a CPU where the fused decode step can be built (:mod:`engines.gpt_sovits.cpu_step`), the onnx engine's GPT is the
torch model with that step (``gpt="auto"``/``"fused"``): one C call per step beats the step graph (ONNX Runtime spent
half of its int8 step outside the matrix products), while the vocoder and the reference graphs stay on ONNX Runtime,
whose vocoder is the faster one on CPUs. ``gpt="graph"`` keeps the graphs (what TensorRT builds from, so the tests
verify them through ONNX Runtime).
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
from engines.gpt_sovits import cpu_step
from engines.gpt_sovits.checkpoint import load_gpt_checkpoint
from engines.gpt_sovits.gpt import Text2SemanticModel
from engines.graph_engine import GraphEngine, graph_model
from engines.vocoder_int8 import choose_vocoder

if TYPE_CHECKING:
    import onnxruntime

    # per graph: its I/O binding and what each name is bound to (data pointer, shape, dtype)
    _Bindings = dict[str, tuple[onnxruntime.IOBinding, dict[str, tuple[int, tuple[int, ...], torch.dtype]]]]

log = logging.getLogger(__name__)

__all__ = ["OnnxEngine"]

PRECISIONS = ("fp32", "int8")  # fp16 graphs run through the tensorrt backend
VOCODER_PRECISIONS = ("auto", "fp32", "int8")  # engine.vocoder_precision
GPT_PATHS = ("auto", "fused", "graph")  # how the onnx engine runs its GPT, see the module notes
GPT_GRAPHS = ("gpt_prefill", "gpt_step")
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
        # torch samples between graph runs on the same cores: do not let idle ORT workers spin on them. Measured with
        # other processes on the 2 cores (Zen 4, int8 step): 11-29 ms not spinning, 58-96 ms spinning.
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


class OnnxEngine(GraphEngine):
    """GPT-SoVITS v2/v2Pro/v2ProPlus on ONNX Runtime (CPU; CUDA with onnxruntime-gpu). Precisions: fp32, int8 (CPU,
    step graph)."""

    name = "onnx"

    @classmethod
    def from_files(cls, models: ModelPaths, onnx_dir: str | os.PathLike[str], *, device: str = "cpu",
                   precision: str = "fp32", threads: int = 0, max_batch: int = 8, gpt: str = "auto",
                   vocoder: str = "auto") -> OnnxEngine:
        """Export the graphs once per model pair (under ``onnx_dir``), then open them in ONNX Runtime.

        Parameters
        ----------
        models: checkpoint paths (``gpt``, ``sovits``; ``hubert``, ``bert`` load on first use).
        onnx_dir: export cache folder (``engine.onnx_dir``).
        device: ``"cpu"`` or ``"cuda:N"``.
        precision: ``"fp32"``, or ``"int8"`` (dynamic int8 step graph, CPU only).
        threads: ORT intra-op threads and the fused step's (0: every core this process may use).
        max_batch: rows decoded together.
        gpt: ``"auto"`` (the fused CPU step where it can be built, else the graphs), ``"fused"`` or ``"graph"``.
        vocoder: ``"auto"``, ``"fp32"`` or ``"int8"`` (CPU: the residual blocks' convolutions in int8, see
            :mod:`engines.vocoder_int8`); ``auto`` is int8 with the int8 GPT on a CPU where the int8 vocoder's proof
            holds on this model, else fp32.
        """
        if precision not in PRECISIONS:
            raise EngineError(f"the onnx engine runs fp32 or int8, not {precision!r}; for fp16 use "
                              "engine.backend: tensorrt (or torch)")
        if precision == "int8" and device != "cpu":
            raise EngineError("int8 is a CPU path of the onnx engine; set engine.device: cpu or another precision")
        if vocoder not in VOCODER_PRECISIONS or (vocoder == "int8" and device != "cpu"):
            raise EngineError(f"engine.vocoder_precision is auto, fp32, or int8 on a CPU; got {vocoder!r} on {device}")
        if vocoder == "auto" and (device != "cpu" or precision != "int8"):
            vocoder = "fp32"  # fp32 asks for upstream's exact decode; GPUs run the vocoder in fp32
        ident, sv_path = graph_model(models, onnx_dir)  # v2Pro: its SV model, before any export
        if gpt not in GPT_PATHS:
            raise EngineError(f"gpt must be one of {', '.join(GPT_PATHS)}, got {gpt!r}")
        fused = gpt != "graph" and device == "cpu" and cpu_step.load_library() is not None
        if gpt == "fused" and not fused:
            raise EngineError(f"the fused GPT step runs on CPUs only, and needs a C compiler: "
                              f"{cpu_step.unavailable_reason() or 'device ' + device}")
        folder = ensure_onnx(models, onnx_dir)
        manifest = load_manifest(folder)
        files = {name: folder / f"{name}.onnx" for name in GRAPHS if not (fused and name in GPT_GRAPHS)}
        step = "gpt_step"
        torch_gpt = None
        if fused:
            torch_gpt = Text2SemanticModel.from_checkpoint(load_gpt_checkpoint(models.gpt), "cpu")
            if precision == "int8":
                torch_gpt.quantize_int8()
        elif precision == "int8":
            files[INT8_STEP] = quantize_step_int8(folder)
            del files["gpt_step"]
            step = INT8_STEP
        files["sovits_decode"], vocoder = choose_vocoder(folder, vocoder)
        runner = _OrtRunner(files, device, threads)
        log.info("onnx engine: %s on %s (GPT: %s, vocoder %s), graphs from %s", precision, device,
                 "fused CPU step" if fused else step, vocoder, folder)
        engine = cls(runner, manifest, device=device, precision=precision, model_id=ident,
                     hubert_path=Path(models.hubert), bert_path=Path(models.bert), max_batch=max_batch,
                     step_graph=step, gpt=torch_gpt, threads=threads or len(os.sched_getaffinity(0)),
                     sv_path=sv_path)
        engine.vocoder_precision = vocoder
        if precision == "int8":  # (a CPU path) the Chinese BERT in int8 too, where it proves itself on this GPT
            engine.encoders.int8_bert_for = Path(models.gpt)
            engine.encoders.int8_bert_store = folder / "bert_int8"  # (the folder is this GPT's: kept per model pair)
        return engine
