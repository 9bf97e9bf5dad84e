"""The reference stretch is chosen by voice activity (Silero VAD), not loudness: noise and music beside speech stay out.

The speech is two committed espeak-ng voices (tests/data/speech); the other sounds are generated here. The same
clips with the detector switched off show the energy gate's mistake the detector fixes (issue 16, item 8).
"""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from synthesis import audio, vad
from synthesis.types import AudioInputError
from synthesis.vad import VAD_FRAME, model_path, speech_probability
from tests.audio_samples import NOT_A_VOICE, SPEECH_RATE, beeps, recorded_speech, speech_like, upload_scenarios


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


@pytest.mark.parametrize("name", list(NOT_A_VOICE))
def test_a_clip_without_a_voice_is_refused_in_one_line(name: str) -> None:
    """Music, tones and noise bursts: loud, with pauses like speech; before, loudness alone made them a voice."""
    x = NOT_A_VOICE[name](12.0, 48_000)
    data = audio.encode_audio(x, 48_000, "flac")
    dec = audio.decode_upload(data, "clip.flac", max_bytes=10**7, max_seconds=60.0)
    with pytest.raises(AudioInputError) as e:
        audio.prepare_reference(dec)
    assert str(e.value) == ("no speech found: the voice detector hears no one speaking in this 12.0 s clip (0.0 s of "
                            "voice), only music, tones or noise; record yourself speaking")
    with mock.patch.object(audio, "_voice_frames", lambda *a: None):  # what loudness alone made of it
        assert audio.prepare_reference(dec).duration_s >= 3.0


@pytest.mark.parametrize("f0,seed", [(100.0, 0), (140.0, 1), (180.0, 9), (250.0, 3)])
def test_the_tests_speech_is_a_voice_to_the_detector(f0: float, seed: int) -> None:
    """tests.audio_samples.speech_like (every test's voice clip) is accepted by the rule that refuses the above."""
    ref = audio.prepare_reference(audio.Decoded(speech_like(4.0, f0, seed, 32000), 32000, 4.0))
    assert 3.0 <= ref.duration_s <= 4.0 and ref.warnings == [] and not ref.speech_left_out, ref


def test_without_the_detector_loudness_decides_and_the_person_is_told(monkeypatch) -> None:
    """silero-vad missing (model_path None): tones with gaps pass for speech, and the warning says so and who fixes it."""
    monkeypatch.setattr(vad, "model_path", lambda: None)
    monkeypatch.setattr(vad, "_session", None)
    monkeypatch.setattr(vad, "_unavailable", None)
    assert vad.speech_probability(recorded_speech()) is None
    x = beeps(8.0, SPEECH_RATE)
    ref = audio.prepare_reference(audio.Decoded(x, SPEECH_RATE, 8.0))
    assert ref.warnings[0] == audio.NO_DETECTOR_WARNING and "\n" not in audio.NO_DETECTOR_WARNING
    speech = audio.prepare_reference(audio.Decoded(recorded_speech(), SPEECH_RATE, 9.03))
    assert speech.warnings == [audio.NO_DETECTOR_WARNING] and speech.duration_s >= 7.0
