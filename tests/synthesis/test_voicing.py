"""A voice's transcript matches its stored audio: kept when only silence was trimmed, never stored when the kept
stretch leaves out speech the transcript describes, and the person told which seconds were kept and why."""

from __future__ import annotations

import io
import re

import numpy as np
import soundfile as sf

from synthesis.audio import MAX_LEFT_OUT_S
from tests.audio_samples import speech_like
from tests.synthesis.conftest import CONSENT

SR = 32000
WORDS = "On quiet evenings I like to cook something simple, open the window, and listen to the rain."
DROPPED = (", so its transcript was not stored and the voice is reference-free; to keep a transcript, send only the "
           "seconds you want, with the words said in them")


def _wav(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, SR, format="WAV")
    return buf.getvalue()


def _padded(speech_s: float, before_s: float, after_s: float) -> np.ndarray:
    """``speech_s`` of speech with ``before_s`` and ``after_s`` of quiet room around it."""
    room = (0.0005 * np.random.default_rng(0).standard_normal(int((before_s + speech_s + after_s) * SR)))
    x = room.astype(np.float32)
    i = int(before_s * SR)
    x[i : i + int(speech_s * SR)] += speech_like(speech_s, 140.0, 2, SR, lead_s=0.0)
    return x


async def test_only_silence_trimmed_keeps_the_transcript(synth) -> None:
    voice, warnings = await synth.voicing.create("padded", _wav(_padded(6.0, 4.0, 12.0)), "padded.wav",
                                                 transcript=WORDS, language="en", consent=CONSENT)
    assert warnings == [] and voice.prompt_text == WORDS and voice.prompt.prompt_phones.size > 0
    ref = synth.voices.meta(voice.id)["reference"]
    assert ref["kept"] == "" and ref["left_out_s"] == 0.0 and ref["clip_s"] == 22.0
    assert 3.8 <= ref["start_s"] <= 4.0 and 10.0 <= ref["end_s"] <= 10.2, ref


async def test_a_transcript_of_speech_left_out_is_not_stored(synth) -> None:
    """25 s of speech: 10 s at most are kept, and the transcript of all 25 s does not match them."""
    voice, warnings = await synth.voicing.create("long", _wav(_padded(25.0, 0.5, 0.5)), "long.wav",
                                                 transcript=WORDS, language="en", consent=CONSENT)
    assert voice.prompt_text == "" and voice.prompt.prompt_phones.size == 0 and voice.prompt.prompt_tokens.size == 0
    ref = synth.voices.meta(voice.id)["reference"]
    line = warnings[0]
    assert line == ref["kept"] and "\n" not in line
    assert ref["clip_s"] == 26.0 and ref["left_out_s"] >= 12.0 and ref["end_s"] - ref["start_s"] <= 10.0, ref
    assert re.fullmatch(rf"the voice uses seconds {ref['start_s']:.1f}-{ref['end_s']:.1f} of the 26\.0 s clip, the "
                        r"most continuous part of its 2\d\.\d s of speech \(GPT-SoVITS takes 3-10 s\), and leaves out "
                        rf"{ref['left_out_s']:.1f} s of speech{re.escape(DROPPED)}", line), line
    # the stored clip is the kept seconds, so a re-encode for another model stays transcript-free with it
    assert synth.voices.load_clip(voice.id).size / SR <= 10.0


async def test_the_enrollment_sentence_is_a_transcript_like_any_other(synth) -> None:
    voice, warnings = await synth.voicing.create("enrolled", _wav(_padded(25.0, 0.5, 0.5)), "enrolled.wav",
                                                 enrollment_prompt=WORDS, language="en", consent=CONSENT)
    assert voice.prompt_text == "" and warnings[0].endswith(DROPPED)
    assert synth.voices.meta(voice.id)["enrollment_prompt"] == WORDS  # what they were asked to read stays on record


async def test_without_a_transcript_the_person_is_still_told_what_was_kept(synth) -> None:
    voice, warnings = await synth.voicing.create("free", _wav(_padded(25.0, 0.5, 0.5)), "free.wav", language="en",
                                                 consent=CONSENT)
    assert voice.prompt_text == ""
    assert warnings[0].startswith("the voice uses seconds ") and warnings[0].endswith(
        "; to choose the part yourself, send only the seconds you want"), warnings
    assert synth.voices.meta(voice.id)["reference"]["left_out_s"] > MAX_LEFT_OUT_S
