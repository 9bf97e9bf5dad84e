"""The TensorRT backend (10.x): engines built from the exported ONNX graphs, run on torch buffers and streams.

Each graph of :mod:`engines.export` becomes one serialised engine, FP16 with one optimisation profile over its batch
and length axes (:func:`profiles`), built once and cached under ``engine.tensorrt_dir`` in a file whose name hashes
the GPU (name + compute capability), the TensorRT version, the ONNX file and the build settings, so a driver, GPU or
model change rebuilds and nothing stale is ever loaded. Layer norms, softmaxes and the GPT's output head are pinned to
FP32 (half-precision logits make GPT-SoVITS stop early); the GPT's K/V inputs and outputs are FP16, halving the
cache's memory and bandwidth.

Running uses the named-tensor API only: ``set_input_shape`` + ``set_tensor_address`` on torch CUDA tensors, then
``execute_async_v3`` on the current torch stream, so TensorRT work and the torch sampler are ordered without a sync.
The decode loop, cache handling and the Engine surface are :class:`engines.graph_engine.GraphEngine`'s.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, cast

import torch

from engines.base import ModelPaths, BERT_DIM, EngineError
from engines.export import GRAPHS, ensure_onnx, load_manifest
from engines.gpt_sovits.checkpoint import file_fingerprint
from engines.graph_engine import GraphEngine, graph_model
from engines.plan import EnginePlan, Settings, plan_engine, probe_machine
from engines.gpt_sovits.generate import MAX_CONTEXT

log = logging.getLogger(__name__)

__all__ = ["TensorRTEngine", "build_trt_engines", "profiles"]

INSTALL_HINT = ("TensorRT is not installed: on a machine with an NVIDIA GPU and CUDA 12, `pip install tensorrt` "
                "(10.x); or use engine.backend: torch")
MAX_PHONES = 512  # prefill: phones (prompt + target) per request
MAX_PROMPT_TOKENS = 512  # prefill: reference tokens (25 Hz; 20 s)
MAX_TOKENS = 1500  # SoVITS: semantic tokens per sentence (the GPT's step cap)
MIN_SPEED = 0.5  # slowest speed the SoVITS profile admits (frames = 2 Ts / speed + 1)
MAX_REF_FRAMES = 1000  # reference spectrogram frames (50 Hz; 20 s)
MAX_REF_BATCH = 4  # references encoded at once
FP32_LAYER_KINDS = ("NORMALIZATION", "SOFTMAX", "REDUCE")  # kept in FP32 inside FP16 engines
_FP16_IO = ("past_k_", "past_v_", "new_k", "new_v", "keys", "values")  # GPT K/V tensors: FP16 I/O



Shape = tuple[int, ...]
Profile = dict[str, tuple[Shape, Shape, Shape]]  # input name -> (min, opt, max) shape


def profiles(manifest: dict[str, Any], max_batch: int) -> dict[str, Profile]:
    """Optimisation profiles of every graph's dynamic inputs; the GPT step is tuned for one stream.

    Parameters
    ----------
    manifest: the export manifest (model dimensions).
    max_batch: largest GPT decode batch.
    """
    g, s = manifest["gpt"], manifest["sovits"]
    # cache positions: up to the exported positional table (generate() may size past MAX_CONTEXT)
    b, ctx, heads, hd = max_batch, max(MAX_CONTEXT, g["pe_positions"]), g["heads"], g["head_dim"]
    frames = int(2 * MAX_TOKENS / MIN_SPEED) + 1  # 50 Hz latent frames of the longest, slowest sentence
    lengths = ((1, 1), (1, 256), (b, ctx))  # (rows, cache positions) at min / opt / max
    step: Profile = {"tokens": ((1,), (1,), (b,)), "audio_pos": ((1,), (1,), (b,)),
                     "kv_bias": lengths}  # type: ignore[dict-item]
    for i in range(g["layers"]):
        step[f"past_k_{i}"] = tuple((r, heads, hd, t) for r, t in lengths)  # type: ignore[assignment]
        step[f"past_v_{i}"] = tuple((r, heads, t, hd) for r, t in lengths)  # type: ignore[assignment]
    c = s["inter_channels"]
    return {
        "gpt_prefill": {"phones": ((1, 1), (1, 100), (1, MAX_PHONES)),
                        "bert": ((1, BERT_DIM, 1), (1, BERT_DIM, 100), (1, BERT_DIM, MAX_PHONES)),
                        "prompt": ((1, 0), (1, 150), (1, MAX_PROMPT_TOKENS))},
        "gpt_step": step,
        "sovits_decode": {"codes": ((1, 1, 1), (1, 1, 150), (1, 1, MAX_TOKENS)),
                          "text": ((1, 1), (1, 60), (1, MAX_PHONES)),
                          "noise": ((1, c, 1), (1, c, 300), (1, c, frames))},
        "ref_style": {"spec": ((1, 1025, 1), (1, 1025, 300), (MAX_REF_BATCH, 1025, MAX_REF_FRAMES)),
                      **_sv_profile(s)},
        "extract_latent": {"ssl": ((1, 768, 2), (1, 768, 300), (MAX_REF_BATCH, 768, MAX_REF_FRAMES))},
    }


def _sv_profile(sovits: dict[str, Any]) -> Profile:
    """v2Pro/v2ProPlus: ``ref_style``'s second input, the SV features ``[B, sv_dim]`` of the same clips (v2: none)."""
    d = int(sovits.get("sv_dim") or 0)
    return {"sv": ((1, d), (1, d), (MAX_REF_BATCH, d))} if d else {}


def _import_trt() -> Any:
    """The tensorrt module, or an EngineError that says how to install it."""
    try:
        import tensorrt  # pyright: ignore[reportMissingImports]  # the gpu extra, absent without a GPU
    except ImportError:
        raise EngineError(INSTALL_HINT) from None
    trt = cast(Any, tensorrt)  # used untyped (where it is installed its type information is partial)
    if int(trt.__version__.split(".")[0]) < 10:
        raise EngineError(f"TensorRT {trt.__version__} is too old: the engine uses the 10.x named-tensor API; "
                          "`pip install -U tensorrt`")
    return trt


def _device_id(device: str) -> tuple[int, str]:
    """CUDA index and 'name (sm_XY)' of ``device``."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        raise EngineError(f"the tensorrt engine needs a CUDA GPU (engine.device is {device!r}); "
                          "use engine.backend: onnx or torch on CPUs")
    index = torch.device(device).index or 0
    major, minor = torch.cuda.get_device_capability(index)
    return index, f"{torch.cuda.get_device_name(index)} (sm_{major}{minor})"


def _cache_name(graph: str, onnx_path: Path, gpu: str, trt_version: str, settings: dict[str, Any]) -> str:
    """Engine file name: graph + hash of GPU, TensorRT version, ONNX file and build settings."""
    ident = json.dumps({"gpu": gpu, "trt": trt_version, "onnx": file_fingerprint(onnx_path), **settings},
                       sort_keys=True)
    return f"{graph}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}.plan"


def build_trt_engines(onnx_folder: str | os.PathLike[str], trt_dir: str | os.PathLike[str], *, device: str = "cuda:0",
                      workspace_mb: int = 4096, max_batch: int = 8, progress: bool = False) -> dict[str, Path]:
    """Build (or find cached) FP16 engines for every graph of an export folder.

    Parameters
    ----------
    onnx_folder: from :func:`engines.export.ensure_onnx`.
    trt_dir: engine cache folder (``engine.tensorrt_dir``).
    device: the CUDA device the engines are built for.
    workspace_mb: builder workspace limit (``engine.tensorrt_workspace_mb``).
    max_batch: largest GPT decode batch of the step profile.
    progress: show a tqdm bar (``python -m bot engines build``).

    Returns
    -------
    dict
        graph name -> serialised engine path.
    """
    trt = _import_trt()
    index, gpu = _device_id(device)
    folder, out = Path(onnx_folder), Path(trt_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(folder)
    table = profiles(manifest, max_batch)
    settings = {"max_batch": max_batch, "profiles": repr(table), "precision": "fp16", "format": 1}
    paths = {g: out / _cache_name(g, folder / f"{g}.onnx", gpu, trt.__version__, settings) for g in GRAPHS}
    todo = [g for g in GRAPHS if not paths[g].is_file()]
    if not todo:
        return paths
    from tqdm import tqdm

    logger = trt.Logger(trt.Logger.WARNING)
    with torch.cuda.device(index), tqdm(todo, desc="TensorRT", unit="engine", disable=not progress) as bar:
        for graph in bar:
            bar.set_postfix_str(f"building {graph} (minutes)")
            log.info("building the TensorRT engine for %s on %s", graph, gpu)
            plan = _build_one(trt, logger, folder / f"{graph}.onnx", table[graph], workspace_mb,
                              gpt=graph.startswith("gpt"))
            tmp = paths[graph].with_suffix(".tmp")
            tmp.write_bytes(plan)
            os.replace(tmp, paths[graph])
    return paths


def _build_one(trt: Any, logger: Any, onnx_path: Path, profile: Profile, workspace_mb: int, gpt: bool) -> bytes:
    """Parse one ONNX file and build its serialised FP16 engine."""
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineError(f"TensorRT cannot parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    config.set_flag(trt.BuilderFlag.FP16)
    config.set_flag(trt.BuilderFlag.PREFER_PRECISION_CONSTRAINTS)
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if any(kind == layer.type.name for kind in FP32_LAYER_KINDS):
            layer.precision = trt.float32
            for j in range(layer.num_outputs):
                layer.set_output_type(j, trt.float32)
    if gpt:
        outputs = {network.get_output(i).name: network.get_output(i) for i in range(network.num_outputs)}
        head = _producer(network, outputs["logits"])  # the output head's MatMul (through reshapes)
        if head is not None:
            head.precision = trt.float32
            head.set_output_type(0, trt.float32)
        for tensor in [network.get_input(i) for i in range(network.num_inputs)] + list(outputs.values()):
            if tensor.name.startswith(_FP16_IO):
                tensor.dtype = trt.float16
    opt = builder.create_optimization_profile()
    for name, (lo, mid, hi) in profile.items():
        opt.set_shape(name, lo, mid, hi)
    config.add_optimization_profile(opt)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise EngineError(f"TensorRT failed to build an engine from {onnx_path}; see the log above "
                          "(raise engine.tensorrt_workspace_mb if it ran out of memory)")
    return bytes(plan)


def _producer(network: Any, tensor: Any) -> Any:
    """The MatMul layer that produces ``tensor``, looking through shuffles (reshapes); None if not found."""
    producers: dict[str, Any] = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        for j in range(layer.num_outputs):
            producers[layer.get_output(j).name] = layer
    layer = producers.get(tensor.name)
    while layer is not None and layer.type.name in ("SHUFFLE", "IDENTITY"):
        layer = producers.get(layer.get_input(0).name)
    return layer if layer is not None and layer.type.name == "MATRIX_MULTIPLY" else None


class _TrtRunner:
    """Deserialised engines and one execution context per graph, run on the current torch stream."""

    kv_dtype = torch.float16

    def __init__(self, plans: dict[str, Path], device: str) -> None:
        trt = _import_trt()
        self.device = torch.device(device)
        self._trt = trt
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self._engines: dict[str, Any] = {}
        self._contexts: dict[str, Any] = {}
        self._locks = {g: threading.Lock() for g in plans}
        with torch.cuda.device(self.device):
            for graph, path in plans.items():
                engine = self._runtime.deserialize_cuda_engine(Path(path).read_bytes())
                if engine is None:
                    raise EngineError(f"TensorRT cannot load {path}; delete it to rebuild")
                self._engines[graph] = engine
                self._contexts[graph] = engine.create_execution_context()
        self._dtypes = {g: {e.get_tensor_name(i): _torch_dtype(trt, e.get_tensor_dtype(e.get_tensor_name(i)))
                            for i in range(e.num_io_tensors)} for g, e in self._engines.items()}

    def run(self, graph: str, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor], *,
            large: bool = False) -> None:
        # (large: nothing to give back; the engines' working memory is sized when they are built)
        types = self._dtypes[graph]
        stream = torch.cuda.current_stream(self.device)
        staged: list[tuple[torch.Tensor, torch.Tensor]] = []  # (engine-typed output, caller's output)
        with self._locks[graph]:
            ctx = self._contexts[graph]
            keep: list[torch.Tensor] = []  # converted inputs must outlive the enqueue
            for name, t in inputs.items():
                if t.dtype != types[name]:
                    t = t.to(types[name]).contiguous()
                keep.append(t)
                ctx.set_input_shape(name, tuple(t.shape))
                ctx.set_tensor_address(name, t.data_ptr())
            for name, t in outputs.items():
                if t.dtype != types[name]:
                    tmp = torch.empty(t.shape, dtype=types[name], device=t.device)
                    staged.append((tmp, t))
                    t = tmp
                ctx.set_tensor_address(name, t.data_ptr())
            if not ctx.execute_async_v3(stream.cuda_stream):
                raise EngineError(f"TensorRT failed to run {graph} (input shapes "
                                  f"{ {k: tuple(v.shape) for k, v in inputs.items() if not k.startswith('past_')} })")
            for tmp, t in staged:
                t.copy_(tmp)
            del keep


def _torch_dtype(trt: Any, dtype: Any) -> torch.dtype:
    """TensorRT tensor dtype -> torch dtype."""
    table = {trt.float32: torch.float32, trt.float16: torch.float16, trt.int32: torch.int32, trt.int64: torch.int64,
             trt.bool: torch.bool}
    if dtype not in table:
        raise EngineError(f"unexpected TensorRT I/O type {dtype}")
    return table[dtype]


class TensorRTEngine(GraphEngine):
    """GPT-SoVITS v2/v2Pro/v2ProPlus on TensorRT FP16 (GPT logits, norms and softmaxes in FP32; HuBERT/BERT and the
    SV model in torch)."""

    name = "tensorrt"

    @classmethod
    def from_files(cls, models: ModelPaths, onnx_dir: str | os.PathLike[str], trt_dir: str | os.PathLike[str], *,
                   device: str = "cuda:0", workspace_mb: int = 4096, max_batch: int = 8,
                   plan: EnginePlan | None = None) -> TensorRTEngine:
        """Export the ONNX graphs and build the engines if missing (minutes, once per GPU/TensorRT/model), then load.

        Parameters
        ----------
        models: checkpoint paths (``gpt``, ``sovits``; ``hubert``, ``bert`` load on first use).
        onnx_dir, trt_dir: export and engine caches (``engine.onnx_dir``, ``engine.tensorrt_dir``).
        device: ``"cuda:N"``.
        workspace_mb: builder workspace limit.
        max_batch: rows decoded together (the step profile's largest batch).
        plan: what :func:`engines.loader.load_engine` planned; None: planned here (fp16 on ``device``).
        """
        if plan is None:
            plan = plan_engine(Settings(backend="tensorrt", device=device, precision="fp16", max_batch=max_batch),
                               probe_machine())
        _import_trt()
        _device_id(device)
        ident, sv_path = graph_model(models, onnx_dir)  # v2Pro: its SV model, before any export
        folder = ensure_onnx(models, onnx_dir)
        plans = build_trt_engines(folder, trt_dir, device=device, workspace_mb=workspace_mb, max_batch=max_batch)
        runner = _TrtRunner(plans, device)
        log.info("tensorrt engine: fp16 on %s, engines in %s", device, trt_dir)
        return cls(runner, load_manifest(folder), plan, model_id=ident, hubert_path=Path(models.hubert),
                   bert_path=Path(models.bert), sv_path=sv_path)
