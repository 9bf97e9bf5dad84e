"""Building blocks of the SoVITS v2 decoder (inference only), written from the upstream reference, section 6.

Parameter names follow upstream's state dict (``conv_q``, ``gamma``, ``in_layers``...) so a checkpoint loads by name.
Weight norm is *not* modelled here: :func:`fold_weight_norm` turns ``weight_g``/``weight_v`` pairs into plain
weights once at load time, so no inference call pays for it.

Shapes: ``B`` batch, ``C`` channels, ``T`` frames (50 Hz inside the text encoder and flow). Every sequence is
unpadded (one utterance per call, as upstream decodes), so upstream's all-ones masks are omitted.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LRELU_SLOPE = 0.1  # leaky-ReLU slope inside the HiFi-GAN generator
FINAL_LRELU_SLOPE = 0.01  # the generator's last leaky-ReLU uses torch's default slope, not 0.1
LN_EPS = 1e-5  # layer-norm epsilon of the attention encoders
REL_WINDOW = 4  # relative-position attention window of the text/SSL encoders (9 offsets)
FLOW_KERNEL = 5  # WN kernel inside each coupling layer
FLOW_WN_LAYERS = 4  # WN depth inside each coupling layer
FLOW_COUPLINGS = 4  # coupling layers in the flow (each followed by a channel flip)
MRTE_HEADS = 4  # cross-attention heads of the MRTE (hard-coded upstream)
STYLE_HIDDEN = 128  # MelStyleEncoder width
STYLE_HEADS = 2  # MelStyleEncoder attention heads
STYLE_KERNEL = 5  # MelStyleEncoder temporal conv kernel


def fold_weight_norm(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """Replace every ``X.weight_g`` / ``X.weight_v`` pair by ``X.weight = g * v / ||v||`` (computed in fp32).

    The norm is taken over all dims but dim 0, as ``torch.nn.utils.weight_norm(dim=0)`` does. For a
    ``ConvTranspose1d`` (weight ``[in, out, k]``) dim 0 is the *input* channel; ``weight_g`` is ``[in, 1, 1]`` then,
    so the same formula is right for both conv kinds.

    Parameters
    ----------
    state_dict:
        name -> tensor; not modified.

    Returns
    -------
    dict
        a new dict with folded fp32 weights in place of each pair (other tensors are passed through).
    """
    out: dict[str, Tensor] = {}
    for name, value in state_dict.items():
        if name.endswith(".weight_g"):
            continue
        if name.endswith(".weight_v"):
            stem = name[: -len(".weight_v")]
            g = state_dict.get(stem + ".weight_g")
            if g is None:
                raise KeyError(f"{name} has no matching {stem}.weight_g")
            v = value.float()
            # (Tensor.norm's stub leaves its dim parameter untyped)
            norm = cast(Tensor, v.flatten(1).norm(dim=1))  # pyright: ignore[reportUnknownMemberType]
            norm = norm.view(-1, *([1] * (v.dim() - 1)))
            out[stem + ".weight"] = g.float() * v / norm
            continue
        out[name] = value
    orphans = [n for n in state_dict if n.endswith(".weight_g") and n[: -len("_g")] + "_v" not in state_dict]
    if orphans:
        raise KeyError(f"weight_g without weight_v: {orphans[:3]}")
    return out


class ChannelLayerNorm(nn.Module):
    """Layer norm over the channel dim of ``[B, C, T]``; statistics in fp32 so fp16/bf16 stay stable."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: Tensor) -> Tensor:
        y = F.layer_norm(x.transpose(1, 2).float(), (x.shape[1],), self.gamma.float(), self.beta.float(), LN_EPS)
        return y.to(x.dtype).transpose(1, 2)


class MultiHeadAttention(nn.Module):
    """Multi-head attention over ``[B, C, T]`` with 1x1 conv projections and optional relative positions.

    With ``window_size`` set, keys and values get a learned offset embedding for ``|j - i| <= window_size``
    (shared by all heads): the score of (i, j) gains ``q_i . Ek[j - i + w]`` and the output of row i gains
    ``sum_j p_ij Ev[j - i + w]``. Both are done with gathers over a ``2w + 1`` band, never a loop over time.
    """

    def __init__(self, channels: int, out_channels: int, n_heads: int, window_size: int | None = None) -> None:
        super().__init__()
        assert channels % n_heads == 0
        self.n_heads = n_heads
        self.k_channels = channels // n_heads
        self.window_size = window_size
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, out_channels, 1)
        if window_size is not None:
            self.emb_rel_k = nn.Parameter(torch.zeros(1, 2 * window_size + 1, self.k_channels))
            self.emb_rel_v = nn.Parameter(torch.zeros(1, 2 * window_size + 1, self.k_channels))

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        """Queries from ``x [B, C, Tq]``, keys/values from ``c [B, C, Tk]`` -> ``[B, out, Tq]``."""
        b, _, t_q = x.shape
        t_k = c.shape[2]
        h, d = self.n_heads, self.k_channels
        q = self.conv_q(x).view(b, h, d, t_q).transpose(2, 3) * (1.0 / math.sqrt(d))  # [B, h, Tq, d]
        k = self.conv_k(c).view(b, h, d, t_k)  # [B, h, d, Tk]
        v = self.conv_v(c).view(b, h, d, t_k).transpose(2, 3)  # [B, h, Tk, d]
        scores = torch.matmul(q, k)  # [B, h, Tq, Tk]
        if self.window_size is not None:
            assert t_q == t_k, "relative positions are for self-attention"
            rel = torch.matmul(q, self.emb_rel_k[0].transpose(0, 1))  # [B, h, T, 2w+1]
            scores = scores + _band_to_full(rel, self.window_size)
        p = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out = torch.matmul(p, v)  # [B, h, Tq, d]
        if self.window_size is not None:
            out = out + torch.matmul(_full_to_band(p, self.window_size), self.emb_rel_v[0])
        out = out.transpose(2, 3).reshape(b, h * d, t_q)
        return self.conv_o(out)


_band_index_cache: dict[tuple[int, int, torch.device], tuple[Tensor, Tensor]] = {}


def _band_indices(t: int, w: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Gather indices (band->full ``[T, T]``, full->band ``[T, 2w+1]``) for a length and window, cached."""
    key = (t, w, device)
    hit = _band_index_cache.get(key)
    if hit is None:
        i = torch.arange(t, device=device).unsqueeze(1)
        j = torch.arange(t, device=device).unsqueeze(0)
        off = j - i + w  # [T, T] band column of (i, j)
        to_full = torch.where((off >= 0) & (off <= 2 * w), off, torch.full_like(off, 2 * w + 1))
        to_band = i + torch.arange(2 * w + 1, device=device).unsqueeze(0)  # [T, 2w+1] column in the w-padded row
        hit = (to_full, to_band)
        if len(_band_index_cache) > 64:
            _band_index_cache.clear()
        _band_index_cache[key] = hit
    return hit


def _band_to_full(rel: Tensor, w: int) -> Tensor:
    """``rel [B, h, T, 2w+1]`` (column r = offset r - w) -> ``[B, h, T, T]`` with zeros outside the band."""
    b, h, t, _ = rel.shape
    to_full, _ = _band_indices(t, w, rel.device)
    padded = F.pad(rel, (0, 1))  # column 2w+1 is the zero used outside the band
    return torch.gather(padded, 3, to_full.expand(b, h, t, t))


def _full_to_band(p: Tensor, w: int) -> Tensor:
    """``p [B, h, T, T]`` -> ``[B, h, T, 2w+1]`` with column r = ``p[i, i + r - w]`` (0 outside the sequence)."""
    b, h, t, _ = p.shape
    _, to_band = _band_indices(t, w, p.device)
    padded = F.pad(p, (w, w))  # [B, h, T, T+2w]: column j + w holds key j
    return torch.gather(padded, 3, to_band.expand(b, h, t, 2 * w + 1))


class FFN(nn.Module):
    """Conv FFN of the attention encoders: conv(k) -> ReLU -> conv(k), "same" padding."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int) -> None:
        super().__init__()
        # upstream pads (k-1)//2 left and k//2 right; for the odd kernels used here that is symmetric
        assert kernel_size % 2 == 1
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size, padding=kernel_size // 2)
        self.conv_2 = nn.Conv1d(filter_channels, channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv_2(torch.relu(self.conv_1(x)))


class Encoder(nn.Module):
    """Post-LN transformer encoder over ``[B, C, T]`` with relative-position self-attention (VITS ``attentions.Encoder``)."""

    def __init__(self, hidden: int, filter_channels: int, n_heads: int, n_layers: int, kernel_size: int) -> None:
        super().__init__()
        self.attn_layers = nn.ModuleList(
            MultiHeadAttention(hidden, hidden, n_heads, window_size=REL_WINDOW) for _ in range(n_layers)
        )
        self.norm_layers_1 = nn.ModuleList(ChannelLayerNorm(hidden) for _ in range(n_layers))
        self.ffn_layers = nn.ModuleList(FFN(hidden, filter_channels, kernel_size) for _ in range(n_layers))
        self.norm_layers_2 = nn.ModuleList(ChannelLayerNorm(hidden) for _ in range(n_layers))

    def forward(self, x: Tensor) -> Tensor:
        for attn, norm1, ffn, norm2 in zip(self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2):
            x = norm1(x + attn(x, x))
            x = norm2(x + ffn(x))
        return x


class MRTE(nn.Module):
    """Mel-reference-text encoder: SSL frames attend to the phones, plus the style vector ``ge``."""

    def __init__(self, content_channels: int, hidden: int, out_channels: int, n_heads: int = MRTE_HEADS) -> None:
        super().__init__()
        self.cross_attention = MultiHeadAttention(hidden, hidden, n_heads)
        self.c_pre = nn.Conv1d(content_channels, hidden, 1)
        self.text_pre = nn.Conv1d(content_channels, hidden, 1)
        self.c_post = nn.Conv1d(hidden, out_channels, 1)

    def forward(self, ssl: Tensor, text: Tensor, ge: Tensor) -> Tensor:
        """``ssl [B, C, Ty]``, ``text [B, C, Tt]``, ``ge [B, hidden, 1]`` -> ``[B, out, Ty]``."""
        s = self.c_pre(ssl)
        x = self.cross_attention(s, self.text_pre(text)) + s + ge
        return self.c_post(x)


class TextEncoder(nn.Module):
    """``enc_p``: 50 Hz SSL features + phone ids + ge -> prior statistics ``(m_p, logs_p)``."""

    def __init__(
        self,
        out_channels: int,
        hidden: int,
        filter_channels: int,
        n_heads: int,
        n_layers: int,
        kernel_size: int,
        n_symbols: int,
        mrte_hidden: int,
        ssl_dim: int = 768,
    ) -> None:
        super().__init__()
        self.out_channels = out_channels
        self.ssl_proj = nn.Conv1d(ssl_dim, hidden, 1)
        self.encoder_ssl = Encoder(hidden, filter_channels, n_heads, n_layers // 2, kernel_size)
        self.text_embedding = nn.Embedding(n_symbols, hidden)
        self.encoder_text = Encoder(hidden, filter_channels, n_heads, n_layers, kernel_size)
        self.mrte = MRTE(hidden, mrte_hidden, hidden)
        self.encoder2 = Encoder(hidden, filter_channels, n_heads, n_layers // 2, kernel_size)
        self.proj = nn.Conv1d(hidden, out_channels * 2, 1)

    def forward(
        self, y: Tensor, text: Tensor, ge: Tensor, speed: float = 1.0
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``y [B, 768, T]``, ``text [B, Tt]`` int64, ``ge [B, mrte_hidden, 1]`` ->
        ``(x, m_p, logs_p)`` with ``x [B, hidden, T']`` and ``m_p``/``logs_p [B, out, T']``.

        ``T' = T`` at speed 1, else ``int(T / speed) + 1`` (linear interpolation of the encoder output).
        """
        y = self.encoder_ssl(self.ssl_proj(y))
        t = self.encoder_text(self.text_embedding(text).transpose(1, 2))
        y = self.encoder2(self.mrte(y, t, ge))
        if speed != 1:
            y = F.interpolate(y, size=int(y.shape[-1] / speed) + 1, mode="linear")
        stats = self.proj(y)
        m, logs = torch.split(stats, self.out_channels, dim=1)
        return y, m, logs


class WN(nn.Module):
    """Non-causal WaveNet stack (gated tanh/sigmoid units, residual + skip), conditioned on ``g``."""

    def __init__(self, hidden: int, kernel_size: int, n_layers: int, gin_channels: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.n_layers = n_layers
        self.cond_layer = nn.Conv1d(gin_channels, 2 * hidden * n_layers, 1)
        self.in_layers = nn.ModuleList(
            nn.Conv1d(hidden, 2 * hidden, kernel_size, padding=kernel_size // 2) for _ in range(n_layers)
        )
        self.res_skip_layers = nn.ModuleList(
            nn.Conv1d(hidden, 2 * hidden if i < n_layers - 1 else hidden, 1) for i in range(n_layers)
        )

    def forward(self, x: Tensor, g: Tensor) -> Tensor:
        """``x [B, hidden, T]``, ``g [B, gin, 1]`` -> skip sum ``[B, hidden, T]`` (no padding: mask omitted)."""
        h = self.hidden
        g_all = self.cond_layer(g)  # [B, 2*hidden*n_layers, 1], broadcast over time
        out: Tensor | None = None
        for i, (in_layer, res_skip) in enumerate(zip(self.in_layers, self.res_skip_layers)):
            a = in_layer(x) + g_all[:, i * 2 * h : (i + 1) * 2 * h]
            acts = torch.tanh(a[:, :h]) * torch.sigmoid(a[:, h:])
            rs = res_skip(acts)
            if i < self.n_layers - 1:
                x = x + rs[:, :h]
                skip = rs[:, h:]
            else:
                skip = rs
            out = skip if out is None else out + skip
        assert out is not None
        return out


class ResidualCouplingLayer(nn.Module):
    """Mean-only affine coupling: the second half of the channels is shifted by a WN of the first half."""

    def __init__(self, channels: int, hidden: int, gin_channels: int) -> None:
        super().__init__()
        self.half_channels = channels // 2  # (not `half`: that is nn.Module's fp16 method)
        self.pre = nn.Conv1d(self.half_channels, hidden, 1)
        self.enc = WN(hidden, FLOW_KERNEL, FLOW_WN_LAYERS, gin_channels)
        self.post = nn.Conv1d(hidden, self.half_channels, 1)

    def reverse(self, x: Tensor, g: Tensor) -> Tensor:
        """Inverse pass ``[B, C, T] -> [B, C, T]``."""
        x0, x1 = x[:, : self.half_channels], x[:, self.half_channels :]
        m = self.post(self.enc(self.pre(x0), g))
        return torch.cat([x0, x1 - m], dim=1)


class Flip(nn.Module):
    """Reverse the channel order (parameter-free; keeps upstream's ``flows.{odd}`` slots)."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.flip(x, [1])


class ResidualCouplingBlock(nn.Module):
    """The flow: ``[C0, Flip, C1, Flip, C2, Flip, C3, Flip]``; inference runs it in reverse."""

    def __init__(self, channels: int, hidden: int, gin_channels: int, n_flows: int = FLOW_COUPLINGS) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(n_flows):
            layers += [ResidualCouplingLayer(channels, hidden, gin_channels), Flip()]
        self.flows = nn.ModuleList(layers)

    def reverse(self, z_p: Tensor, g: Tensor) -> Tensor:
        """``z_p [B, C, T]`` (prior sample), ``g [B, gin, 1]`` -> ``z [B, C, T]``."""
        x = z_p
        for flow in reversed(self.flows):
            x = flow.reverse(x, g) if isinstance(flow, ResidualCouplingLayer) else flow(x)
        return x


class ResBlock1(nn.Module):
    """HiFi-GAN V1 residual block: 3 x (lrelu -> dilated conv -> lrelu -> conv -> add)."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=(kernel_size * d - d) // 2) for d in dilations
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, padding=(kernel_size - 1) // 2) for _ in dilations
        )

    def forward(self, x: Tensor) -> Tensor:
        for c1, c2 in zip(self.convs1, self.convs2):
            xt = c2(F.leaky_relu(c1(F.leaky_relu(x, LRELU_SLOPE)), LRELU_SLOPE))
            x = x + xt
        return x


class Generator(nn.Module):
    """HiFi-GAN generator ``dec``: latent ``[B, C, T]`` at 50 Hz -> waveform ``[B, 1, T * prod(rates)]`` in (-1, 1)."""

    def __init__(
        self,
        in_channels: int,
        resblock_kernel_sizes: list[int],
        resblock_dilation_sizes: list[list[int]],
        upsample_rates: list[int],
        upsample_initial_channel: int,
        upsample_kernel_sizes: list[int],
        gin_channels: int,
    ) -> None:
        super().__init__()
        self.num_kernels = len(resblock_kernel_sizes)
        self.conv_pre = nn.Conv1d(in_channels, upsample_initial_channel, 7, padding=3)
        self.cond = nn.Conv1d(gin_channels, upsample_initial_channel, 1)
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        ch = upsample_initial_channel
        for u, k in zip(upsample_rates, upsample_kernel_sizes):
            self.ups.append(nn.ConvTranspose1d(ch, ch // 2, k, stride=u, padding=(k - u) // 2))
            ch //= 2
            for rk, rd in zip(resblock_kernel_sizes, resblock_dilation_sizes):
                self.resblocks.append(ResBlock1(ch, rk, tuple(rd)))
        self.conv_post = nn.Conv1d(ch, 1, 7, padding=3, bias=False)

    def forward(self, x: Tensor, g: Tensor) -> Tensor:
        x = self.conv_pre(x) + self.cond(g)
        n = self.num_kernels
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, LRELU_SLOPE))
            xs = self.resblocks[i * n](x)
            for j in range(1, n):
                xs = xs + self.resblocks[i * n + j](x)
            x = xs * (1.0 / n)
        return torch.tanh(self.conv_post(F.leaky_relu(x, FINAL_LRELU_SLOPE)))


class _LinearNorm(nn.Module):
    """A Linear kept under the attribute name ``fc`` (upstream's ``LinearNorm`` state-dict layout)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x)


class _ConvNorm(nn.Module):
    """A Conv1d kept under the attribute name ``conv`` (upstream's ``ConvNorm`` layout)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=(kernel_size - 1) // 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x)


class _Conv1dGLU(nn.Module):
    """Gated conv with a residual: ``x + a * sigmoid(b)`` where ``(a, b) = split(conv(x))``."""

    def __init__(self, channels: int, kernel_size: int) -> None:
        super().__init__()
        self.channels = channels
        self.conv1 = _ConvNorm(channels, 2 * channels, kernel_size)

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv1(x)
        return x + y[:, : self.channels] * torch.sigmoid(y[:, self.channels :])


class _StyleAttention(nn.Module):
    """MelStyleEncoder self-attention; its softmax temperature is ``sqrt(d_model)``, not ``sqrt(d_k)`` (upstream)."""

    def __init__(self, n_heads: int, d_model: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.temperature = math.sqrt(d_model)
        self.w_qs = nn.Linear(d_model, d_model)
        self.w_ks = nn.Linear(d_model, d_model)
        self.w_vs = nn.Linear(d_model, d_model)
        self.fc = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        h, d = self.n_heads, self.d_k
        q = self.w_qs(x).view(b, t, h, d).transpose(1, 2)  # [B, h, T, d]
        k = self.w_ks(x).view(b, t, h, d).transpose(1, 2)
        v = self.w_vs(x).view(b, t, h, d).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(2, 3)) / self.temperature
        p = torch.softmax(scores.float(), dim=-1).to(x.dtype)
        out = torch.matmul(p, v).transpose(1, 2).reshape(b, t, c)
        return self.fc(out) + x


class MelStyleEncoder(nn.Module):
    """``ref_enc``: linear spectrogram bins ``[B, n_bins, T]`` -> style vector ``ge [B, gin, 1]`` (mean over time)."""

    def __init__(self, n_bins: int, style_dim: int, hidden: int = STYLE_HIDDEN) -> None:
        super().__init__()
        self.spectral = nn.Sequential(
            _LinearNorm(n_bins, hidden), nn.Mish(), nn.Identity(), _LinearNorm(hidden, hidden), nn.Mish(), nn.Identity()
        )
        self.temporal = nn.Sequential(_Conv1dGLU(hidden, STYLE_KERNEL), _Conv1dGLU(hidden, STYLE_KERNEL))
        self.slf_attn = _StyleAttention(STYLE_HEADS, hidden)
        self.fc = _LinearNorm(hidden, style_dim)

    def forward(self, spec: Tensor) -> Tensor:
        x = self.spectral(spec.transpose(1, 2))  # [B, T, hidden]
        x = self.temporal(x.transpose(1, 2)).transpose(1, 2)
        x = self.fc(self.slf_attn(x))  # [B, T, gin]
        return x.mean(dim=1).unsqueeze(-1)
