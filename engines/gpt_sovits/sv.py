"""The speaker-verification front-end of SoVITS v2Pro/v2ProPlus: 32 kHz reference -> ``sv_emb [B, sv_dim]``.

Upstream (``sv.SV.compute_embedding3``): the 32 kHz reference after the ``max > 1`` loudness rule is resampled to
16 kHz by ``torchaudio.transforms.Resample(32000, 16000)`` (not the librosa signal HuBERT reads), Kaldi filter banks
are taken (:mod:`engines.gpt_sovits.fbank`), and an ERes2NetV2 (3D-Speaker, ``baseWidth=24, scale=4, expansion=4``)
runs up to its last fused feature map, which is averaged over time (``forward3``): ``[B, m_channels * 8 * 4 * 10]``
(20480 for the released model, whose stem width ``m_channels`` is 64). The speaker embedding head ``seg_1`` is in
the file but unused.

Every module here is written from those facts; sizes come from the weight shapes (``conv1.weight.shape[0]`` is
``m_channels``), so the released model and narrower test models load the same way.
"""

from __future__ import annotations

import logging
import math
import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engines.base import EngineError, ModelFormatError, ModelPaths, VoicePrompt
from engines.gpt_sovits import ieee_fp32_on_cuda
from engines.gpt_sovits.checkpoint import SvCheckpoint, load_sv_checkpoint
from engines.gpt_sovits.fbank import FBANK_BINS, fbank
from engines.gpt_sovits.spectrogram import MAX_PEAK_DIVISOR
from engines.runtime import IdleUnloaded

log = logging.getLogger(__name__)

__all__ = ["ERes2NetV2", "SpeakerEncoder", "LazySpeakerEncoder", "check_voice", "require_sv_model",
           "speaker_features", "speaker_rows",
           "resample_32k_to_16k"]

# ---------------------------------------------------------------------------------------------- 32 -> 16 kHz
RESAMPLE_ZEROS = 6  # lowpass_filter_width: zero crossings of the sinc on each side
RESAMPLE_ROLLOFF = 0.99  # cutoff as a fraction of the lower Nyquist rate
RESAMPLE_DOWN = 2  # 32000 / 16000 reduced by their gcd: 2 input samples per output sample
_resample_kernels: dict[tuple[torch.device, torch.dtype], tuple[Tensor, int]] = {}


def _resample_kernel(device: torch.device, dtype: torch.dtype) -> tuple[Tensor, int]:
    """The windowed-sinc kernel ``[1, 1, 2 * width + 2]`` and its half width, as torchaudio's ``sinc_interp_hann``.

    For a 2:1 reduction there is one output phase: output n is ``sum_k x[2n + k - width] h[k]`` with
    ``h[k] = r/2 * sinc(r (k - width) / 2) * cos^2(pi r (k - width) / (2 * 2 * zeros))`` clipped to ``|.| <= zeros``
    (``r`` the roll-off), computed in float64 and cast once.
    """
    key = (device, dtype)
    hit = _resample_kernels.get(key)
    if hit is None:
        base = RESAMPLE_ROLLOFF  # min(orig, new) reduced (= 1) times the roll-off
        width = math.ceil(RESAMPLE_ZEROS * RESAMPLE_DOWN / base)  # 13 input samples each side
        t = torch.arange(-width, width + RESAMPLE_DOWN, dtype=torch.float64) / RESAMPLE_DOWN * base
        t = t.clamp(-RESAMPLE_ZEROS, RESAMPLE_ZEROS)
        window = torch.cos(t * math.pi / RESAMPLE_ZEROS / 2) ** 2
        t = t * math.pi
        sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t)
        kernel = sinc * window * (base / RESAMPLE_DOWN)
        hit = (kernel.view(1, 1, -1).to(device, dtype), width)
        _resample_kernels[key] = hit
    return hit


def resample_32k_to_16k(wav32k: Tensor) -> Tensor:
    """Halve the sample rate with torchaudio's default band-limited resampler (``Resample(32000, 16000)``).

    Parameters
    ----------
    wav32k:
        ``[B, N]`` (or ``[N]``) float @ 32 kHz.

    Returns
    -------
    Tensor
        ``[B, ceil(N / 2)]`` @ 16 kHz, same dtype and device (zero padding at both ends, as torchaudio).
    """
    x = wav32k if wav32k.dim() == 2 else wav32k.unsqueeze(0)
    if x.dim() != 2:
        raise ValueError(f"wav32k must be [B, N] or [N], got shape {tuple(wav32k.shape)}")
    kernel, width = _resample_kernel(x.device, x.dtype)
    n = x.shape[1]
    padded = F.pad(x, (width, width + RESAMPLE_DOWN)).unsqueeze(1)  # [B, 1, N + 2w + 2]
    y = F.conv1d(padded, kernel, stride=RESAMPLE_DOWN).squeeze(1)
    return y[:, : -(-n // RESAMPLE_DOWN)]


# --------------------------------------------------------------------------------------------------- ERes2NetV2
BASE_WIDTH = 24  # per-branch width = floor(planes * 24 / 64)
SCALE = 4  # branches per block (Res2Net "scale")
EXPANSION = 4  # block output = planes * 4
AFF_REDUCTION = 4  # attentional feature fusion bottleneck
CLIP = 20.0  # the blocks' activation is Hardtanh(0, 20), not a plain ReLU
LAYER_STRIDES = (1, 2, 2, 2)  # layer1..layer4
FREQ_DOWNSAMPLE = 8  # layer2..4 halve the 80 mel bins three times: 10 frequency rows remain


def _clip(x: Tensor) -> Tensor:
    return torch.clamp(x, 0.0, CLIP)


class _AFF(nn.Module):
    """Attentional feature fusion of two equal-shape maps: ``x * a + y * (2 - a)``, ``a = 1 + tanh(att([x, y]))``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        inner = channels // AFF_REDUCTION
        self.local_att = nn.Sequential(
            nn.Conv2d(2 * channels, inner, 1),
            nn.BatchNorm2d(inner),
            nn.SiLU(),
            nn.Conv2d(inner, channels, 1),
            nn.BatchNorm2d(channels),
        )

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        a = 1.0 + torch.tanh(self.local_att(torch.cat([x, y], dim=1)))
        return x * a + y * (2.0 - a)


class _Block(nn.Module):
    """ERes2NetV2 bottleneck: 1x1 conv, ``SCALE`` chained 3x3 branches (summed, or AFF-fused), 1x1 conv, shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int, fuse: bool) -> None:
        super().__init__()
        width = int(math.floor(planes * BASE_WIDTH / 64.0))
        self.width = width
        self.conv1 = nn.Conv2d(in_planes, width * SCALE, 1, stride=stride, bias=False)
        self.bn1 = nn.BatchNorm2d(width * SCALE)
        self.convs = nn.ModuleList(nn.Conv2d(width, width, 3, padding=1, bias=False) for _ in range(SCALE))
        self.bns = nn.ModuleList(nn.BatchNorm2d(width) for _ in range(SCALE))
        self.fuse_models = nn.ModuleList(_AFF(width) for _ in range(SCALE - 1)) if fuse else None
        self.conv3 = nn.Conv2d(width * SCALE, planes * EXPANSION, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * EXPANSION)
        self.shortcut: nn.Module = nn.Sequential()
        if stride != 1 or in_planes != planes * EXPANSION:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes * EXPANSION, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes * EXPANSION),
            )

    def forward(self, x: Tensor) -> Tensor:
        parts = torch.split(_clip(self.bn1(self.conv1(x))), self.width, dim=1)
        outs: list[Tensor] = []
        sp = parts[0]
        for i, (conv, bn) in enumerate(zip(self.convs, self.bns)):
            if i > 0:  # each branch also sees the previous branch's output
                sp = self.fuse_models[i - 1](sp, parts[i]) if self.fuse_models is not None else sp + parts[i]
            sp = _clip(bn(conv(sp)))
            outs.append(sp)
        out = self.bn3(self.conv3(torch.cat(outs, dim=1)))
        return _clip(out + self.shortcut(x))


class ERes2NetV2(nn.Module):
    """ERes2NetV2 up to ``forward3`` (the time-averaged fused feature map), eval-mode BatchNorm.

    Parameters
    ----------
    m_channels:
        stem width (64 released).
    num_blocks:
        blocks per layer (``(3, 4, 6, 3)`` released).
    feat_dim:
        filter-bank bins (80).

    Notes
    -----
    Attribute names mirror upstream's state dict (``conv1``, ``bn1``, ``layer1..4``, ``layer3_ds``, ``fuse34``).
    """

    def __init__(self, m_channels: int, num_blocks: Sequence[int] = (3, 4, 6, 3), feat_dim: int = FBANK_BINS) -> None:
        super().__init__()
        self.m_channels = m_channels
        self.feat_dim = feat_dim
        self.conv1 = nn.Conv2d(1, m_channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(m_channels)
        in_planes = m_channels
        layers: list[nn.Sequential] = []
        for i, (n, stride) in enumerate(zip(num_blocks, LAYER_STRIDES)):
            planes = m_channels * 2**i
            blocks: list[nn.Module] = []
            for j in range(n):
                blocks.append(_Block(in_planes, planes, stride if j == 0 else 1, fuse=i >= 2))
                in_planes = planes * EXPANSION
            layers.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        c3, c4 = m_channels * 4 * EXPANSION, m_channels * 8 * EXPANSION
        self.layer3_ds = nn.Conv2d(c3, c4, 3, stride=2, padding=1, bias=False)
        self.fuse34 = _AFF(c4)

    @property
    def out_dim(self) -> int:
        """Width of :meth:`forward` 's output: channels of the last map times its frequency rows (20480 released)."""
        return self.m_channels * 8 * EXPANSION * (self.feat_dim // FREQ_DOWNSAMPLE)

    def feature_map(self, feats: Tensor) -> Tensor:
        """Filter banks ``[B, T, 80]`` -> fused map ``[B, 8 * 4 * m, 10, T']`` (``T' = ceil(T / 8)``)."""
        x = feats.transpose(1, 2).unsqueeze(1)  # [B, 1, 80, T]: frequency as height, time as width
        out = F.relu(self.bn1(self.conv1(x)))  # the stem uses a plain ReLU
        out3 = self.layer3(self.layer2(self.layer1(out)))
        return self.fuse34(self.layer4(out3), self.layer3_ds(out3))

    def forward(self, feats: Tensor) -> Tensor:
        """Filter banks ``[B, T, 80]`` -> ``sv_emb [B, out_dim]``: the fused map's channels x rows, mean over time."""
        return self.feature_map(feats).flatten(1, 2).mean(-1)

    @classmethod
    def from_checkpoint(cls, ckpt: SvCheckpoint, device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32) -> ERes2NetV2:
        """Build from the weights (stem width and block counts from their names/shapes), check, load, eval.

        Raises
        ------
        ModelFormatError
            missing, unexpected or mis-shaped weights (names listed).
        """
        model, sd = cls._matched(ckpt)
        expected = model.state_dict()
        model.load_state_dict({k: v.to(expected[k].dtype) for k, v in sd.items()}, strict=True)
        ieee_fp32_on_cuda(device)
        model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        log.info("SV model ERes2NetV2: m_channels %d, sv_dim %d, %.1f M params, %s %s", ckpt.m_channels,
                 model.out_dim, sum(p.numel() for p in model.parameters()) / 1e6, device, dtype)
        return model

    @classmethod
    def validate(cls, ckpt: SvCheckpoint) -> int:
        """Check every weight name and shape against the architecture on the meta device (no memory, no compute)
        and return the feature width ``sv_dim``; ModelFormatError as :meth:`from_checkpoint`."""
        with torch.device("meta"):
            model, _ = cls._matched(ckpt)
        return model.out_dim

    @classmethod
    def _matched(cls, ckpt: SvCheckpoint) -> tuple[ERes2NetV2, dict[str, Tensor]]:
        """The architecture the weights describe (built on the current default device), and the weights it loads."""
        sd = {k: v for k, v in ckpt.state_dict.items() if not k.startswith(("seg_1.", "seg_2.", "seg_bn_1."))}
        counts: list[int] = []
        for layer in range(1, 5):
            idx = {int(m.group(1)) for k in sd if (m := re.match(rf"layer{layer}\.(\d+)\.", k))}
            counts.append(max(idx) + 1 if idx else 0)
        if min(counts) < 1:
            raise ModelFormatError(f"speaker-verification weights lack layer blocks (found {counts} per layer); "
                                   "download sv/pretrained_eres2netv2w24s4ep4.ckpt again.")
        model = cls(ckpt.m_channels, tuple(counts))
        expected = model.state_dict()
        missing = sorted(set(expected) - set(sd))
        unexpected = sorted(set(sd) - set(expected))
        wrong = [f"{k} {tuple(v.shape)} != {tuple(expected[k].shape)}" for k, v in sd.items()
                 if k in expected and v.shape != expected[k].shape]
        if missing or unexpected or wrong:
            raise ModelFormatError(
                "speaker-verification weights do not match an ERes2NetV2 (baseWidth 24, scale 4, expansion 4) with "
                f"m_channels={ckpt.m_channels}: missing {_some(missing)}, unexpected {_some(unexpected)}, "
                f"mis-shaped {_some(wrong)}; use upstream's sv/pretrained_eres2netv2w24s4ep4.ckpt."
            )
        return model, sd


class SpeakerEncoder:
    """32 kHz reference clips -> SV features for a v2Pro SoVITS (resample, filter banks, ERes2NetV2).

    Parameters
    ----------
    model:
        the loaded :class:`ERes2NetV2` (its device and dtype are used; filter banks are computed in fp32).
    """

    def __init__(self, model: ERes2NetV2) -> None:
        self.model = model

    @property
    def dim(self) -> int:
        """``sv_dim``: width of one embedding (20480 for the released model)."""
        return self.model.out_dim

    @torch.inference_mode()
    def embed(self, wav32k: Tensor | np.ndarray) -> Tensor:
        """One reference clip -> ``sv_emb [1, sv_dim]`` float32 (upstream ``compute_embedding3`` of its 16 kHz twin).

        Parameters
        ----------
        wav32k:
            ``[N]`` or ``[1, N]`` float32 @ 32 kHz, ``N >= 800`` (one 25 ms frame at 16 kHz); clips louder than full
            scale are divided by ``min(2, peak)`` first, the rule the SoVITS spectrogram uses.
        """
        x = torch.as_tensor(wav32k).float().reshape(1, -1)
        peak = float(x.abs().max()) if x.numel() else 0.0
        if peak > 1.0:
            x = x / min(MAX_PEAK_DIVISOR, peak)
        p = next(self.model.parameters())
        feats = fbank(resample_32k_to_16k(x.to(p.device)))  # [1, T, 80] fp32
        return self.model(feats.to(p.dtype)).float()


class LazySpeakerEncoder:
    """The SV model of a v2Pro engine, built on first use (it is needed only when a voice is encoded).

    Its weight names and shapes are checked at once (on the meta device), and so is its output width against the
    SoVITS's ``sv_emb`` input, so a wrong or damaged file is reported at start-up, not at the first enrollment.

    Parameters
    ----------
    path:
        ``sv/pretrained_eres2netv2w24s4ep4.ckpt`` (or a model of the same architecture).
    device:
        where it runs; always fp32 (it runs once per voice, and its conformance is proven in fp32).
    sv_dim:
        the width the SoVITS reads (``SovitsConfig.sv_dim``).

    Raises
    ------
    ModelFormatError
        the file is not a matching ERes2NetV2, or its features are not ``sv_dim`` wide.
    """

    def __init__(self, path: str | os.PathLike[str], device: str, sv_dim: int) -> None:
        width = ERes2NetV2.validate(load_sv_checkpoint(path))
        if width != sv_dim:
            raise ModelFormatError(f"{path}: this speaker-verification model gives {width}-wide features but the "
                                   f"SoVITS reads {sv_dim}; use the SV model of the SoVITS's own set "
                                   "(sv/pretrained_eres2netv2w24s4ep4.ckpt for upstream's v2Pro/v2ProPlus)")
        self.path = path
        self._device = device
        # (unloaded after engines.runtime.IDLE_UNLOAD_S unused: 54 M weights, 0.2 GiB, for the voices made)
        self.model: IdleUnloaded[SpeakerEncoder] = IdleUnloaded(self._load, "the SV model")

    def get(self) -> SpeakerEncoder:
        """The loaded encoder (loads it if it is not; ModelFormatError if the file is wrong)."""
        return self.model.get()

    def _load(self) -> SpeakerEncoder:
        return SpeakerEncoder(ERes2NetV2.from_checkpoint(load_sv_checkpoint(self.path), self._device, torch.float32))


def require_sv_model(models: ModelPaths, version: str) -> Path:
    """The speaker-verification model file a ``version`` (v2Pro/v2ProPlus) SoVITS needs: ``models.sv``.

    Every engine asks here, so the rule and the message are one; the file's fingerprint belongs in the engine's
    model id (a voice's style depends on the SV model too).

    Raises
    ------
    EngineError
        ``models.sv`` is not configured or does not exist; the message says where to get it.
    """
    sv = getattr(models, "sv", None)
    if sv is None or not Path(sv).is_file():
        raise EngineError(f"the {version} SoVITS {models.sovits} needs the speaker-verification model "
                          f"sv/pretrained_eres2netv2w24s4ep4.ckpt ({sv or 'not configured'} does not exist): download "
                          "it from upstream's pretrained set (Hugging Face lj1995/GPT-SoVITS, folder sv/) and point "
                          "models.sv in config.yaml at it")
    return Path(sv)


def speaker_features(speaker: LazySpeakerEncoder | None, version: str, refs32k: Sequence[np.ndarray]) -> np.ndarray:
    """``Engine.encode_speaker`` of a v2Pro/v2ProPlus SoVITS, for every backend: the SV features ``[n_refs, sv_dim]``
    float32 of each 32 kHz clip, from ``speaker`` (None: the engine was built without the SV model)."""
    if speaker is None:
        raise EngineError(f"the {version} SoVITS needs the speaker-verification model: "
                          "point models.sv at sv/pretrained_eres2netv2w24s4ep4.ckpt")
    if not refs32k:
        raise EngineError("encode_speaker needs at least one 32 kHz reference clip")
    encoder = speaker.get()
    return torch.cat([encoder.embed(np.asarray(w, np.float32)) for w in refs32k]).cpu().numpy()


def speaker_rows(sv_emb: np.ndarray, n_refs: int, device: torch.device | str = "cpu") -> list[Tensor]:
    """``sv_emb [n_refs, sv_dim]`` as one ``[1, sv_dim]`` tensor per reference clip (``ref_style``'s input)."""
    feats = np.asarray(sv_emb, np.float32)
    if feats.ndim != 2 or feats.shape[0] != n_refs:
        raise EngineError(f"sv_emb has {feats.shape[0]} rows for {n_refs} reference clips")
    return [torch.as_tensor(row, device=device).view(1, -1) for row in feats]


def check_voice(voice: VoicePrompt, version: str, sv_dim: int, gin: int) -> None:
    """Refuse a voice whose style was made for another kind of SoVITS (never mix a v2 style into a v2Pro model).

    ``version``, ``sv_dim`` (0 for v2) and ``gin`` describe the loaded SoVITS (:class:`SovitsConfig` fields, or an
    export manifest's).

    Raises
    ------
    EngineError
        the voice lacks SV features for a v2Pro model, has them for a v2 model, was fused with SV features of
        another width, or its ``ge`` is not ``[gin, 1]``; the message says to re-encode the voice.
    """
    redo = "re-encode the voice from its stored reference clip with the loaded model"
    if sv_dim > 0:
        if voice.sv_emb is None:
            raise EngineError(f"this voice has no speaker-verification features (VoicePrompt.sv_emb): it was "
                              f"encoded for a plain v2 SoVITS, but the loaded SoVITS is {version}: {redo}, keeping "
                              "its sv_emb")
        if voice.sv_emb.ndim != 2 or voice.sv_emb.shape[1] != sv_dim:
            raise EngineError(f"this voice's speaker-verification features are {tuple(voice.sv_emb.shape)}, the "
                              f"loaded {version} SoVITS reads [n_refs, {sv_dim}]: {redo}")
    elif voice.sv_emb is not None:
        raise EngineError(f"this voice was encoded for a v2Pro/v2ProPlus SoVITS but the loaded SoVITS is plain "
                          f"v2: {redo}")
    if voice.ge.size != gin:
        raise EngineError(f"this voice's style vector has {voice.ge.size} values, the loaded SoVITS uses {gin}: "
                          f"{redo}")


def _some(names: Sequence[str], n: int = 5) -> str:
    """At most ``n`` names for an error message, with a count of the rest."""
    if not names:
        return "none"
    more = f" (+{len(names) - n} more)" if len(names) > n else ""
    return ", ".join(names[:n]) + more
