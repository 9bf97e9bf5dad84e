"""The reference linear spectrogram SoVITS reads its style from (upstream ``spectrogram_torch``, section 3(b)).

Magnitude STFT, not log-scaled, not mel: reflect-pad 704 samples on each side, periodic Hann window of 2048,
hop 640, no centring, ``sqrt(re^2 + im^2 + 1e-8)``. 50 frames per second of 32 kHz audio.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["linear_spectrogram", "reference_spec_input", "spectrogram_frames"]

N_FFT = 2048  # samples per STFT window @ 32 kHz
HOP = 640  # samples between frames @ 32 kHz (20 ms)
N_BINS = N_FFT // 2 + 1  # 1025 linear-frequency bins
PAD = (N_FFT - HOP) // 2  # 704 samples reflected on each side
MAG_EPS = 1e-8  # added under the square root, as upstream
MAX_PEAK_DIVISOR = 2.0  # reference clips louder than full scale are divided by min(2, peak)

_windows: dict[tuple[torch.device, torch.dtype], Tensor] = {}


def _window(device: torch.device, dtype: torch.dtype) -> Tensor:
    """The periodic Hann window for a device/dtype, built once."""
    key = (device, dtype)
    w = _windows.get(key)
    if w is None:
        w = _windows[key] = torch.hann_window(N_FFT, periodic=True, device=device, dtype=dtype)
    return w


def spectrogram_frames(n_samples: int) -> int:
    """Frames :func:`linear_spectrogram` returns for ``n_samples`` of audio: ``1 + (N + 1408 - 2048) // 640``."""
    return 1 + (n_samples + 2 * PAD - N_FFT) // HOP


def linear_spectrogram(wav: Tensor | np.ndarray) -> Tensor:
    """Linear magnitude spectrogram of 32 kHz audio.

    Parameters
    ----------
    wav:
        ``[B, N]`` (or ``[N]``) float32 @ 32 kHz, ``N > 704`` (the reflect pad needs it).

    Returns
    -------
    Tensor
        ``[B, 1025, frames]`` float32 on the input's device, ``frames = spectrogram_frames(N)``.
    """
    x = torch.as_tensor(wav)
    if x.dim() == 1:
        x = x.unsqueeze(0)
    if x.dim() != 2:
        raise ValueError(f"wav must be [B, N] or [N], got shape {tuple(x.shape)}")
    if x.shape[1] <= PAD:  # also guarantees at least one frame
        raise ValueError(f"wav is too short for a spectrogram: {x.shape[1]} samples (need more than {PAD})")
    x = x.float()
    x = F.pad(x.unsqueeze(1), (PAD, PAD), mode="reflect").squeeze(1)
    spec = torch.stft(
        x,
        N_FFT,
        hop_length=HOP,
        win_length=N_FFT,
        window=_window(x.device, x.dtype),
        center=False,
        normalized=False,
        onesided=True,
        return_complex=True,
    )
    ri = torch.view_as_real(spec)  # [B, 1025, frames, 2]
    return torch.sqrt(ri.pow(2).sum(-1) + MAG_EPS)


def reference_spec_input(wav: Tensor | np.ndarray) -> Tensor:
    """Spectrogram of a reference clip with upstream's loudness rule (``TTS._get_ref_spec``).

    If ``max|x| > 1`` the clip is divided by ``min(2, max|x|)`` first; otherwise it is used as is.

    Parameters
    ----------
    wav:
        ``[N]`` or ``[B, N]`` float32 @ 32 kHz (mono; resampling is the caller's job).

    Returns
    -------
    Tensor
        ``[B, 1025, frames]`` float32, as :func:`linear_spectrogram`.
    """
    x = torch.as_tensor(wav).float()
    peak = float(x.abs().max()) if x.numel() else 0.0
    if peak > 1.0:
        x = x / min(MAX_PEAK_DIVISOR, peak)
    return linear_spectrogram(x)
