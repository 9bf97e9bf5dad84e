"""A reference is one person: an upload with two speakers is split into turns and the stretch chosen inside one.

The clips are built from the committed espeak-ng voices and from ``speaker_a`` with its formants moved by the
resample trick (tests/speaker_samples.py says what each voice is). Every case's numbers, and the calibration on
long monologues: ``python tests/tools/measure_speakers.py --long``.
"""

from __future__ import annotations

import io
from unittest import mock

import numpy as np
import pytest
import soundfile as sf

from synthesis import audio
from synthesis import speakers
from synthesis.speakers import N_CEPS, mfcc, pitch, speaker_turns
from synthesis.types import AudioInputError
from synthesis.vad import VAD_FRAME_S, speech_probability
from tests.audio_samples import SPEECH_RATE, speech_like, upload_scenarios
from tests.speaker_samples import CASES, build, other_speech_inside
from tests.synthesis.conftest import CONSENT

SPLIT = [name for name, (_, n) in CASES.items() if n == 2]
ONE_VOICE = [name for name, (_, n) in CASES.items() if n == 1]
NOT_SPEAKERS = ["noise burst beside speech", "noise burst after speech", "music then speech", "speech then music"]


def _prepare(x: np.ndarray) -> audio.Reference:
    return audio.prepare_reference(audio.Decoded(x, SPEECH_RATE, x.size / SPEECH_RATE))


def _speaker_warnings(ref: audio.Reference) -> list[str]:
    """What the person is told about speakers: the kept line, and any warning of a second speaker in the kept audio."""
    return [w for w in [ref.kept, *ref.warnings] if "more than one speaker" in w or "second speaker" in w]


@pytest.mark.parametrize("name", SPLIT)
def test_two_speakers_the_stretch_is_one_of_them(name: str) -> None:
    x, parts = build(CASES[name][0])
    ref = _prepare(x)
    who, other = other_speech_inside(ref.start_s, ref.end_s, parts)
    assert other <= audio.FRAME_S, (ref.start_s, ref.end_s, who, other, parts)  # within one frame hop (20 ms)
    assert ref.duration_s >= 7.0, ref.duration_s  # most of one speaker's 8.6 s, not a sliver
    # one line says which seconds were kept and why; no warning of a second speaker: none is in the kept audio
    (line,) = _speaker_warnings(ref)
    assert line == ref.kept and ref.speech_left_out and ref.left_out_s >= 3.0, (line, ref.left_out_s)
    assert line.startswith(f"the clip has more than one speaker; the voice uses seconds {ref.start_s:.1f}-"
                           f"{ref.end_s:.1f} of the {x.size / SPEECH_RATE:.1f} s clip, the one who speaks longest"), line


def test_a_second_speaker_in_the_kept_audio_is_measured_there() -> None:
    """The warning about a second speaker is measured on the kept frames: both voices in them, one warning; one."""
    x, parts = build(CASES["a then b"][0])
    x32 = audio.resample(x, SPEECH_RATE, 32000)
    n = x32.size // int(audio.FRAME_S * 32000)
    voiced = np.ones(n, bool)
    change = int(parts[1][0] / audio.FRAME_S)
    (warning,) = audio._second_speaker(x32, voiced, 0, n)
    assert warning.startswith("the kept audio seems to hold a second speaker too (a change near second ")
    assert abs(float(warning.split("second ")[2].split(" ")[0]) - parts[1][0]) <= 0.6, (warning, parts)
    assert audio._second_speaker(x32, voiced, 0, change - 5) == []  # speaker a's part alone


def test_the_stored_scenario_with_two_speakers_keeps_speaker_a() -> None:
    """tests.audio_samples' "two speakers" upload: before, 5.5 s of speaker_a and 4.0 s of speaker_b were kept."""
    x, spans = upload_scenarios()["two speakers"]
    ref = _prepare(x)
    b_start, b_end = next((s, e) for s, e, what in spans if what == "speech_b")
    assert ref.end_s <= b_start + audio.FRAME_S or ref.start_s >= b_end - audio.FRAME_S, (ref.start_s, ref.end_s)
    assert ref.duration_s >= 7.0 and _speaker_warnings(ref) == [ref.kept]


@pytest.mark.parametrize("name", ONE_VOICE + NOT_SPEAKERS)
def test_one_speaker_keeps_the_same_choice_and_no_warning(name: str) -> None:
    """One voice, with pauses, repeats or a loud noise/music beside it: the choice is what it was without turns."""
    x = upload_scenarios()[name][0] if name in NOT_SPEAKERS else build(CASES[name][0])[0]
    ref = _prepare(x)
    with mock.patch.object(audio, "_one_speaker", lambda *a: None):
        before = _prepare(x)
    assert (ref.start_s, ref.end_s) == (before.start_s, before.end_s)
    assert ref.warnings == before.warnings and not _speaker_warnings(ref)
    assert np.array_equal(ref.wav32k, before.wav32k)


@pytest.mark.parametrize("name", ["a then b", "a, a long pause, b", "a then a with formants +12 %"])
def test_the_change_lies_in_the_pause_between_the_voices(name: str) -> None:
    x, parts = build(CASES[name][0])
    p = speech_probability(x)
    assert p is not None
    n_frames = int(x.size / SPEECH_RATE / audio.FRAME_S)
    centres = (np.arange(n_frames) + 0.5) * audio.FRAME_S
    voiced = p[np.minimum((centres / VAD_FRAME_S).astype(np.int64), p.size - 1)] >= 0.5
    turns = speaker_turns(x, SPEECH_RATE, voiced, audio.FRAME_S)
    assert [t[0] for t in turns][0] == 0 and turns[-1][1] == n_frames and len(turns) == 2, turns
    change_s = turns[1][0] * audio.FRAME_S
    first_end, second_start = parts[0][1], parts[1][0]
    assert first_end - audio.FRAME_S <= change_s <= second_start + audio.FRAME_S, (change_s, parts)


def test_two_speakers_neither_long_enough_is_refused() -> None:
    x, _ = build([("a", 2.8), ("a_up", 2.8)])
    with pytest.raises(AudioInputError, match=r"more than one speaker and none speaks for 3 s in one go"):
        _prepare(x)


def test_mfcc_shape_and_loudness_independence() -> None:
    x, _ = build([("a", 0)])
    f = mfcc(x, SPEECH_RATE)
    assert f.shape == (1 + (x.size - 400) // 160, N_CEPS)
    # c0 is left out, so a speaker who moves closer to the microphone is not "another speaker"
    quieter = mfcc(x * np.float32(0.1), SPEECH_RATE)
    loud = np.flatnonzero(np.abs(x[: f.shape[0] * 160]).reshape(-1, 160).max(axis=1) > 0.05)
    assert np.max(np.abs(f[loud])) > 5.0 and np.max(np.abs(f[loud] - quieter[loud])) < 1e-2  # only the log floor
    assert mfcc(x[:100], SPEECH_RATE).shape == (0, N_CEPS)


async def test_the_warning_reaches_the_person_who_made_the_voice(synth) -> None:
    """The same list the Discord command shows as "Note: ..." and `voices add` prints as "warning: ..."."""
    x, _ = build(CASES["a then a with formants +12 %"][0])
    buf = io.BytesIO()
    sf.write(buf, x, SPEECH_RATE, format="WAV")
    voice, warnings = await synth.voicing.create("duo", buf.getvalue(), "duo.wav", transcript="The quick brown fox.",
                                                 language="en", consent=CONSENT)
    (line,) = [w for w in warnings if w.startswith("the clip has more than one speaker; the voice uses")]
    # the transcript was of both voices' words, and the kept audio is one voice's: it is not stored
    assert line.endswith(", so its transcript was not stored and the voice is reference-free; to keep a transcript, "
                         "send only the seconds you want, with the words said in them"), line
    assert voice.prompt_text == "" and voice.prompt.prompt_phones.size == 0
    assert not any("second speaker" in w for w in warnings), warnings


def test_pitch_of_a_voice_and_of_noise() -> None:
    x = speech_like(6.0, f0=140.0, seed=1, sr=SPEECH_RATE)  # harmonics at 140 Hz with a 6 % vibrato
    frames = np.arange(1 + (x.size - 400) // 160)
    hz = np.exp(pitch(x, SPEECH_RATE, frames))  # NaN stays NaN
    voiced = np.abs(x[frames * 160 + 200]) > 0.05
    assert float(np.mean(np.isfinite(hz[voiced]))) > 0.8
    assert 135.0 <= float(np.nanmedian(hz[voiced])) <= 145.0
    noise = (0.3 * np.random.default_rng(0).standard_normal(3 * SPEECH_RATE)).astype(np.float32)
    assert float(np.mean(np.isfinite(pitch(noise, SPEECH_RATE, np.arange(250))))) < 0.05


def test_a_pitch_shift_lowers_the_bar_only_for_a_change_of_voice() -> None:
    """speaker_a then 4 s of speaker_b: the spectra alone stay under PENALTY; their 6 semitones make it a change."""
    x, _ = build(CASES["a then 4 s of b"][0])
    with mock.patch.object(speakers, "PITCH_SHIFT_ST", np.inf):
        assert not _speaker_warnings(_prepare(x))
    assert len(_speaker_warnings(_prepare(x))) == 1
