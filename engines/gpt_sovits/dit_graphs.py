"""The diffusion families' DiT steps replayed from CUDA graphs on a GPU.

A sampler step launches a few hundred small kernels (22 blocks of norms, products, rotary, attention, GELU), so at
batch 1 on a GPU the launches, not the arithmetic, set its time. :class:`CudaGraphDit` records one step per shape
(rows, frames) the first time the shape comes (that step runs for real on a side stream, then is captured) and from
then on copies the step's inputs into the graph's buffers and replays it. The frames are the shape's own, not a
padded bucket: the DiT's position convolutions are two in a row, and a masked padding would leak into the last
valid frames through the second one, so only the exact length gives the eager step's numbers. A voice's chunks come
in few lengths (v5's targets are at most 640 frames after a fixed prompt), and the least recently used graph is
dropped past :data:`MAX_GRAPHS`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from engines.gpt_sovits.dit import DiT, DitPrepared

__all__ = ["MAX_GRAPHS", "CudaGraphDit"]

MAX_GRAPHS = 8  # graphs kept: each holds a memory pool of one step's activations (tens of MB per chunk)


@dataclass
class _Graph:
    """One recorded step: the buffers it reads, the velocity it writes."""

    graph: torch.cuda.CUDAGraph
    x: Tensor
    static: Tensor
    cos: Tensor
    sin: Tensor
    block_mods: Tensor  # [depth, 6, dim]: the step's modulations
    final_mods: Tensor  # [2, dim]
    out: Tensor


class CudaGraphDit:
    """The sampler's :class:`~engines.gpt_sovits.cfm.Estimator` for a DiT on a CUDA device: :meth:`prepare` is the
    DiT's, :meth:`step` replays a CUDA graph of ``DiT.step`` per (rows, frames). A masked call (the sampler never
    makes one) or a DiT off the GPU runs eagerly."""

    def __init__(self, dit: DiT, max_graphs: int = MAX_GRAPHS) -> None:
        self.dit = dit
        self.max_graphs = max_graphs
        self.graphs: OrderedDict[tuple[int, int], _Graph] = OrderedDict()
        self.captures = 0
        self.replays = 0

    def prepare(self, cond: Tensor, text: Tensor, times: Tensor, d: Tensor | None, x_lens: Tensor | None = None,
                negative: str | None = None) -> DitPrepared:
        """:meth:`DiT.prepare <engines.gpt_sovits.dit.DiT.prepare>`."""
        return self.dit.prepare(cond, text, times, d, x_lens, negative)

    def step(self, x: Tensor, prep: DitPrepared, k: int) -> Tensor:
        """The velocity ``[B, T, 100]`` at step ``k``: replayed, or run and recorded the first time its shape comes."""
        if prep.mask is not None or x.device.type != "cuda":
            return self.dit.step(x, prep, k)
        key = (int(prep.static.shape[0]), int(x.shape[1]))
        g = self.graphs.get(key)
        if g is None:
            return self._record(key, x, prep, k)
        self.graphs.move_to_end(key)
        self._load(g, x, prep, k)
        g.graph.replay()
        self.replays += 1
        return g.out.clone()  # the graph writes the same buffer at its next replay

    def _load(self, g: _Graph, x: Tensor, prep: DitPrepared, k: int) -> None:
        g.x.copy_(x)
        g.static.copy_(prep.static)
        g.cos.copy_(prep.rope[0])
        g.sin.copy_(prep.rope[1])
        g.block_mods.copy_(prep.block_mods[k])
        g.final_mods.copy_(prep.final_mods[k])

    def _run(self, x: Tensor, static: Tensor, cos: Tensor, sin: Tensor, block_mods: Tensor,
             final_mods: Tensor) -> Tensor:
        prep = DitPrepared(static=static, rope=(cos, sin), mask=None, block_mods=block_mods[None],
                           final_mods=final_mods[None])
        return self.dit.step(x, prep, 0)

    def _record(self, key: tuple[int, int], x: Tensor, prep: DitPrepared, k: int) -> Tensor:
        bufs: dict[str, Any] = {"x": x.clone(), "static": prep.static.clone(), "cos": prep.rope[0].clone(),
                                "sin": prep.rope[1].clone(), "block_mods": prep.block_mods[k].clone(),
                                "final_mods": prep.final_mods[k].clone()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            velocity = self._run(**bufs)  # this step, for real, and the capture's warm-up
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the vocoder may run in a thread of its own meanwhile (cudaMalloc is capture-unsafe there)
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # recorded, not executed
            out = self._run(**bufs)
        self.graphs[key] = _Graph(graph=graph, out=out, **bufs)
        self.captures += 1
        while len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)  # its pool goes with it
        return velocity
