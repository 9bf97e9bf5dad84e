"""The DiT velocity network of the diffusion families (upstream ``f5_tts`` ``DiT``; reference section 3).

One call maps a noisy mel ``x``, the prompt mel ``cond`` (zeros after the prompt), the encoder features ``mu`` and
the flow time ``t`` (v3/v4: plus the step size ``d``) to a velocity ``[B, T, 100]``. Time-major inside
(``[B, T, C]``), as upstream after its first transposes.

Written for the sampler's loop rather than for one call: everything that does not change between the steps of one
sampler call is computed once (:meth:`DiT.prepare`): the text embedding, the prompt/text part of the input
projection, the rotary table, and the AdaLN modulations of *every* step (they depend on ``t`` only, so all steps'
come from one batched matrix product). A step (:meth:`DiT.step`) is then the noisy-mel projection plus the blocks.
q, k and v are one fused matrix product (``to_q/to_k/to_v`` concatenated at load). CFG's negative rides in the same
batch as the positive; the LayerNorms take their AdaLN modulation as their affine, and rotary positions are written
in place into the first head. The naive upstream path this is compared with (per step a whole forward with separate
q/k/v, per-step modulations, a second call for the CFG negative) is :class:`~engines.gpt_sovits.dit_naive.NaiveDiT`;
:meth:`DiT.forward` is one upstream-signature call over the fast pieces, for the conformance tests.

Upstream quirks kept (reference section 9): rotary positions reach only the first head (the first ``dim_head``
channels of q/k are rotated, pairs interleaved); the text embedding adds sinusoidal positions before 4 ConvNeXt-V2
blocks whose GRN normalises over *time*; the feed-forward uses tanh-GELU, the ConvNeXt blocks exact GELU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["DiT", "DitConfig", "DitPrepared"]

MEL_DIM = 100  # mel bins of x and cond
FREQ_EMBED_DIM = 256  # sinusoidal features of the time embedding
TIME_SCALE = 1000.0  # the time embedding sees 1000 * t
POS_THETA = 10000.0  # base of every sinusoid here
TEXT_MAX_POS = 4096  # positions of the text embedding's table; later frames reuse the last
CONV_POS_KERNEL = 31  # ConvPositionEmbedding kernel
CONV_POS_GROUPS = 16  # ConvPositionEmbedding groups
CONVNEXT_KERNEL = 7  # depthwise kernel of the text ConvNeXt blocks
LN_EPS = 1e-6  # every LayerNorm of the DiT
GRN_EPS = 1e-6


@dataclass(frozen=True)
class DitConfig:
    """DiT sizes, all read from the weights (upstream hard-codes them: 1024/22/16/64/2048/512/4 when released)."""

    dim: int
    depth: int
    heads: int
    dim_head: int
    ff_inner: int
    text_dim: int
    text_inner: int
    conv_layers: int
    step_embedding: bool  # v3/v4: d_embed present

    @property
    def inner(self) -> int:
        """Attention width ``heads * dim_head``."""
        return self.heads * self.dim_head

    @classmethod
    def from_state_dict(cls, sd: dict[str, Tensor], prefix: str = "") -> DitConfig:
        """Sizes from upstream-named DiT weights (``prefix`` e.g. ``"cfm.estimator."``); KeyError if absent."""
        dim = int(sd[prefix + "time_embed.time_mlp.2.weight"].shape[0])
        depth = 0
        while f"{prefix}transformer_blocks.{depth}.attn.to_q.weight" in sd:
            depth += 1
        conv_layers = 0
        while f"{prefix}text_embed.text_blocks.{conv_layers}.dwconv.weight" in sd:
            conv_layers += 1
        dim_head = 2 * int(sd[prefix + "rotary_embed.inv_freq"].shape[0])
        inner = int(sd[prefix + "transformer_blocks.0.attn.to_q.weight"].shape[0])
        return cls(
            dim=dim, depth=depth, heads=inner // dim_head, dim_head=dim_head,
            ff_inner=int(sd[prefix + "transformer_blocks.0.ff.ff.0.0.weight"].shape[0]),
            text_dim=int(sd[prefix + "text_embed.text_blocks.0.dwconv.weight"].shape[0]),
            text_inner=int(sd[prefix + "text_embed.text_blocks.0.pwconv1.weight"].shape[0]),
            conv_layers=conv_layers, step_embedding=prefix + "d_embed.time_mlp.0.weight" in sd,
        )


def sinusoid_features(t: Tensor) -> Tensor:
    """``[S]`` times -> ``[S, 256]`` ``[sin(1000 t f), cos(1000 t f)]``, ``f_i = 10000^(-i/127)``."""
    half = FREQ_EMBED_DIM // 2
    freqs = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(POS_THETA) / (half - 1)))
    arg = TIME_SCALE * t.float()[:, None] * freqs[None]
    return torch.cat((arg.sin(), arg.cos()), dim=-1).to(t.dtype)


class _TimestepEmbedding(nn.Module):
    """Sinusoid features -> Linear -> SiLU -> Linear (upstream ``TimestepEmbedding``, keys ``time_mlp.0/2``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.time_mlp = nn.Sequential(nn.Linear(FREQ_EMBED_DIM, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: Tensor) -> Tensor:
        return self.time_mlp(sinusoid_features(t))


class _GRN(nn.Module):
    """Global response normalisation over time: ``gamma * (x * N) + beta + x``, ``N = |x|_T / mean_C |x|_T``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, 1, dim))
        self.beta = nn.Parameter(torch.zeros(1, 1, dim))

    def forward(self, x: Tensor) -> Tensor:
        g = cast(Tensor, torch.linalg.vector_norm(x, dim=1, keepdim=True))  # pyright: ignore[reportUnknownMemberType]
        n = g / (g.mean(dim=-1, keepdim=True) + GRN_EPS)
        return torch.addcmul(self.beta + x, self.gamma, x * n)


class _ConvNeXtV2Block(nn.Module):
    """Depthwise conv k7 -> LayerNorm -> Linear -> GELU -> GRN -> Linear, plus the input."""

    def __init__(self, dim: int, inner: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, CONVNEXT_KERNEL, padding=CONVNEXT_KERNEL // 2, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=LN_EPS)
        self.pwconv1 = nn.Linear(dim, inner)
        self.grn = _GRN(inner)
        self.pwconv2 = nn.Linear(inner, dim)

    def forward(self, x: Tensor) -> Tensor:
        h = self.dwconv(x.transpose(1, 2)).transpose(1, 2)
        h = self.pwconv2(self.grn(F.gelu(self.pwconv1(self.norm(h)))))
        return x + h


class _TextEmbedding(nn.Module):
    """Features ``[B, T, C]`` + sinusoidal positions -> ConvNeXt-V2 blocks (keys ``text_blocks.{i}``)."""

    def __init__(self, dim: int, inner: int, layers: int) -> None:
        super().__init__()
        self.dim = dim
        self.text_blocks = nn.Sequential(*(_ConvNeXtV2Block(dim, inner) for _ in range(layers)))
        self._table: Tensor | None = None

    def positions(self, frames: int, device: torch.device) -> Tensor:
        """``[frames, C]`` ``[cos(p theta_i) ‖ sin(p theta_i)]``, positions past the table's end clipped to it."""
        if self._table is None or self._table.device != device:
            freqs = 1.0 / (POS_THETA ** (torch.arange(0, self.dim, 2, device=device)[: self.dim // 2].float() / self.dim))
            angles = torch.outer(torch.arange(TEXT_MAX_POS, device=device).float(), freqs)
            self._table = torch.cat((angles.cos(), angles.sin()), dim=-1)
        pos = torch.arange(frames, device=device).clamp(max=TEXT_MAX_POS - 1)
        return self._table[pos]

    def forward(self, text: Tensor, drop: bool = False) -> Tensor:
        if drop:
            text = torch.zeros_like(text)
        return self.text_blocks(text + self.positions(text.shape[1], text.device).to(text.dtype))


class _ConvPositionEmbedding(nn.Module):
    """Two grouped convs k31 with Mish, on channels-first data (keys ``conv1d.0``, ``conv1d.2``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        conv = lambda: nn.Conv1d(dim, dim, CONV_POS_KERNEL, padding=CONV_POS_KERNEL // 2, groups=CONV_POS_GROUPS)  # noqa: E731
        self.conv1d = nn.Sequential(conv(), nn.Mish(), conv(), nn.Mish())

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if mask is not None:
            x = x.masked_fill(~mask[..., None], 0.0)
        out = self.conv1d(x.transpose(1, 2)).transpose(1, 2)
        return out if mask is None else out.masked_fill(~mask[..., None], 0.0)


class _InputEmbedding(nn.Module):
    """``proj(x ‖ cond ‖ text)`` plus its conv position embedding (``proj.weight [dim, 100 + 100 + C]``)."""

    def __init__(self, text_dim: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(2 * MEL_DIM + text_dim, dim)
        self.conv_pos_embed = _ConvPositionEmbedding(dim)


class _Attention(nn.Module):
    """Self-attention with q/k/v fused in one Linear (``qkv``; upstream ``to_q``/``to_k``/``to_v``, remapped)."""

    def __init__(self, dim: int, heads: int, dim_head: int) -> None:
        super().__init__()
        self.heads, self.dim_head = heads, dim_head
        self.qkv = nn.Linear(dim, 3 * heads * dim_head)
        self.to_out = nn.ModuleList([nn.Linear(heads * dim_head, dim)])
        self.compute_dtype: torch.dtype | None = None  # attention's own dtype where it differs (the fast DiT's bf16)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor | None) -> Tensor:
        b, t, _ = x.shape
        inner = self.heads * self.dim_head
        q, k, v = self.qkv(x).split(inner, dim=-1)
        _rotate_first_head(q, rope)
        _rotate_first_head(k, rope)
        if self.compute_dtype is not None:
            q, k, v = q.to(self.compute_dtype), k.to(self.compute_dtype), v.to(self.compute_dtype)
        shape = (b, t, self.heads, self.dim_head)
        attn_mask = None if mask is None else mask[:, None, None, :]
        o = F.scaled_dot_product_attention(q.reshape(shape).transpose(1, 2), k.reshape(shape).transpose(1, 2),
                                           v.reshape(shape).transpose(1, 2), attn_mask=attn_mask)
        out = self.to_out[0](o.to(x.dtype).transpose(1, 2).reshape(b, t, inner))
        return out if mask is None else out.masked_fill(~mask[..., None], 0.0)


def _rotate_first_head(x: Tensor, rope: tuple[Tensor, Tensor]) -> None:
    """Rotary positions on the first ``rot`` channels (head 0) only, in place, adjacent pairs ``(x_2j, x_2j+1)``
    rotated; the other heads are not touched (upstream concatenates them back, a copy of all of q and k)."""
    cos, sin = rope  # [T, rot] each, angles interleaved [a0, a0, a1, a1, ...]
    rot = cos.shape[-1]
    head = x[..., :rot]
    pairs = head.reshape(*head.shape[:-1], rot // 2, 2)
    turned = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    head.copy_(torch.addcmul(turned * sin, head, cos))


class _FeedForward(nn.Module):
    """Linear -> tanh-GELU -> Linear (keys ``ff.0.0`` and ``ff.2``; slot 1 was upstream's dropout)."""

    def __init__(self, dim: int, inner: int) -> None:
        super().__init__()
        self.ff = nn.Sequential(nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")), nn.Identity(),
                                nn.Linear(inner, dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.ff(x)


class _AdaLinear(nn.Module):
    """The modulation Linear of an AdaLayerNormZero (key ``linear``), applied to ``SiLU(t_emb)``."""

    def __init__(self, dim: int, n: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, n * dim)


class _DiTBlock(nn.Module):
    """AdaLN-zero attention and feed-forward (``attn_norm``, ``attn``, ``ff``)."""

    def __init__(self, cfg: DitConfig) -> None:
        super().__init__()
        self.attn_norm = _AdaLinear(cfg.dim, 6)
        self.attn = _Attention(cfg.dim, cfg.heads, cfg.dim_head)
        self.ff = _FeedForward(cfg.dim, cfg.ff_inner)

    def forward(self, x: Tensor, mod: Tensor, rope: tuple[Tensor, Tensor], mask: Tensor | None) -> Tensor:
        # mod [6, dim]: shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp
        # the modulation is the LayerNorm's affine (one pass over the frames, not two); x is the caller's own
        # buffer, so the residual adds go in place
        d = x.shape[-1]
        h = F.layer_norm(x, (d,), 1 + mod[1], mod[0], LN_EPS)
        x = x.addcmul_(mod[2], self.attn(h, rope, mask))
        h = F.layer_norm(x, (d,), 1 + mod[4], mod[3], LN_EPS)
        return x.addcmul_(mod[5], self.ff(h))


@dataclass
class DitPrepared:
    """What stays fixed across the steps of one sampler call (:meth:`DiT.prepare`).

    Attributes
    ----------
    static:
        ``[B, T, dim]`` the prompt-mel and text part of the input projection plus its bias (row 1: CFG negative).
    rope:
        ``(cos, sin)`` ``[T, dim_head]`` rotary tables.
    mask:
        ``[B, T]`` bool frame mask, or None when every row is full length.
    block_mods:
        ``[steps, depth, 6, dim]`` the AdaLN modulations of every step and block.
    final_mods:
        ``[steps, 2, dim]`` the output layer's ``scale, shift`` per step.
    """

    static: Tensor
    rope: tuple[Tensor, Tensor]
    mask: Tensor | None
    block_mods: Tensor
    final_mods: Tensor


class DiT(nn.Module):
    """The DiT (inference only). Build with :meth:`DitConfig.from_state_dict`; load with :meth:`load_weights`."""

    def __init__(self, cfg: DitConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.time_embed = _TimestepEmbedding(cfg.dim)
        self.d_embed = _TimestepEmbedding(cfg.dim) if cfg.step_embedding else None
        self.text_embed = _TextEmbedding(cfg.text_dim, cfg.text_inner, cfg.conv_layers)
        self.input_embed = _InputEmbedding(cfg.text_dim, cfg.dim)
        self.register_buffer("inv_freq", torch.zeros(cfg.dim_head // 2))  # rotary_embed.inv_freq in the file
        self.transformer_blocks = nn.ModuleList(_DiTBlock(cfg) for _ in range(cfg.depth))
        self.norm_out = _AdaLinear(cfg.dim, 2)
        self.proj_out = nn.Linear(cfg.dim, MEL_DIM)

    inv_freq: Tensor

    @staticmethod
    def remap(sd: dict[str, Tensor]) -> dict[str, Tensor]:
        """Upstream DiT names -> this module's: q/k/v concatenated into ``qkv``, the rotary buffer renamed."""
        out: dict[str, Tensor] = {}
        for name, value in sd.items():
            if ".attn.to_k." in name or ".attn.to_v." in name:
                continue
            if ".attn.to_q." in name:
                leaf = name.rsplit(".", 1)[-1]
                stem = name[: -len(f"to_q.{leaf}")]
                out[stem + "qkv." + leaf] = torch.cat([sd[f"{stem}to_{p}.{leaf}"] for p in "qkv"], dim=0)
            elif name == "rotary_embed.inv_freq":
                out["inv_freq"] = value
            else:
                out[name] = value
        return out

    # --------------------------------------------------------------------------------------------- pieces
    def block(self, i: int) -> _DiTBlock:
        """Transformer block ``i``."""
        return cast(_DiTBlock, self.transformer_blocks[i])

    def attend_in(self, dtype: torch.dtype | None) -> None:
        """Every block's attention runs in ``dtype`` from now on (None: the DiT's own dtype)."""
        for i in range(len(self.transformer_blocks)):
            self.block(i).attn.compute_dtype = dtype

    def time_embedding(self, t: Tensor, d: Tensor | None) -> Tensor:
        """``[S]`` flow times (and v3/v4 step sizes) -> ``[S, dim]`` ``time_embed(t) + d_embed(d)``."""
        emb = self.time_embed(t)
        if self.d_embed is not None:
            if d is None:
                raise ValueError("this DiT (v3/v4) embeds the step size: pass d = 1 / steps")
            emb = emb + self.d_embed(d)
        elif d is not None:
            raise ValueError("this DiT (v5) has no step-size embedding: pass d = None")
        return emb

    def rope(self, frames: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """Rotary ``(cos, sin)`` ``[frames, dim_head]`` of positions ``0..frames-1``, angles interleaved."""
        angles = torch.outer(torch.arange(frames, device=device).float(), self.inv_freq.float())
        angles = angles.repeat_interleave(2, dim=-1)
        return angles.cos(), angles.sin()

    def condition(self, cond: Tensor, text_emb: Tensor, drop_audio: bool = False) -> Tensor:
        """The step-independent part of the input projection: ``W[:, 100:] (cond ‖ text_emb) + b`` ``[B, T, dim]``."""
        w = self.input_embed.proj.weight
        out = F.linear(text_emb, w[:, 2 * MEL_DIM :], self.input_embed.proj.bias)
        if not drop_audio:
            out = out + F.linear(cond, w[:, MEL_DIM : 2 * MEL_DIM])
        return out

    def modulations(self, temb: Tensor) -> tuple[Tensor, Tensor]:
        """``[S, dim]`` time embeddings -> ``([S, depth, 6, dim], [S, 2, dim])`` every AdaLN modulation."""
        s = F.silu(temb)
        blocks = torch.stack([cast(_DiTBlock, blk).attn_norm.linear(s) for blk in self.transformer_blocks], 1)
        final = self.norm_out.linear(s)
        return blocks.reshape(*blocks.shape[:-1], 6, self.cfg.dim), final.reshape(final.shape[0], 2, self.cfg.dim)

    def prepare(self, cond: Tensor, text: Tensor, times: Tensor, d: Tensor | None,
                x_lens: Tensor | None = None, negative: str | None = None) -> DitPrepared:
        """Everything fixed over one sampler call.

        Parameters
        ----------
        cond:
            ``[1, T, 100]`` prompt mel (zeros after the prompt), time-major.
        text:
            ``[1, T, C]`` encoder features ``mu``, time-major.
        times:
            ``[S]`` the flow times of the steps; ``d``: ``[S]`` step sizes (v3/v4) or None (v5).
        x_lens:
            ``[1]`` valid frames, or None for all.
        negative:
            None: no CFG; ``"audio"``: a second row with the prompt dropped (v5); ``"audio+text"``: with both
            dropped (v3/v4 upstream's negative).
        """
        text_emb = self.text_embed(text)
        static = self.condition(cond, text_emb)
        if negative is not None:
            drop_text = negative == "audio+text"
            neg_text = self.text_embed(text, drop=True) if drop_text else text_emb
            static = torch.cat((static, self.condition(cond, neg_text, drop_audio=True)), dim=0)
        frames = cond.shape[1]
        mask = None
        if x_lens is not None and int(x_lens.min()) < frames:
            mask = torch.arange(frames, device=cond.device)[None] < x_lens[:, None]
            mask = mask.expand(static.shape[0], frames)
        block_mods, final_mods = self.modulations(self.time_embedding(times, d))
        return DitPrepared(static=static, rope=self.rope(frames, cond.device), mask=mask,
                           block_mods=block_mods, final_mods=final_mods)

    def step(self, x: Tensor, prep: DitPrepared, k: int) -> Tensor:
        """The velocity at step ``k``: noisy mel ``x [1, T, 100]`` (time-major) -> ``[B, T, 100]`` (B rows of
        ``prep.static``: the positive, then the CFG negative if prepared)."""
        w = self.input_embed.proj.weight
        h = F.linear(x, w[:, :MEL_DIM]) + prep.static
        h = h + self.input_embed.conv_pos_embed(h, prep.mask)
        mods = prep.block_mods[k]
        for i, blk in enumerate(self.transformer_blocks):
            h = blk(h, mods[i], prep.rope, prep.mask)
        fm = prep.final_mods[k]
        return self.proj_out(F.layer_norm(h, (h.shape[-1],), 1 + fm[0], fm[1], LN_EPS))

    def forward(self, x0: Tensor, cond0: Tensor, x_lens: Tensor, time: Tensor, dt: Tensor | None, text0: Tensor,
                drop_audio_cond: bool = False, drop_text: bool = False) -> Tensor:
        """One call as upstream's ``DiT.forward`` (channels-first inputs ``[B, C, T]``) -> ``[B, T, 100]``."""
        x, cond, text = x0.transpose(1, 2), cond0.transpose(1, 2), text0.transpose(1, 2)
        text_emb = self.text_embed(text, drop=drop_text)
        static = self.condition(cond, text_emb, drop_audio=drop_audio_cond)
        frames = x.shape[1]
        mask = None
        if int(x_lens.min()) < frames:
            mask = torch.arange(frames, device=x.device)[None] < x_lens[:, None]
        block_mods, final_mods = self.modulations(self.time_embedding(time.reshape(-1), None if dt is None else dt.reshape(-1)))
        prep = DitPrepared(static=static, rope=self.rope(frames, x.device), mask=mask,
                           block_mods=block_mods, final_mods=final_mods)
        return self.step(x, prep, 0)
