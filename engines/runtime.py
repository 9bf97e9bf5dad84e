"""The runtime pieces every backend shares: CPU thread counts, CUDA streams and host memory (the loader and the
backends import this module; none of them imports another backend)."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import math
import mmap
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Callable, Generic, TypeVar

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

__all__ = ["IDLE_UNLOAD_S", "IdleUnloaded", "cpu_threads", "lazy_zeros", "release_freed_memory", "set_cpu_threads",
           "use_lane_stream"]

T = TypeVar("T")

# a model needed only when a voice is made (HuBERT, the v2Pro SV model) is unloaded after this long unused
IDLE_UNLOAD_S = 600.0


def cpu_threads(threads: int) -> int:
    """``threads``, or one per core the process may use when 0."""
    return threads or len(os.sched_getaffinity(0))


def set_cpu_threads(threads: int) -> int:
    """Use ``threads`` CPU threads in the calling thread (0: one per core the process may use)."""
    import torch

    n = cpu_threads(threads)
    torch.set_num_threads(n)
    return n


def use_lane_stream(device: str) -> None:
    """Give the calling thread a CUDA stream of its own on ``device`` (engines' ``bind_thread`` on a GPU).

    The GPT and the vocoder run in threads of their own on a GPU; on the shared default stream their kernels would
    serialise. Nothing crosses between the lanes but numpy, and the weights were written on the default stream:
    that work is finished first."""
    import torch

    torch.cuda.synchronize(device)
    torch.cuda.set_stream(torch.cuda.Stream(device=device))


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor whose memory the OS commits page by page as it is first written (an anonymous mapping),
    for large buffers mostly unused: the GPT's static KV cache, sized for ``engine.max_batch`` rows of the longest
    context (8 x 2048 positions, 805 MB in bf16 at the real v2 size), of which a stream or two write a few hundred
    positions. ``torch.zeros`` writes every page at once, and the process keeps them all resident; pages that are only
    read here map the kernel's shared zero page. The mapping is page aligned and freed with the tensor."""
    import torch

    size = math.prod(shape) * dtype.itemsize
    if size == 0 or not hasattr(mmap, "MAP_PRIVATE"):  # (Windows: no private anonymous mappings in Python's mmap)
        return torch.zeros(shape, dtype=dtype)
    # private: a read fault maps the zero page (a shared mapping is shared memory, committed on reading too); the
    # tensor keeps the mapping alive (torch.frombuffer holds a reference to the buffer)
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).view(shape)


_libc: ctypes.CDLL | None | bool = None


def release_freed_memory() -> int:
    """Collect unreachable objects, then hand the memory that the C heap keeps after large frees back to the OS
    (glibc's ``malloc_trim``); returns the bytes the process's resident set shrank by (0 where there is no glibc).

    Why: loading and converting models frees gigabytes in pieces that glibc keeps for reuse rather than returning,
    and the process's resident memory stays at its high-water mark: after the int8 BERT's proof, more than half of a
    serving process's resident memory was such freed heap (see FINDINGS.md#freed-heap)."""
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name) if name else None
            _libc = lib if lib is not None and hasattr(lib, "malloc_trim") else False
        except OSError:
            _libc = False
    if not isinstance(_libc, ctypes.CDLL):
        return 0
    before = _resident_bytes()
    gc.collect()  # (a model's modules can be held by reference cycles until the collector runs)
    _libc.malloc_trim(ctypes.c_size_t(0))
    freed = max(0, before - _resident_bytes())
    log.debug("released %.0f MB of freed heap memory to the OS", freed / 2**20)
    return freed


def _resident_bytes() -> int:
    """This process's resident memory in bytes (Linux), else 0."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class IdleUnloaded(Generic[T]):
    """A model loaded on first use and unloaded again after ``idle_s`` without use (loaded anew when next asked for),
    for the models that run only when a voice is made: HuBERT (0.36 GiB resident at the real size) and the v2Pro SV
    model. A caller's reference stays valid while it uses the model, also if it is unloaded meanwhile.

    Parameters
    ----------
    load: makes the model (may raise: nothing is kept then).
    name: for the log line.
    idle_s: unused this long, the model is dropped and the freed memory returned to the OS.
    clock: seconds, monotonic (a test's clock decides idleness; the timer only says when to look).
    """

    def __init__(self, load: Callable[[], T], name: str, idle_s: float = IDLE_UNLOAD_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._load, self.name, self.idle_s, self._clock = load, name, idle_s, clock
        self._model: T | None = None
        self._used = 0.0  # clock() of the last get()
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def get(self) -> T:
        with self._lock:
            if self._model is None:
                self._model = self._load()
                release_freed_memory()  # (loading's own buffers)
            self._used = self._clock()
            if self._timer is None:
                self._check_in(self.idle_s)
            return self._model

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def _check_in(self, delay_s: float) -> None:
        """(Under the lock) look for idleness after ``delay_s``."""
        me = weakref.ref(self)  # (a timer does not keep a dropped engine's models alive)

        def check() -> None:
            unloader = me()
            if unloader is not None:
                unloader.unload_if_idle()

        timer = self._timer = threading.Timer(delay_s, check)
        timer.name, timer.daemon = f"voicebot-idle-{self.name}", True
        timer.start()

    def unload_if_idle(self) -> None:
        """Drop the model if it has been unused for ``idle_s``, else look again when it would be."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()  # (when called from outside the timer: one pending look at a time)
                self._timer = None
            if self._model is None:
                return
            idle = self._clock() - self._used
            if idle < self.idle_s:
                self._check_in(self.idle_s - idle)
                return
            self._model = None
        log.info("%s unused for %.0f s: unloaded (it loads again when a voice is made)", self.name, idle)
        release_freed_memory()
