"""The SoVITS v2/v2Pro/v2ProPlus decoder (upstream ``SynthesizerTrn``, inference parts only): tokens + phones +
style -> 32 kHz audio.

Built from a checkpoint's config *and* its weight shapes (the MRTE width, the symbol count and the SV feature width
are not in the config). Weight norm is folded into plain weights at load time; ``enc_q`` (training only) is never
built.

The pipeline of :meth:`SoVITSDecoder.decode` (upstream reference, section 6.1)::

    codes [1,1,Ts] -> codebook lookup [1,768,Ts] -> 2x nearest (50 Hz) -> enc_p (+ phones, MRTE style) -> m_p, logs_p
    -> z_p = m_p + eps * exp(logs_p) * noise_scale -> reverse flow (ge) -> HiFi-GAN (ge) -> wav [1,1,2*Ts*640]

v2Pro and v2ProPlus (the same class upstream, ``is_v2pro``) add three modules. Per reference i the style is
``ge_i = PReLU(ref_enc(spec_i) + sv_emb(sv_i))`` with ``sv_i`` the speaker-verification features
(:mod:`engines.gpt_sovits.sv`); ``ge`` is the mean over the references and goes to the flow and the vocoder, while
the MRTE gets ``ge_to512(ge)`` (v2 feeds ``ge`` to both). v2ProPlus differs from v2Pro only in sizes from its config.
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
from engines.gpt_sovits.checkpoint import V2PRO_VERSIONS, SovitsCheckpoint, is_dict
from engines.gpt_sovits.sovits_modules import (
    Generator,
    MelStyleEncoder,
    ResidualCouplingBlock,
    TextEncoder,
    fold_weight_norm,
)

log = logging.getLogger(__name__)

__all__ = ["SoVITSDecoder", "SovitsConfig", "mean_style"]

SSL_DIM = 768  # HuBERT feature width (chinese-hubert-base)
CODEBOOK_SIZE = 1024  # semantic codes
STYLE_BINS_V2 = 704  # v2 ref_enc reads only the first 704 of the 1025 linear bins
_CODEBOOK_KEY = "quantizer.vq.layers.0._codebook.embed"
# Training-time state of the quantizer; present in every file, unused at inference.
_IGNORED_KEYS = (
    "quantizer.vq.layers.0._codebook.inited",
    "quantizer.vq.layers.0._codebook.cluster_size",
    "quantizer.vq.layers.0._codebook.embed_avg",
)


@dataclass(frozen=True)
class SovitsConfig:
    """The dimensions a SoVITS decoder is built from (the checkpoint's ``config["model"]`` plus weight shapes)."""

    inter_channels: int
    hidden_channels: int
    filter_channels: int
    n_heads: int
    n_layers: int
    kernel_size: int
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    upsample_rates: tuple[int, ...]
    upsample_initial_channel: int
    upsample_kernel_sizes: tuple[int, ...]
    gin_channels: int
    n_symbols: int  # rows of enc_p.text_embedding (732 for v2)
    mrte_hidden: int  # width of the MRTE (upstream hard-codes 512 = gin of released models)
    style_bins: int = STYLE_BINS_V2  # spectrogram bins read by ref_enc
    sampling_rate: int = 32000  # Hz
    sv_dim: int = 0  # v2Pro/v2ProPlus: width of the SV features sv_emb reads (20480 released); 0: plain v2
    version: str = "v2"  # "v2", "v2Pro" or "v2ProPlus"

    @property
    def is_v2pro(self) -> bool:
        """True for v2Pro/v2ProPlus: the style fuses speaker-verification features and the MRTE gets ``ge_to512``."""
        return self.sv_dim > 0

    @property
    def hop(self) -> int:
        """Output samples per 50 Hz latent frame (640 for v2)."""
        n = 1
        for u in self.upsample_rates:
            n *= u
        return n

    @classmethod
    def from_checkpoint(cls, config: dict[str, Any], state_dict: dict[str, Tensor],
                        version: str = "v2") -> SovitsConfig:
        """Read the dims from ``config["model"]`` and the weight shapes; raises ModelFormatError if unsupported.

        ``version`` is the family the loader found (:attr:`SovitsCheckpoint.version`); for v2Pro/v2ProPlus the SV
        width is ``sv_emb.weight.shape[1]`` and the MRTE width must equal ``ge_to512``'s output.
        """
        m = config.get("model")
        if not is_dict(m):
            raise ModelFormatError("SoVITS config has no 'model' section; re-export the model with GPT-SoVITS.")
        try:
            if str(m.get("resblock", "1")) != "1":
                raise ModelFormatError(f"SoVITS resblock type {m['resblock']!r} is not supported (v2 uses '1').")
            if m.get("semantic_frame_rate", "25hz") != "25hz":
                raise ModelFormatError(
                    f"SoVITS semantic_frame_rate {m['semantic_frame_rate']!r} is not supported (v2 uses '25hz')."
                )
            emb = state_dict["enc_p.text_embedding.weight"]
            c_pre = state_dict["enc_p.mrte.c_pre.weight"]
            style = state_dict["ref_enc.spectral.0.fc.weight"]
            v2pro = version in V2PRO_VERSIONS
            sv_dim = int(state_dict["sv_emb.weight"].shape[1]) if v2pro else 0
            to512 = int(state_dict["ge_to512.weight"].shape[0]) if v2pro else 0
            cfg = cls(
                inter_channels=int(m["inter_channels"]),
                hidden_channels=int(m["hidden_channels"]),
                filter_channels=int(m["filter_channels"]),
                n_heads=int(m["n_heads"]),
                n_layers=int(m["n_layers"]),
                kernel_size=int(m["kernel_size"]),
                resblock_kernel_sizes=tuple(int(k) for k in m["resblock_kernel_sizes"]),
                resblock_dilation_sizes=tuple(tuple(int(d) for d in ds) for ds in m["resblock_dilation_sizes"]),
                upsample_rates=tuple(int(u) for u in m["upsample_rates"]),
                upsample_initial_channel=int(m["upsample_initial_channel"]),
                upsample_kernel_sizes=tuple(int(k) for k in m["upsample_kernel_sizes"]),
                gin_channels=int(m["gin_channels"]),
                n_symbols=int(emb.shape[0]),
                mrte_hidden=int(c_pre.shape[0]),
                style_bins=int(style.shape[1]),
                sampling_rate=int(config.get("data", {}).get("sampling_rate", 32000)),
                sv_dim=sv_dim,
                version=version,
            )
        except KeyError as e:
            raise ModelFormatError(f"SoVITS checkpoint lacks {e.args[0]!r}; the file is incomplete or not a "
                                   f"{version} model.") from None
        if cfg.is_v2pro:
            if cfg.mrte_hidden != to512:
                raise ModelFormatError(
                    f"{version} SoVITS MRTE width {cfg.mrte_hidden} differs from ge_to512's output {to512}; "
                    "the file is damaged or not an upstream model."
                )
        elif version != "v2":
            raise ModelFormatError(f"SoVITS family {version!r} is not supported; use a v2, v2Pro or v2ProPlus model.")
        elif cfg.mrte_hidden != cfg.gin_channels:
            raise ModelFormatError(
                f"SoVITS MRTE width {cfg.mrte_hidden} differs from gin_channels {cfg.gin_channels}; "
                "only plain v2 models are supported (not v2Pro)."
            )
        return cfg


def mean_style(ges: Sequence[Tensor]) -> Tensor:
    """Combine several references: the mean of their ``ge [1, gin, 1]`` (upstream ``stack(ges).mean(0)``)."""
    if not ges:
        raise ValueError("mean_style needs at least one style vector")
    return ges[0] if len(ges) == 1 else torch.stack(list(ges), 0).mean(0)


class SoVITSDecoder(nn.Module):
    """SoVITS v2/v2Pro/v2ProPlus inference model. Tensors in, tensors out; call under ``torch.inference_mode()``.

    Parameters
    ----------
    cfg:
        the dimensions (see :meth:`SovitsConfig.from_checkpoint`).

    Notes
    -----
    Attribute names mirror upstream's state dict (``ssl_proj``, ``ref_enc``, ``enc_p``, ``flow``, ``dec``, and for
    v2Pro ``sv_emb``, ``prelu``, ``ge_to512``); the VQ codebook ``quantizer.vq.layers.0._codebook.embed`` is held as
    the buffer ``codebook``.
    """

    def __init__(self, cfg: SovitsConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.ssl_proj = nn.Conv1d(SSL_DIM, SSL_DIM, 2, stride=2)  # 50 Hz -> 25 Hz
        self.register_buffer("codebook", torch.zeros(CODEBOOK_SIZE, SSL_DIM))  # [1024, 768]
        self.ref_enc = MelStyleEncoder(cfg.style_bins, cfg.gin_channels)
        self.enc_p = TextEncoder(
            cfg.inter_channels,
            cfg.hidden_channels,
            cfg.filter_channels,
            cfg.n_heads,
            cfg.n_layers,
            cfg.kernel_size,
            cfg.n_symbols,
            cfg.mrte_hidden,
            SSL_DIM,
        )
        self.flow = ResidualCouplingBlock(cfg.inter_channels, cfg.hidden_channels, cfg.gin_channels)
        self.dec = Generator(
            cfg.inter_channels,
            list(cfg.resblock_kernel_sizes),
            [list(d) for d in cfg.resblock_dilation_sizes],
            list(cfg.upsample_rates),
            cfg.upsample_initial_channel,
            list(cfg.upsample_kernel_sizes),
            cfg.gin_channels,
        )
        if cfg.is_v2pro:
            self.sv_emb = nn.Linear(cfg.sv_dim, cfg.gin_channels)  # SV features -> style offset
            self.prelu = nn.PReLU(num_parameters=cfg.gin_channels)
            self.ge_to512 = nn.Linear(cfg.gin_channels, cfg.mrte_hidden)  # style for the MRTE

    codebook: Tensor

    # ---------------------------------------------------------------------------------------------- loading
    @classmethod
    def from_checkpoint(
        cls, ckpt: SovitsCheckpoint, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> SoVITSDecoder:
        """Build from a loaded checkpoint, fold weight norm, load the weights, move to ``device``/``dtype``, eval.

        Parameters
        ----------
        ckpt:
            from :func:`engines.gpt_sovits.checkpoint.load_sovits_checkpoint`.
        device, dtype:
            fp32 on CPU; fp16/bf16 work on GPU (layer norms and softmax keep fp32 statistics).

        Raises
        ------
        ModelFormatError
            unsupported dims, or missing/unexpected/mis-shaped weights (names listed).
        """
        cfg = SovitsConfig.from_checkpoint(ckpt.config, ckpt.state_dict, ckpt.version)
        model = cls(cfg)
        model.load_weights(ckpt.state_dict)
        ieee_fp32_on_cuda(device)
        model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        log.info(
            "SoVITS %s decoder: hidden %d, gin %d, %d symbols, sv_dim %d, %.1f M params, %s %s",
            cfg.version,
            cfg.hidden_channels,
            cfg.gin_channels,
            cfg.n_symbols,
            cfg.sv_dim,
            sum(p.numel() for p in model.parameters()) / 1e6,
            device,
            dtype,
        )
        return model

    def load_weights(self, state_dict: dict[str, Tensor]) -> None:
        """Load upstream-named weights (fp16 ok): ``enc_q.*`` ignored, weight norm folded, names/shapes checked."""
        sd = {k: v for k, v in state_dict.items() if not k.startswith("enc_q.")}
        try:
            sd = fold_weight_norm(sd)
        except KeyError as e:
            raise ModelFormatError(f"SoVITS weights are inconsistent: {e.args[0]}") from None
        inited = sd.get("quantizer.vq.layers.0._codebook.inited")
        if inited is not None and float(inited.float().min()) < 1:
            log.warning("SoVITS quantizer codebook is marked uninitialised; the model was probably never trained")
        for k in _IGNORED_KEYS:
            sd.pop(k, None)
        if _CODEBOOK_KEY in sd:
            sd["codebook"] = sd.pop(_CODEBOOK_KEY)
        expected = self.state_dict()
        missing = sorted(set(expected) - set(sd))
        unexpected = sorted(set(sd) - set(expected))
        if missing or unexpected:
            raise ModelFormatError(
                f"SoVITS weights do not match a {self.cfg.version} model built from its config: "
                f"missing {_some(missing)}, unexpected {_some(unexpected)}; the file is not a plain "
                f"{self.cfg.version} SoVITS model."
            )
        wrong = [f"{k} {tuple(v.shape)} != {tuple(expected[k].shape)}" for k, v in sd.items() if v.shape != expected[k].shape]
        if wrong:
            raise ModelFormatError(f"SoVITS weight shapes differ from its config: {_some(wrong)}")
        self.load_state_dict({k: v.to(expected[k].dtype) for k, v in sd.items()}, strict=True)

    # ------------------------------------------------------------------------------------------- references
    def extract_latent(self, ssl: Tensor) -> Tensor:
        """HuBERT features -> semantic codes (``ssl_proj`` k2 s2, then the nearest codeword).

        Parameters
        ----------
        ssl:
            ``[B, 768, T50]`` HuBERT ``last_hidden_state`` transposed (50 Hz).

        Returns
        -------
        Tensor
            ``[1, B, T50 // 2]`` int64 codes (``[n_q, B, T]``, n_q = 1; a trailing odd frame is dropped).
        """
        x = self.ssl_proj(ssl.to(self.codebook.dtype)).float().transpose(1, 2)  # [B, T25, 768]
        b, t, d = x.shape
        flat = x.reshape(b * t, d)
        embed_t = self.codebook.float().t()  # [768, 1024]
        # upstream's formula term by term, so near-ties resolve the same way: -(|x|^2 - 2 x.E + |E|^2)
        dist = -(flat.pow(2).sum(1, keepdim=True) - 2 * flat @ embed_t + embed_t.pow(2).sum(0, keepdim=True))
        return dist.argmax(dim=-1).view(1, b, t)

    def dequantize(self, codes: Tensor) -> Tensor:
        """Codebook lookup: ``codes [1, B, Ts]`` -> ``[B, 768, Ts]`` (upstream ``quantizer.decode``)."""
        return F.embedding(codes[0], self.codebook).transpose(1, 2)

    def ref_style(self, spec: Tensor, sv: Tensor | None = None) -> Tensor:
        """Reference linear spectrogram ``[B, 1025, Tr]`` -> style vector ``ge [B, gin, 1]`` (first 704 bins).

        Parameters
        ----------
        spec:
            the reference's :func:`engines.gpt_sovits.spectrogram.linear_spectrogram`.
        sv:
            v2Pro/v2ProPlus only, required there: the same reference's SV features ``[B, sv_dim]``
            (:class:`engines.gpt_sovits.sv.SpeakerEncoder`); the result is then ``PReLU(ref_enc + sv_emb(sv))``.
        """
        ge = self.ref_enc(spec[:, : self.cfg.style_bins].to(self.codebook.dtype))
        if not self.cfg.is_v2pro:
            if sv is not None:
                raise ValueError("this is a plain v2 SoVITS: it takes no speaker-verification features")
            return ge
        if sv is None:
            raise ValueError(f"a {self.cfg.version} SoVITS needs the reference's speaker-verification features")
        if sv.shape[-1] != self.cfg.sv_dim:
            raise ValueError(f"speaker-verification features have width {sv.shape[-1]}, this {self.cfg.version} "
                             f"SoVITS reads {self.cfg.sv_dim}; use the SV model that belongs to it")
        return self.prelu(ge + self.sv_emb(sv.to(ge.dtype)).unsqueeze(-1))

    def text_style(self, ge: Tensor) -> Tensor:
        """The style the MRTE gets: ``ge`` itself in v2, ``ge_to512(ge)`` ``[B, mrte_hidden, 1]`` in v2Pro."""
        if not self.cfg.is_v2pro:
            return ge
        return self.ge_to512(ge.transpose(1, 2)).transpose(1, 2)

    # --------------------------------------------------------------------------------------------- decoding
    def encode_prior(
        self, codes: Tensor, text: Tensor, ge: Tensor, speed: float = 1.0
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``enc_p``: codes ``[1, 1, Ts]`` + phones ``[1, Tt]`` + ``ge [1, gin, 1]`` -> ``(x, m_p, logs_p)``.

        All three are ``[1, C, T']`` with ``T' = 2 Ts`` at speed 1, else ``int(2 Ts / speed) + 1`` frames (50 Hz).
        ``ge`` is the flow/vocoder style; the MRTE gets :meth:`text_style` of it.
        """
        y = self.dequantize(codes)
        y = F.interpolate(y, size=2 * y.shape[-1], mode="nearest")  # 25 Hz -> 50 Hz
        return self.enc_p(y, text, self.text_style(ge.to(y.dtype)), speed)

    def flow_reverse(self, z_p: Tensor, ge: Tensor) -> Tensor:
        """Reverse flow: prior sample ``z_p [1, C, T]`` -> latent ``z [1, C, T]``."""
        return self.flow.reverse(z_p, ge.to(z_p.dtype))

    def vocode(self, z: Tensor, ge: Tensor) -> Tensor:
        """HiFi-GAN: latent ``z [1, C, T]`` -> waveform ``[1, 1, T * 640]`` in (-1, 1) @ 32 kHz."""
        return self.dec(z, ge.to(z.dtype))

    def decode(
        self,
        codes: Tensor,
        text: Tensor,
        ge: Tensor,
        speed: float = 1.0,
        noise_scale: float = 0.5,
        generator: torch.Generator | None = None,
        eps: Tensor | None = None,
    ) -> Tensor:
        """Synthesize one utterance.

        Parameters
        ----------
        codes:
            ``[1, 1, Ts]`` int64 semantic tokens (25 Hz; only the new ones, not the prompt's).
        text:
            ``[1, Tt]`` int64 phone ids of the target text (without the prompt's phones).
        ge:
            ``[1, gin, 1]`` style vector (:meth:`ref_style`, with the SV features for v2Pro; several references:
            :func:`mean_style`).
        speed:
            speaking rate; 1 keeps ``Ts * 1280`` samples.
        noise_scale:
            prior noise; 0 is deterministic.
        generator:
            RNG for the noise (on the model's device), for reproducible output.
        eps:
            optional standard-normal noise of ``m_p``'s shape, used instead of drawing it (conformance tests).

        Returns
        -------
        Tensor
            ``[1, 1, N]`` waveform @ 32 kHz in the model dtype, ``N = T' * 640``.
        """
        _, m_p, logs_p = self.encode_prior(codes, text, ge, speed)
        z_p = m_p
        if noise_scale != 0:
            if eps is None:
                eps = torch.randn(m_p.shape, generator=generator, device=m_p.device, dtype=m_p.dtype)
            z_p = m_p + eps.to(m_p.dtype) * torch.exp(logs_p) * noise_scale
        return self.vocode(self.flow_reverse(z_p, ge), ge)


def _some(names: Sequence[str], n: int = 5) -> str:
    """At most ``n`` names for an error message, with a count of the rest."""
    if not names:
        return "none"
    more = f" (+{len(names) - n} more)" if len(names) > n else ""
    return ", ".join(names[:n]) + more
