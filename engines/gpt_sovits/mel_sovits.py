"""The SoVITS of the diffusion families (upstream ``SynthesizerTrnV3``, inference parts; reference section 2).

Tokens, phones and a style vector become *features* at the mel frame rate, which condition the DiT sampler
(:mod:`engines.gpt_sovits.cfm`); there is no flow and no waveform decoder inside any more::

    codes [1,1,N] -> codebook [1,768,N] -> 2x nearest -> enc_p (phones, MRTE with ge) [1,H,2N]
    -> bridge (1x1 conv, leaky ReLU) [1,512,2N] -> nearest x2 (v3: x1.875) -> wns1 (WaveNet, ge; frames past
    int(N*4) masked, v3 int(N*3.875)) -> fea [1,C,~4N]   (100 fps; v3 93.75 fps)

Every size is read from the weights (upstream hard-codes the DiT, ``bridge`` and ``wns1`` sizes; the text encoder's
come from the config). ``enc_p`` and ``ref_enc`` are v2's (:mod:`engines.gpt_sovits.sovits_modules`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engines.base import ModelFormatError
from engines.gpt_sovits import ieee_fp32_on_cuda
from engines.gpt_sovits.checkpoint import SovitsCheckpoint, is_dict
from engines.gpt_sovits.dit import DiT, DitConfig
from engines.gpt_sovits.family import FamilySpec, family_spec
from engines.gpt_sovits.sovits_modules import WN, MelStyleEncoder, TextEncoder, fold_weight_norm

log = logging.getLogger(__name__)

__all__ = ["MelSoVITS", "MelSovitsConfig"]

SSL_DIM = 768  # HuBERT feature width
BRIDGE_SLOPE = 0.01  # bridge's LeakyReLU (torch default)
_DIT_PREFIX = "cfm.estimator."
_CODEBOOK_KEY = "quantizer.vq.layers.0._codebook.embed"
# In the file, unused here: training statistics of the quantizer, and linear_mel (a training-only head)
_UNUSED = ("quantizer.vq.layers.0._codebook.inited", "quantizer.vq.layers.0._codebook.cluster_size",
           "quantizer.vq.layers.0._codebook.embed_avg", "linear_mel.weight", "linear_mel.bias")


@dataclass(frozen=True)
class MelSovitsConfig:
    """Sizes of a v3/v4/v5 SoVITS: the text encoder's from the config, everything else from weight shapes."""

    family: FamilySpec
    inter_channels: int
    hidden_channels: int
    filter_channels: int
    n_heads: int
    n_layers: int
    kernel_size: int
    n_symbols: int
    mrte_hidden: int
    codebook_size: int
    style_bins: int
    style_hidden: int
    gin_channels: int
    bridge_channels: int
    wn_hidden: int
    wn_kernel: int
    wn_layers: int
    feature_dim: int
    dit: DitConfig

    @classmethod
    def from_checkpoint(cls, ckpt: SovitsCheckpoint) -> MelSovitsConfig:
        """Read the sizes; ModelFormatError names what is missing or inconsistent."""
        m = ckpt.config.get("model")
        sd = ckpt.state_dict
        if not is_dict(m):
            raise ModelFormatError("SoVITS config has no 'model' section; re-export the model with GPT-SoVITS.")
        if not any(k.startswith(_DIT_PREFIX + "transformer_blocks.") for k in sd):
            raise ModelFormatError(f"{ckpt.version} SoVITS has no DiT blocks; the file is truncated, download it again.")
        try:
            wn_layers = 0
            while f"wns1.enc.in_layers.{wn_layers}.weight_v" in sd or f"wns1.enc.in_layers.{wn_layers}.weight" in sd:
                wn_layers += 1
            in0 = sd.get("wns1.enc.in_layers.0.weight_v", sd.get("wns1.enc.in_layers.0.weight"))
            if in0 is None:
                raise KeyError("wns1.enc.in_layers.0.weight_v")
            cfg = cls(
                family=family_spec(ckpt.version),
                inter_channels=int(m["inter_channels"]), hidden_channels=int(m["hidden_channels"]),
                filter_channels=int(m["filter_channels"]), n_heads=int(m["n_heads"]), n_layers=int(m["n_layers"]),
                kernel_size=int(m["kernel_size"]),
                n_symbols=int(sd["enc_p.text_embedding.weight"].shape[0]),
                mrte_hidden=int(sd["enc_p.mrte.c_pre.weight"].shape[0]),
                codebook_size=int(sd[_CODEBOOK_KEY].shape[0]),
                style_bins=int(sd["ref_enc.spectral.0.fc.weight"].shape[1]),
                style_hidden=int(sd["ref_enc.spectral.0.fc.weight"].shape[0]),
                gin_channels=int(sd["ref_enc.fc.fc.weight"].shape[0]),
                bridge_channels=int(sd["bridge.0.weight"].shape[0]),
                wn_hidden=int(sd["wns1.pre.weight"].shape[0]), wn_kernel=int(in0.shape[-1]), wn_layers=wn_layers,
                feature_dim=int(sd["wns1.proj.weight"].shape[0]),
                dit=DitConfig.from_state_dict(sd, _DIT_PREFIX),
            )
        except KeyError as e:
            raise ModelFormatError(f"SoVITS checkpoint lacks {e.args[0]!r}; the file is incomplete or not a "
                                   f"{ckpt.version} model, download it again.") from None
        if cfg.dit.conv_layers == 0:
            raise ModelFormatError(f"{ckpt.version} SoVITS has no DiT text blocks; the file is truncated, download "
                                   "it again.")
        if cfg.dit.text_dim != cfg.feature_dim:
            raise ModelFormatError(f"{ckpt.version} SoVITS: the DiT reads {cfg.dit.text_dim} feature channels but "
                                   f"wns1 writes {cfg.feature_dim}; the file is damaged, download it again.")
        return cfg


class _MaskedEncoder(nn.Module):
    """``wns1``: 1x1 conv -> WaveNet (style ``g``) -> 1x1 conv, frames outside ``mask`` zeroed throughout."""

    def __init__(self, in_channels: int, out_channels: int, hidden: int, kernel: int, layers: int, gin: int) -> None:
        super().__init__()
        self.pre = nn.Conv1d(in_channels, hidden, 1)
        self.enc = WN(hidden, kernel, layers, gin)
        self.proj = nn.Conv1d(hidden, out_channels, 1)

    def forward(self, x: Tensor, g: Tensor, mask: Tensor) -> Tensor:
        enc = self.enc
        h = enc.hidden
        x = self.pre(x) * mask
        g_all = enc.cond_layer(g)
        out = torch.zeros_like(x)
        for i, (in_layer, res_skip) in enumerate(zip(enc.in_layers, enc.res_skip_layers)):
            a = in_layer(x) + g_all[:, i * 2 * h : (i + 1) * 2 * h]
            rs = res_skip(torch.tanh(a[:, :h]) * torch.sigmoid(a[:, h:]))
            if i < enc.n_layers - 1:
                x = (x + rs[:, :h]) * mask
                out = out + rs[:, h:]
            else:
                out = out + rs
        return self.proj(out * mask) * mask


class MelSoVITS(nn.Module):
    """v3/v4/v5dev/v5turbo SoVITS (inference). Tensors in, tensors out; call under ``torch.inference_mode()``.

    Attribute names mirror upstream's state dict (``ref_enc``, ``enc_p``, ``bridge``, ``wns1``, ``ssl_proj``); the
    codebook is the buffer ``codebook`` and the DiT is ``dit`` (upstream ``cfm.estimator``).
    """

    def __init__(self, cfg: MelSovitsConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.ssl_proj = nn.Conv1d(SSL_DIM, SSL_DIM, 2, stride=2)  # HuBERT 50 Hz -> 25 Hz (prompt tokens)
        self.register_buffer("codebook", torch.zeros(cfg.codebook_size, SSL_DIM))
        self.ref_enc = MelStyleEncoder(cfg.style_bins, cfg.gin_channels, cfg.style_hidden)
        self.enc_p = TextEncoder(cfg.inter_channels, cfg.hidden_channels, cfg.filter_channels, cfg.n_heads,
                                 cfg.n_layers, cfg.kernel_size, cfg.n_symbols, cfg.mrte_hidden, SSL_DIM)
        self.bridge = nn.Sequential(nn.Conv1d(cfg.hidden_channels, cfg.bridge_channels, 1), nn.LeakyReLU(BRIDGE_SLOPE))
        self.wns1 = _MaskedEncoder(cfg.bridge_channels, cfg.feature_dim, cfg.wn_hidden, cfg.wn_kernel, cfg.wn_layers,
                                   cfg.gin_channels)
        self.dit = DiT(cfg.dit)

    codebook: Tensor

    @property
    def family(self) -> FamilySpec:
        """The family's fixed behaviour (frame rates, chunking, sampler defaults)."""
        return self.cfg.family

    @classmethod
    def from_checkpoint(cls, ckpt: SovitsCheckpoint, device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32) -> MelSoVITS:
        """Build from :func:`engines.gpt_sovits.dit_checkpoint.load_dit_sovits_checkpoint`, fold weight norm,
        load, move, eval; ModelFormatError lists missing/unexpected/mis-shaped weights."""
        cfg = MelSovitsConfig.from_checkpoint(ckpt)
        model = cls(cfg)
        model.load_weights(ckpt.state_dict)
        ieee_fp32_on_cuda(device)
        model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        log.info("SoVITS %s (DiT %d x %d, %d heads), %.1f M params, %s %s", cfg.family.name, cfg.dit.depth,
                 cfg.dit.dim, cfg.dit.heads, sum(p.numel() for p in model.parameters()) / 1e6, device, dtype)
        return model

    def load_weights(self, state_dict: dict[str, Tensor]) -> None:
        """Upstream-named weights (fp16 ok): ``enc_q.*`` and unused training heads dropped, names/shapes checked."""
        sd = {k: v for k, v in state_dict.items() if not k.startswith("enc_q.") and k not in _UNUSED}
        try:
            sd = fold_weight_norm(sd)
        except KeyError as e:
            raise ModelFormatError(f"SoVITS weights are inconsistent: {e.args[0]}") from None
        if _CODEBOOK_KEY in sd:
            sd["codebook"] = sd.pop(_CODEBOOK_KEY)
        dit = {k[len(_DIT_PREFIX):]: sd.pop(k) for k in [k for k in sd if k.startswith(_DIT_PREFIX)]}
        sd.update({"dit." + k: v for k, v in DiT.remap(dit).items()})
        expected = self.state_dict()
        missing = sorted(set(expected) - set(sd))
        unexpected = sorted(set(sd) - set(expected))
        name = self.cfg.family.name
        if missing or unexpected:
            raise ModelFormatError(f"SoVITS weights do not match a {name} model: missing {_some(missing)}, "
                                   f"unexpected {_some(unexpected)}; the file is damaged or not a {name} model.")
        wrong = [f"{k} {tuple(v.shape)} != {tuple(expected[k].shape)}" for k, v in sd.items()
                 if v.shape != expected[k].shape]
        if wrong:
            raise ModelFormatError(f"{name} SoVITS weight shapes are inconsistent: {_some(wrong)}")
        self.load_state_dict({k: v.to(expected[k].dtype) for k, v in sd.items()}, strict=True)

    # ---------------------------------------------------------------------------------------- references
    def extract_latent(self, ssl: Tensor) -> Tensor:
        """HuBERT features ``[B, 768, T50]`` -> semantic codes ``[1, B, T50 // 2]`` (nearest codeword)."""
        x = self.ssl_proj(ssl.to(self.codebook.dtype)).float().transpose(1, 2)
        b, t, d = x.shape
        flat = x.reshape(b * t, d)
        embed_t = self.codebook.float().t()
        dist = -(flat.pow(2).sum(1, keepdim=True) - 2 * flat @ embed_t + embed_t.pow(2).sum(0, keepdim=True))
        return dist.argmax(dim=-1).view(1, b, t)

    def ref_style(self, spec: Tensor) -> Tensor:
        """Reference linear spectrogram ``[1, 1025, Tr]`` (32 kHz, v2's) -> style ``ge [1, gin, 1]``."""
        return self.ref_enc(spec[:, : self.cfg.style_bins].to(self.codebook.dtype))

    # --------------------------------------------------------------------------------------------- features
    def features(self, codes: Tensor, text: Tensor, ge: Tensor, speed: float = 1.0) -> Tensor:
        """Upstream ``decode_encp`` with a given ``ge``: codes ``[1, 1, N]`` + phones ``[1, P]`` -> ``fea [1, C, T]``.

        ``T = 4N`` (v4/v5; v3 ``floor(3.75 N)``) at speed 1; otherwise ``2 (int(2N / speed) + 1)`` frames with
        those past ``int(4N / speed) + 1`` zeroed.
        """
        return self.encode(codes, text, ge, speed)[1]

    def encode(self, codes: Tensor, text: Tensor, ge: Tensor, speed: float = 1.0) -> tuple[Tensor, Tensor]:
        """``(enc_p output [1, H, T50], fea [1, C, T])`` (the first for tests of the text encoder)."""
        n = codes.shape[-1]
        spec = self.cfg.family
        frames = int(n * spec.mask_scale) if speed == 1 else int(n * spec.mask_scale / speed) + 1
        y = F.embedding(codes[0], self.codebook).transpose(1, 2)  # [1, 768, N]
        y = F.interpolate(y, size=2 * n, mode="nearest")  # 25 Hz -> 50 Hz
        x = self.enc_p(y, text, ge.to(y.dtype), speed)[0]
        fea = F.interpolate(self.bridge(x), scale_factor=spec.feature_scale, mode="nearest")
        mask = (torch.arange(fea.shape[-1], device=fea.device) < frames).to(fea.dtype)[None, None]
        return x, self.wns1(fea, ge.to(fea.dtype), mask)


def _some(names: Sequence[Any], n: int = 5) -> str:
    """At most ``n`` names for an error message, with a count of the rest."""
    if not names:
        return "none"
    more = f" (+{len(names) - n} more)" if len(names) > n else ""
    return ", ".join(str(x) for x in names[:n]) + more
