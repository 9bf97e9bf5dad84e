"""A sentence's way through the pipeline, as named stages: ``phonemize -> (cached audio) -> speak -> finish``.

A sentence is one :class:`SentenceJob`; each stage reads what the ones before it filled in and adds its own part:

* :meth:`Stages.phonemize`: text -> phone ids, the sentence's seed and its cache keys;
* :meth:`Stages.cached_audio`: the audio cache, looked up first (a hit skips the GPT and SoVITS);
* :meth:`Stages.speak`: the semantic tokens from the prosody cache or BERT (zh) + the GPT, and SoVITS, all handed to
  the :class:`~synthesis.scheduler.DeviceWorker`, which decides when each step and each decode runs (and whether the
  sentence's first words go out in windows before its GPT ends); the results cached;
* :func:`finish`: the sentence's :class:`~synthesis.types.AudioChunk`, followed by its pause.

The stages never block the event loop and never touch the engine's threads.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import numpy as np

from engines import Engine
from engines.base import DIFFUSION_FAMILIES, SAMPLE_RATE, SamplingParams, SemanticRequest, check_sampler
from synthesis.cache import SynthesisCache
from synthesis.cache_lane import SpeechCache
from synthesis.metrics import PipelineStats
from synthesis.scheduler import LIVE, DeviceWorker
from synthesis.speaking import SentenceHandle, Utterance
from synthesis.text import Phonemes, bert_features, normalize_for_cache, text_to_phonemes
from synthesis.types import AudioChunk, SynthesisParams, Voice

@dataclass(eq=False)
class SentenceJob:
    """One sentence of one request on its way through the stages.

    Attributes
    ----------
    text, index: the sentence and its position in the request.
    voice, params: who speaks it, and how.
    priority, order: the worker's ordering (:data:`~synthesis.scheduler.LIVE` first, then (request, sentence)).
    ph, seed, prosody_key, audio_key, cached: filled by :meth:`Stages.phonemize`.
    tokens: ``[Ts]`` int64 semantic tokens, filled by :meth:`Stages.prosody`.
    audio: ``[N]`` float32 @ ``sample_rate`` (the engine's), the whole sentence, filled by
        :meth:`Stages.cached_audio` or :meth:`Stages.speak`; ``emitted`` of its first samples already went out early.
    timings: ``gpt_s``, ``sovits_s``, ``prosody_hit``, ``audio_hit`` (what the chunk reports).
    """

    text: str
    index: int
    voice: Voice
    params: SynthesisParams
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

    @property
    def engine(self) -> Engine:
        return self.worker.engine

    def next_request(self) -> int:
        """The next request's place in the admission order (its jobs' ``order`` starts with it)."""
        return self.worker.next_request()

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

    # ---- cached audio, then speak (prosody: cache | GPT; vocode: SoVITS) ---------------------------------------

    async def cached_audio(self, job: SentenceJob) -> bool:
        """The audio cache, looked up before anything else: True (and ``job.audio`` set) on a hit."""
        audio = await self.cache.get_audio(job.audio_key) if job.cached else None
        if audio is None:
            self.stats.counters["audio_miss"] += 1
            return False
        job.audio = audio
        job.timings["audio_hit"] = job.timings["prosody_hit"] = 1.0
        self.stats.counters["audio_hit"] += 1
        return True

    async def cached_tokens(self, job: SentenceJob) -> np.ndarray | None:
        """The sentence's semantic tokens from the prosody cache (None: a miss, the GPT makes them)."""
        tokens = await self.cache.get_tokens(job.prosody_key) if job.cached else None
        if tokens is None:
            self.stats.counters["prosody_miss"] += 1
            return None
        job.timings["prosody_hit"] = 1.0
        self.stats.counters["prosody_hit"] += 1
        return tokens

    async def speak(self, job: SentenceJob, work: SentenceHandle, first_window: int = 0,
                    on_audio: Callable[[np.ndarray], None] | None = None) -> None:
        """``job.tokens`` and ``job.audio``: the tokens from the prosody cache or the GPT, then SoVITS, on the worker
        (``work``: the sentence's handle); both stored for next time. ``first_window``: tokens of the first early
        window (0: none; see :mod:`synthesis.windows`); ``on_audio`` gets early audio as it is made (windows, or a
        diffusion family's sampler chunks), exactly the first ``job.emitted`` samples of ``job.audio``. A prosody hit
        speaks exactly what the run that filled it spoke (the windows depend only on the tokens)."""
        tokens = await self.cached_tokens(job)
        request = None if tokens is not None else await self.gpt_request(job, lambda fn: work.call(self.worker, fn))
        spoken = await work.speak(self.utterance(job, first_window), tokens=tokens, request=request, on_audio=on_audio)
        job.tokens, job.audio, job.emitted = spoken.tokens, spoken.audio, spoken.emitted
        job.timings["gpt_s"], job.timings["sovits_s"] = spoken.gpt_s, spoken.vocoder_s
        if job.cached and tokens is None:
            await self.cache.put_tokens(job.prosody_key, spoken.tokens, job.voice.id)  # (queued, not awaited)
        # audio fused with other voices' clips is not kept: its entry would be tagged with this voice alone, and
        # outlive the deletion of an aux voice whose timbre it carries
        if job.cached and not job.voice.timbre:
            await self.cache.put_audio(job.audio_key, spoken.audio, job.voice.id)  # (queued: the chunk goes out now)

    def utterance(self, job: SentenceJob, first_window: int = 0) -> Utterance:
        """What the worker's vocoder needs for this sentence."""
        p = job.params
        steps, cfg = self.sampler(p)
        return Utterance(job.phonemes.ids, job.voice.prompt, p.speed, p.noise_scale, job.seed, steps, cfg,
                         job.sample_rate, first_window=first_window, keep_windows=p.seed != -1,
                         sampled=self.engine.family in DIFFUSION_FAMILIES)

    async def gpt_request(self, job: SentenceJob, call: Callable[[Callable[[], Any]], Awaitable[Any]]
                          ) -> SemanticRequest:
        """The GPT's request for the sentence, with its BERT features (zh only) computed by ``call`` (the worker)."""
        ph, p = job.phonemes, job.params
        await self.load_bert_for(ph)
        bert = await call(lambda: bert_features(ph, self.engine.text_features))
        sampling = SamplingParams(top_k=p.top_k, top_p=p.top_p, temperature=p.temperature,
                                  repetition_penalty=p.repetition_penalty, seed=job.seed)
        return SemanticRequest(ph.ids, bert, job.voice.prompt, sampling)

    async def semantic(self, job: SentenceJob) -> tuple[np.ndarray, float]:
        """BERT features (zh only) then the GPT, on their own (precompute): (tokens ``[Ts]``, GPT seconds)."""
        def call(fn: Callable[[], Any]) -> Awaitable[Any]:
            return self.worker.call(fn, priority=job.priority, order=job.order)

        request = await self.gpt_request(job, call)
        return await self.worker.semantic(request, priority=job.priority, order=job.order)

    async def load_bert_for(self, ph: Phonemes) -> None:
        """Load BERT in a helper thread before the first Chinese text needs it: the load takes seconds, and on the
        single device thread it would stall every other listener's speech meanwhile."""
        if any(piece.lang == "zh" for piece in ph.pieces):
            await asyncio.to_thread(self.engine.load_encoder, "bert")


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
