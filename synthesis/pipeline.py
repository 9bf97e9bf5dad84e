"""``Synthesizer.stream``: the hot path from text to audio chunks, sentence by sentence.

Per sentence: text front-end -> prosody cache or GPT -> audio cache or SoVITS. Up to ``LOOKAHEAD`` sentences are
in flight, so the GPT of sentence i+1 runs while sentence i is being decoded and played. Every request is
independent: the voice travels with it, nothing is shared between users but the engine and the caches.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import itertools
import logging
import math
import random
import time
from typing import Any, AsyncIterator, Callable, Mapping, Sequence

import numpy as np

from engines import (SAMPLE_RATE, SAMPLES_PER_TOKEN, SSL_SAMPLE_RATE, Engine, SamplingParams, SemanticRequest,
                     SpeechError, VoicePrompt)
from synthesis.audio import fade_edges, raised_cosine, reference_from_upload, resample
from synthesis.cache import SynthesisCache
from synthesis.scheduler import BACKGROUND, LIVE, Clock, Deadline, DeviceWorker
from synthesis.text import Phonemes, SentenceStream, bert_features, normalize_for_cache, split_sentences, text_to_phonemes
from synthesis.types import AudioChunk, BusyError, DeadlineError, Limits, SynthesisParams, Voice, VoiceNotFound
from synthesis.voices import VoiceError, VoiceStore, check_name

log = logging.getLogger(__name__)

LOOKAHEAD = 2  # sentences rendered ahead of the one being yielded
METRIC_WINDOW = 512  # recent samples kept for the ttfa / rtf histograms
WARM_UP_TOKENS = 8  # GPT steps of the start-up warm-up run
EARLY_HOLDBACK_TOKENS = 4  # the early chunk's last tokens lack right context: the full decode replaces them
CROSSFADE_SAMPLES = 640  # 20 ms @ 32 kHz where the early chunk hands over to the full decode
# A request starts only if its first sentence comes within this share of the deadline: the rest is the headroom
# that lets its later sentences wait behind the requests admitted before it, so a request that starts is finished.
FIRST_WAIT_SHARE = 0.5
MIN_ROOM_POSITIONS = 400  # GPT context a voice's prompt must leave for a sentence (~100 phones + 12 s of tokens)
TOKENS_PER_S = SAMPLE_RATE / SAMPLES_PER_TOKEN  # semantic tokens per second of reference (25)
GPT_CONTEXT = 2048  # the engines' GPT context per request (engines.torch_engine.MAX_CONTEXT) unless they say
Progress = Callable[[str, float], None]


class Synthesizer:
    """Text (whole or streamed) + voice -> audio chunks. One per process; safe for many concurrent callers."""

    def __init__(self, engine: Engine, voices: VoiceStore, cache: SynthesisCache, *,
                 defaults: SynthesisParams | None = None, limits: Limits | None = None,
                 clock: Clock = time.monotonic) -> None:
        self.engine = engine
        self.voices = voices
        self.cache = cache
        self.defaults = defaults or SynthesisParams()
        self.limits = limits or Limits()
        self.clock = clock  # the time deadlines are measured in (tests may pass a virtual clock)
        self.worker = DeviceWorker(engine, clock=clock)
        self._admitted = 0  # live requests between their stream() call and the end of their stream
        self._requests = itertools.count()  # admission order: earlier requests are finished first
        self.ttfa_s: collections.deque[float] = collections.deque(maxlen=METRIC_WINDOW)
        self.rtf: collections.deque[float] = collections.deque(maxlen=METRIC_WINDOW)
        self.counters: collections.Counter[str] = collections.Counter()
        self._background: set[asyncio.Task[int]] = set()
        self._precomputing: dict[asyncio.Task[int], str] = {}  # precompute task -> voice id
        self._uses_sv: bool | None = None  # does the engine's SoVITS read SV features (v2Pro)? None: not yet known
        self._reencoding: dict[str, asyncio.Lock] = {}  # voice id -> lock held while it is re-encoded

    @property
    def engine_name(self) -> str:
        return self.engine.name

    @property
    def device(self) -> str:
        return self.engine.device

    @property
    def precision(self) -> str:
        return self.engine.precision

    @property
    def busy(self) -> bool:
        """True when a new live request would be refused (``limits.queue_size`` requests are admitted)."""
        return self._admitted >= self.limits.queue_size

    # ---- speech ------------------------------------------------------------------------------------------------

    def stream(self, text: str | AsyncIterator[str], voice: Voice | str,
               params: SynthesisParams | None = None, *, deadline: float | None = None,
               priority: int = LIVE) -> AsyncIterator[AudioChunk]:
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
        if priority == LIVE:
            if self._admitted >= self.limits.queue_size:
                self.counters["busy"] += 1
                return _refused(BusyError(
                    f"the speech queue is full ({self.limits.queue_size} requests are being spoken or waiting); "
                    "try again in a moment"))
            self._admitted += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released and priority == LIVE:
                released = True
                self._admitted -= 1

        return _AdmittedStream(self._stream(text, voice, params, deadline, priority, release), release)

    async def _stream(self, text: str | AsyncIterator[str], voice: Voice | str, params: SynthesisParams | None,
                      deadline: float | None, priority: int, release: Callable[[], None]) -> AsyncIterator[AudioChunk]:
        """The body of :meth:`stream` for an admitted request."""
        try:
            v = await self._fitted_voice(self._resolve_voice(voice))
            p = params or self.defaults
        except BaseException:
            release()
            raise
        request = next(self._requests)
        self.counters["requests"] += 1
        started = time.perf_counter()
        audio_s = 0.0
        # The producer turns text into render tasks; the bounded queue limits how far it runs ahead.
        order: asyncio.Queue[tuple[asyncio.Task[AudioChunk | None], Deadline] | BaseException | None] = \
            asyncio.Queue(LOOKAHEAD)
        overall = math.inf if deadline is None else float(deadline)
        producer = asyncio.create_task(self._produce(text, v, p, overall, priority, request, order))
        current: asyncio.Task[AudioChunk | None] | None = None
        try:
            while (item := await order.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                current, waited = item
                if audio_s > 0.0:
                    # The request is speaking: the rest of it is finished, never cut part-way. Its jobs still wait
                    # only behind the requests admitted before it (the scheduler's order), so the wait is bounded
                    # by work already admitted, and the overall ``deadline`` still applies.
                    waited.wait_s = math.inf
                waited.start(self.clock())  # somebody waits for this sentence from now on
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
            self.counters["completed"] += 1
        except DeadlineError:
            self.counters["deadline"] += 1
            raise
        finally:
            release()
            producer.cancel()
            leftovers = [current] if current is not None else []
            while not order.empty():
                item = order.get_nowait()
                if isinstance(item, tuple):
                    leftovers.append(item[0])
            for task in leftovers:
                task.cancel()
            await asyncio.gather(producer, *leftovers, return_exceptions=True)

    async def _produce(self, text: str | AsyncIterator[str], v: Voice, p: SynthesisParams, overall: float,
                       priority: int, request: int,
                       order: asyncio.Queue[tuple[asyncio.Task[AudioChunk | None], Deadline] | BaseException | None],
                       ) -> None:
        """Start a render task per sentence as soon as the sentence is complete."""
        try:
            index = 0
            previous_gpt: asyncio.Event | None = None
            async for sentence in self._sentences(text, p):
                # the sentence's own wait bound: its clock starts when the consumer waits for it
                wait_s = self.limits.deadline_s * (FIRST_WAIT_SHARE if index == 0 else 1.0)
                deadline = Deadline(wait_s, at=overall, opens=index == 0)
                gpt_done = asyncio.Event()
                early = None
                if index == 0 and self.limits.first_chunk_tokens > 0 and p.speed == 1.0:
                    early = _EarlyChunk(self.limits.first_chunk_tokens)
                    early_task = asyncio.create_task(self._render_early(sentence, v, p, deadline, priority,
                                                                        (request, 0), early))
                    try:
                        await order.put((early_task, deadline))
                    except asyncio.CancelledError:
                        early_task.cancel()
                        raise
                task = asyncio.create_task(self._render(sentence, index, v, p, deadline, priority,
                                                        (request, index), previous_gpt, gpt_done, early))
                previous_gpt = gpt_done
                try:
                    await order.put((task, deadline))
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

    async def _render(self, sentence: str, index: int, voice: Voice, p: SynthesisParams, deadline: Deadline,
                      priority: int, order: tuple[int, int], after: asyncio.Event | None = None,
                      gpt_done: asyncio.Event | None = None, early: _EarlyChunk | None = None) -> AudioChunk:
        """One sentence: front-end, prosody (cache or GPT), audio (cache or SoVITS).

        A request's sentences take the GPT one after another (``after`` -> ``gpt_done``): sentence i+1's GPT runs
        while sentence i is being decoded, and sentence 1 never shares the GPT with its own followers, which keeps
        the time to first audio short. ``order`` is (request, sentence): the requests admitted first are finished
        first, on both lanes, so an overloaded worker serves some requests whole rather than all of them in part.
        """
        try:
            return await self._render_sentence(sentence, index, voice, p, deadline, priority, order, after,
                                               gpt_done, early)
        finally:
            if gpt_done is not None:
                gpt_done.set()  # never leave a follower waiting (cache hit, error or cancellation)
            if early is not None:
                early.give_up()  # nor the early chunk

    async def _render_sentence(self, sentence: str, index: int, voice: Voice, p: SynthesisParams,
                               deadline: Deadline, priority: int, order: tuple[int, int],
                               after: asyncio.Event | None, gpt_done: asyncio.Event | None,
                               early: _EarlyChunk | None) -> AudioChunk:
        timings: dict[str, float] = {"gpt_s": 0.0, "sovits_s": 0.0, "prosody_hit": 0.0, "audio_hit": 0.0}
        ph = await asyncio.to_thread(text_to_phonemes, sentence, p.language)
        seed = _sentence_seed(p.seed, ph.norm_text)
        pkey = self._prosody_key(voice, ph, p)
        akey = self.cache.audio_key(pkey, p.speed, p.noise_scale, p.seed if p.seed != -1 else "any")
        cached = self._cacheable(p)  # the cache's random-seed policy decides whether results are kept and served
        audio = self.cache.get_audio(akey) if cached else None
        emitted = 0  # samples of this sentence the early chunk already delivered
        if audio is not None:
            timings["audio_hit"] = timings["prosody_hit"] = 1.0
            self.counters["audio_hit"] += 1
        else:
            self.counters["audio_miss"] += 1
            tokens = self.cache.get_tokens(pkey) if cached else None
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
                                                                order, on_tokens)
                if cached:
                    self.cache.put_tokens(pkey, tokens, voice.id)
            if gpt_done is not None:
                gpt_done.set()
            if early is not None:
                early.give_up()  # no early chunk unless it has started by now
            t0 = time.perf_counter()
            audio = await self.worker.call(
                lambda: self.engine.decode(tokens, ph.ids, voice.prompt, p.speed, p.noise_scale, seed),
                priority=priority, order=order, deadline=deadline)
            timings["sovits_s"] = time.perf_counter() - t0
            audio = np.asarray(audio, dtype=np.float32)
            handover = await early.handover() if early is not None else None
            if handover is not None:
                emitted, head = handover
                audio = _stitch(head, audio, emitted)
            audio = fade_edges(audio)
            if cached:
                self.cache.put_audio(akey, audio, voice.id)
        gap = np.zeros(int(round(SAMPLE_RATE * p.fragment_interval)), dtype=np.float32)
        return AudioChunk(np.concatenate([audio[emitted:], gap]), sentence, index, SAMPLE_RATE, timings)

    async def _render_early(self, sentence: str, voice: Voice, p: SynthesisParams, deadline: Deadline,
                            priority: int, order: tuple[int, int], early: _EarlyChunk) -> AudioChunk | None:
        """The first sentence's first words, decoded from its first tokens while its GPT still runs."""
        try:
            offered = await early.prefix
            if offered is None:
                return None
            ph, tokens, seed = offered
            t0 = time.perf_counter()
            head = await self.worker.call(
                lambda: self.engine.decode(tokens, ph.ids, voice.prompt, 1.0, p.noise_scale, seed),
                priority=priority, order=order, deadline=deadline)
            head = np.asarray(head, dtype=np.float32)
            emitted = min(head.size, (tokens.size - EARLY_HOLDBACK_TOKENS) * SAMPLES_PER_TOKEN)
            early.result.set_result((emitted, head))
            timings = {"gpt_s": 0.0, "sovits_s": time.perf_counter() - t0, "prosody_hit": 0.0, "audio_hit": 0.0,
                       "partial": 1.0}
            return AudioChunk(fade_edges(head[:emitted], tail=False), sentence, 0, SAMPLE_RATE, timings)
        finally:
            if not early.result.done():
                early.result.set_result(None)

    async def _semantic(self, ph: object, prompt: VoicePrompt, p: SynthesisParams, seed: int,
                        deadline: Deadline | None, priority: int, order: tuple[int, ...],
                        on_tokens: Callable[[np.ndarray], None] | None = None) -> tuple[np.ndarray, float]:
        """BERT features (zh only) then the GPT, both on the device worker."""
        await self._load_bert_for(ph)  # type: ignore[arg-type]
        bert = await self.worker.call(lambda: bert_features(ph, self.engine.text_features),  # type: ignore[arg-type]
                                      priority=priority, order=order, deadline=deadline)
        sampling = SamplingParams(top_k=p.top_k, top_p=p.top_p, temperature=p.temperature,
                                  repetition_penalty=p.repetition_penalty, seed=seed)
        request = SemanticRequest(ph.ids, bert, prompt, sampling)  # type: ignore[attr-defined]
        return await self.worker.semantic(request, priority=priority, order=order, deadline=deadline,
                                          on_tokens=on_tokens)

    async def _load_bert_for(self, ph: Phonemes) -> None:
        """Load BERT in a helper thread before the first Chinese text needs it: the load takes seconds, and on the
        single device thread it would stall every other listener's speech meanwhile (issue 14)."""
        encoders = getattr(self.engine, "encoders", None)  # the engines that use BERT load it lazily there
        if encoders is not None and any(piece.lang == "zh" for piece in ph.pieces):
            await asyncio.to_thread(encoders.bert)

    def _cacheable(self, p: SynthesisParams) -> bool:
        """May this request's results be stored and served? (``SynthesisCache.cacheable``: the seed policy)."""
        return self.cache.cacheable({"seed": p.seed, "top_k": p.top_k})

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
        check_name(name)  # a name the store would refuse is refused before any decoding or encoding
        report("decoding", 0.0)
        lim = self.limits
        ref = await asyncio.to_thread(reference_from_upload, data, filename, max_bytes=lim.max_upload_bytes,
                                      max_seconds=lim.max_upload_s, min_s=lim.min_speech_s, max_s=lim.max_speech_s)
        report("encoding", 0.3)
        prompt_text = (transcript or enrollment_prompt or "").strip()
        prompt = await self._encode_prompt(ref.wav16k, ref.wav32k, prompt_text, language)
        self._check_prompt_room(prompt.prompt_phones.size, prompt.prompt_tokens.size)
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
        # v2Pro/v2ProPlus: the clip's speaker-verification features, fused into its style and kept with the voice
        # (the engine checks at decode time that a voice's features match its model); None for a v2 model
        sv = await self.worker.call(lambda: self.engine.encode_speaker([wav32k]))
        sv_emb = None if sv is None else np.asarray(sv, np.float32)  # [1, sv_dim]
        self._uses_sv = sv_emb is not None
        if prompt_text:
            if prompt_text[-1] not in "，。？！,.?!~:：—…":
                prompt_text += "." if language == "en" else "。"
            ph = await asyncio.to_thread(text_to_phonemes, prompt_text, language)
            # checked before the model work, with the tokens the clip will give (25 per second)
            self._check_prompt_room(len(ph.ids), math.ceil(wav16k.size / SSL_SAMPLE_RATE * TOKENS_PER_S))
            await self._load_bert_for(ph)
            bert = await self.worker.call(lambda: bert_features(ph, self.engine.text_features))
            tokens, ge = await self.worker.call(lambda: self.engine.encode_reference(wav16k, [wav32k], sv_emb=sv_emb))
            return VoicePrompt(np.asarray(tokens, np.int64), np.asarray(ge, np.float32),
                               np.asarray(ph.ids, np.int64), np.asarray(bert, np.float32), sv_emb)
        _, ge = await self.worker.call(lambda: self.engine.encode_reference(None, [wav32k], sv_emb=sv_emb))
        return VoicePrompt(np.zeros(0, np.int64), np.asarray(ge, np.float32), np.zeros(0, np.int64),
                           np.zeros((1024, 0), np.float32), sv_emb)

    async def _fitted_voice(self, voice: Voice) -> Voice:
        """The voice as the loaded model needs it: re-encoded (once) from its stored reference clip when its prompt
        was made by another model, so a prompt of one model never conditions another.

        Raises
        ------
        VoiceError
            the voice needs re-encoding but has no stored reference clip; the message says to create it again.
        """
        if await self._fits(voice):
            return voice
        lock = self._reencoding.setdefault(voice.id, asyncio.Lock())
        async with lock:  # concurrent requests for the voice wait for one re-encode
            try:
                stored = await asyncio.to_thread(self.voices.get, voice.id)
            except VoiceNotFound:
                raise VoiceError(f"voice {voice.name!r} was made for another model and is not in the voice store, "
                                 "so it cannot be re-encoded; create the voice again") from None
            if await self._fits(stored):  # re-encoded meanwhile (the caller held the previous version)
                return stored
            return await self._reencode(stored)

    async def _fits(self, voice: Voice) -> bool:
        """Was this voice's prompt made by the loaded model (its model id, and SV features exactly when it uses
        them)?"""
        if voice.model_id != self.engine.model_id:
            return False
        if self._uses_sv is None:  # learnt from the first encode; until then, from one second of silence
            sv = await self.worker.call(lambda: self.engine.encode_speaker([np.zeros(SAMPLE_RATE, np.float32)]))
            self._uses_sv = sv is not None
        return (voice.prompt.sv_emb is not None) == self._uses_sv

    async def _reencode(self, voice: Voice) -> Voice:
        """Encode a stored voice again, from its stored clip and transcript, with the loaded model; store it."""
        try:
            clip = await asyncio.to_thread(self.voices.load_clip, voice.id)  # [N] float32 @ 32 kHz
        except VoiceNotFound:
            raise VoiceError(f"voice {voice.name!r} was made for another model and its reference clip is missing, "
                             "so it cannot be re-encoded; create the voice again") from None
        log.info("voice %s was encoded by model %s; re-encoding it for model %s", voice.id, voice.model_id,
                 self.engine.model_id)
        wav16k = await asyncio.to_thread(resample, clip, SAMPLE_RATE, SSL_SAMPLE_RATE)  # [M] float32 @ 16 kHz
        prompt = await self._encode_prompt(wav16k, clip, voice.prompt_text, voice.language)
        self.counters["voice_reencoded"] += 1
        return await asyncio.to_thread(self.voices.replace, voice.id, prompt, model_id=self.engine.model_id)

    def _check_prompt_room(self, phones: int, tokens: int) -> None:
        """Refuse a reference whose transcript and tokens leave the GPT no room for a sentence.

        Every request puts the reference's phones and prompt tokens in front of the sentence, in a context of
        ``engine.max_context`` positions; an overlong transcript would make every synthesis with the voice fail.
        """
        context = int(getattr(self.engine, "max_context", GPT_CONTEXT))
        used = int(phones) + int(tokens)
        if used + MIN_ROOM_POSITIONS > context:
            raise VoiceError(
                f"the reference is too long for the model: its transcript ({phones} phones) "
                f"and clip ({tokens} tokens) take {used} of the GPT's {context} positions, "
                f"leaving less than the {MIN_ROOM_POSITIONS} a sentence needs; give only the words spoken in "
                "the 3-10 s clip as its transcript")

    async def delete_voice(self, voice_id: str) -> None:
        """Remove the voice and every byte derived from it (files and cache entries).

        Its background precomputes are stopped first, and the cache refuses the voice's entries from now on, so
        a request still in flight for it cannot write its results back after the delete.
        """
        pending = [t for t, vid in self._precomputing.items() if vid == voice_id]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.to_thread(self.voices.delete, voice_id)
        self._reencoding.pop(voice_id, None)

    def precompute(self, voice: Voice, phrases: Sequence[str], progress: Progress | None = None,
                   params: SynthesisParams | None = None) -> asyncio.Task[int]:
        """Compute the prosody of ``phrases`` in the background (live requests always go first)."""
        task = asyncio.create_task(self._precompute(voice, list(phrases), progress, params or self.defaults))
        self._background.add(task)
        self._precomputing[task] = voice.id
        task.add_done_callback(self._background_done)
        return task

    def _background_done(self, task: asyncio.Task[int]) -> None:
        self._background.discard(task)
        self._precomputing.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("precompute failed: %s", task.exception())

    async def _precompute(self, voice: Voice, phrases: list[str], progress: Progress | None,
                          p: SynthesisParams) -> int:
        done = 0
        voice = await self._fitted_voice(voice)
        if not self._cacheable(p):  # nothing computed here could be served again
            log.info("precompute skipped: the cache keeps no random-seed samples (cache.reuse_random is off)")
            return done
        order = (next(self._requests),)
        for i, phrase in enumerate(phrases):
            for sentence in split_sentences(phrase, p.split_method, p.language):
                ph = await asyncio.to_thread(text_to_phonemes, sentence, p.language)
                pkey = self._prosody_key(voice, ph, p)
                if self.cache.get_tokens(pkey) is None:
                    seed = _sentence_seed(p.seed, ph.norm_text)
                    tokens, _ = await self._semantic(ph, voice.prompt, p, seed, None, BACKGROUND, order)
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
                ph_warm = await asyncio.to_thread(text_to_phonemes, text, lang)
                if lang == "zh" and self.defaults.language == "zh":  # Chinese is the default: BERT now
                    await self._load_bert_for(ph_warm)
            except SpeechError as e:  # a missing optional language must not stop the process
                log.warning("text front-end warm-up for %s failed: %s", lang, e)
        ph = await asyncio.to_thread(text_to_phonemes, "Warming up.", "en")
        silence = np.zeros(SAMPLE_RATE, np.float32)  # [32000] @ 32 kHz
        sv = await self.worker.call(lambda: self.engine.encode_speaker([silence]))
        self._uses_sv = sv is not None
        _, ge = await self.worker.call(lambda: self.engine.encode_reference(None, [silence], sv_emb=sv))
        prompt = VoicePrompt(np.zeros(0, np.int64), np.asarray(ge, np.float32), np.zeros(0, np.int64),
                             np.zeros((1024, 0), np.float32), None if sv is None else np.asarray(sv, np.float32))
        request = SemanticRequest(ph.ids, np.zeros((1024, ph.ids.size), np.float32), prompt,
                                  SamplingParams(seed=0, early_stop_num=WARM_UP_TOKENS))
        tokens, _ = await self.worker.semantic(request)
        await self.worker.call(lambda: self.engine.decode(tokens, ph.ids, prompt, 1.0, 0.5, 0))

    def metrics(self) -> dict[str, object]:
        c = self.counters
        ph, pm = c["prosody_hit"], c["prosody_miss"]
        ah, am = c["audio_hit"], c["audio_miss"]
        return {
            "queue_depth": self.worker.queue_depth, "inflight": self._admitted, "requests": c["requests"],
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


class _AdmittedStream:
    """An admitted request's chunks; gives its admission back once, however the stream ends.

    Ending covers exhaustion, an error, ``aclose()`` (also of a stream that was never iterated, whose body
    never ran) and, as a last resort, garbage collection.
    """

    def __init__(self, chunks: AsyncIterator[AudioChunk], release: Callable[[], None]) -> None:
        self._chunks = chunks
        self._release = release

    def __aiter__(self) -> _AdmittedStream:
        return self

    async def __anext__(self) -> AudioChunk:
        try:
            return await anext(self._chunks)
        except BaseException:
            self._release()
            raise

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()  # type: ignore[attr-defined]
        finally:
            self._release()

    def __del__(self) -> None:
        self._release()


async def _refused(error: BaseException) -> AsyncIterator[AudioChunk]:
    """A stream that raises ``error`` at its first step (a request that was not admitted)."""
    raise error
    yield  # pragma: no cover - makes this an async generator


def _sentence_seed(seed: int, norm_text: str) -> int:
    """Per-sentence seed: fixed seeds give the same sentence the same sample wherever it appears."""
    if seed == -1:
        return random.getrandbits(31)
    digest = hashlib.blake2b(f"{seed}\x00{norm_text}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def _stitch(head: np.ndarray, full: np.ndarray, emitted: int) -> np.ndarray:
    """The full decode, with the early chunk's samples before ``emitted`` and a crossfade after them."""
    out = full.copy()
    out[:emitted] = head[:emitted]
    n = max(0, min(CROSSFADE_SAMPLES, head.size - emitted, full.size - emitted))
    if n:
        rise = raised_cosine(n)
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
