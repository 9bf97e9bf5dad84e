"""The sentence stages one at a time, with the tiny real models: phonemize, prosody, vocode, finish, early audio."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from engines.base import FRAME_SAMPLES, token_sample
from synthesis.audio import FADE_S, fade_edges
from synthesis.scheduler import Deadline
from synthesis.stages import (CROSSFADE_SAMPLES, EARLY_CONTEXT_TOKENS, EARLY_HOLDBACK_TOKENS, EarlyAudio,
                              SentenceJob, Spoken, finish, sentence_seed)
from synthesis.types import SynthesisParams

SEEDED = SynthesisParams(language="en", seed=1234, noise_scale=0.5)
CONSENT = {"user_id": 1, "text": "this is my own voice"}
TEXT = "The weather is nice today."


def _job(voice, params=SEEDED, text=TEXT, index=0):
    return SentenceJob(text, index, voice, params, Deadline(60.0), order=(0, index))


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


async def test_prosody_runs_the_gpt_once_then_hits_the_cache(synth, voice):
    job = _job(voice)
    await synth.stages.phonemize(job)
    seen: list[np.ndarray] = []
    steps = synth.worker.gpt_steps
    await synth.stages.prosody(job, on_tokens=seen.append)
    assert job.tokens is not None and job.tokens.dtype == np.int64 and job.tokens.size > 0
    assert synth.worker.gpt_steps > steps and job.timings["gpt_s"] > 0 and job.timings["prosody_hit"] == 0.0
    assert np.array_equal(np.concatenate(seen), job.tokens)  # the callback saw every token, in order, once
    again, seen_again = _job(voice), []
    await synth.stages.phonemize(again)
    steps = synth.worker.gpt_steps
    await synth.stages.prosody(again, on_tokens=seen_again.append)
    assert synth.worker.gpt_steps == steps and again.timings["prosody_hit"] == 1.0 and again.timings["gpt_s"] == 0.0
    assert np.array_equal(again.tokens, job.tokens)
    assert len(seen_again) == 1 and np.array_equal(seen_again[0], job.tokens)  # a hit feeds them all at once


async def test_prosody_waits_for_the_sentence_before(synth, voice):
    job = _job(voice)
    await synth.stages.phonemize(job)
    before = asyncio.Event()
    task = asyncio.create_task(synth.stages.prosody(job, after=before))
    await asyncio.sleep(0.2)
    assert not task.done() and synth.worker.gpt_steps == 0  # the GPT has not started
    before.set()
    await asyncio.wait_for(task, 120)
    assert job.tokens is not None and synth.worker.gpt_steps > 0


async def test_vocode_decodes_fades_and_caches(synth, voice):
    job = _job(voice)
    await synth.stages.phonemize(job)
    assert not await synth.stages.cached_audio(job)
    await synth.stages.prosody(job)
    await synth.stages.vocode(job)
    assert job.audio is not None and job.audio.dtype == np.float32
    assert job.audio.size == job.tokens.size * 1280  # 1280 samples @ 32 kHz per token
    assert job.audio[0] == 0.0 and abs(job.audio[-1]) < 1e-3 and job.timings["sovits_s"] > 0
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


async def _early(synth, job, tokens_needed):
    """The sentence through prosody and vocode with early audio; the windows that went out."""
    early = EarlyAudio(synth.stages, job, tokens_needed)
    await synth.stages.prosody(job, on_tokens=early.feed)
    await synth.stages.vocode(job, early)
    chunks = []
    while (chunk := await early.next_chunk()) is not None:
        chunks.append(chunk)
    return early, chunks


async def test_early_audio_speaks_the_first_tokens_and_hands_over(synth, voice):
    job = _job(voice, text="This first sentence is long enough to need many semantic tokens from the model.")
    await synth.stages.phonemize(job)
    decoded = []
    decode = synth.stages.decode

    async def counting(job, tokens, speed, noise_offset=0):
        decoded.append(tokens.size)
        return await decode(job, tokens, speed, noise_offset)

    synth.stages.decode = counting
    _, chunks = await _early(synth, job, 12)
    total = job.tokens.size
    # windows end at 12, 24, 48... tokens (each at twice the tokens of the one before), all the sentence reaches
    ends = [e for e in (12, 24, 48, 96, 192) if e <= total]
    assert len(chunks) == len(ends) and all(c.timings["partial"] == 1.0 and c.index == 0 for c in chunks)
    sent = [0] + [e - EARLY_HOLDBACK_TOKENS for e in ends]
    assert [c.audio.size for c in chunks] == [(b - a) * 1280 for a, b in zip(sent, sent[1:])]
    assert job.emitted == sent[-1] * 1280
    # each decode starts EARLY_CONTEXT_TOKENS before the unsent tokens: the first window from 0, the rest from there
    starts = [0] + [max(0, e - EARLY_CONTEXT_TOKENS) for e in sent[1:]]
    assert decoded == [end - start for start, end in zip(starts, ends + [total])]
    # the sentence's audio starts with exactly what went out early
    assert np.array_equal(job.audio[:job.emitted], np.concatenate([c.audio for c in chunks]))
    assert finish(job).audio.size == job.audio.size - job.emitted + int(0.3 * 32000) == (total - sent[-1]) * 1280 + \
        int(0.3 * 32000)


async def test_early_audio_does_not_happen_for_a_short_sentence(synth, voice):
    job = _job(voice)
    await synth.stages.phonemize(job)
    early, chunks = await _early(synth, job, 10_000)  # more tokens than the sentence has
    assert chunks == [] and job.emitted == 0 and await early.spoken() is None


async def test_early_audio_stops_when_cancelled(synth, voice):
    job = _job(voice, text="This first sentence is long enough to need many semantic tokens from the model.")
    await synth.stages.phonemize(job)
    early = EarlyAudio(synth.stages, job, 10_000)
    early.feed(np.arange(5))
    running = early.cancel()
    assert running is not None
    await asyncio.gather(running, return_exceptions=True)
    assert await early.next_chunk() is None and early.cancel() is None


def test_spoken_continues_with_a_crossfade():
    sent = Spoken(20, np.full(20 * 1280, 0.5, np.float32), np.full(4 * 1280, 0.5, np.float32))
    assert sent.start == 20 - EARLY_CONTEXT_TOKENS
    rest = np.full(30 * 1280, -0.5, np.float32)  # tokens 12..42
    out = sent.join(rest, 30)
    assert out.size == 42 * 1280
    join = 20 * 1280
    assert np.all(out[:join] == 0.5) and np.all(out[join + CROSSFADE_SAMPLES:] == -0.5)
    assert 0.5 >= out[join] > out[join + CROSSFADE_SAMPLES // 2] > out[join + CROSSFADE_SAMPLES - 1] >= -0.5
    upto, past = sent.continuation(rest, 30, 30)
    assert upto.size == 10 * 1280 and past.size == 12 * 1280  # up to a token, and the samples after it


def test_spoken_at_another_speed_cuts_at_frame_edges_and_carries_the_noise_on():
    """At speed != 1 a piece goes on from the latent frame edge where its interpolation put the hand-over token, and
    is decoded with the noise the tail has at the same frames."""
    speed, size = 1.25, 30  # the piece: 30 tokens from token 12 (the sent 20 minus 8 of context)
    frames = int(2 * size / speed) + 1
    piece = np.arange(frames * FRAME_SAMPLES, dtype=np.float32)
    sent = Spoken(20, np.zeros(100, np.float32), np.zeros(4000, np.float32), speed, frame=57)
    first = token_sample(8, size, speed)
    assert first % FRAME_SAMPLES == 0 and first == round(8 * frames / size) * FRAME_SAMPLES
    out, past = sent.continuation(piece, size, 24)
    assert np.array_equal(out[CROSSFADE_SAMPLES:], piece[first + CROSSFADE_SAMPLES:token_sample(12, size, speed)])
    assert past.size == piece.size - token_sample(12, size, speed)
    assert sent.noise_offset(size) == 57 - first // FRAME_SAMPLES  # the tail's frame 57 is the piece's frame `first`
    # at speed 1: two frames per token, the noise offset twice the piece's first token
    assert Spoken(20, np.zeros(1), np.zeros(1), frame=40).noise_offset(size) == 2 * 12


def test_fade_edges():
    audio = np.ones(1000, np.float32)
    faded = fade_edges(audio)
    n = int(round(32000 * FADE_S))
    assert faded[0] == 0.0 and faded[-1] == 0.0 and np.all(faded[n:-n] == 1.0)
    assert np.all(np.diff(faded[:n]) >= 0)  # a rise, never a step down
    assert fade_edges(audio, tail=False)[-1] == 1.0
