"""The DiT as upstream runs it, eagerly: the baseline the fast path is measured against (``path="naive"``).

Every sampler step is one whole upstream ``DiT.forward`` (reference section 3), with upstream's own caches and
nothing more: v3/v4 keep the text embedding and the step-size embedding after the first step (``text_cache``,
``dt_cache``); v5 keeps its static cache (the prompt/text part of the input projection, the mask, the rotary table:
``prepare_static_cache``). Per step and block it computes the time embedding and the AdaLN modulations anew, q, k and
v with three matrix products, the rotary positions as x_transformers does (the first head's channels rotated, then
concatenated back with the rest), attention with the length mask expanded to ``[B, heads, T, T]``, and the output
re-masked; v3/v4 project the full ``x ‖ cond ‖ text`` each step. CFG's negative is a second forward.

It reads the weights of a :class:`~engines.gpt_sovits.dit.DiT` and plugs into :func:`engines.gpt_sovits.cfm.sample`
as its estimator (``prepare`` / ``step``), so the sampler loop, the noise and the chunking are the same for both paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from engines.gpt_sovits.dit import LN_EPS, MEL_DIM, DiT

if TYPE_CHECKING:
    from engines.gpt_sovits.dit import _Attention, _DiTBlock  # pyright: ignore[reportPrivateUsage]

__all__ = ["NaiveDiT"]


@dataclass
class _Call:
    """One sampler call's inputs and upstream's caches (filled at the first step, as upstream fills them)."""

    cond: Tensor  # [1, T, 100] prompt mel, time-major
    text: Tensor  # [1, T, C] features
    times: Tensor  # [S]
    d: Tensor | None  # [S] step sizes (v3/v4)
    mask: Tensor  # [1, T] bool
    negative: str | None
    text_emb: Tensor | None = None  # v3/v4 text_cache
    neg_text_emb: Tensor | None = None  # v3/v4 text_cfg_cache
    d_emb: Tensor | None = None  # v3/v4 dt_cache
    static: Tensor | None = None  # v5 static cache, positive
    neg_static: Tensor | None = None  # v5 static cache, negative


class NaiveDiT:
    """Upstream's eager estimator over ``dit``'s weights (see the module notes); ``prepare``/``step`` as :class:`DiT`."""

    def __init__(self, dit: DiT) -> None:
        self.dit = dit
        self.v5 = dit.d_embed is None

    def prepare(self, cond: Tensor, text: Tensor, times: Tensor, d: Tensor | None,
                x_lens: Tensor | None = None, negative: str | None = None) -> _Call:
        """Keep the call's inputs; v5 builds its static cache here, as upstream's ``CFMV5.inference`` does."""
        frames = cond.shape[1]
        lens = torch.full((1,), frames, device=cond.device) if x_lens is None else x_lens
        mask = torch.arange(frames, device=cond.device)[None] < lens[:, None]
        call = _Call(cond=cond, text=text, times=times, d=d, mask=mask, negative=negative)
        if self.v5:
            w, b = self.dit.input_embed.proj.weight, self.dit.input_embed.proj.bias
            text_emb = self.dit.text_embed(text)
            call.static = F.linear(torch.cat((cond, text_emb), dim=-1), w[:, MEL_DIM:], b)
            if negative is not None:
                call.neg_static = F.linear(torch.cat((torch.zeros_like(cond), text_emb), dim=-1), w[:, MEL_DIM:], b)
        return call

    def step(self, x: Tensor, prep: _Call, k: int) -> Tensor:
        """The velocity at step ``k`` (``[B, T, 100]``: the positive, then the CFG negative as its own forward)."""
        v = self._forward(x, prep, k, negative=False)
        if prep.negative is None:
            return v
        return torch.cat((v, self._forward(x, prep, k, negative=True)), dim=0)

    def _forward(self, x: Tensor, call: _Call, k: int, negative: bool) -> Tensor:
        """One upstream ``DiT.forward`` (time-major ``x``)."""
        dit = self.dit
        t = dit.time_embed(call.times[k : k + 1])
        if dit.d_embed is not None:
            assert call.d is not None
            if call.d_emb is None:
                call.d_emb = dit.d_embed(call.d[k : k + 1])
            t = t + call.d_emb
        mask = call.mask
        if self.v5:
            static = call.neg_static if negative else call.static
            assert static is not None
            h = F.linear(x, dit.input_embed.proj.weight[:, :MEL_DIM]) + static
            h = dit.input_embed.conv_pos_embed(h, mask) + h
        else:
            drop = negative and call.negative == "audio+text"
            if negative:
                text_emb = call.neg_text_emb
                if text_emb is None:
                    text_emb = call.neg_text_emb = dit.text_embed(call.text, drop=drop)
            else:
                text_emb = call.text_emb
                if text_emb is None:
                    text_emb = call.text_emb = dit.text_embed(call.text)
            cond = torch.zeros_like(call.cond) if negative else call.cond
            h = dit.input_embed.proj(torch.cat((x, cond, text_emb), dim=-1))
            h = dit.input_embed.conv_pos_embed(h) + h
        angles = torch.outer(torch.arange(h.shape[1], device=h.device).float(), dit.inv_freq.float())
        freqs = torch.stack((angles, angles), dim=-1).flatten(-2)  # x_transformers: interleaved, computed per call
        for i in range(dit.cfg.depth):
            h = self._block(dit.block(i), h, t, freqs, mask)
        scale, shift = dit.norm_out.linear(F.silu(t)).chunk(2, dim=1)
        h = F.layer_norm(h, (h.shape[-1],), eps=LN_EPS) * (1 + scale)[:, None, :] + shift[:, None, :]
        return dit.proj_out(h)

    def _block(self, blk: _DiTBlock, x: Tensor, t: Tensor, freqs: Tensor, mask: Tensor) -> Tensor:
        """Upstream ``DiTBlock.forward``: AdaLayerNormZero, attention, feed-forward."""
        emb = blk.attn_norm.linear(F.silu(t))
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
        d = x.shape[-1]
        norm = F.layer_norm(x, (d,), eps=LN_EPS) * (1 + scale_msa[:, None]) + shift_msa[:, None]
        x = x + gate_msa.unsqueeze(1) * self._attention(blk.attn, norm, freqs, mask)
        norm = F.layer_norm(x, (d,), eps=LN_EPS) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        return x + gate_mlp.unsqueeze(1) * blk.ff(norm)

    def _attention(self, attn: _Attention, x: Tensor, freqs: Tensor, mask: Tensor) -> Tensor:
        """Upstream ``AttnProcessor``: separate q/k/v products, rotary, SDPA with the expanded mask, re-masked."""
        b = x.shape[0]
        heads, dim_head = attn.heads, attn.dim_head
        inner = heads * dim_head
        w, bias = attn.qkv.weight, attn.qkv.bias
        assert bias is not None
        q, k, v = (F.linear(x, w[i * inner : (i + 1) * inner], bias[i * inner : (i + 1) * inner]) for i in range(3))
        q, k = _apply_rotary(q, freqs), _apply_rotary(k, freqs)
        q, k, v = (y.view(b, -1, heads, dim_head).transpose(1, 2) for y in (q, k, v))
        attn_mask = mask[:, None, None, :].expand(b, heads, q.shape[-2], k.shape[-2])
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        o = attn.to_out[0](o.transpose(1, 2).reshape(b, -1, inner))
        return o.masked_fill(~mask[..., None], 0.0)


def _apply_rotary(x: Tensor, freqs: Tensor) -> Tensor:
    """x_transformers ``apply_rotary_pos_emb``: the first ``freqs`` channels rotated in pairs, the rest appended."""
    rot = freqs.shape[-1]
    head, rest = x[..., :rot], x[..., rot:]
    pairs = head.reshape(*head.shape[:-1], rot // 2, 2)
    turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return torch.cat((head * freqs.cos() + turned * freqs.sin(), rest), dim=-1)
