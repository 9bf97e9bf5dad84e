"""A sentence's way through the pipeline, as named stages: ``phonemize -> prosody -> vocode -> finish``.

A sentence is one :class:`SentenceJob`; each stage reads what the ones before it filled in and adds its own part:

* :meth:`Stages.phonemize`: text -> phone ids, the sentence's seed and its cache keys;
* :meth:`Stages.cached_audio`: the audio cache, looked up first (a hit skips the GPT and SoVITS);
* :meth:`Stages.prosody`: semantic tokens from the prosody cache, else BERT (zh) + the GPT on the device worker;
* :meth:`Stages.vocode`: SoVITS on the device worker (optionally with :class:`EarlyAudio`, or a diffusion family's
  sampler chunks as they come, :class:`SampledAudio`), faded, cached;
* :func:`finish`: the sentence's :class:`~synthesis.types.AudioChunk`, followed by its pause.

Every model call goes through the :class:`~synthesis.scheduler.DeviceWorker` with the job's priority, order and
deadline, so the stages themselves never block the event loop and never touch the engine's threads.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
import random
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import numpy as np

from engines import Engine
from engines.base import (DIFFUSION_FAMILIES, FRAME_SAMPLES, SAMPLE_RATE, SamplingParams, SemanticRequest,
                          check_sampler, token_sample)
from synthesis.audio import FADE_S, fade_edges, raised_cosine
from synthesis.cache import SynthesisCache
from synthesis.cache_lane import SpeechCache
from synthesis.metrics import PipelineStats
from synthesis.scheduler import LIVE, Deadline, DeviceWorker
from synthesis.text import Phonemes, bert_features, normalize_for_cache, text_to_phonemes
from synthesis.types import AudioChunk, SynthesisParams, Voice

EARLY_HOLDBACK_TOKENS = 4  # a window's last tokens lack right context: the next piece replaces them
EARLY_CONTEXT_TOKENS = 8  # tokens before a piece decoded with it as left context (their audio is not used again)
CROSSFADE_SAMPLES = 640  # 20 ms @ 32 kHz where one piece of a sentence hands over to the next
# Faster than this a first sentence is spoken whole. At speed s a token is 40 / s ms of audio while its GPT step costs
# the same, so the windows' margin shrinks by s: faster than 1, the first window and the held-back tokens are s times
# as many (:func:`at_speed`: as many latent frames as at speed 1; the later windows double from the first). At 2 the
# third window came late beside a busy process on 2 cores (see FINDINGS.md#early-words-at-other-speeds).
EARLY_MAX_SPEED = 1.5


def at_speed(tokens: int, speed: float) -> int:
    """``tokens`` at speed 1 and slower, ``speed`` times as many faster: the first window and the held-back tokens
    are as many latent frames at any speed as at speed 1 (see :data:`EARLY_MAX_SPEED`; the held-back tokens lack
    right context, and 4 of them at speed 2 joined the next piece at a correlation of 0.94-0.97 past the crossfade
    where 8 joined at 0.99, tiny model; real size, default noise, at speed 1.5: hand-overs 15.8-18.7 dB with 6 held
    back, 12.7-14.5 dB with 4)."""
    return math.ceil(tokens * max(1.0, speed))


TokenCallback = Callable[[np.ndarray], None]


@dataclass(eq=False)
class SentenceJob:
    """One sentence of one request on its way through the stages.

    Attributes
    ----------
    text, index: the sentence and its position in the request.
    voice, params: who speaks it, and how.
    deadline: how long its model jobs may wait for the worker (None: no bound, for background work).
    priority, order: the worker's ordering (:data:`~synthesis.scheduler.LIVE` first, then (request, sentence)).
    ph, seed, prosody_key, audio_key, cached: filled by :meth:`Stages.phonemize`.
    tokens: ``[Ts]`` int64 semantic tokens, filled by :meth:`Stages.prosody`.
    audio: ``[N]`` float32 @ ``sample_rate`` (the engine's), the whole sentence, filled by
        :meth:`Stages.cached_audio` or :meth:`Stages.vocode`; ``emitted`` of its first samples already went out early.
    timings: ``gpt_s``, ``sovits_s``, ``prosody_hit``, ``audio_hit`` (what the chunk reports).
    """

    text: str
    index: int
    voice: Voice
    params: SynthesisParams
    deadline: Deadline | None = None
    priority: int = LIVE
    order: tuple[int, ...] = ()
    ph: Phonemes | None = None
    seed: int = 0
    prosody_key: str = ""
    audio_key: str = ""
    cached: bool = False  # may its results be stored and served (the cache's random-seed policy)
    tokens: np.ndarray | None = None
    audio: np.ndarray | None = None
    emitted: int = 0
    sample_rate: int = SAMPLE_RATE  # Hz of ``audio`` (the engine's, set by phonemize)
    timings: dict[str, float] = field(default_factory=lambda: {"gpt_s": 0.0, "sovits_s": 0.0, "prosody_hit": 0.0,
                                                               "audio_hit": 0.0})

    @property
    def phonemes(self) -> Phonemes:
        assert self.ph is not None, "phonemize runs first"
        return self.ph


class Stages:
    """The stages, bound to the device worker, the caches and the counters they share.

    Parameters
    ----------
    worker: runs every model call (its ``engine`` is the loaded model).
    cache: the prosody and audio caches (awaited: no lookup or write runs on the event loop).
    stats: where hits and misses are counted.
    """

    def __init__(self, worker: DeviceWorker, cache: SpeechCache, stats: PipelineStats) -> None:
        self.worker = worker
        self.cache = cache
        self.stats = stats
        self._requests = itertools.count()  # admission order: earlier requests are finished first

    @property
    def engine(self) -> Engine:
        return self.worker.engine

    def next_request(self) -> int:
        """The next request's place in the admission order (its jobs' ``order`` starts with it)."""
        return next(self._requests)

    # ---- phonemize ---------------------------------------------------------------------------------------------

    async def phonemize(self, job: SentenceJob) -> None:
        """Text front-end (off the event loop), then the sentence's seed and cache keys."""
        p = job.params
        family = self.engine.family
        check_sampler(family, p.steps, p.cfg)  # before any model work: a bad value costs nothing
        job.sample_rate = self.engine.sample_rate
        job.ph = await asyncio.to_thread(text_to_phonemes, job.text, p.language, p.lexicon)
        job.seed = sentence_seed(p.seed, job.ph.norm_text)
        job.prosody_key = self.prosody_key(job.voice, job.ph, p)
        steps, cfg = self.sampler(p)
        job.audio_key = SynthesisCache.audio_key(job.prosody_key, p.speed, p.noise_scale,
                                                 p.seed if p.seed != -1 else "any", timbre=job.voice.timbre,
                                                 family=family if family in DIFFUSION_FAMILIES else "",
                                                 steps=steps, cfg=cfg)
        job.cached = self.cacheable(p)

    def sampler(self, p: SynthesisParams) -> tuple[int | None, float | None]:
        """The request's diffusion sampler options for the loaded family; (None, None) for a v2 family, which has
        no sampler (upstream's clients send ``sample_steps`` whatever the model: it is ignored there, as upstream
        does)."""
        return (p.steps, p.cfg) if self.engine.family in DIFFUSION_FAMILIES else (None, None)

    def cacheable(self, p: SynthesisParams) -> bool:
        """May this request's results be stored and served? (``SynthesisCache.cacheable``: the seed policy)."""
        return self.cache.cacheable({"seed": p.seed, "top_k": p.top_k})

    def prosody_key(self, voice: Voice, ph: Phonemes, p: SynthesisParams) -> str:
        """The cache key of a sentence's semantic tokens.

        The language part is the languages the front-end actually used for its pieces, not the requested mode,
        so "auto" and "en" share entries for an English sentence (precomputed phrases hit either way). The
        reading (phones, BERT layout) is part of it: a sentence a pronunciation entry changed, or one the front-end
        now reads otherwise, never hits tokens made for another reading.
        """
        sampling = {"top_k": p.top_k, "top_p": p.top_p, "temperature": p.temperature,
                    "repetition_penalty": p.repetition_penalty,
                    # a random-seed request takes any earlier sample of the same text (that is what makes
                    # precomputed common phrases hit); a seeded one only its own
                    "seed": p.seed if p.seed != -1 else "any"}
        return SynthesisCache.prosody_key(self.engine.model_id, voice.id, voice.version,
                                          normalize_for_cache(ph.norm_text),
                                          "+".join(piece.lang for piece in ph.pieces), sampling,
                                          reading=ph.reading_key, style=voice.style, family=self.engine.family)

    # ---- prosody (cache | GPT) ---------------------------------------------------------------------------------

    async def cached_audio(self, job: SentenceJob) -> bool:
        """The vocode stage's cache, looked up before the prosody: True (and ``job.audio`` set) on a hit."""
        audio = await self.cache.get_audio(job.audio_key) if job.cached else None
        if audio is None:
            self.stats.counters["audio_miss"] += 1
            return False
        job.audio = audio
        job.timings["audio_hit"] = job.timings["prosody_hit"] = 1.0
        self.stats.counters["audio_hit"] += 1
        return True

    async def prosody(self, job: SentenceJob, *, after: asyncio.Event | None = None,
                      on_tokens: TokenCallback | None = None) -> None:
        """``job.tokens`` from the prosody cache, else from the GPT (stored for next time).

        ``after``: the GPT waits for it (a request's sentences take the GPT one after another).
        ``on_tokens``: sees the tokens as they come, all at once on a cache hit (that feeds :class:`EarlyAudio`,
        so a hit sounds exactly like a miss).
        """
        tokens = await self.cache.get_tokens(job.prosody_key) if job.cached else None
        if tokens is not None:
            job.timings["prosody_hit"] = 1.0
            self.stats.counters["prosody_hit"] += 1
            if on_tokens is not None:
                on_tokens(tokens)
        else:
            self.stats.counters["prosody_miss"] += 1
            if after is not None:
                await after.wait()
            tokens, job.timings["gpt_s"] = await self.semantic(job, on_tokens)
            if job.cached:
                await self.cache.put_tokens(job.prosody_key, tokens, job.voice.id)  # (queued, not awaited)
        job.tokens = tokens

    async def semantic(self, job: SentenceJob,
                       on_tokens: TokenCallback | None = None) -> tuple[np.ndarray, float]:
        """BERT features (zh only) then the GPT, both on the device worker: (tokens ``[Ts]``, GPT seconds)."""
        ph, p = job.phonemes, job.params
        await self.load_bert_for(ph)
        bert = await self.worker.call(lambda: bert_features(ph, self.engine.text_features),
                                      priority=job.priority, order=job.order, deadline=job.deadline)
        sampling = SamplingParams(top_k=p.top_k, top_p=p.top_p, temperature=p.temperature,
                                  repetition_penalty=p.repetition_penalty, seed=job.seed)
        request = SemanticRequest(ph.ids, bert, job.voice.prompt, sampling)
        return await self.worker.semantic(request, priority=job.priority, order=job.order, deadline=job.deadline,
                                          on_tokens=on_tokens)

    async def load_bert_for(self, ph: Phonemes) -> None:
        """Load BERT in a helper thread before the first Chinese text needs it: the load takes seconds, and on the
        single device thread it would stall every other listener's speech meanwhile."""
        if any(piece.lang == "zh" for piece in ph.pieces):
            await asyncio.to_thread(self.engine.load_encoder, "bert")

    # ---- vocode (cache | SoVITS) -------------------------------------------------------------------------------

    async def decode(self, job: SentenceJob, tokens: np.ndarray, speed: float, noise_offset: int = 0) -> np.ndarray:
        """SoVITS on the device worker: ``[N]`` float32 at the engine's rate for ``tokens``, with the sentence's prior
        noise from latent frame ``noise_offset`` on (a piece of a sentence: see :class:`Spoken`)."""
        ph, p, prompt = job.phonemes, job.params, job.voice.prompt
        steps, cfg = self.sampler(p)
        audio = await self.worker.call(
            lambda: self.engine.decode(tokens, ph.ids, prompt, speed, p.noise_scale, job.seed, noise_offset,
                                       steps=steps, cfg=cfg),
            priority=job.priority, order=job.order, deadline=job.deadline)
        return np.asarray(audio, dtype=np.float32)

    async def vocode(self, job: SentenceJob, early: EarlyAudio | SampledAudio | None = None) -> None:
        """``job.audio``: the whole sentence, faded, cached; where ``early`` spoke its first part already, that part
        as it went out followed by the rest, decoded from a little before it (:class:`EarlyAudio`); with
        :class:`SampledAudio`, decoded piece by piece, each piece out as it is made."""
        assert job.tokens is not None, "prosody runs first"
        t0 = time.perf_counter()
        spoken = await early.spoken() if isinstance(early, EarlyAudio) else None  # every window out, all done
        if isinstance(early, SampledAudio):
            job.audio, job.emitted = await self.sampled(job, early)
        elif spoken is None:
            job.audio = fade_edges(await self.decode(job, job.tokens, job.params.speed),
                                   sample_rate=job.sample_rate)
        else:
            size = job.tokens.size - spoken.start
            rest = await self.decode(job, job.tokens[spoken.start:], spoken.speed, spoken.noise_offset(size))
            job.emitted = spoken.audio.size
            job.audio = fade_edges(spoken.join(rest, size), head=False)  # (the first window went out faded in)
        job.timings["sovits_s"] = time.perf_counter() - t0
        # audio fused with other voices' clips is not kept: its entry would be tagged with this voice alone, and
        # outlive the deletion of an aux voice whose timbre it carries
        if job.cached and not job.voice.timbre:
            await self.cache.put_audio(job.audio_key, job.audio, job.voice.id)  # (queued: the chunk goes out now)

    async def sampled(self, job: SentenceJob, out: SampledAudio) -> tuple[np.ndarray, int]:
        """A diffusion family's sentence through :meth:`Engine.decode_stream`, one worker call per sampler chunk:
        each chunk's samples go to ``out`` as soon as it is made, but the last :data:`FADE_S`, which the sentence's
        fade-out may still cover. Returns the whole sentence faded (what :meth:`decode` gives, faded) and how many of
        its samples went out; those are exactly its first ones."""
        assert job.tokens is not None, "prosody runs first"
        ph, p, prompt, tokens = job.phonemes, job.params, job.voice.prompt, job.tokens
        steps, cfg = self.sampler(p)
        pieces = self.engine.decode_stream(tokens, ph.ids, prompt, p.speed, p.noise_scale, job.seed, steps=steps,
                                           cfg=cfg)
        fade = int(round(FADE_S * job.sample_rate))
        t0 = time.perf_counter()
        got: list[np.ndarray] = []
        sent = 0
        while (piece := await self.worker.call(lambda: next(pieces, None), priority=job.priority, order=job.order,
                                               deadline=job.deadline)) is not None:
            got.append(np.asarray(piece, dtype=np.float32))
            whole = np.concatenate(got)
            upto = whole.size - fade
            if whole.size >= 2 * fade and upto > sent:  # (the fade-in is then as long as the whole sentence's)
                faded = fade_edges(whole, tail=False, sample_rate=job.sample_rate)
                out.put(AudioChunk(faded[sent:upto], job.text, job.index, job.sample_rate,
                                   {**job.timings, "sovits_s": time.perf_counter() - t0, "partial": 1.0}))
                sent = upto
        whole = np.concatenate(got) if got else np.zeros(0, np.float32)
        return fade_edges(whole, sample_rate=job.sample_rate), sent


@dataclass
class Spoken:
    """What :class:`EarlyAudio` sent of a sentence: ``audio`` (its first ``tokens`` tokens' samples, as they went
    out) and ``tail``, the last window's samples past them (decoded without right context), for the crossfade; at
    ``speed``; ``frame``: the prior-noise frame at which the tail begins.

    A piece that continues it is cut at a latent frame edge (:func:`~engines.token_sample`), where its waveform is in
    phase with the tail's also at speed != 1, and decoded with the noise the tail has at the same frames, so two
    pieces differ only by their context (real size, noise scale 0.5, speed 1: 18-20 dB between them at a hand-over,
    7 dB when each piece drew its noise from frame 0)."""

    tokens: int
    audio: np.ndarray
    tail: np.ndarray
    speed: float = 1.0
    frame: int = 0

    @property
    def start(self) -> int:
        """The first token of the next piece's decode: :data:`EARLY_CONTEXT_TOKENS` before the unsent ones."""
        return max(0, self.tokens - EARLY_CONTEXT_TOKENS)

    def noise_offset(self, size: int) -> int:
        """The noise offset of the next piece (``size`` tokens from :attr:`start`): its frame at the hand-over gets
        the tail's noise there."""
        return max(0, self.frame - token_sample(self.tokens - self.start, size, self.speed) // FRAME_SAMPLES)

    def continuation(self, piece: np.ndarray, size: int, end: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The unsent samples of ``piece`` (a decode of ``size`` tokens from token :attr:`start`) up to token ``end``
        (None: all), crossfaded from :attr:`tail` at their start; and the samples of ``piece`` past them."""
        first = token_sample(self.tokens - self.start, size, self.speed)
        last = piece.size if end is None else min(piece.size, token_sample(end - self.start, size, self.speed))
        out = np.array(piece[first:last], dtype=np.float32)
        n = max(0, min(CROSSFADE_SAMPLES, self.tail.size, out.size))
        if n:
            rise = raised_cosine(n)
            out[:n] = self.tail[:n] * (1 - rise) + out[:n] * rise
        return out, np.asarray(piece[last:], dtype=np.float32)

    def join(self, rest: np.ndarray, size: int) -> np.ndarray:
        """The whole sentence: what went out, then the rest (a decode of its ``size`` tokens from :attr:`start`)."""
        return np.concatenate([self.audio, self.continuation(rest, size)[0]])


class EarlyAudio:
    """The vocode stage's option to speak a first sentence while its GPT still runs, in growing windows.

    :meth:`feed` is the GPT's token callback (the scheduler calls it on the event loop as tokens are decoded). Once
    ``tokens_needed`` tokens are known they are decoded on the vocoder lane and go out (:meth:`next_chunk`) without
    their last :data:`EARLY_HOLDBACK_TOKENS` tokens, which lack right context; then each next window, ending at twice
    the tokens of the one before (``tokens_needed`` 16: windows end at 16, 32, 64, 128 tokens), is decoded from
    :data:`EARLY_CONTEXT_TOKENS` before its unsent tokens and goes out crossfaded, until the GPT ends;
    :meth:`Stages.vocode` decodes the rest the same way. So a long sentence never waits for its whole decode: a
    window of N new tokens must be ready before the N - 4 tokens of audio sent before it have played (40 ms each),
    and takes N GPT steps and the decode of N + 8 tokens: about 12.5 N + 60 ms against 40 (N - 4) on a 2-core AVX2
    CPU, so it holds on a CPU twice as slow; the former schedule (24 tokens, then 48, 96... new) held only on one 1.2x
    as slow, and spoke later (see FINDINGS.md#early-word-windows). Windows end at fixed token counts, every one the
    sentence reaches is decoded, so the audio depends only on the tokens (a prosody-cache hit speaks the same samples
    as the run that filled it) while ``wanted`` holds (the pipeline stops the windows beside another request that has
    not started speaking; the sentence is then decoded whole). A window decoded with 8 tokens of left context matches
    the whole sentence's decode at about 30 dB SNR, the first window (no right context) at 24 dB (see
    FINDINGS.md#early-word-windows). At another speed (up to :data:`EARLY_MAX_SPEED`) every piece is decoded at that
    speed, its tokens found in it by :func:`~engines.token_sample` (at a frame edge, see :class:`Spoken`).

    Parameters
    ----------
    stages: whose worker decodes.
    job: the sentence (phonemized).
    tokens_needed: tokens of the first window.
    wanted: asked before each window is decoded; once False, no more windows are (the sentence is decoded whole,
        or its rest after what went out, by :meth:`Stages.vocode`). None: always wanted.
    """

    def __init__(self, stages: Stages, job: SentenceJob, tokens_needed: int,
                 wanted: Callable[[], bool] | None = None) -> None:
        self.stages = stages
        self.job = job
        self.tokens_needed = tokens_needed
        self.wanted = wanted
        self._seen: list[np.ndarray] = []
        self._count = 0  # tokens fed so far
        self._more = asyncio.Event()  # tokens came, or the feed closed
        self._closed = False  # no more tokens will come
        self._sent: Spoken | None = None  # what went out so far
        self._chunks: asyncio.Queue[AudioChunk | BaseException | None] = asyncio.Queue()
        self._ended = False  # the listener has taken the last chunk
        self.first_out = asyncio.Event()  # the first window went out, or none will
        self._windows = asyncio.ensure_future(self._run())
        # the listener's end mark, however the windows end (also when cancelled before they started)
        self._windows.add_done_callback(lambda _: (self._chunks.put_nowait(None), self.first_out.set()))

    def feed(self, new_tokens: np.ndarray) -> None:
        """Tokens from the GPT (or all of them from the cache)."""
        if self._closed:
            return
        tokens = np.asarray(new_tokens, np.int64)
        self._seen.append(tokens)
        self._count += tokens.size
        self._more.set()

    def close(self) -> None:
        """No more tokens will come: the windows already reached are decoded, no others."""
        self._closed = True
        self._more.set()

    def cancel(self) -> Awaitable[object] | None:
        """Stop the windows (the request ended); returns them, to be awaited, while they run."""
        self.close()
        if self._windows.done():
            return None
        self._windows.cancel()
        return self._windows

    async def next_chunk(self) -> AudioChunk | None:
        """The next window's audio for the listener; None once no more will come (raises a window's error)."""
        if self._ended:
            return None
        item = await self._chunks.get()
        if item is None or isinstance(item, BaseException):
            self._ended = True
        if isinstance(item, BaseException):
            raise item
        return item

    async def spoken(self) -> Spoken | None:
        """What went out (every window the sentence reached, all decoded), or None when nothing did."""
        self.close()
        await asyncio.wait({self._windows})
        return self._sent

    async def _run(self) -> None:
        """Decode each window as its tokens arrive; the listener gets each (or an error), then None."""
        end = self.tokens_needed
        try:
            while True:
                while self._count < end:
                    if self._closed:
                        return
                    self._more.clear()
                    await self._more.wait()
                if self.wanted is not None and not self.wanted():
                    return
                await self._window(np.concatenate(self._seen)[:end])
                end *= 2
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - the listener raises it
            self._chunks.put_nowait(e)

    async def _window(self, tokens: np.ndarray) -> None:
        """Decode ``tokens`` (from the sent ones' context on), send all but the held-back last ones."""
        t0 = time.perf_counter()
        sent, speed = self._sent, self.job.params.speed
        start = sent.start if sent is not None else 0
        upto = tokens.size - at_speed(EARLY_HOLDBACK_TOKENS, speed)
        if upto <= (sent.tokens if sent is not None else 0):
            return  # (a first window of at most the held-back tokens: nothing to send)
        size = tokens.size - start
        offset = sent.noise_offset(size) if sent is not None else 0
        piece = await self.stages.decode(self.job, tokens[start:], speed, offset)
        if sent is None:
            cut = token_sample(upto, size, speed)
            audio, tail = fade_edges(piece[:cut], tail=False), np.asarray(piece[cut:], dtype=np.float32)
            whole = audio
        else:
            audio, tail = sent.continuation(piece, size, upto)
            whole = np.concatenate([sent.audio, audio])
        self._sent = Spoken(upto, whole, tail, speed, offset + (piece.size - tail.size) // FRAME_SAMPLES)
        timings = {"gpt_s": 0.0, "sovits_s": time.perf_counter() - t0, "prosody_hit": 0.0, "audio_hit": 0.0,
                   "partial": 1.0}
        self._chunks.put_nowait(AudioChunk(audio, self.job.text, self.job.index, self.job.sample_rate, timings))
        self.first_out.set()


class SampledAudio:
    """The vocode stage's pieces of a diffusion family's sentence (:meth:`Stages.sampled`): each sampler chunk goes
    out as soon as it is decoded, so a long sentence speaks after its first chunk's steps, not after all of them.
    Unlike :class:`EarlyAudio` it adds no model work (the pieces are the sentence's own decode), so a request that
    shares the device with others sends them all the same."""

    def __init__(self) -> None:
        self._chunks: asyncio.Queue[AudioChunk | None] = asyncio.Queue()
        self._closed = False
        self._ended = False  # the listener has taken the end mark

    def put(self, chunk: AudioChunk) -> None:
        """A piece for the listener (none after :meth:`close`)."""
        if not self._closed:
            self._chunks.put_nowait(chunk)

    def close(self) -> None:
        """No more pieces: the sentence's rest comes as its render's chunk (or its error)."""
        if not self._closed:
            self._closed = True
            self._chunks.put_nowait(None)

    def cancel(self) -> None:
        """Nothing of its own runs (the render task decodes): only close."""
        self.close()

    async def next_chunk(self) -> AudioChunk | None:
        """The next piece; None once no more will come."""
        if self._ended:
            return None
        item = await self._chunks.get()
        self._ended = item is None
        return item


def finish(job: SentenceJob) -> AudioChunk:
    """The sentence's chunk: its audio from where the early chunk stopped, then ``fragment_interval`` of silence."""
    assert job.audio is not None, "vocode runs first"
    gap = np.zeros(int(round(job.sample_rate * job.params.fragment_interval)), dtype=np.float32)
    return AudioChunk(np.concatenate([job.audio[job.emitted:], gap]), job.text, job.index, job.sample_rate,
                      job.timings)


def sentence_seed(seed: int, norm_text: str) -> int:
    """Per-sentence seed: fixed seeds give the same sentence the same sample wherever it appears."""
    if seed == -1:
        return random.getrandbits(31)
    digest = hashlib.blake2b(f"{seed}\x00{norm_text}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF
