"""The reference stretch is chosen by voice activity (Silero VAD), not loudness: noise and music beside speech stay out.

The speech is two committed espeak-ng voices (tests/data/speech); the other sounds are generated here. The same
clips with the detector switched off show the energy gate's mistake the detector fixes (issue 16, item 8).
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from synthesis import audio
from synthesis.vad import VAD_FRAME, model_path, speech_probability
from tests.audio_samples import SPEECH_RATE, recorded_speech, upload_scenarios


def _speech_share(x: np.ndarray, spans: list[tuple[float, float, str]], ref: audio.Reference) -> tuple[float, float]:
    """(seconds of speech, seconds of anything else loud) inside the chosen stretch."""
    speech = other = 0.0
    for s, e, what in spans:
        sec = max(0.0, min(ref.end_s, e) - max(ref.start_s, s))
        if what.startswith("speech"):
            speech += sec
        else:
            other += sec
    return speech, other


def test_the_model_ships_with_the_package() -> None:
    assert model_path() is not None, "the silero-vad package (a dependency in pyproject.toml) is not installed"


def test_probability_tells_speech_from_noise_and_tones() -> None:
    speech = recorded_speech("speaker_a")
    p = speech_probability(speech)
    assert p is not None and p.size == -(-speech.size // VAD_FRAME)
    assert float(np.mean(p >= 0.5)) > 0.75  # espeak's sentences with their short pauses
    noise = (0.3 * np.random.default_rng(0).standard_normal(5 * SPEECH_RATE)).astype(np.float32)
    t = np.arange(5 * SPEECH_RATE) / SPEECH_RATE
    chord = (0.1 * sum(np.sin(2 * np.pi * f * t) for f in (261.6, 329.6, 392.0))).astype(np.float32)
    for x in (noise, chord):
        q = speech_probability(x)
        assert q is not None and float(np.mean(q >= 0.5)) < 0.02


@pytest.mark.parametrize("name", ["noise burst beside speech", "noise burst after speech", "music then speech",
                                  "speech then music"])
def test_stretch_is_speech_not_the_loud_sound_beside_it(name: str) -> None:
    x, spans = upload_scenarios()[name]
    ref = audio.prepare_reference(audio.Decoded(x, SPEECH_RATE, x.size / SPEECH_RATE))
    speech, other = _speech_share(x, spans, ref)
    assert speech >= 7.0 and other <= 0.1, (ref.start_s, ref.end_s, speech, other)
    assert not any("noise" in w for w in ref.warnings), ref.warnings


def test_loudness_alone_takes_the_noise_burst() -> None:
    """The case of issue 16 without the detector: half of the stored reference was white noise."""
    x, spans = upload_scenarios()["noise burst beside speech"]
    with mock.patch.object(audio, "_voice_frames", lambda *a: None):
        ref = audio.prepare_reference(audio.Decoded(x, SPEECH_RATE, x.size / SPEECH_RATE))
    speech, other = _speech_share(x, spans, ref)
    assert other >= 4.0 and speech <= 6.0, (speech, other)


def test_signal_the_detector_does_not_hear_as_voice_falls_back_to_loudness() -> None:
    """Synthetic buzz is no voice to the detector; it is still accepted, chosen by loudness as before."""
    from tests.synthesis.test_audio import fake_speech

    x = np.zeros(SPEECH_RATE * 10, np.float32)
    x[2 * SPEECH_RATE : 8 * SPEECH_RATE] = fake_speech(6.0, SPEECH_RATE, seed=7)
    ref = audio.prepare_reference(audio.Decoded(x, SPEECH_RATE, 10.0))
    assert 1.7 <= ref.start_s <= 2.2 and 7.8 <= ref.end_s <= 8.3, (ref.start_s, ref.end_s)
