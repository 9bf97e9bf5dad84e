"""The engine plan: what runs where, decided once from the settings and a probe of the machine.

:func:`probe_machine` looks at the machine (C compiler and the fused CPU step, CUDA GPUs, TensorRT, ONNX Runtime,
CPU model, ISA flags, cores) and returns a frozen :class:`MachineProbe`; :func:`plan_engine` is a pure function of
the engine settings and that probe and returns a frozen :class:`EnginePlan`: the device, the backend, how the GPT
decodes (runner, weight format, KV cache dtype), the vocoder, the BERT, the diffusion decoder's path and the threads.
The backends build exactly what the plan says and decide nothing themselves; a setting the machine cannot run is a
one-line :class:`~engines.base.EngineError` that names the fix, raised here before anything loads.

What ``auto`` picks and why (measured with ``python -m bot bench``; figures in FINDINGS.md#auto-on-a-cpu):

- on a CPU, backend ``onnx``: the vocoder and the reference graphs on ONNX Runtime (its vocoder is the faster one
  on CPUs) and the GPT as a torch model decoded by the fused C step (:mod:`engines.gpt_sovits.cpu_step`: all layers
  in one call, each weight read once per step) where a C compiler builds it, else by the exported step graphs.
  The fused step beat every library product tried for the batch-1 step and falls back to one thread by itself when
  another process takes a core. Precision ``int8``: the GPT's linears int8 per output channel, weight-only, with a
  bf16 KV cache (proven along upstream's greedy paths within a logit bound, tests/engines/test_int8_proof.py);
  the int8 GPT, vocoder and BERT run where their proofs hold on the loaded model, else fp32 (logged; the engine's
  plan then says fp32 for what runs in fp32: :meth:`EnginePlan.gpt_in_fp32`). The int8 products over many rows
  (the GPT's prefill, the v4/v5 DiT's linears) run on oneDNN where the CPU has AMX, else on fbgemm; with AMX the
  v4/v5 DiT's attention runs in bf16 (inside the DiT's proof).
- on an NVIDIA GPU: TensorRT for fp16 where it is installed, else torch with CUDA graphs.
"""

from __future__ import annotations

import importlib.util
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from engines.base import EngineError

__all__ = ["EnginePlan", "EngineSettings", "MachineProbe", "Settings", "plan_engine", "probe_machine", "resolve_device",
           "resolve_precision"]

BACKENDS = ("torch", "onnx", "tensorrt")
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
GPT_RUNNERS = ("auto", "fused", "graphs", "torch")  # engine.gpt_runner
VOCODER_PRECISIONS = ("auto", "fp32", "int8")  # engine.vocoder_precision
CPU_AUTO_BACKEND = "onnx"  # see the module notes
CPU_AUTO_PRECISION = "int8"
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "asimd", "sve")  # the ones that
# change which kernels run (reported with the plan)


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
    def gpt_runner(self) -> str: ...
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


@dataclass(frozen=True)
class Settings:
    """The settings a plan reads, as plain values (what :func:`plan_engine` copies from any :class:`EngineSettings`;
    the backends' keyword constructors fill it in for tests and benchmarks)."""

    backend: str = "auto"
    device: str = "auto"
    precision: str = "auto"
    vocoder_precision: str = "auto"
    gpt_runner: str = "auto"
    threads: int = 0
    max_batch: int = 8
    cuda_graphs: bool = True


@dataclass(frozen=True)
class MachineProbe:
    """What the machine offers the engines (:func:`probe_machine` makes it; tests write one by hand).

    Attributes
    ----------
    cpu: the CPU's model name.
    cores: cores this process may use.
    isa: the CPU's ISA flags among :data:`ISA_FLAGS`.
    compiler: the C compiler found, or None.
    fused_step: the fused CPU step builds and loads here.
    fused_step_reason: why it does not ("" when it does).
    gpus: names of the usable CUDA GPUs, by index (empty: no CUDA).
    tensorrt: TensorRT is importable.
    onnxruntime: ONNX Runtime is importable.
    onnxruntime_cuda: its CUDA execution provider is available (onnxruntime-gpu).
    amx: the CPU's AMX tiles, as its libraries see them (CPUID): oneDNN's int8 products then run on them.
    """

    cpu: str = ""
    cores: int = 1
    isa: tuple[str, ...] = ()
    compiler: str | None = None
    fused_step: bool = False
    fused_step_reason: str = ""
    gpus: tuple[str, ...] = ()
    tensorrt: bool = False
    onnxruntime: bool = True
    onnxruntime_cuda: bool = False
    amx: bool = False


@dataclass(frozen=True)
class EnginePlan:
    """What the engine runs; backends receive it and build exactly this.

    Attributes
    ----------
    backend: ``torch``, ``onnx`` (ONNX Runtime for the vocoder and reference graphs; the GPT by :attr:`gpt_runner`)
        or ``tensorrt``.
    device: ``cpu`` or ``cuda:N``.
    device_name: the CPU's or the GPU's model name.
    precision: the engine's precision (``fp32``, ``fp16``, ``bf16``, ``int8``).
    gpt_runner: how the GPT decodes: ``fused`` (the fused C step), ``graphs`` (exported step graphs), ``torch``
        (the torch layer loop, TorchScript on a CPU) or ``cuda-graphs`` (the torch step captured per bucket; a
        diffusion family's DiT steps are then replayed from CUDA graphs too).
    gpt_weights: ``fp32``, ``fp16``, ``bf16``, ``int8-weight-only`` (per output channel, activations fp32) or
        ``int8-dynamic`` (activations quantised per step too: torch's fbgemm or the ONNX int8 step graph); an
        engine's plan says ``fp32`` where the int8 GPT missed its proof on the loaded model.
    kv_dtype: the GPT's KV cache dtype.
    vocoder: ``torch``, ``ort-fp32``, ``ort-int8-if-proven`` (int8 where its proof holds on the loaded model, else
        fp32, logged), ``ort-int8`` (int8 whatever the proof says), ``tensorrt`` (fp16), or for the diffusion
        families ``torch`` / ``ort-fp32`` / ``ort-int8-if-proven`` as :attr:`diffusion_path` runs it.
    int8_gemm: the library of the int8 products over many rows on a CPU (the prefill of the fused step's int8 GPT,
        the fast diffusion decoder's DiT linears): ``onednn`` where the CPU has AMX, else ``fbgemm``; ``""`` where
        no such product runs.
    dit_attention: the dtype of the diffusion decoder's attention: ``bf16`` on the fast path where the CPU has AMX
        (its proof on the loaded model covers it), else the DiT's own dtype; ``""`` for the v2 families.
    bert: ``fp32``, ``fp16``, ``bf16`` or ``int8-if-proven``.
    diffusion_path: the v3/v4/v5 decoder's path (``fast``, ``fp32``, ``naive``); ``""`` for the v2 families.
    threads: CPU threads of the engine's worker (torch, ONNX Runtime, the fused step's team).
    max_batch: rows the GPT decodes together.
    notes: why ``auto`` chose what it did where that depends on the machine (one line each).
    fallback: the plan to build if this one's backend cannot be built (``auto`` only), else None.
    """

    backend: str
    device: str
    device_name: str
    precision: str
    gpt_runner: str
    gpt_weights: str
    kv_dtype: str
    vocoder: str
    bert: str
    diffusion_path: str
    threads: int
    max_batch: int
    notes: tuple[str, ...] = ()
    fallback: EnginePlan | None = field(default=None, repr=False)
    int8_gemm: str = ""
    dit_attention: str = ""

    def labels(self) -> dict[str, str]:
        """The plan as string labels (``/metrics``' engine info, the bench's meta)."""
        return {"backend": self.backend, "device": self.device, "device_name": self.device_name,
                "precision": self.precision, "gpt_runner": self.gpt_runner, "gpt_weights": self.gpt_weights,
                "kv_dtype": self.kv_dtype, "int8_gemm": self.int8_gemm, "vocoder": self.vocoder,
                "bert": self.bert, "diffusion_path": self.diffusion_path, "dit_attention": self.dit_attention,
                "threads": str(self.threads)}

    def gpt_in_fp32(self, why: str) -> EnginePlan:
        """This plan with its GPT in fp32 on the same runner (its int8 missed its proof on the loaded model:
        :mod:`engines.gpt_int8_proof`), so that what the engine reports is what runs; ``why`` joins the notes."""
        gemm = self.int8_gemm if self.diffusion_path == "fast" else ""  # (the DiT's linears keep theirs)
        return replace(self, gpt_weights="fp32", kv_dtype=_kv_dtype(self.backend, "fp32", self.gpt_runner),
                       int8_gemm=gemm, notes=(*self.notes, why))

    def describe(self) -> str:
        """One line for the log."""
        gpt = f"GPT {self.gpt_runner} {self.gpt_weights} (KV {self.kv_dtype})"
        decoder = f", decoder {self.diffusion_path} (attention {self.dit_attention})" if self.diffusion_path else ""
        gemm = f", int8 products on {self.int8_gemm}" if self.int8_gemm else ""
        why = f" [{'; '.join(self.notes)}]" if self.notes else ""
        return (f"{self.backend} on {self.device} ({self.device_name}), {self.precision}: {gpt}, vocoder "
                f"{self.vocoder}, BERT {self.bert}{decoder}{gemm}, {self.threads} threads, batch {self.max_batch}{why}")


def probe_machine() -> MachineProbe:
    """Look at this machine once (builds the fused CPU step on first use: a few seconds, then cached on disk)."""
    import torch

    from engines.gpt_sovits import cpu_step

    cpu, flags = _cpu_info()
    gpus = (tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
            if torch.cuda.is_available() else ())
    ort = importlib.util.find_spec("onnxruntime") is not None
    ort_cuda = False
    if ort and gpus:
        import onnxruntime

        ort_cuda = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    fused = cpu_step.load_library() is not None
    # (torch asks CPUID, as oneDNN does: a CPU shown as AVX2-only says no here even where /proc/cpuinfo says amx)
    amx_check = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return MachineProbe(cpu=cpu, cores=len(os.sched_getaffinity(0)), isa=tuple(f for f in ISA_FLAGS if f in flags),
                        compiler=cpu_step.find_compiler(), fused_step=fused,
                        fused_step_reason="" if fused else cpu_step.unavailable_reason() or "",
                        gpus=gpus, tensorrt=importlib.util.find_spec("tensorrt") is not None, onnxruntime=ort,
                        onnxruntime_cuda=ort_cuda, amx=bool(amx_check()) if callable(amx_check) else False)


def _cpu_info() -> tuple[str, set[str]]:
    """The CPU's model name and flags from /proc/cpuinfo (empty where there is none)."""
    import platform

    model, flags = platform.processor() or platform.machine(), set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model") and value.strip():
                model = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags = set(value.split())
    except OSError:
        pass
    return model, flags


def plan_engine(settings: EngineSettings | Settings, probe: MachineProbe, *, diffusion: bool = False) -> EnginePlan:
    """The engine for ``settings`` on the machine ``probe`` describes (pure: reads nothing else).

    Parameters
    ----------
    settings: the ``engine`` config section (or :class:`Settings`).
    probe: from :func:`probe_machine`.
    diffusion: the SoVITS is a v3/v4/v5 one (its GPT runs in torch; its decoder is the diffusion decoder).

    Raises
    ------
    EngineError
        a setting this machine or this model cannot run (one line, naming the fix).
    """
    s = Settings(backend=settings.backend, device=settings.device, precision=settings.precision,
                 vocoder_precision=settings.vocoder_precision, gpt_runner=settings.gpt_runner,
                 threads=settings.threads, max_batch=settings.max_batch, cuda_graphs=settings.cuda_graphs)
    _check_names(s)
    device = resolve_device(s.device, probe)
    precision = resolve_precision(s.precision, device)
    notes: list[str] = []
    backend = _backend(s, device, precision, probe, diffusion, notes)
    runner = _gpt_runner(s, backend, device, precision, probe, diffusion, notes)
    fallback = None
    if s.backend == "auto" and backend != "torch":  # a model auto's backend cannot export or build still speaks
        try:
            fallback = plan_engine(replace(s, backend="torch"), probe, diffusion=diffusion)
        except EngineError:
            fallback = None  # a setting only the chosen backend runs (engine.vocoder_precision: int8...)
    weights = _gpt_weights(precision, runner)
    dit_path = ("fast" if device == "cpu" and precision == "int8" else "fp32") if diffusion else ""
    return EnginePlan(
        backend=backend, device=device, device_name=_device_name(device, probe), precision=precision,
        gpt_runner=runner, gpt_weights=weights, kv_dtype=_kv_dtype(backend, precision, runner),
        int8_gemm=_int8_gemm(weights, dit_path, probe),
        vocoder=_vocoder(s, backend, device, precision, probe, diffusion),
        bert=_bert(backend, device, precision, diffusion), diffusion_path=dit_path,
        dit_attention=_dit_attention(dit_path, device, precision, probe),
        threads=s.threads or probe.cores, max_batch=s.max_batch, notes=tuple(notes), fallback=fallback)


def _check_names(s: Settings) -> None:
    """Each setting is one of its names (the config checks them too; settings built in code come here directly)."""
    for key, value, names in (("backend", s.backend, ("auto", *BACKENDS)), ("precision", s.precision,
                              ("auto", *PRECISIONS)), ("vocoder_precision", s.vocoder_precision, VOCODER_PRECISIONS),
                              ("gpt_runner", s.gpt_runner, GPT_RUNNERS)):
        if value not in names:
            raise EngineError(f"unknown engine.{key} {value!r}: expected {', '.join(names)}")
    if s.threads < 0 or s.max_batch < 1:
        raise EngineError(f"engine.threads must be >= 0 and engine.max_batch >= 1 (got {s.threads}, {s.max_batch})")


def resolve_device(device: str, probe: MachineProbe) -> str:
    """``auto`` -> ``cuda:0`` where a CUDA GPU is usable, else ``cpu``; ``cuda`` -> ``cuda:0``."""
    if device == "auto":
        return "cuda:0" if probe.gpus else "cpu"
    if re.fullmatch(r"cuda(:\d+)?", device):
        index = int(device.partition(":")[2] or 0)
        if not probe.gpus:
            raise EngineError(f"engine.device is {device!r} but no CUDA GPU is usable here; set engine.device: cpu "
                              f"(or auto)")
        if index >= len(probe.gpus):
            raise EngineError(f"engine.device is {device!r} but this machine has {len(probe.gpus)} CUDA GPU(s); "
                              f"set engine.device: cuda:0 (or auto)")
        return f"cuda:{index}"
    if device != "cpu":
        raise EngineError(f"engine.device must be auto, cpu, cuda or cuda:N, got {device!r}")
    return device


def resolve_precision(precision: str, device: str) -> str:
    """``auto`` -> fp16 on a GPU, int8 on a CPU; a precision the device cannot run is refused."""
    if precision == "auto":
        return "fp16" if device != "cpu" else CPU_AUTO_PRECISION
    if device == "cpu" and precision in ("fp16", "bf16"):
        raise EngineError(f"engine.precision {precision} is for GPUs; on the CPU use fp32 (or int8), on a GPU the "
                          "tensorrt or torch backend")
    if device != "cpu" and precision == "int8":
        raise EngineError("engine.precision int8 is a CPU speed path; on a GPU use fp16 (or bf16, fp32)")
    return precision


def _backend(s: Settings, device: str, precision: str, probe: MachineProbe, diffusion: bool,
             notes: list[str]) -> str:
    """The backend to build: ``auto`` is onnx on a CPU, TensorRT for fp16 on a GPU where it is installed, else
    torch; an explicit choice the device, the precision or the model cannot serve is refused."""
    if s.backend == "auto":
        if device == "cpu":
            if not probe.onnxruntime:
                notes.append("ONNX Runtime is not installed: the torch backend runs")
                return "torch"
            return CPU_AUTO_BACKEND
        if precision == "fp16" and probe.tensorrt and not diffusion:
            return "tensorrt"
        if precision == "fp16" and diffusion and probe.tensorrt:
            notes.append("TensorRT does not run the v3/v4/v5 models yet: the torch backend runs")
        return "torch"
    if s.backend == "tensorrt":
        if device == "cpu":
            raise EngineError("engine.backend tensorrt needs an NVIDIA GPU (engine.device: cuda or auto on a machine "
                              "with one); on the CPU use torch or onnx")
        if precision != "fp16":
            raise EngineError(f"the tensorrt backend builds fp16 engines; set engine.precision: fp16 (or auto), or "
                              f"use engine.backend: torch for {precision}")
        if diffusion:
            raise EngineError("engine.backend tensorrt does not run the v3/v4/v5 models yet; set engine.backend: "
                              "torch (or auto)")
        if not probe.tensorrt:
            raise EngineError("engine.backend tensorrt needs TensorRT (pip install 'voicebot[gpu]'); or set "
                              "engine.backend: torch (or auto)")
    if s.backend == "onnx" and not diffusion:
        if precision not in ("fp32", "int8"):
            raise EngineError(f"the onnx backend runs fp32 or int8, not {precision}; for fp16 use engine.backend: "
                              "tensorrt (or torch)")
        if not probe.onnxruntime:
            raise EngineError("engine.backend onnx needs ONNX Runtime (pip install onnxruntime); or set "
                              "engine.backend: torch")
        if device != "cpu" and not probe.onnxruntime_cuda:
            raise EngineError("engine.backend onnx on a GPU needs onnxruntime-gpu (pip install onnxruntime-gpu); "
                              "or use engine.backend: tensorrt / torch on GPUs")
    return s.backend


def _gpt_runner(s: Settings, backend: str, device: str, precision: str, probe: MachineProbe, diffusion: bool,
                notes: list[str]) -> str:
    """How the GPT decodes (``engine.gpt_runner``): the fused C step on a CPU where it builds; the step graphs on
    tensorrt, and on onnx without the fused step; the torch loop (CUDA graphs on a GPU with engine.cuda_graphs)."""
    graphs_backend = backend in ("onnx", "tensorrt") and not diffusion  # the diffusion engine's GPT is torch's
    torch_runner = "cuda-graphs" if device != "cpu" and s.cuda_graphs else "torch"
    can_fuse = device == "cpu" and backend != "tensorrt" and probe.fused_step
    why_not = ("the fused step runs on CPUs" if device != "cpu" else
               f"the fused step is unavailable here: {probe.fused_step_reason or 'no C compiler'}")
    if s.gpt_runner == "fused":
        if not can_fuse:
            raise EngineError(f"engine.gpt_runner fused cannot run: {why_not}; set engine.gpt_runner: auto")
        return "fused"
    if s.gpt_runner == "graphs":
        if not graphs_backend:
            raise EngineError("engine.gpt_runner graphs runs on the onnx and tensorrt backends with a v2 model; set "
                              "engine.gpt_runner: auto (or engine.backend: onnx)")
        return "graphs"
    if s.gpt_runner == "torch":
        if backend == "tensorrt" or (backend == "onnx" and not diffusion):
            raise EngineError(f"the {backend} backend runs its GPT as step graphs or the fused step, not the torch "
                              "loop; set engine.gpt_runner: auto (or engine.backend: torch)")
        return torch_runner
    if backend == "tensorrt":
        return "graphs"
    if can_fuse:
        return "fused"
    if device == "cpu":
        notes.append(f"{why_not}: the GPT decodes with the {'step graphs' if graphs_backend else 'torch loop'}, "
                     "slower")
    return "graphs" if graphs_backend else torch_runner


def _gpt_weights(precision: str, runner: str) -> str:
    """The GPT's weight format: int8 is weight-only under the fused step, dynamic (activations too) otherwise."""
    if precision != "int8":
        return precision
    return "int8-weight-only" if runner == "fused" else "int8-dynamic"


def _int8_gemm(weights: str, dit_path: str, probe: MachineProbe) -> str:
    """The library of the int8 products over many rows (see :attr:`EnginePlan.int8_gemm`): the weight-only int8
    GPT's prefill and the fast decoder's DiT run them. oneDNN where the CPU has AMX (its tiles halve the products'
    time; without them oneDNN was the slower one, see FINDINGS.md#prefill-int8-gemm)."""
    if weights != "int8-weight-only" and dit_path != "fast":
        return ""
    return "onednn" if probe.amx else "fbgemm"


def _dit_attention(dit_path: str, device: str, precision: str, probe: MachineProbe) -> str:
    """The diffusion decoder's attention dtype: bf16 on the fast path where AMX runs it (fp32 took 1.6x its time
    at 1000 frames; its error is inside the DiT's proof on the loaded model, see FINDINGS.md#dit-on-amx), else the
    DiT's."""
    if not dit_path:
        return ""
    if dit_path == "fast" and probe.amx:
        return "bf16"
    return precision if device != "cpu" else "fp32"


def _kv_dtype(backend: str, precision: str, runner: str) -> str:
    """The KV cache's dtype: the step graphs' (fp32 on ONNX Runtime, fp16 on TensorRT), bf16 beside torch's int8
    weights, else the precision's."""
    if runner == "graphs":
        return "fp16" if backend == "tensorrt" else "fp32"
    return "bf16" if precision == "int8" else precision


def _vocoder(s: Settings, backend: str, device: str, precision: str, probe: MachineProbe, diffusion: bool) -> str:
    """What decodes the audio. ``engine.vocoder_precision`` int8 is the v2 ONNX vocoder's, on a CPU; ``auto`` is it
    with the int8 GPT (fp32 asks for upstream's exact decode)."""
    if s.vocoder_precision == "int8":
        if diffusion:
            raise EngineError("engine.vocoder_precision int8 is the v2 vocoder's; the v3/v4/v5 vocoders follow "
                              "engine.precision: set it to auto or fp32")
        if device != "cpu" or backend != "onnx":
            raise EngineError(f"engine.vocoder_precision int8 runs on the onnx engine on a CPU (this configuration "
                              f"runs {backend} on {device}); set it to auto or fp32")
        return "ort-int8"
    if diffusion:  # the decoder's path decides (DiffusionDecoder.load): ONNX Runtime for the 48 kHz vocoder on a CPU
        if device != "cpu" or not probe.onnxruntime:
            return "torch"
        return "ort-int8-if-proven" if precision == "int8" else "ort-fp32"
    if backend == "tensorrt":
        return "tensorrt"
    if backend == "torch":
        return "torch"
    if s.vocoder_precision == "auto" and device == "cpu" and precision == "int8":
        return "ort-int8-if-proven"
    return "ort-fp32"


def _bert(backend: str, device: str, precision: str, diffusion: bool) -> str:
    """The Chinese BERT's precision: int8 with the int8 GPT where its proof holds (v2 engines), the GPU's half
    precision on torch and TensorRT, else fp32."""
    if precision == "int8":
        return "fp32" if diffusion else "int8-if-proven"
    if device != "cpu" and (backend == "torch" or diffusion or precision == "fp16"):
        return precision
    return "fp32"


def _device_name(device: str, probe: MachineProbe) -> str:
    """The model name of the device the plan runs on."""
    if device == "cpu":
        return probe.cpu or "cpu"
    return probe.gpus[int(device.partition(":")[2] or 0)]
