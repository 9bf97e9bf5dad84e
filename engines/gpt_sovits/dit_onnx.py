"""One sampling step of the diffusion families' DiT as an ONNX graph (what a TensorRT engine for v3/v4/v5 builds
from), and a sampler estimator that runs it under ONNX Runtime.

The graph is :meth:`DiT.step <engines.gpt_sovits.dit.DiT.step>` over a prepared call: what is fixed across a
sampler call (:meth:`DiT.prepare <engines.gpt_sovits.dit.DiT.prepare>`: the text embedding, the prompt and text part
of the input projection, the rotary table, every step's AdaLN modulations) stays in torch, once per call, and comes
in as inputs. fp32, opset 17, dynamic over the batch ``B`` and the frame count ``T``, no random op, no mask:

==============  ===================  ================================================================================
name            shape                what
==============  ===================  ================================================================================
x               [1, T, 100]          the noisy mel, time-major (the sampler's state)
static          [B, T, dim]          ``DitPrepared.static``: row 0 the positive, row 1 (B = 2) the CFG negative
cos, sin        [T, dim_head]        ``DitPrepared.rope``: the rotary tables, angles interleaved
block_mods      [depth, 6, dim]      ``DitPrepared.block_mods[k]``: this step's modulations of every block
final_mods      [2, dim]             ``DitPrepared.final_mods[k]``: this step's output-layer ``scale, shift``
velocity (out)  [B, T, 100]          the velocity of each row
==============  ===================  ================================================================================

No frame mask: the sampler (:func:`engines.gpt_sovits.cfm.sample`) prepares with every frame valid, so the mask is
None at every step the product runs; :class:`OrtDit` hands a masked call (only :meth:`DiT.forward`'s callers make
one) to the torch step.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import TYPE_CHECKING, Any, Generator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engines.gpt_sovits import dit as dit_module
from engines.gpt_sovits.dit import DiT, DitPrepared
from engines.gpt_sovits.vocoder_ort import _session  # pyright: ignore[reportPrivateUsage]  # the same CPU session

if TYPE_CHECKING:
    import onnxruntime

__all__ = ["GRAPH", "INPUTS", "OrtDit", "export_dit_step"]

GRAPH = "dit_step"  # the graph's file stem in an export folder
INPUTS: tuple[str, ...] = ("x", "static", "cos", "sin", "block_mods", "final_mods")
OUTPUT = "velocity"
DEFAULT_OPSET = 17  # LayerNormalization is native from 17; TensorRT 10 parses opsets 9..20
TRACE_FRAMES = 13  # frames of the tracing input (the axis is dynamic; distinct from every size of the weights)


class _Step(nn.Module):
    """``DiT.step`` with one step's modulations as inputs: the graph's forward."""

    def __init__(self, dit: DiT) -> None:
        super().__init__()
        self.dit = dit

    def forward(self, x: Tensor, static: Tensor, cos: Tensor, sin: Tensor, block_mods: Tensor,
                final_mods: Tensor) -> Tensor:
        prep = DitPrepared(static=static, rope=(cos, sin), mask=None, block_mods=block_mods.unsqueeze(0),
                           final_mods=final_mods.unsqueeze(0))
        return self.dit.step(x, prep, 0)


def _rotate_first_head_whole(x: Tensor, rope: tuple[Tensor, Tensor]) -> None:
    """``dit._rotate_first_head``, writing all of ``x`` back: the exporter drops an in-place write into a slice (the
    rotation vanished from the graph and its cos/sin inputs were pruned), and keeps a whole-tensor one."""
    cos, sin = rope
    rot = cos.shape[-1]
    head = x[..., :rot]
    pairs = head.reshape(*head.shape[:-1], rot // 2, 2)
    turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    x.copy_(torch.cat((torch.addcmul(turned * sin, head, cos), x[..., rot:]), dim=-1))


class _StaticLayerNorm:
    """``torch.nn.functional`` as dit.py sees it during export, with ``layer_norm``'s normalised size as ints: the
    DiT passes ``x.shape[-1]``, a traced value LayerNormalization's static ``axis`` cannot be made from."""

    def __getattr__(self, name: str) -> Any:
        return getattr(F, name)

    @staticmethod
    def layer_norm(x: Tensor, shape: Any, weight: Tensor | None = None, bias: Tensor | None = None,
                   eps: float = 1e-5) -> Tensor:
        return F.layer_norm(x, [int(s) for s in shape], weight, bias, eps)


@contextlib.contextmanager
def _traceable_dit() -> Generator[None, None, None]:
    """During export, dit.py's rotary write and layer norms in forms the exporter keeps (same maths). Module-wide,
    like :func:`engines.export._traceable_sovits`: a torch DiT stepping in another thread meanwhile gets the same
    numbers."""
    rotate, functional = dit_module._rotate_first_head, dit_module.F  # pyright: ignore[reportPrivateUsage]
    dit_module._rotate_first_head = _rotate_first_head_whole  # pyright: ignore[reportPrivateUsage]
    dit_module.F = _StaticLayerNorm()  # type: ignore[assignment]
    try:
        yield
    finally:
        dit_module._rotate_first_head = rotate  # pyright: ignore[reportPrivateUsage]
        dit_module.F = functional


def export_dit_step(dit: DiT, opset: int = DEFAULT_OPSET) -> bytes:
    """The ONNX graph of one sampling step of ``dit`` (inputs in the module notes), in memory: ONNX Runtime loads
    it from bytes at load as the vocoder's, and the build writes it where it keeps its graphs.

    Raises
    ------
    ValueError
        ``dit`` is not the fp32 DiT (its attention in its own dtype), or ``opset`` is before 17.
    """
    if opset < DEFAULT_OPSET:
        raise ValueError(f"opset {opset} is too old: the DiT step needs LayerNormalization (opset 17+)")
    if dit.proj_out.weight.dtype != torch.float32 or any(
            dit.block(i).attn.compute_dtype is not None for i in range(dit.cfg.depth)):
        raise ValueError("export the fp32 DiT (the graph is fp32; TensorRT chooses its own precisions)")
    device = dit.proj_out.weight.device
    # the example is a real prepared call with the CFG negative, so B = 2 and every shape comes from prepare
    zeros = torch.zeros(1, TRACE_FRAMES, dit_module.MEL_DIM, device=device)
    times = torch.zeros(1, device=device)
    with torch.no_grad():
        prep = dit.prepare(zeros, torch.zeros(1, TRACE_FRAMES, dit.cfg.text_dim, device=device), times,
                           times if dit.cfg.step_embedding else None, negative="audio")
    args = (zeros, prep.static, *prep.rope, prep.block_mods[0], prep.final_mods[0])
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad(), _traceable_dit():
        warnings.simplefilter("ignore")  # tracer warnings about shape arithmetic are expected here
        # (torch.onnx.export's parameters are partly untyped, and typed for paths where it also takes a buffer)
        torch.onnx.export(  # pyright: ignore[reportUnknownMemberType]
            _Step(dit).eval(), args, buf,  # pyright: ignore[reportArgumentType]
            dynamo=False, input_names=list(INPUTS), output_names=[OUTPUT],
            dynamic_axes={"x": {1: "t"}, "static": {0: "b", 1: "t"}, "cos": {0: "t"}, "sin": {0: "t"},
                          OUTPUT: {0: "b", 1: "t"}},
            opset_version=opset, do_constant_folding=True)
    return buf.getvalue()


def _array(t: Tensor) -> np.ndarray:
    """A CPU float32 array of ``t`` (no copy when it is already one, contiguous)."""
    return t.detach().float().cpu().contiguous().numpy()


class OrtDit:
    """The sampler's :class:`~engines.gpt_sovits.cfm.Estimator` with each step under ONNX Runtime on the CPU:
    :meth:`prepare` is the torch DiT's (once per sampler call), :meth:`step` runs :func:`export_dit_step`'s graph.

    Build with :meth:`from_dit`.
    """

    def __init__(self, dit: DiT, session: onnxruntime.InferenceSession) -> None:
        self.dit = dit
        self.session = session

    @classmethod
    def from_dit(cls, dit: DiT, threads: int = 0) -> OrtDit:
        """``dit`` (fp32) traced and run by ONNX Runtime on ``threads`` threads (0: every core the process may use)."""
        return cls(dit, _session(export_dit_step(dit), threads))

    def prepare(self, cond: Tensor, text: Tensor, times: Tensor, d: Tensor | None, x_lens: Tensor | None = None,
                negative: str | None = None) -> DitPrepared:
        """:meth:`DiT.prepare <engines.gpt_sovits.dit.DiT.prepare>`."""
        return self.dit.prepare(cond, text, times, d, x_lens, negative)

    def step(self, x: Tensor, prep: DitPrepared, k: int) -> Tensor:
        """The velocity ``[B, T, 100]`` at step ``k`` of ``x [1, T, 100]``."""
        if prep.mask is not None:  # the graph has no mask input (the sampler never passes lengths)
            return self.dit.step(x, prep, k)
        cos, sin = prep.rope
        feeds = dict(zip(INPUTS, map(_array, (x, prep.static, cos, sin, prep.block_mods[k], prep.final_mods[k]))))
        (v,) = self.session.run([OUTPUT], feeds)
        return torch.as_tensor(np.asarray(v, dtype=np.float32)).to(x.device)
