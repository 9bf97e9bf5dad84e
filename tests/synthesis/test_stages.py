"""The sentence stages one at a time, with the tiny real models: phonemize, speak (prosody, vocode, early audio),
finish."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from synthesis.audio import FADE_S, fade_edges
from synthesis.stages import SentenceJob, finish, sentence_seed
from synthesis.types import SynthesisParams
from synthesis.windows import EARLY_CONTEXT_TOKENS, EARLY_HOLDBACK_TOKENS

SEEDED = SynthesisParams(language="en", seed=1234, noise_scale=0.5)
CONSENT = {"user_id": 1, "text": "this is my own voice"}
TEXT = "The weather is nice today."


def _job(voice, params=SEEDED, text=TEXT, index=0):
    return SentenceJob(text, index, voice, params, order=(0, index))


async def _speak(synth, job, first_window=0):
    """The sentence through ``Stages.speak`` as the only sentence of a request; the early audio that went out."""
    talk = synth.worker.open()
    early: list[np.ndarray] = []
    try:
        await synth.stages.speak(job, talk.sentence(0), first_window, early.append)
    finally:
        talk.close()
    return early


async def test_phonemize_fills_phones_seed_and_keys(synth, voice):
    job = _job(voice)
    await synth.stages.phonemize(job)
    assert job.phonemes.ids.dtype == np.int64 and job.phonemes.ids.size > 10
    assert job.seed == sentence_seed(1234, job.phonemes.norm_text)  # the same sentence, the same seed
    assert job.cached and len(job.prosody_key) == len(job.audio_key) == 64
    faster = _job(voice, dataclasses.replace(SEEDED, speed=1.1))
    await synth.stages.phonemize(faster)
    # speed changes the audio, not the prosody
    assert faster.prosody_key == job.prosody_key and faster.audio_key != job.audio_key
    other_seed = _job(voice, dataclasses.replace(SEEDED, seed=99))
    await synth.stages.phonemize(other_seed)
    assert other_seed.prosody_key != job.prosody_key and other_seed.seed != job.seed


async def test_speak_runs_the_gpt_once_then_hits_the_cache(synth, voice):
    job = _job(voice)
    await synth.stages.phonemize(job)
    steps = synth.worker.gpt_steps
    await _speak(synth, job)
    assert job.tokens is not None and job.tokens.dtype == np.int64 and job.tokens.size > 0
    assert synth.worker.gpt_steps > steps and job.timings["gpt_s"] > 0 and job.timings["prosody_hit"] == 0.0
    await synth.cache.drain()  # (the writes are queued)
    synth.cache.store._audio.clear()  # white-box: drop the audio cache, keep the prosody cache
    again = _job(voice)
    await synth.stages.phonemize(again)
    steps = synth.worker.gpt_steps
    await _speak(synth, again)
    assert synth.worker.gpt_steps == steps and again.timings["prosody_hit"] == 1.0 and again.timings["gpt_s"] == 0.0
    assert np.array_equal(again.tokens, job.tokens) and np.array_equal(again.audio, job.audio)


async def test_a_sentence_gpt_waits_for_the_sentence_before(synth, voice):
    """Sentence 1's GPT starts only once sentence 0's ended (here: sentence 0 needed no GPT, its audio was cached)."""
    job = _job(voice, index=1)
    await synth.stages.phonemize(job)
    talk = synth.worker.open()
    try:
        first, second = talk.sentence(0), talk.sentence(1)
        task = asyncio.create_task(synth.stages.speak(job, second))
        await asyncio.sleep(0.2)
        assert not task.done() and synth.worker.gpt_steps == 0  # the GPT has not started
        first.settle()
        await asyncio.wait_for(task, 120)
    finally:
        talk.close()
    assert job.tokens is not None and synth.worker.gpt_steps > 0


async def test_speak_decodes_fades_and_caches(synth, voice):
    job = _job(voice)
    await synth.stages.phonemize(job)
    assert not await synth.stages.cached_audio(job)
    assert await _speak(synth, job) == []  # (no early window asked for)
    assert job.audio is not None and job.audio.dtype == np.float32
    assert job.audio.size == job.tokens.size * 1280  # 1280 samples @ 32 kHz per token
    assert job.audio[0] == 0.0 and abs(job.audio[-1]) < 1e-3 and job.timings["sovits_s"] > 0
    await synth.cache.drain()
    hit = _job(voice)
    await synth.stages.phonemize(hit)
    assert await synth.stages.cached_audio(hit)  # the audio cache now holds the sentence, bit for bit
    assert np.array_equal(hit.audio, job.audio) and hit.timings["audio_hit"] == hit.timings["prosody_hit"] == 1.0


def test_finish_appends_the_pause_after_what_went_out_early(voice_free_job):
    job = voice_free_job
    job.audio = np.arange(1000, dtype=np.float32)
    job.emitted = 300
    chunk = finish(job)
    assert chunk.audio.size == 700 + int(0.3 * 32000)
    assert chunk.audio[0] == 300.0 and np.all(chunk.audio[700:] == 0)
    assert chunk.index == 2 and chunk.sentence == TEXT and chunk.sample_rate == 32000


@pytest.fixture
def voice_free_job():
    return SentenceJob(TEXT, 2, None, SynthesisParams(fragment_interval=0.3))  # type: ignore[arg-type]


def _counting_decodes(synth):
    """The token counts of the engine's decodes, in order (recorded on the worker's thread)."""
    engine, decoded = synth.engine, []
    decode = engine.decode

    def counting(tokens, *args, **kwargs):
        decoded.append(tokens.size)
        return decode(tokens, *args, **kwargs)

    engine.decode = counting
    return decoded


async def test_early_audio_speaks_the_first_tokens_and_hands_over(synth, voice):
    job = _job(voice, text="This first sentence is long enough to need many semantic tokens from the model.")
    await synth.stages.phonemize(job)
    decoded = _counting_decodes(synth)
    chunks = await _speak(synth, job, 12)
    total = job.tokens.size
    # windows end at 12, 24, 48... tokens (each at twice the tokens of the one before), all the sentence reaches
    ends = [e for e in (12, 24, 48, 96, 192) if e <= total]
    assert len(chunks) == len(ends)
    sent = [0] + [e - EARLY_HOLDBACK_TOKENS for e in ends]
    assert [c.size for c in chunks] == [(b - a) * 1280 for a, b in zip(sent, sent[1:])]
    assert job.emitted == sent[-1] * 1280
    # each decode starts EARLY_CONTEXT_TOKENS before the unsent tokens: the first window from 0, the rest from there
    starts = [0] + [max(0, e - EARLY_CONTEXT_TOKENS) for e in sent[1:]]
    assert decoded == [end - start for start, end in zip(starts, ends + [total])]
    # the sentence's audio starts with exactly what went out early
    assert np.array_equal(job.audio[:job.emitted], np.concatenate(chunks))
    assert finish(job).audio.size == job.audio.size - job.emitted + int(0.3 * 32000) == (total - sent[-1]) * 1280 + \
        int(0.3 * 32000)


async def test_early_audio_does_not_happen_for_a_short_sentence(synth, voice):
    job = _job(voice)
    await synth.stages.phonemize(job)
    decoded = _counting_decodes(synth)
    chunks = await _speak(synth, job, 10_000)  # more tokens than the sentence has
    assert chunks == [] and job.emitted == 0 and decoded == [job.tokens.size]


def test_fade_edges():
    audio = np.ones(1000, np.float32)
    faded = fade_edges(audio)
    n = int(round(32000 * FADE_S))
    assert faded[0] == 0.0 and faded[-1] == 0.0 and np.all(faded[n:-n] == 1.0)
    assert np.all(np.diff(faded[:n]) >= 0)  # a rise, never a step down
    assert fade_edges(audio, tail=False)[-1] == 1.0
