"""Speech for tests: the committed recordings (tests/data/speech), moved to a chosen pitch and length.

An earlier generator made "speech" of harmonics in syllables; the voice detector (Silero VAD) hears little or none of
that as a voice, and a clip it hears no voice in is refused like music (synthesis.audio.prepare_reference). Real
recorded speech, pitch-shifted by the resample trick, is heard as a voice at every pitch the tests use.
"""

from __future__ import annotations

import io
from functools import cache
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

SPEECH_DIR = Path(__file__).resolve().parent / "data" / "speech"
SPEECH_RATE = 16_000  # Hz, rate of the committed speech files
BASE_F0_HZ = 89.0  # Hz, median pitch of speaker_a (synthesis.speakers.pitch over the whole file)
WORD_GAP_S = 0.1  # s, a quieter stretch at least this long in a recording separates two words
WORD_LEVEL = 0.01  # |x| of a recording (peak 0.5) below which it is a pause between words
LOOP_PAUSE_S = 0.3  # s of pause where the recording starts over to fill a longer clip


def speech_like(seconds: float = 4.0, f0: float = 140.0, seed: int = 0, sr: int = 32000,
                lead_s: float = 0.2) -> np.ndarray:
    """``[N]`` float32 @ ``sr``: recorded speech (speaker_a) with a median pitch of ``f0`` Hz, peak about 0.5.

    ``f0`` moves pitch, formants and tempo together (the recording played faster or slower: another voice to a
    listener); ``seed`` picks the word it starts on. It starts after ``lead_s`` of pause and ends mid-word or in a
    pause, over -54 dBFS room noise; the recording starts over after a short pause when ``seconds`` needs more.
    """
    words, onsets = _shifted(f0, sr)
    rng = np.random.default_rng(seed)
    n = int(seconds * sr)
    out = np.zeros(n, np.float32)
    pos = int(lead_s * sr)
    src = int(onsets[seed % len(onsets)])
    while pos < n:
        take = min(words.size - src, n - pos)
        out[pos : pos + take] = words[src : src + take]
        pos += take + int(LOOP_PAUSE_S * sr)
        src = int(onsets[0])
    out += (0.002 * rng.standard_normal(n)).astype(np.float32)
    return out


@cache
def _shifted(f0: float, sr: int) -> tuple[np.ndarray, np.ndarray]:
    """speaker_a at ``f0`` Hz, as ``sr`` samples, without its trailing pause; and the sample where each word starts."""
    a = recorded_speech("speaker_a")
    loud = np.flatnonzero(np.abs(a) > WORD_LEVEL)
    a = a[: loud[-1] + 1]
    factor = f0 / BASE_F0_HZ  # played this much faster: pitch and formants times factor
    x = np.asarray(soxr.resample(a, SPEECH_RATE * factor, sr), np.float32)
    hop = int(0.01 * sr)
    level = np.abs(x[: x.size // hop * hop]).reshape(-1, hop).max(axis=1)  # [F] peak per 10 ms
    quiet = level < WORD_LEVEL
    gap = int(WORD_GAP_S / 0.01)
    onsets = [0] + [i * hop for i in range(gap, quiet.size) if not quiet[i] and quiet[i - gap : i].all()]
    return x, np.asarray(sorted(set(onsets)), np.int64)


def speech_like_wav(seconds: float = 4.0, f0: float = 140.0, seed: int = 0, sr: int = 32000) -> bytes:
    """The same as WAV file bytes."""
    buf = io.BytesIO()
    sf.write(buf, speech_like(seconds, f0, seed, sr), sr, format="WAV")
    return buf.getvalue()


# --- recorded speech (tests/data/speech, two espeak-ng voices) and uploads built around it --------------------------


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


# --- sounds that are not a voice: loud, with pauses like speech, so only the voice detector can refuse them -----------


def plucked_melody(seconds: float, sr: int, seed: int = 0) -> np.ndarray:
    """``[N]`` float32: a melody of plucked notes (harmonics that decay), 0.15-0.4 s each, some with a rest after."""
    rng = np.random.default_rng(seed)
    n = int(seconds * sr)
    out = np.zeros(n)
    pos = 0
    while pos < n:
        length = min(int(rng.uniform(0.15, 0.4) * sr), n - pos)
        t = np.arange(length) / sr
        f = 196.0 * 2 ** (rng.integers(0, 15) / 12)  # G3 and up, on the scale's semitones
        note = sum(np.sin(2 * np.pi * f * k * t) * 0.6**k for k in range(1, 7)) * np.exp(-t / 0.12)
        out[pos : pos + length] += note
        pos += length + (int(rng.uniform(0.1, 0.3) * sr) if rng.random() < 0.4 else 0)
    return (0.3 * out / np.max(np.abs(out))).astype(np.float32)


def beeps(seconds: float, sr: int, hz: float = 1000.0, on_s: float = 0.2, off_s: float = 0.15) -> np.ndarray:
    """``[N]`` float32: a pure tone switched on and off (a phone's beeps, a test tone with gaps)."""
    n = int(seconds * sr)
    t = np.arange(n) / sr
    on = (t % (on_s + off_s)) < on_s
    return (0.3 * np.sin(2 * np.pi * hz * t) * on).astype(np.float32)


def noise_bursts(seconds: float, sr: int, seed: int = 0) -> np.ndarray:
    """``[N]`` float32: bursts of noise with a square-wave buzz, 80-250 ms long and 30-120 ms apart, in word-like
    groups: loud and rhythmic like speech, but no voice."""
    rng = np.random.default_rng(seed)
    out = np.zeros(int(seconds * sr), np.float32)
    pos = 0
    while True:
        n = int(rng.uniform(0.08, 0.25) * sr)
        if pos + n > out.size:
            break
        t = np.arange(n) / sr
        env = np.sin(np.pi * np.arange(n) / n) ** 0.5
        buzz = np.sign(np.sin(2 * np.pi * rng.uniform(100, 220) * t)) * 0.5 + rng.standard_normal(n)
        out[pos : pos + n] = (0.2 * rng.uniform(0.5, 1.0) * env * buzz / 1.5).astype(np.float32)
        pos += n + int(rng.uniform(0.03, 0.12) * sr)
    return out


def _rests(seconds: float, sr: int, bar_s: float = 1.0, rest_s: float = 0.25) -> np.ndarray:
    """``[N]`` float32 gate: 1, then 0 for the last ``rest_s`` of every ``bar_s``."""
    t = np.arange(int(seconds * sr)) / sr
    return ((t % bar_s) < bar_s - rest_s).astype(np.float32)


NOT_A_VOICE = {  # name: (seconds, sr) -> [N] float32, each long enough to hold 3-10 s of "speech" by loudness
    "music (plucked melody)": lambda s, sr: plucked_melody(s, sr, seed=1),
    "music (chords with rests)": lambda s, sr: _music_like(s, sr, seed=3) * _rests(s, sr),
    "beeps (1 kHz with gaps)": lambda s, sr: beeps(s, sr),
    "low beeps (220 Hz with gaps)": lambda s, sr: beeps(s, sr, hz=220.0, on_s=0.3, off_s=0.2),
    "noise bursts with a buzz": lambda s, sr: noise_bursts(s, sr, seed=7),
}
