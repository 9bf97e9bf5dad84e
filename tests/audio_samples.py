"""Synthetic "speech" for tests: voiced harmonics in syllables with pauses, at a chosen pitch."""

from __future__ import annotations

import io

import numpy as np
import soundfile as sf


def speech_like(seconds: float = 4.0, f0: float = 140.0, seed: int = 0, sr: int = 32000) -> np.ndarray:
    """``[N]`` float32: syllables (~180 ms) separated by short gaps, words by longer pauses."""
    rng = np.random.default_rng(seed)
    n = int(seconds * sr)
    t = np.arange(n) / sr
    pitch = f0 * (1 + 0.06 * np.sin(2 * np.pi * 0.9 * t + seed))
    phase = 2 * np.pi * np.cumsum(pitch) / sr
    voiced = sum(np.sin(k * phase + rng.uniform(0, 6.28)) / k for k in range(1, 9))
    env = np.zeros(n)
    pos = int(0.2 * sr)
    while pos < n - int(0.2 * sr):
        for _ in range(rng.integers(1, 4)):  # a word of 1-3 syllables
            length = int(rng.uniform(0.12, 0.25) * sr)
            end = min(pos + length, n)
            env[pos:end] = np.hanning(end - pos)
            pos = end + int(0.04 * sr)
        pos += int(rng.uniform(0.15, 0.35) * sr)
    x = 0.3 * voiced * env + 0.002 * rng.standard_normal(n)
    return x.astype(np.float32)


def speech_like_wav(seconds: float = 4.0, f0: float = 140.0, seed: int = 0, sr: int = 32000) -> bytes:
    """The same as WAV file bytes."""
    buf = io.BytesIO()
    sf.write(buf, speech_like(seconds, f0, seed, sr), sr, format="WAV")
    return buf.getvalue()
