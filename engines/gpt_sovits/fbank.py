"""Kaldi-style log-mel filter banks, the input features of the v2Pro speaker-verification model.

Upstream calls ``kaldi.fbank(wav16k[None], num_mel_bins=80, sample_frequency=16000, dither=0)`` (its copy of
torchaudio's ``compliance.kaldi.fbank``) with every other option at Kaldi's default. Written here from those
defaults, per frame:

1. 25 ms (400-sample) frames every 10 ms (160 samples), only frames that fit (``snip_edges``):
   ``T = 1 + (N - 400) // 160``;
2. the frame's mean is removed (DC offset), then pre-emphasis ``x[n] - 0.97 x[n-1]`` with ``x[-1] := x[0]``;
3. the "povey" window ``hann(400, symmetric) ** 0.85``, zero-padded to 512 samples, power spectrum (257 bins);
4. 80 triangular filters evenly spaced on Kaldi's mel scale ``1127 ln(1 + f / 700)`` between 20 Hz and 8 kHz;
5. ``log(max(E, eps))`` with ``eps`` the float32 machine epsilon. No mean normalisation.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["fbank", "fbank_frames", "FBANK_BINS"]

FBANK_RATE = 16000  # Hz, the SV model's input rate
FBANK_BINS = 80  # mel filters
FRAME_LENGTH = 400  # samples per frame (25 ms @ 16 kHz)
FRAME_SHIFT = 160  # samples between frames (10 ms @ 16 kHz)
N_FFT = 512  # frame length rounded up to a power of two
PREEMPH = 0.97  # pre-emphasis coefficient
POVEY_POWER = 0.85  # Kaldi's "povey" window is a symmetric Hann window to this power
LOW_FREQ = 20.0  # Hz, lower edge of the first filter (Kaldi default)
HIGH_FREQ = FBANK_RATE / 2  # Hz, upper edge of the last filter (Kaldi's default high_freq=0 means Nyquist)
MEL_BREAK = 700.0  # Hz, Kaldi mel scale 1127 ln(1 + f / 700)
MEL_SCALE = 1127.0

_cache: dict[tuple[torch.device, torch.dtype], tuple[Tensor, Tensor]] = {}


def _constants(device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(window ``[400]``, filter bank ``[257, 80]``) for a device/dtype, built once.

    Both are computed in float32 in the same order of operations as Kaldi/torchaudio (scalar mel edges in double,
    the per-bin arithmetic in float32), not more exactly: low-energy bins are sums of tiny terms, and an exact
    filter bank would move their logs by ~2e-4, which the SV network then amplifies.
    """
    key = (device, dtype)
    hit = _cache.get(key)
    if hit is None:
        window = torch.hann_window(FRAME_LENGTH, periodic=False, dtype=torch.float32).pow(POVEY_POWER)
        lo = MEL_SCALE * math.log(1.0 + LOW_FREQ / MEL_BREAK)
        hi = MEL_SCALE * math.log(1.0 + HIGH_FREQ / MEL_BREAK)
        delta = (hi - lo) / (FBANK_BINS + 1)
        i = torch.arange(FBANK_BINS, dtype=torch.float32).unsqueeze(1)
        left, center, right = lo + i * delta, lo + (i + 1.0) * delta, lo + (i + 2.0) * delta  # [80, 1]
        freqs = (FBANK_RATE / N_FFT) * torch.arange(N_FFT // 2, dtype=torch.float32)
        bin_mel = (MEL_SCALE * (1.0 + freqs / MEL_BREAK).log()).unsqueeze(0)  # [1, 256]
        up = (bin_mel - left) / (center - left)
        down = (right - bin_mel) / (right - center)
        banks = torch.clamp(torch.minimum(up, down), min=0.0)  # [80, 256]
        banks = F.pad(banks, (0, 1))  # the Nyquist bin gets weight 0
        hit = (window.to(device, dtype), banks.t().contiguous().to(device, dtype))
        _cache[key] = hit
    return hit


def fbank_frames(n_samples: int) -> int:
    """Frames :func:`fbank` returns for ``n_samples`` of 16 kHz audio (0 if shorter than one frame)."""
    return 0 if n_samples < FRAME_LENGTH else 1 + (n_samples - FRAME_LENGTH) // FRAME_SHIFT


def fbank(wav16k: Tensor) -> Tensor:
    """Log-mel filter-bank features of 16 kHz audio, as upstream's ``kaldi.fbank(..., dither=0)``.

    Parameters
    ----------
    wav16k:
        ``[B, N]`` (or ``[N]``) float @ 16 kHz, ``N >= 400``; each row is one clip (computed independently).

    Returns
    -------
    Tensor
        ``[B, T, 80]`` in the input's float dtype, ``T = 1 + (N - 400) // 160``.
    """
    x = wav16k if wav16k.dim() == 2 else wav16k.unsqueeze(0)
    if x.dim() != 2:
        raise ValueError(f"wav16k must be [B, N] or [N], got shape {tuple(wav16k.shape)}")
    if x.shape[1] < FRAME_LENGTH:
        raise ValueError(f"audio is too short for filter banks: {x.shape[1]} samples @ 16 kHz (need {FRAME_LENGTH})")
    if not x.is_floating_point():
        x = x.float()
    window, banks = _constants(x.device, x.dtype)
    frames = x.unfold(1, FRAME_LENGTH, FRAME_SHIFT)  # [B, T, 400]
    frames = frames - frames.mean(dim=-1, keepdim=True)
    prev = torch.cat([frames[..., :1], frames[..., :-1]], dim=-1)
    frames = (frames - PREEMPH * prev) * window
    # [B, T, 257] complex (torch.fft has no type information)
    spectrum = cast(Tensor, torch.fft.rfft(frames, n=N_FFT))  # pyright: ignore[reportUnknownMemberType]
    power = spectrum.abs().pow(2)
    energies = torch.matmul(power, banks)  # [B, T, 80]
    eps = torch.finfo(torch.float32).eps  # Kaldi/torchaudio floor the energies at float32 epsilon
    return torch.clamp(energies, min=eps).log()

