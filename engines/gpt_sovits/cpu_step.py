"""The GPT's decode layers fused into one C call on CPUs (``cpu_step.c``), built once per machine.

Why our own kernel: the batch-1 decode step reads every weight once, so its floor is the memory bandwidth, and the
libraries' matrix-vector products stay far from it on the CPUs people self-host on, and ONNX Runtime spent about half
of its int8 step outside the products (see FINDINGS.md#library-products). One call per step for all 24 layers
removes the per-op cost as well, and the int8 weights are weight-only (activations stay fp32
into the products, as 15-bit integers inside them), so they round less than dynamic int8.

The library is compiled with the system C compiler (``cc``) on first use for this very CPU (``-march=native``; set
``VOICEBOT_MARCH`` to build for another, as ``make test-avx2`` does for the CPU it emulates) and cached in
:func:`kernel_dir` under a name that covers the source, the compiler, the flags and the CPU's flags. Without a
compiler the engine plan runs the TorchScript step or the step graphs instead (slower; the plan's log line says how
to get the fast one).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

__all__ = ["FusedStep", "Sampler", "build_library", "linear", "kernel_dir", "load_library", "set_threads", "unavailable_reason"]

SOURCE = Path(__file__).with_name("cpu_step.c")
MAX_ROWS = 16  # rows one call decodes (VB_MAX_ROWS in the C source)
PER_LAYER = 17  # pointers per layer in the parameter table (P_PER_LAYER)
MARCH_ENV = "VOICEBOT_MARCH"  # the -march the library is built for: this CPU ("native") unless set (emulated CPUs)
CFLAGS = ("-O3", f"-march={os.environ.get(MARCH_ENV) or 'native'}", "-fPIC", "-shared", "-pthread")
_reason: str | None = None  # why the library is unavailable, once load_library() failed


def kernel_dir() -> Path:
    """Where built kernels are kept: ``$VOICEBOT_KERNEL_DIR``, else ``$XDG_CACHE_HOME/voicebot/kernels``."""
    if os.environ.get("VOICEBOT_KERNEL_DIR"):
        return Path(os.environ["VOICEBOT_KERNEL_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "voicebot" / "kernels"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def build_library(cc: str, cflags: tuple[str, ...] = CFLAGS, directory: Path | None = None) -> ctypes.CDLL:
    """Compile ``cpu_step.c`` with ``cc`` and ``cflags`` into ``directory`` (:func:`kernel_dir` by default) unless
    that build is there already, and load it. The file name covers the source, the compiler's version, the flags and
    this CPU's flags, so a cache folder shared between machines never loads a build for another CPU.

    Raises
    ------
    OSError: the compiler failed or the library cannot be loaded.
    """
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\0".join((SOURCE.read_text(), version, " ".join(cflags), _cpu_flags())).encode())
    out = (directory or kernel_dir()) / f"cpu_step-{key.hexdigest()[:16]}.so"
    if not out.is_file():
        log.info("building the fused CPU decode step for this CPU with %s (once, a few seconds)", cc)
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)  # renamed into place: concurrent builds are safe
        os.close(fd)
        try:
            run = subprocess.run([cc, *cflags, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True,
                                 timeout=120)
            if run.returncode:
                raise OSError(f"{cc} failed: {run.stderr.strip()[-500:]}")
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    lib = ctypes.CDLL(str(out))
    lib.vb_decode_layers.restype = ctypes.c_int
    lib.vb_decode_layers.argtypes = [ctypes.c_void_p, *[ctypes.c_int] * 7, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.vb_linear.restype = ctypes.c_int
    lib.vb_linear.argtypes = [*[ctypes.c_void_p] * 3, *[ctypes.c_int] * 4, ctypes.c_void_p, ctypes.c_void_p]
    lib.vb_set_threads.restype = ctypes.c_int
    lib.vb_set_threads.argtypes = [ctypes.c_int]
    lib.vb_stalls.restype = ctypes.c_long
    lib.vb_sample_rows.restype = ctypes.c_int
    lib.vb_sample_rows.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, *[ctypes.c_void_p] * 2, ctypes.c_int,
                                   *[ctypes.c_void_p] * 8, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    return lib


def find_compiler() -> str | None:
    """``$CC``, else ``cc``, ``gcc`` or ``clang`` on the PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


@functools.lru_cache(maxsize=None)
def load_library() -> ctypes.CDLL | None:
    """The fused-step library for this CPU, built on first use; ``None`` (reason in :func:`unavailable_reason`)
    where it cannot be built or loaded here. Whether the GPT uses it is the engine plan's decision
    (``engine.gpt_runner``, :mod:`engines.plan`)."""
    global _reason
    cc = find_compiler()
    if cc is None:
        _reason = "no C compiler found (install gcc: apt-get install gcc)"
        return None
    try:
        return build_library(cc)
    except (OSError, subprocess.SubprocessError) as e:
        _reason = f"the fused CPU step could not be built or loaded ({e})"
        return None


def set_threads(threads: int) -> int:
    """Threads of every later fused step in this process (the calling thread and ``threads - 1`` workers); 0 where
    the library is unavailable. On a busy machine the steps fall back to one thread by themselves (see the C file)."""
    lib = load_library()
    return int(lib.vb_set_threads(max(1, threads))) if lib is not None else 0


def unavailable_reason() -> str | None:
    """Why :func:`load_library` returned ``None`` (``None`` while it has not failed)."""
    return _reason


# one layer's parameters as FusedStep takes them
LayerParams = tuple[
    list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]],  # the four linears' (weight, scale or None, bias)
    list[tuple[torch.Tensor, torch.Tensor]],  # the two norms' (weight, bias)
]


def linear(lib: ctypes.CDLL, weight: torch.Tensor, scale: torch.Tensor | None, bias: torch.Tensor | None,
           x: torch.Tensor) -> torch.Tensor:
    """``x [B, in] @ weight.T (* scale) + bias`` as the fused step computes its products (``weight [out, in]`` int8
    with a per-channel fp32 ``scale``, or fp32 with ``None``), ``B <= MAX_ROWS``; returns ``[B, out]`` fp32."""
    int8 = weight.dtype == torch.int8
    if weight.device.type != "cpu" or not weight.is_contiguous() or (int8 and scale is None) or \
            (not int8 and weight.dtype != torch.float32):
        raise ValueError(f"linear takes contiguous CPU int8 (with a scale) or fp32 weights, got {weight.dtype}")
    x = x.to(torch.float32).contiguous()
    b, out = int(x.shape[0]), int(weight.shape[0])
    y = torch.empty(b, out, dtype=torch.float32)
    scale = None if scale is None else scale.to(torch.float32).contiguous()
    bias = None if bias is None else bias.to(torch.float32).contiguous()
    rc = lib.vb_linear(weight.data_ptr(), 0 if scale is None else scale.data_ptr(),
                       0 if bias is None else bias.data_ptr(), out, int(weight.shape[1]), int(int8), b, x.data_ptr(),
                       y.data_ptr())
    if rc:
        raise ValueError(f"linear refused its arguments (rows {b}, weight {tuple(weight.shape)}, x {tuple(x.shape)})")
    return y


class FusedStep:
    """The decode layers of one :class:`~engines.gpt_sovits.gpt.Text2SemanticModel` as one C call.

    Parameters
    ----------
    lib: from :func:`load_library`.
    layers: per layer ``(linears, norms)``: the four linears (QKV, out, FFN up, FFN down) as ``(weight, scale,
        bias)`` with weight ``[out, in]`` fp32 (scale ``None``) or int8 with a ``[out]`` fp32 scale; the two norms as
        ``(weight, bias)``.
    kv: per layer cache ``[2, slots, heads, max_len, head_dim]`` fp32 or bf16, contiguous.
    head: the output head ``[vocab, dim]`` fp32 (no bias).
    dim, heads, ffn, eps: the architecture.

    Notes
    -----
    Holds references to every tensor whose address it passes to C. Threads are the process's one team
    (:meth:`set_threads`); a call made while another call holds the team runs on its own thread.
    """

    def __init__(self, lib: ctypes.CDLL, layers: list[LayerParams], kv: list[torch.Tensor],
                 head: torch.Tensor, *, dim: int, heads: int, ffn: int, eps: float) -> None:
        self.lib = lib
        self.dim, self.heads, self.ffn, self.eps = dim, heads, ffn, eps
        self.int8 = layers[0][0][0][0].dtype == torch.int8
        self.kv_bf16 = kv[0].dtype == torch.bfloat16
        if kv[0].dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"the fused step reads an fp32 or bf16 cache, not {kv[0].dtype}")
        self.slots, self.max_len = int(kv[0].shape[1]), int(kv[0].shape[3])
        keep: list[Any] = []
        table: list[int] = []
        for (linears, norms), cache in zip(layers, kv, strict=True):
            for weight, scale, bias in linears:
                want = torch.int8 if self.int8 else torch.float32
                if weight.dtype != want or not weight.is_contiguous() or weight.device.type != "cpu":
                    raise ValueError(f"fused step weights must be contiguous CPU {want}, got {weight.dtype}")
                keep += [weight, scale, bias]
                table += [weight.data_ptr(), 0 if scale is None else scale.data_ptr(), bias.data_ptr()]
            for g, b in norms:
                keep += [g, b]
                table += [g.data_ptr(), b.data_ptr()]
            if not cache.is_contiguous():
                raise ValueError("the KV cache must be contiguous")
            keep.append(cache)
            table.append(cache.data_ptr())
        if head.dtype != torch.float32 or not head.is_contiguous() or head.shape[1] != dim:
            raise ValueError(f"the fused step's head must be contiguous fp32 [vocab, {dim}]")
        self.head, self.vocab = head, int(head.shape[0])
        self._keep = keep
        self.table = torch.tensor(table, dtype=torch.int64)
        self.layers = len(layers)
        self._scratch = torch.empty(0)

    def __call__(self, h: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Run every layer and the head on ``h [B, dim]`` fp32 (overwritten); returns ``[B, vocab]`` fp32 logits.
        ``slots``/``positions [B]`` int64: each row's cache row and the position its token is written to (it
        attends to ``[0, position]``)."""
        b = int(h.shape[0])
        if b > MAX_ROWS:
            raise ValueError(f"the fused step decodes at most {MAX_ROWS} rows, got {b}")
        need = b * (4 * self.dim + 2 * self.ffn) + MAX_ROWS
        if self._scratch.numel() < need:
            self._scratch = torch.empty(need, dtype=torch.float32)
        h = h.contiguous()
        slots, positions = slots.contiguous(), positions.contiguous()
        logits = torch.empty(b, self.vocab, dtype=torch.float32)
        rc = self.lib.vb_decode_layers(self.table.data_ptr(), self.layers, self.dim, self.heads, self.ffn,
                                       int(self.int8), int(self.kv_bf16), b, h.data_ptr(), slots.data_ptr(),
                                       positions.data_ptr(), self.slots, self.max_len, self.eps,
                                       self._scratch.data_ptr(), self.head.data_ptr(), self.vocab, logits.data_ptr())
        if rc:
            # (torch's stub types tolist() as a bare list)
            shown: list[object] = [t.tolist() for t in (slots, positions)]  # pyright: ignore[reportUnknownMemberType]
            raise ValueError(f"fused step refused its arguments (rows {b}, slots {shown[0]}, positions "
                             f"{shown[1]}, cache {self.slots}x{self.max_len})")
        return logits


class Sampler:
    """:class:`~engines.gpt_sovits.generate.BatchDecoder`'s sampling step on CPU buffers as one C call.

    The same rules and noise as :func:`~engines.gpt_sovits.sampling.sample_step` (top-p excluded: the decoder keeps the
    torch sampler while a row uses it); about 35 small torch ops per step become one call, which is worth 0.5-2 ms a
    step on a 2-core CPU where the fused int8 step itself takes 5-6 ms. exp/log may round differently from torch's in
    the last bit, so a sample can differ only where two candidates' scores tie to about 1e-7.
    """

    def __init__(self, lib: ctypes.CDLL, vocab: int, eos: int, min_steps: int) -> None:
        self.lib, self.vocab, self.eos, self.min_steps = lib, vocab, eos, min_steps
        self._scratch = torch.empty(2 * vocab, dtype=torch.float32)

    def __call__(self, logits: torch.Tensor, seen: torch.Tensor, tokens: torch.Tensor, steps: torch.Tensor,
                 eos_at: torch.Tensor, next_token: torch.Tensor, live: torch.Tensor, top_k: torch.Tensor,
                 temperature: torch.Tensor, penalty: torch.Tensor, key: torch.Tensor) -> None:
        """Sample one token for each of the ``B`` rows and update the row buffers in place: ``logits [B, V]`` fp32;
        ``seen [B, V]`` bool; ``tokens [B, T]`` int64 (the token goes to column ``steps[b]``); ``steps``, ``eos_at``,
        ``next_token``, ``live``, ``top_k``, ``key`` ``[B]`` int64; ``temperature``, ``penalty`` ``[B]`` fp32. Every
        tensor contiguous on the CPU (row slices of the decoder's buffers are)."""
        b, v = logits.shape
        logits = logits.float().contiguous()
        live = live.contiguous()
        for t in (seen, tokens, steps, eos_at, next_token, top_k, temperature, penalty, key):
            if not t.is_contiguous() or t.shape[0] != b:
                raise ValueError("the sampler's buffers must be contiguous with one entry per row")
        rc = self.lib.vb_sample_rows(logits.data_ptr(), b, v, seen.data_ptr(), tokens.data_ptr(), tokens.shape[1],
                                     steps.data_ptr(), eos_at.data_ptr(), next_token.data_ptr(), live.data_ptr(),
                                     top_k.data_ptr(), temperature.data_ptr(), penalty.data_ptr(), key.data_ptr(),
                                     self.eos, self.min_steps, self._scratch.data_ptr())
        if rc:
            raise ValueError(f"the sampler refused its arguments ({b} rows, vocab {v}, "
                             f"steps {steps.tolist()})")  # pyright: ignore[reportUnknownMemberType]  # (a bare list)
