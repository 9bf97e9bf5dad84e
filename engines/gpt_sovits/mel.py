"""The reference mel front-end of the diffusion families (upstream ``mel_spectrogram_torch``, ``norm_spec``, and
``TTS.resample``; reference section 5).

A voice's mel prompt is the raw reference clip (stereo averaged, *no* loudness normalisation) resampled to the
family's mel rate (32 kHz for v4/v5, 24 kHz for v3) by a Hann-windowed sinc (torchaudio's ``sinc_interp_hann``,
6 zero crossings, roll-off 0.99), then ``ln(max(mel, 1e-5))`` of a Slaney-scale, area-normalised 100-band mel
filter bank over ``sqrt(|STFT|^2 + 1e-8)`` (periodic Hann, reflect pad ``(n_fft - hop) / 2``, no centring), then
mapped to about [-1, 1] by :func:`norm_spec` before the sampler; :func:`denorm_spec` undoes it before the vocoder.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["resample", "log_mel", "mel_frames", "norm_spec", "denorm_spec", "mel_filters"]

N_MELS = 100  # mel bands of every diffusion family
MAG_EPS = 1e-8  # added under the square root of the magnitude
LOG_FLOOR = 1e-5  # the mel is clamped to this before the log
SPEC_MIN, SPEC_MAX = -12.0, 2.0  # log-mel range mapped to [-1, 1] by norm_spec
RESAMPLE_ZEROS = 6  # lowpass_filter_width: sinc zero crossings each side
RESAMPLE_ROLLOFF = 0.99  # cut-off as a fraction of the lower Nyquist frequency
# Slaney mel scale (librosa's default, htk=False): linear below 1 kHz, logarithmic above
_SLANEY_F_SP = 200.0 / 3  # Hz per mel in the linear part
_SLANEY_MIN_LOG_HZ = 1000.0
_SLANEY_LOGSTEP = math.log(6.4) / 27.0


@lru_cache(maxsize=16)
def _sinc_kernel(orig: int, new: int) -> tuple[Tensor, int]:
    """The ``[new, 1, 2 * width + orig]`` float32 kernel and pad width for reduced rates ``orig -> new``."""
    base = min(orig, new) * RESAMPLE_ROLLOFF
    width = math.ceil(RESAMPLE_ZEROS * orig / base)
    idx = torch.arange(-width, width + orig, dtype=torch.float64)[None, None] / orig
    t = (torch.arange(0, -new, -1, dtype=torch.float64)[:, None, None] / new + idx) * base
    t = t.clamp(-RESAMPLE_ZEROS, RESAMPLE_ZEROS)
    window = torch.cos(t * math.pi / RESAMPLE_ZEROS / 2) ** 2
    t = t * math.pi
    sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / torch.where(t == 0, torch.ones_like(t), t))
    return (sinc * window * (base / orig)).float(), width


def resample(wav: Tensor | np.ndarray, orig_rate: int, new_rate: int) -> Tensor:
    """Band-limited resampling as torchaudio's ``Resample(orig_rate, new_rate)`` with its defaults.

    Parameters
    ----------
    wav:
        ``[..., N]`` float audio at ``orig_rate``.

    Returns
    -------
    Tensor
        ``[..., ceil(N * new_rate / orig_rate)]`` float32 at ``new_rate`` (the input itself, as float32, if the
        rates are equal).
    """
    x = torch.as_tensor(wav).float()
    if orig_rate <= 0 or new_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_rate} -> {new_rate}")
    if orig_rate == new_rate:
        return x
    g = math.gcd(orig_rate, new_rate)
    orig, new = orig_rate // g, new_rate // g
    kernel, width = _sinc_kernel(orig, new)
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    n = flat.shape[-1]
    padded = F.pad(flat, (width, width + orig))
    out = F.conv1d(padded[:, None], kernel.to(x.device), stride=orig)  # [B, new, blocks]
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)[:, : math.ceil(new * n / orig)]
    return out.reshape(*shape[:-1], out.shape[-1])


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
    """Slaney mel of frequencies in Hz."""
    mel = f / _SLANEY_F_SP
    log_part = _SLANEY_MIN_LOG_HZ / _SLANEY_F_SP + np.log(np.maximum(f, 1e-10) / _SLANEY_MIN_LOG_HZ) / _SLANEY_LOGSTEP
    return np.where(f >= _SLANEY_MIN_LOG_HZ, log_part, mel)


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
    """Frequencies in Hz of Slaney mels."""
    min_log_mel = _SLANEY_MIN_LOG_HZ / _SLANEY_F_SP
    return np.where(m >= min_log_mel, _SLANEY_MIN_LOG_HZ * np.exp(_SLANEY_LOGSTEP * (m - min_log_mel)),
                    _SLANEY_F_SP * m)


@lru_cache(maxsize=8)
def mel_filters(rate: int, n_fft: int, n_mels: int = N_MELS) -> Tensor:
    """librosa's ``filters.mel(sr=rate, n_fft=n_fft, n_mels=n_mels)`` (fmin 0, fmax rate/2, Slaney scale and
    area normalisation): ``[n_mels, n_fft // 2 + 1]`` float32 triangles."""
    fft_freqs = np.linspace(0, rate / 2, 1 + n_fft // 2)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(rate / 2.0)), n_mels + 2))
    widths = np.diff(edges)
    ramps = edges[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper)) * (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return torch.tensor(weights, dtype=torch.float32)


def mel_frames(n_samples: int, n_fft: int, hop: int) -> int:
    """Frames :func:`log_mel` gives for ``n_samples``: ``(N + n_fft - hop - n_fft) // hop + 1``."""
    return (n_samples - hop) // hop + 1


_windows: dict[tuple[int, torch.device], Tensor] = {}


def log_mel(wav: Tensor | np.ndarray, rate: int, n_fft: int, hop: int) -> Tensor:
    """Natural-log mel spectrogram (upstream ``mel_spectrogram_torch`` with ``win = n_fft``, 100 mels, fmin 0).

    Parameters
    ----------
    wav:
        ``[B, N]`` or ``[N]`` float audio at ``rate`` Hz, ``N > (n_fft - hop) / 2``.

    Returns
    -------
    Tensor
        ``[B, 100, mel_frames(N)]`` float32 ``ln(max(mel, 1e-5))``.
    """
    x = torch.as_tensor(wav).float()
    if x.dim() == 1:
        x = x[None]
    pad = (n_fft - hop) // 2
    if x.dim() != 2 or x.shape[-1] <= max(pad, hop - 1):
        raise ValueError(f"wav must be [B, N] with N > {max(pad, hop - 1)} samples, got {tuple(x.shape)}")
    key = (n_fft, x.device)
    window = _windows.get(key)
    if window is None:
        window = _windows[key] = torch.hann_window(n_fft, periodic=True, device=x.device)
    x = F.pad(x[:, None], (pad, pad), mode="reflect")[:, 0]
    spec = torch.stft(x, n_fft, hop_length=hop, win_length=n_fft, window=window, center=False, onesided=True,
                      return_complex=True)
    mag = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + MAG_EPS)  # [B, n_fft/2+1, frames]
    mel = torch.matmul(mel_filters(rate, n_fft).to(x.device), mag)
    return torch.log(torch.clamp(mel, min=LOG_FLOOR))


def norm_spec(x: Tensor) -> Tensor:
    """Log-mel -> the sampler's domain: ``[-12, 2]`` mapped linearly to ``[-1, 1]``."""
    return (x - SPEC_MIN) / (SPEC_MAX - SPEC_MIN) * 2 - 1


def denorm_spec(y: Tensor) -> Tensor:
    """The sampler's domain -> log-mel (inverse of :func:`norm_spec`)."""
    return (y + 1) / 2 * (SPEC_MAX - SPEC_MIN) + SPEC_MIN
