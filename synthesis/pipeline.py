"""``Synthesizer.stream``: the hot path from text to audio chunks, sentence by sentence.

Per sentence: text front-end -> prosody cache or GPT -> audio cache or SoVITS. Up to ``LOOKAHEAD`` sentences are
in flight, so the GPT of sentence i+1 runs while sentence i is being decoded and played. Every request is
independent: the voice travels with it, nothing is shared between users but the engine and the caches.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import random
import time
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

import numpy as np

from engines.base import SAMPLE_RATE, SAMPLES_PER_TOKEN, Engine, SamplingParams, SemanticRequest, SpeechError, VoicePrompt
from synthesis.audio import decode_upload, prepare_reference
from synthesis.cache import SynthesisCache
from synthesis.scheduler import BACKGROUND, LIVE, DeviceWorker
from synthesis.text import Phonemes, SentenceStream, bert_features, normalize_for_cache, split_sentences, text_to_phonemes
from synthesis.types import AudioChunk, BusyError, SynthesisParams, Voice, VoiceNotFound
from synthesis.voices import VoiceStore

log = logging.getLogger(__name__)

LOOKAHEAD = 2  # sentences rendered ahead of the one being yielded
FADE_S = 0.004  # seconds of fade at each sentence edge, so joins with the silence never click
METRIC_WINDOW = 512  # recent samples kept for the ttfa / rtf histograms
WARM_UP_TOKENS = 8  # GPT steps of the start-up warm-up run
_PRIORITY_SPAN = 100_000
EARLY_HOLDBACK_TOKENS = 4  # the early chunk's last tokens lack right context: the full decode replaces them
CROSSFADE_SAMPLES = 640  # 20 ms @ 32 kHz where the early chunk hands over to the full decode  # job priority = request priority * span + sentence index (earlier sentences first)
Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class Limits:
    """Operational limits (from config)."""

    queue_size: int = 64  # concurrent requests before "busy"
    deadline_s: float = 120.0  # default per-request deadline
    stream_pause_s: float = 1.5  # flush streamed text after this pause
    stream_max_chars: int = 300  # ...or once this much is pending
    max_text_chars: int = 5000
    first_chunk_tokens: int = 24  # first sentence: speak its first tokens before its GPT ends (0 = off)
    max_upload_bytes: int = 25 * 1024 * 1024
    max_upload_s: float = 600.0
    min_speech_s: float = 3.0
    max_speech_s: float = 10.0


class Synthesizer:
    """Text (whole or streamed) + voice -> audio chunks. One per process; safe for many concurrent callers."""

    def __init__(self, engine: Engine, voices: VoiceStore, cache: SynthesisCache, *,
                 defaults: SynthesisParams | None = None, limits: Limits | None = None) -> None:
        self.engine = engine
        self.voices = voices
        self.cache = cache
        self.defaults = defaults or SynthesisParams()
        self.limits = limits or Limits()
        self.worker = DeviceWorker(engine)
        self._inflight = 0
        self.ttfa_s: collections.deque[float] = collections.deque(maxlen=METRIC_WINDOW)
        self.rtf: collections.deque[float] = collections.deque(maxlen=METRIC_WINDOW)
        self.counters: collections.Counter[str] = collections.Counter()
        self._background: set[asyncio.Task[int]] = set()

    @property
    def engine_name(self) -> str:
        return self.engine.name

    @property
    def device(self) -> str:
        return self.engine.device

    @property
    def precision(self) -> str:
        return self.engine.precision

    # ---- speech ------------------------------------------------------------------------------------------------

    async def stream(self, text: str | AsyncIterator[str], voice: Voice | str,
                     params: SynthesisParams | None = None, *, deadline: float | None = None,
                     priority: int = LIVE) -> AsyncIterator[AudioChunk]:
        """Yield audio sentence by sentence.

        Parameters
        ----------
        text: the whole text, or an async iterator of pieces (a chat model's output, any split).
        voice: a :class:`Voice`, a voice id, or a voice name.
        params: per-request options (defaults from config).
        deadline: ``time.monotonic()`` limit (default: now + ``limits.deadline_s``).

        Closing the iterator or cancelling the consuming task stops the model work within one GPT step.
        """
        # "Busy" is about work waiting for the model, not about open streams (a playing stream holds no work).
        if self.worker.queue_depth >= self.limits.queue_size:
            self.counters["busy"] += 1
            raise BusyError(f"the speech queue is full ({self.limits.queue_size} jobs waiting for the model); "
                            f"try again in a moment")
        v = self._resolve_voice(voice)
        p = params or self.defaults
        deadline = deadline if deadline is not None else time.monotonic() + self.limits.deadline_s
        self._inflight += 1
        self.counters["requests"] += 1
        started = time.perf_counter()
        audio_s = 0.0
        # The producer turns text into render tasks; the bounded queue limits how far it runs ahead.
        order: asyncio.Queue[asyncio.Task[AudioChunk | None] | BaseException | None] = asyncio.Queue(LOOKAHEAD)
        producer = asyncio.create_task(self._produce(text, v, p, deadline, priority, order))
        current: asyncio.Task[AudioChunk | None] | None = None
        try:
            while (item := await order.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                current = item
                chunk = await current
                current = None
                if chunk is None:  # an early chunk that did not happen (short sentence, cache hit)
                    continue
                if audio_s == 0.0:
                    self.ttfa_s.append(time.perf_counter() - started)
                audio_s += chunk.audio.size / SAMPLE_RATE
                yield chunk
            if audio_s > 0:
                self.rtf.append((time.perf_counter() - started) / audio_s)
        finally:
            self._inflight -= 1
            producer.cancel()
            leftovers = [current] if current is not None else []
            while not order.empty():
                item = order.get_nowait()
                if isinstance(item, asyncio.Task):
                    leftovers.append(item)
            for task in leftovers:
                task.cancel()
            await asyncio.gather(producer, *leftovers, return_exceptions=True)

    async def _produce(self, text: str | AsyncIterator[str], v: Voice, p: SynthesisParams, deadline: float,
                       priority: int,
                       order: asyncio.Queue[asyncio.Task[AudioChunk | None] | BaseException | None]) -> None:
        """Start a render task per sentence as soon as the sentence is complete."""
        try:
            index = 0
            previous_gpt: asyncio.Event | None = None
            async for sentence in self._sentences(text, p):
                gpt_done = asyncio.Event()
                early = None
                if index == 0 and self.limits.first_chunk_tokens > 0 and p.speed == 1.0:
                    early = _EarlyChunk(self.limits.first_chunk_tokens)
                    early_task = asyncio.create_task(self._render_early(sentence, v, p, deadline, priority, early))
                    try:
                        await order.put(early_task)
                    except asyncio.CancelledError:
                        early_task.cancel()
                        raise
                task = asyncio.create_task(self._render(sentence, index, v, p, deadline, priority, previous_gpt,
                                                        gpt_done, early))
                previous_gpt = gpt_done
                try:
                    await order.put(task)
                except asyncio.CancelledError:
                    task.cancel()
                    if early is not None:
                        early.give_up()
                    raise
                index += 1
            await order.put(None)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            await order.put(e)

    async def synthesize(self, text: str, voice: Voice | str,
                         params: SynthesisParams | None = None) -> tuple[np.ndarray, list[AudioChunk]]:
        """The whole text as one waveform ``[N]`` float32 @ 32 kHz, plus the chunks (for timings)."""
        chunks = [c async for c in self.stream(text, voice, params)]
        audio = np.concatenate([c.audio for c in chunks]) if chunks else np.zeros(0, np.float32)
        return audio, chunks

    async def _sentences(self, text: str | AsyncIterator[str], p: SynthesisParams) -> AsyncIterator[str]:
        """Sentences as soon as they are certainly complete."""
        if isinstance(text, str):
            if len(text) > self.limits.max_text_chars:
                raise SpeechError(f"the text is {len(text)} characters long; the limit is "
                                  f"{self.limits.max_text_chars}: send it in parts")
            for s in split_sentences(text, p.split_method, p.language):
                yield s
            return
        splitter = SentenceStream(p.split_method, p.language, self.limits.stream_max_chars)
        pieces = aiter(text)
        next_piece: asyncio.Task[str] | None = None
        try:
            while True:
                next_piece = asyncio.ensure_future(anext(pieces))
                done, _ = await asyncio.wait({next_piece}, timeout=self.limits.stream_pause_s)
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

    async def _render(self, sentence: str, index: int, voice: Voice, p: SynthesisParams, deadline: float,
                      priority: int, after: asyncio.Event | None = None,
                      gpt_done: asyncio.Event | None = None, early: _EarlyChunk | None = None) -> AudioChunk:
        """One sentence: front-end, prosody (cache or GPT), audio (cache or SoVITS).

        A request's sentences take the GPT one after another (``after`` -> ``gpt_done``): sentence i+1's GPT runs
        while sentence i is being decoded, and sentence 1 never shares the GPT with its own followers, which keeps
        the time to first audio short. Earlier sentences go first on the vocoder too.
        """
        try:
            return await self._render_sentence(sentence, index, voice, p, deadline,
                                               priority * _PRIORITY_SPAN + index, after, gpt_done, early)
        finally:
            if gpt_done is not None:
                gpt_done.set()  # never leave a follower waiting (cache hit, error or cancellation)
            if early is not None:
                early.give_up()  # nor the early chunk

    async def _render_sentence(self, sentence: str, index: int, voice: Voice, p: SynthesisParams,
                               deadline: float, priority: int, after: asyncio.Event | None,
                               gpt_done: asyncio.Event | None, early: _EarlyChunk | None) -> AudioChunk:
        timings: dict[str, float] = {"gpt_s": 0.0, "sovits_s": 0.0, "prosody_hit": 0.0, "audio_hit": 0.0}
        ph = await asyncio.to_thread(text_to_phonemes, sentence, p.language)
        seed = _sentence_seed(p.seed, ph.norm_text)
        pkey = self._prosody_key(voice, ph, p)
        akey = self.cache.audio_key(pkey, p.speed, p.noise_scale, p.seed if p.seed != -1 else "any")
        audio = self.cache.get_audio(akey)
        emitted = 0  # samples of this sentence the early chunk already delivered
        if audio is not None:
            timings["audio_hit"] = timings["prosody_hit"] = 1.0
            self.counters["audio_hit"] += 1
        else:
            self.counters["audio_miss"] += 1
            tokens = self.cache.get_tokens(pkey)
            if tokens is not None:
                timings["prosody_hit"] = 1.0
                self.counters["prosody_hit"] += 1
                if early is not None:
                    early.offer(ph, tokens, seed)
            else:
                self.counters["prosody_miss"] += 1
                if after is not None:
                    await after.wait()
                on_tokens = (lambda new: early.collect(ph, new, seed)) if early is not None else None
                tokens, timings["gpt_s"] = await self._semantic(ph, voice.prompt, p, seed, deadline, priority,
                                                                on_tokens)
                self.cache.put_tokens(pkey, tokens, voice.id)
            if gpt_done is not None:
                gpt_done.set()
            if early is not None:
                early.give_up()  # no early chunk unless it has started by now
            t0 = time.perf_counter()
            audio = await self.worker.call(
                lambda: self.engine.decode(tokens, ph.ids, voice.prompt, p.speed, p.noise_scale, seed),
                priority=priority, deadline=deadline)
            timings["sovits_s"] = time.perf_counter() - t0
            audio = np.asarray(audio, dtype=np.float32)
            handover = await early.handover() if early is not None else None
            if handover is not None:
                emitted, head = handover
                audio = _stitch(head, audio, emitted)
            audio = _fade_edges(audio)
            self.cache.put_audio(akey, audio, voice.id)
        gap = np.zeros(int(round(SAMPLE_RATE * p.fragment_interval)), dtype=np.float32)
        return AudioChunk(np.concatenate([audio[emitted:], gap]), sentence, index, SAMPLE_RATE, timings)

    async def _render_early(self, sentence: str, voice: Voice, p: SynthesisParams, deadline: float, priority: int,
                            early: _EarlyChunk) -> AudioChunk | None:
        """The first sentence's first words, decoded from its first tokens while its GPT still runs."""
        try:
            offered = await early.prefix
            if offered is None:
                return None
            ph, tokens, seed = offered
            t0 = time.perf_counter()
            head = await self.worker.call(
                lambda: self.engine.decode(tokens, ph.ids, voice.prompt, 1.0, p.noise_scale, seed),
                priority=priority * _PRIORITY_SPAN, deadline=deadline)
            head = np.asarray(head, dtype=np.float32)
            emitted = min(head.size, (tokens.size - EARLY_HOLDBACK_TOKENS) * SAMPLES_PER_TOKEN)
            early.result.set_result((emitted, head))
            timings = {"gpt_s": 0.0, "sovits_s": time.perf_counter() - t0, "prosody_hit": 0.0, "audio_hit": 0.0,
                       "partial": 1.0}
            return AudioChunk(_fade_edges(head[:emitted], tail=False), sentence, 0, SAMPLE_RATE, timings)
        finally:
            if not early.result.done():
                early.result.set_result(None)

    async def _semantic(self, ph: object, prompt: VoicePrompt, p: SynthesisParams, seed: int, deadline: float,
                        priority: int, on_tokens: Callable[[np.ndarray], None] | None = None
                        ) -> tuple[np.ndarray, float]:
        """BERT features (zh only) then the GPT, both on the device worker."""
        bert = await self.worker.call(lambda: bert_features(ph, self.engine.text_features),  # type: ignore[arg-type]
                                      priority=priority, deadline=deadline)
        sampling = SamplingParams(top_k=p.top_k, top_p=p.top_p, temperature=p.temperature,
                                  repetition_penalty=p.repetition_penalty, seed=seed)
        request = SemanticRequest(ph.ids, bert, prompt, sampling)  # type: ignore[attr-defined]
        return await self.worker.semantic(request, priority=priority, deadline=deadline, on_tokens=on_tokens)

    def _prosody_key(self, voice: Voice, ph: Phonemes, p: SynthesisParams) -> str:
        """The cache key of a sentence's semantic tokens.

        The language part is the languages the front-end actually used for its pieces, not the requested mode,
        so "auto" and "en" share entries for an English sentence (precomputed phrases hit either way).
        """
        sampling = {"top_k": p.top_k, "top_p": p.top_p, "temperature": p.temperature,
                    "repetition_penalty": p.repetition_penalty,
                    # a random-seed request takes any earlier sample of the same text (that is what makes
                    # precomputed common phrases hit); a seeded one only its own
                    "seed": p.seed if p.seed != -1 else "any"}
        return self.cache.prosody_key(self.engine.model_id, voice.id, voice.version,
                                      normalize_for_cache(ph.norm_text),
                                      "+".join(piece.lang for piece in ph.pieces), sampling)

    def _resolve_voice(self, voice: Voice | str) -> Voice:
        if isinstance(voice, Voice):
            return voice
        try:
            return self.voices.get(voice)
        except VoiceNotFound:
            return self.voices.find(voice)

    # ---- voices ------------------------------------------------------------------------------------------------

    async def create_voice(self, name: str, data: bytes, filename: str = "", *, consent: Mapping[str, Any],
                           owner_id: int = 0, transcript: str | None = None, language: str = "auto",
                           enrollment_prompt: str | None = None, progress: Progress | None = None,
                           phrases: Sequence[str] = ()) -> tuple[Voice, list[str]]:
        """Validate and encode an uploaded clip, store the voice, start precomputing ``phrases``.

        ``consent`` is the speaker's consent record (``user_id``, ``text``; see ``synthesis.voices.Consent``):
        nothing is stored without it.
        """
        report = progress or (lambda stage, frac: None)
        report("decoding", 0.0)
        lim = self.limits
        dec = await asyncio.to_thread(decode_upload, data, filename, max_bytes=lim.max_upload_bytes,
                                      max_seconds=lim.max_upload_s)
        ref = await asyncio.to_thread(prepare_reference, dec, min_s=lim.min_speech_s, max_s=lim.max_speech_s)
        report("encoding", 0.3)
        prompt_text = (transcript or enrollment_prompt or "").strip()
        prompt = await self._encode_prompt(ref.wav16k, ref.wav32k, prompt_text, language)
        report("storing", 0.8)
        voice = await asyncio.to_thread(
            self.voices.create, name, ref, prompt, owner_id=owner_id, language=language, prompt_text=prompt_text,
            model_id=self.engine.model_id, consent=consent, enrollment_prompt=enrollment_prompt)
        report("done", 1.0)
        if phrases:
            self.precompute(voice, phrases)
        return voice, list(ref.warnings)

    async def _encode_prompt(self, wav16k: np.ndarray, wav32k: np.ndarray, prompt_text: str,
                             language: str) -> VoicePrompt:
        if prompt_text:
            if prompt_text[-1] not in "，。？！,.?!~:：—…":
                prompt_text += "." if language == "en" else "。"
            ph = await asyncio.to_thread(text_to_phonemes, prompt_text, language)
            bert = await self.worker.call(lambda: bert_features(ph, self.engine.text_features))
            tokens, ge = await self.worker.call(lambda: self.engine.encode_reference(wav16k, [wav32k]))
            return VoicePrompt(np.asarray(tokens, np.int64), np.asarray(ge, np.float32),
                               np.asarray(ph.ids, np.int64), np.asarray(bert, np.float32))
        _, ge = await self.worker.call(lambda: self.engine.encode_reference(None, [wav32k]))
        return VoicePrompt(np.zeros(0, np.int64), np.asarray(ge, np.float32), np.zeros(0, np.int64),
                           np.zeros((1024, 0), np.float32))

    async def delete_voice(self, voice_id: str) -> None:
        """Remove the voice and every byte derived from it (files and cache entries)."""
        await asyncio.to_thread(self.voices.delete, voice_id)

    def precompute(self, voice: Voice, phrases: Sequence[str], progress: Progress | None = None,
                   params: SynthesisParams | None = None) -> asyncio.Task[int]:
        """Compute the prosody of ``phrases`` in the background (live requests always go first)."""
        task = asyncio.create_task(self._precompute(voice, list(phrases), progress, params or self.defaults))
        self._background.add(task)
        task.add_done_callback(self._background_done)
        return task

    def _background_done(self, task: asyncio.Task[int]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("precompute failed: %s", task.exception())

    async def _precompute(self, voice: Voice, phrases: list[str], progress: Progress | None,
                          p: SynthesisParams) -> int:
        done = 0
        for i, phrase in enumerate(phrases):
            for sentence in split_sentences(phrase, p.split_method, p.language):
                ph = await asyncio.to_thread(text_to_phonemes, sentence, p.language)
                pkey = self._prosody_key(voice, ph, p)
                if self.cache.get_tokens(pkey) is None:
                    seed = _sentence_seed(p.seed, ph.norm_text)
                    tokens, _ = await self._semantic(ph, voice.prompt, p, seed, float("inf"),
                                                    BACKGROUND * _PRIORITY_SPAN)
                    self.cache.put_tokens(pkey, tokens, voice.id)
                    done += 1
            if progress is not None:
                progress("precompute", (i + 1) / len(phrases))
        return done

    # ---- lifecycle ---------------------------------------------------------------------------------------------

    async def warm_up(self) -> None:
        """Pay the one-time costs now, not on the first request: the text front-end's dictionaries, the GPT's
        KV cache allocation and the first-call kernel selection of the GPT and SoVITS."""
        for text, lang in (("Hello 42, how are you?", "en"), ("你好，一二三。", "zh")):
            try:
                await asyncio.to_thread(text_to_phonemes, text, lang)
            except SpeechError as e:  # a missing optional language must not stop the process
                log.warning("text front-end warm-up for %s failed: %s", lang, e)
        ph = await asyncio.to_thread(text_to_phonemes, "Warming up.", "en")
        _, ge = await self.worker.call(lambda: self.engine.encode_reference(None, [np.zeros(SAMPLE_RATE, np.float32)]))
        prompt = VoicePrompt(np.zeros(0, np.int64), np.asarray(ge, np.float32), np.zeros(0, np.int64),
                             np.zeros((1024, 0), np.float32))
        request = SemanticRequest(ph.ids, np.zeros((1024, ph.ids.size), np.float32), prompt,
                                  SamplingParams(seed=0, early_stop_num=WARM_UP_TOKENS))
        tokens, _ = await self.worker.semantic(request)
        await self.worker.call(lambda: self.engine.decode(tokens, ph.ids, prompt, 1.0, 0.5, 0))

    def metrics(self) -> dict[str, object]:
        c = self.counters
        ph, pm = c["prosody_hit"], c["prosody_miss"]
        ah, am = c["audio_hit"], c["audio_miss"]
        return {
            "queue_depth": self.worker.queue_depth, "inflight": self._inflight, "requests": c["requests"],
            "busy": c["busy"], "prosody_hits": ph, "prosody_misses": pm, "audio_hits": ah, "audio_misses": am,
            "prosody_hit_ratio": ph / (ph + pm) if ph + pm else 0.0,
            "audio_hit_ratio": ah / (ah + am) if ah + am else 0.0,
            "ttfa_s": list(self.ttfa_s), "rtf": list(self.rtf),
            "engine": self.engine.name, "device": self.engine.device, "precision": self.engine.precision,
        }

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await asyncio.to_thread(self.worker.close)
        self.cache.close()


def _sentence_seed(seed: int, norm_text: str) -> int:
    """Per-sentence seed: fixed seeds give the same sentence the same sample wherever it appears."""
    if seed == -1:
        return random.getrandbits(31)
    digest = hashlib.blake2b(f"{seed}\x00{norm_text}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def _fade_edges(audio: np.ndarray, tail: bool = True) -> np.ndarray:
    """Short raised-cosine fades at both ends (no click against the inter-sentence silence)."""
    n = min(int(SAMPLE_RATE * FADE_S), audio.size // 2)
    if n <= 0:
        return audio
    ramp = _ramp(n)
    out = audio.copy()
    out[:n] *= ramp
    if tail:
        out[-n:] *= ramp[::-1]
    return out


def _ramp(n: int) -> np.ndarray:
    """``[n]`` float32 raised-cosine rise from 0 to 1."""
    return (0.5 - 0.5 * np.cos(np.linspace(0.0, np.pi, n, dtype=np.float32))).astype(np.float32)


def _stitch(head: np.ndarray, full: np.ndarray, emitted: int) -> np.ndarray:
    """The full decode, with the early chunk's samples before ``emitted`` and a crossfade after them."""
    out = full.copy()
    out[:emitted] = head[:emitted]
    n = max(0, min(CROSSFADE_SAMPLES, head.size - emitted, full.size - emitted))
    if n:
        rise = _ramp(n)
        out[emitted:emitted + n] = head[emitted:emitted + n] * (1 - rise) + full[emitted:emitted + n] * rise
    return out


class _EarlyChunk:
    """Hand-over between the first sentence's render task and its early-chunk task."""

    def __init__(self, tokens_needed: int) -> None:
        self.tokens_needed = tokens_needed
        loop = asyncio.get_running_loop()
        # (phonemes, first tokens, seed) once enough tokens exist, or None: no early chunk
        self.prefix: asyncio.Future[tuple[Phonemes, np.ndarray, int] | None] = loop.create_future()
        # (samples emitted, the early decode) once the early chunk went out, or None
        self.result: asyncio.Future[tuple[int, np.ndarray] | None] = loop.create_future()
        self._seen: list[np.ndarray] = []

    def collect(self, ph: Phonemes, new_tokens: np.ndarray, seed: int) -> None:
        """Tokens streamed from the GPT; starts the early chunk when enough have arrived."""
        if self.prefix.done():
            return
        self._seen.append(np.asarray(new_tokens, np.int64))
        tokens = np.concatenate(self._seen)
        if tokens.size >= self.tokens_needed:
            self.prefix.set_result((ph, tokens[: self.tokens_needed], seed))

    def offer(self, ph: Phonemes, tokens: np.ndarray, seed: int) -> None:
        """All tokens known up front (prosody-cache hit): the same early chunk, so a hit equals a miss."""
        if not self.prefix.done():
            self.prefix.set_result((ph, tokens[: self.tokens_needed], seed) if tokens.size >= self.tokens_needed
                                   else None)

    def give_up(self) -> None:
        if not self.prefix.done():
            self.prefix.set_result(None)

    async def handover(self) -> tuple[int, np.ndarray] | None:
        """What the early chunk delivered (None when it did not happen)."""
        if self.prefix.done() and self.prefix.result() is None:
            return None
        return await self.result
