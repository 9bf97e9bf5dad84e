"""``Synthesizer.stream``: the hot path from text to audio chunks, sentence by sentence.

Each sentence is one :class:`~synthesis.stages.SentenceJob` through the stages of :mod:`synthesis.stages`:
``phonemize -> (cached audio) -> speak -> finish``. One producer turns the text into a render task per sentence, up
to ``LOOKAHEAD`` ahead of the one being yielded, each registered with the device worker in order; the worker decides
when each sentence's GPT and decodes run (so the GPT of sentence i+1 runs while sentence i is being decoded and
played), and whether a first sentence's first words go out before its GPT ends. This module hands the work over and
passes the audio on, telling the worker how much audio the listener has in hand. Every request is independent: the
voice travels with it, nothing is shared between users but the engine and the caches. Voices are made and deleted
by :mod:`synthesis.voicing`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import time
from typing import AsyncGenerator, AsyncIterator, Awaitable, Callable, NamedTuple, TypeAlias

import numpy as np

from engines import Engine, SpeechError
from engines.base import DIFFUSION_FAMILIES, SAMPLE_RATE, SamplingParams, SemanticRequest, VoicePrompt
from synthesis.admission import Admission, AdmittedStream
from synthesis.cache_lane import SpeechCache
from synthesis.metrics import PipelineStats
from synthesis.scheduler import LIVE, Clock, DeviceWorker
from synthesis.speaking import RequestHandle, SentenceHandle
from synthesis.stages import SentenceJob, Stages, finish
from synthesis.text import SentenceStream, split_sentences, text_to_phonemes
from synthesis.types import AudioChunk, DeadlineError, Limits, SynthesisParams, Voice
from synthesis.voices import VoiceStore
from synthesis.voicing import Voicing
from synthesis.windows import EARLY_MAX_SPEED, at_speed

log = logging.getLogger(__name__)

LOOKAHEAD = 2  # sentences rendered ahead of the one being yielded
WARM_UP_TOKENS = 8  # GPT steps of the start-up warm-up run
# A request starts only if its first sentence comes within this share of the deadline: the rest is the headroom
# that lets its later sentences wait behind the requests admitted before it, so a request that starts is finished.
FIRST_WAIT_SHARE = 0.5


class _InFlight(NamedTuple):
    """A sentence handed from the producer to the consumer: its render task (its last chunk), its job, its handle on
    the worker, and its audio that goes out before the sentence is spoken whole (then None)."""

    task: asyncio.Task[AudioChunk]
    job: SentenceJob
    work: SentenceHandle
    early: asyncio.Queue[AudioChunk | None]


# the producer -> consumer queue: a sentence, the producer's failure, or None (the text ended)
_Order: TypeAlias = "asyncio.Queue[_InFlight | BaseException | None]"


class Synthesizer:
    """Text (whole or streamed) + voice -> audio chunks. One per process; safe for many concurrent callers.

    Parameters
    ----------
    worker: the device worker that owns the engine (built by the caller, closed by :meth:`close`).
    voices: the voice store.
    cache: the prosody and audio caches, as the stages use them (closed by :meth:`close`).
    defaults: per-request options when a call gives none.
    limits: the operational limits.

    Attributes
    ----------
    stages: the sentence stages (:mod:`synthesis.stages`).
    voicing: creates, re-encodes, precomputes and deletes voices (:mod:`synthesis.voicing`).
    stats: counters and recent timings (:mod:`synthesis.metrics`).
    """

    def __init__(self, worker: DeviceWorker, voices: VoiceStore, cache: SpeechCache, *,
                 defaults: SynthesisParams | None = None, limits: Limits | None = None) -> None:
        self.worker = worker
        self.voices = voices
        self.cache = cache
        self.defaults = defaults or SynthesisParams()
        self.limits = limits or Limits()
        self.stats = PipelineStats()
        self.stages = Stages(worker, cache, self.stats)
        self.voicing = Voicing(self.stages, voices, self.limits, self.defaults)
        # live requests between their stream() call and the end of their stream
        self.admission = Admission(lambda: self.limits.queue_size, self.stats.counters)

    @property
    def engine(self) -> Engine:
        return self.worker.engine

    @property
    def clock(self) -> Clock:
        """The time deadlines are measured in: the worker's (tests may give it a virtual clock)."""
        return self.worker.clock

    @property
    def engine_name(self) -> str:
        return self.engine.name

    @property
    def sample_rate(self) -> int:
        """Hz of the audio this synthesizer speaks (the loaded model's: 32000, v4/v5 48000, v3 24000)."""
        return self.engine.sample_rate

    @property
    def device(self) -> str:
        return self.engine.device

    @property
    def precision(self) -> str:
        return self.engine.precision

    @property
    def counters(self) -> collections.Counter[str]:
        return self.stats.counters

    @property
    def busy(self) -> bool:
        """True when a new live request would be refused (``limits.queue_size`` requests are admitted)."""
        return self.admission.busy

    # ---- speech ------------------------------------------------------------------------------------------------

    def stream(self, text: str | AsyncIterator[str], voice: Voice | str,
               params: SynthesisParams | None = None, *, deadline: float | None = None,
               priority: int = LIVE) -> AdmittedStream:
        """Yield audio sentence by sentence.

        Parameters
        ----------
        text: the whole text, or an async iterator of pieces (a chat model's output, any split).
        voice: a :class:`Voice`, a voice id, or a voice name.
        params: per-request options (defaults from config).
        deadline: an overall ``clock()`` limit for the whole request (default: none). Waiting is bounded per
            sentence anyway: each sentence may wait ``limits.deadline_s`` from when its text arrived and somebody
            waits for it; past that the stream raises :class:`~synthesis.types.DeadlineError`.

        A live request is admitted at this call: at most ``limits.queue_size`` are between their call and the
        end of their stream; past that the stream raises :class:`~synthesis.types.BusyError` at its first step,
        before any work. Closing the iterator or cancelling the consuming task stops the model work within one
        GPT step.
        """
        return self.admission.stream(
            lambda release: self._stream(text, voice, params, deadline, priority, release),
            lambda: (f"the speech queue is full ({self.limits.queue_size} requests are being spoken or waiting); "
                     "try again in a moment"), admitted=priority == LIVE)

    async def _stream(self, text: str | AsyncIterator[str], voice: Voice | str, params: SynthesisParams | None,
                      deadline: float | None, priority: int, release: Callable[[], None]
                      ) -> AsyncGenerator[AudioChunk, None]:
        """The body of :meth:`stream` for an admitted request: one producer, this consumer, in sentence order."""
        overall = math.inf if deadline is None else float(deadline)
        talk = self.worker.open(priority=priority, at=overall)  # (admitted: the worker counts it from now on)
        try:
            p = params or self.defaults
            v = await self.voicing.speaking(await self.voicing.fit(await self._resolve_voice(voice)), p)
        except BaseException:
            talk.close()
            release()
            raise
        self.counters["requests"] += 1
        started, audio_s, playing_from = time.perf_counter(), 0.0, 0.0
        order: _Order = asyncio.Queue(LOOKAHEAD)  # bounded: how far the producer renders ahead
        producer = asyncio.create_task(self._produce(text, v, p, priority, talk, order))
        current: _InFlight | None = None
        try:
            while (item := await order.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                current = item
                item.work.waiting()  # somebody waits for this sentence from now on
                while True:  # its early audio as it comes, then the sentence (or the rest of it)
                    early = await item.early.get()
                    chunk = early if early is not None else await item.task
                    if audio_s == 0.0:
                        self.stats.ttfa_s.append(time.perf_counter() - started)
                        playing_from = self.clock()
                    audio_s += chunk.audio.size / chunk.sample_rate
                    talk.played(playing_from + audio_s)  # (played from the first chunk on, as it comes)
                    yield chunk
                    if early is None:
                        break
                current = None
            if audio_s > 0:
                self.stats.rtf.append((time.perf_counter() - started) / audio_s)
            self.counters["completed"] += 1
        except DeadlineError:
            self.counters["deadline"] += 1
            raise
        finally:
            release()
            talk.close()
            producer.cancel()
            await _cancel_in_flight(producer, current, order)

    async def _produce(self, text: str | AsyncIterator[str], v: Voice, p: SynthesisParams, priority: int,
                       talk: RequestHandle, order: _Order) -> None:
        """Register each sentence with the worker and start its render task as soon as the sentence is complete.

        A first sentence may speak its first words in windows while its GPT runs (:mod:`synthesis.windows`; the
        worker decides whether it does, see ``DeviceWorker._alone_or_speaking``); a diffusion family's sentences
        speak their sampler's chunks as they come."""
        first_window = at_speed(self.limits.first_chunk_tokens, p.speed)
        diffusion = self.engine.family in DIFFUSION_FAMILIES
        try:
            async for index, sentence in _enumerate(self._sentences(text, p)):
                # the sentence's own wait bound: its clock starts when the consumer waits for it
                wait_s = self.limits.deadline_s * (FIRST_WAIT_SHARE if index == 0 else 1.0)
                job = SentenceJob(sentence, index, v, p, priority, (talk.rid, index))
                work = talk.sentence(index, wait_s)
                windows = first_window if index == 0 and not diffusion and p.speed <= EARLY_MAX_SPEED else 0
                early: asyncio.Queue[AudioChunk | None] = asyncio.Queue()
                item = _InFlight(asyncio.create_task(self._render(job, work, windows, early)), job, work,
                                 early)
                try:
                    await order.put(item)
                except asyncio.CancelledError:
                    item.task.cancel()
                    raise
            await order.put(None)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            await order.put(e)

    async def _render(self, job: SentenceJob, work: SentenceHandle, first_window: int,
                      early: asyncio.Queue[AudioChunk | None]) -> AudioChunk:
        """One sentence through the stages: its early audio into ``early`` as the worker makes it, then None; its
        last chunk (the sentence from where the early audio stopped) as the result."""

        def out(audio: np.ndarray) -> None:
            early.put_nowait(AudioChunk(audio, job.text, job.index, job.sample_rate, {**job.timings, "partial": 1.0}))

        try:
            await self.stages.phonemize(job)
            if not await self.stages.cached_audio(job):
                await self.stages.speak(job, work, first_window, out)
            return finish(job)
        finally:
            work.settle()  # (a cache hit or a failure: the sentence after it must not wait for it)
            early.put_nowait(None)

    async def synthesize(self, text: str, voice: Voice | str,
                         params: SynthesisParams | None = None) -> tuple[np.ndarray, list[AudioChunk]]:
        """The whole text as one waveform ``[N]`` float32 at :attr:`sample_rate`, plus the chunks (for timings)."""
        chunks = [c async for c in self.stream(text, voice, params)]
        audio = np.concatenate([c.audio for c in chunks]) if chunks else np.zeros(0, np.float32)
        return audio, chunks

    def _sentences(self, text: str | AsyncIterator[str], p: SynthesisParams) -> AsyncIterator[str]:
        """Sentences as soon as they are certainly complete (:func:`stream_sentences`)."""
        return stream_sentences(text, p, self.limits)

    async def _resolve_voice(self, voice: Voice | str) -> Voice:
        """A voice given by id or name, read from the store off the event loop (the store reads files and SQLite)."""
        if isinstance(voice, Voice):
            return voice
        return await asyncio.to_thread(self.voices.lookup, voice)

    # ---- lifecycle ---------------------------------------------------------------------------------------------

    async def warm_up(self) -> None:
        """Pay the one-time costs now, not on the first request: the text front-end's dictionaries, the GPT's
        KV cache allocation and the first-call kernel selection of the GPT and SoVITS."""
        for text, lang in (("Hello 42, how are you?", "en"), ("你好，一二三。", "zh")):
            try:
                ph_warm = await asyncio.to_thread(text_to_phonemes, text, lang)
                if lang == "zh" and self.defaults.language == "zh":  # Chinese is the default: BERT now
                    await self.stages.load_bert_for(ph_warm)
            except SpeechError as e:  # a missing optional language must not stop the process
                log.warning("text front-end warm-up for %s failed: %s", lang, e)
        ph = await asyncio.to_thread(text_to_phonemes, "Warming up.", "en")
        engine = self.engine
        silence = np.zeros(SAMPLE_RATE, np.float32)  # [32000] @ 32 kHz
        sv = await self.worker.call(lambda: engine.encode_speaker([silence]))
        self.voicing.uses_sv = sv is not None
        _, ge = await self.worker.call(lambda: engine.encode_reference(None, [silence], sv_emb=sv))
        prompt = VoicePrompt(np.zeros(0, np.int64), np.asarray(ge, np.float32), np.zeros(0, np.int64),
                             np.zeros((1024, 0), np.float32), None if sv is None else np.asarray(sv, np.float32))
        request = SemanticRequest(ph.ids, np.zeros((1024, ph.ids.size), np.float32), prompt,
                                  SamplingParams(seed=0, early_stop_num=WARM_UP_TOKENS))
        tokens, _ = await self.worker.semantic(request)
        if engine.family in DIFFUSION_FAMILIES:  # their decode needs a transcript's tokens and phones, and a mel prompt
            mel = await self.worker.call(lambda: engine.reference_mel(silence, SAMPLE_RATE))
            prompt = dataclasses.replace(prompt, prompt_tokens=np.asarray(tokens, np.int64), prompt_phones=ph.ids,
                                         family=engine.family, ref_mel=mel)
        await self.worker.call(lambda: engine.decode(tokens, ph.ids, prompt, 1.0, 0.5, 0))

    def metrics(self) -> dict[str, object]:
        """Counters, hit ratios, recent timings and the engine, for ``/metrics``."""
        return {**self.stats.snapshot(queue_depth=self.worker.queue_depth, inflight=self.admission.in_flight,
                                      engine=self.engine.name, device=self.engine.device,
                                      precision=self.engine.precision, plan=self.engine.plan.labels()),
                "cache_write_failures": self.cache.write_failures}

    async def close(self) -> None:
        await self.voicing.stop_precompute()
        await asyncio.to_thread(self.worker.close)
        await self.cache.close()  # (after its queued writes)
        self.voices.close()  # (its SQLite connections; a later use opens them again)


async def stream_sentences(text: str | AsyncIterator[str], p: SynthesisParams, limits: Limits) -> AsyncIterator[str]:
    """The sentences of ``stream``'s text argument, each as soon as it is certainly complete: the argument handling
    of :meth:`Synthesizer.stream`, one body for the local pipeline and the remote client (``synthesis.cluster.client``).

    A string is checked against ``limits.max_text_chars`` and split at once; streamed pieces go through a
    :class:`~synthesis.text.SentenceStream`, which emits a sentence at its end, at ``limits.stream_max_chars``
    pending, or when the writer pauses for ``limits.stream_pause_s``.
    """
    if isinstance(text, str):
        if len(text) > limits.max_text_chars:
            raise SpeechError(f"the text is {len(text)} characters long; the limit is "
                              f"{limits.max_text_chars}: send it in parts")
        for s in split_sentences(text, p.split_method, p.language):
            yield s
        return
    splitter = SentenceStream(p.split_method, p.language, limits.stream_max_chars)
    pieces = aiter(text)
    next_piece: asyncio.Task[str] | None = None
    try:
        while True:
            next_piece = asyncio.ensure_future(anext(pieces))
            done, _ = await asyncio.wait({next_piece}, timeout=limits.stream_pause_s)
            if not done:  # the writer paused: speak what we have, keep waiting
                for s in splitter.flush():
                    yield s
                await asyncio.wait({next_piece})
            try:
                piece = next_piece.result()
            except StopAsyncIteration:
                next_piece = None
                break
            next_piece = None
            for s in splitter.feed(piece):
                yield s
        for s in splitter.flush():
            yield s
    finally:
        if next_piece is not None and not next_piece.done():
            next_piece.cancel()


async def _enumerate(items: AsyncIterator[str]) -> AsyncIterator[tuple[int, str]]:
    index = 0
    async for item in items:
        yield index, item
        index += 1


async def _cancel_in_flight(producer: asyncio.Task[None], current: _InFlight | None, order: _Order) -> None:
    """The request ended (done, failed, closed or cancelled): stop whatever it still has in flight."""
    leftovers: list[Awaitable[object]] = [producer]
    if current is not None:
        current.task.cancel()
        leftovers.append(current.task)
    while not order.empty():
        item = order.get_nowait()
        if isinstance(item, _InFlight):
            item.task.cancel()
            leftovers.append(item.task)
    await asyncio.gather(*leftovers, return_exceptions=True)
