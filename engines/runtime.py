"""The runtime pieces every backend shares: CPU thread counts and CUDA streams (the loader and the backends import
this module; none of them imports another backend)."""

from __future__ import annotations

import os

__all__ = ["cpu_threads", "set_cpu_threads", "use_lane_stream"]


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
