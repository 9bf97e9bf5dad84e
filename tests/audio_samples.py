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


# --- recorded speech (tests/data/speech, two espeak-ng voices) and uploads built around it --------------------------

SPEECH_DIR = __import__("pathlib").Path(__file__).resolve().parent / "data" / "speech"
SPEECH_RATE = 16_000  # Hz, rate of the committed speech files


def recorded_speech(name: str = "speaker_a") -> np.ndarray:
    """``[N]`` float32 @ 16 kHz: one of the committed voices (``speaker_a``, ``speaker_b``), peak 0.5."""
    import av

    with av.open(str(SPEECH_DIR / f"{name}.ogg")) as f:
        parts = [fr.to_ndarray().reshape(-1) for fr in f.decode(audio=0)]
        rate = f.streams.audio[0].rate
    x = np.concatenate(parts).astype(np.float32)
    if rate != SPEECH_RATE:
        import soxr

        x = np.asarray(soxr.resample(x, rate, SPEECH_RATE), np.float32)
    return x


def _music_like(seconds: float, sr: int, seed: int) -> np.ndarray:
    """Chords of harmonic tones changing every 0.5 s with a beat envelope: loud, pitched, rhythmic, not a voice."""
    rng = np.random.default_rng(seed)
    n = int(seconds * sr)
    t = np.arange(n) / sr
    out = np.zeros(n)
    step = int(0.5 * sr)
    for s in range(0, n, step):
        root = 220.0 * 2 ** (rng.integers(0, 12) / 12)
        seg = slice(s, min(s + step, n))
        for ratio in (1.0, 1.26, 1.5):
            out[seg] += sum(np.sin(2 * np.pi * root * ratio * k * t[seg]) / k**1.5 for k in range(1, 5))
    beat = 0.6 + 0.4 * np.abs(np.sin(2 * np.pi * 2.0 * t))
    return (0.12 * out * beat).astype(np.float32)


def upload_scenarios(sr: int = SPEECH_RATE) -> dict[str, tuple[np.ndarray, list[tuple[float, float, str]]]]:
    """Uploads with speech beside other loud sounds, and where each part lies.

    Returns ``{name: (samples [N] float32 @ sr, [(start_s, end_s, what), ...])}`` where ``what`` is ``speech_a``,
    ``speech_b``, ``noise`` or ``music``; the rest is a quiet room (-66 dBFS noise).
    """
    assert sr == SPEECH_RATE
    a, b = recorded_speech("speaker_a"), recorded_speech("speaker_b")
    rng = np.random.default_rng(11)

    def build(total_s: float, parts: list[tuple[float, np.ndarray, str]]):
        x = (0.0005 * rng.standard_normal(int(total_s * sr))).astype(np.float32)
        spans = []
        for start_s, sig, what in parts:
            i = int(start_s * sr)
            x[i : i + sig.size] += sig[: x.size - i]
            spans.append((start_s, start_s + sig.size / sr, what))
        return x, spans

    noise = (0.3 * rng.standard_normal(5 * sr)).astype(np.float32)  # 5 s white-noise burst, louder than the speech
    music = _music_like(8.0, sr, seed=3)
    return {
        # issue 16's case: a 43 s clip, a 5 s white-noise burst right before the speech
        "noise burst beside speech": build(43.0, [(14.0, noise, "noise"), (19.0, a, "speech_a")]),
        "noise burst after speech": build(43.0, [(10.0, a, "speech_a"), (a.size / sr + 10.0, noise, "noise")]),
        "music then speech": build(30.0, [(2.0, music, "music"), (10.5, a, "speech_a")]),
        "speech then music": build(30.0, [(1.0, b, "speech_b"), (10.3, music, "music")]),
        "two speakers": build(24.0, [(1.0, a, "speech_a"), (10.5, b, "speech_b")]),
    }
