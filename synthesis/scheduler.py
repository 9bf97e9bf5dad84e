"""One worker per device: it owns the engine, decides every step, and runs everything that touches it.

It is the single scheduler: the pipeline hands it each sentence's work (:meth:`DeviceWorker.open`, then
:meth:`~synthesis.speaking.SentenceHandle.speak`) and awaits its audio; the worker holds every request's state
(:mod:`synthesis.speaking`: admission order, when its listener runs out of audio, what each sentence decoded) and
decides on its own thread which GPT steps and which vocoder decodes run next, consulting each sentence's window plan
(:mod:`synthesis.windows`). The event loop only posts messages (a sentence's work, playback progress, a listener
starting to wait, a cancellation), applied between two steps. So why any chunk waited is answered here, by
:meth:`DeviceWorker._key` and the device loop's choice.

Two kinds of work:

* the GPT drives a continuous batch (``Engine.open_batch``): requests join between decode steps and leave when they
  finish or are cancelled; live requests go before background ones (and preempt them when the batch is full); a
  request's sentence joins only after the GPT of the sentence before it ended, so a first sentence never shares the
  GPT with its own followers;
* vocoder calls (SoVITS decodes of windows and sentences, BERT features, reference encoding), one at a time; a
  sentence's vocoder work starts once the sentence before it made its first audio (on a prosody-cache hit every
  sentence is ready at once, and the first window must still be the first decode).

On a CPU one device thread interleaves the two (a GPT step or a vocoder call at a time); on a GPU two threads
overlap them. Callers are async: every job resolves an asyncio future, with a result or an error, whatever raises
where (a request the engine refuses fails alone, a failed decode step is retried without the request that broke it,
a closed worker fails what it still holds). Cancelling the awaiting task cancels the job; for the GPT that takes
effect before the next decode step.

Order: ``priority`` (a class: :data:`LIVE` before :data:`BACKGROUND`), then urgency: first the work of requests
whose listener is about to run out of audio (:data:`~synthesis.speaking.LOW_BUFFER_S`), then work somebody already
waits for (the sentence being played next goes before sentences rendered ahead), then ``order`` ((request,
sentence): the requests admitted first are finished first), then arrival. A sentence's bound limits how long its
work may *wait* for the device; work that has started is finished. So that a request that starts speaking is
finished even under overload, a new request's first sentence leaves a quarter of the decode slots to requests
already speaking, and on a CPU's single device thread a vocoder call somebody waits for gets a turn after every GPT
step (unless that GPT work keeps a listener who is about to run out of audio going and the call does not).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import numpy as np

from engines import Engine, EngineError, SpeechError
from engines.base import SemanticBatch, SemanticRequest
from synthesis.speaking import (Cancelled, Handed, Message, Opened, Played, Registered, RequestHandle, Sentence,
                                SentenceAudio, Settled, Speaking, Utterance, Waiting, WorkerClosed, complete)
from synthesis.types import DeadlineError
from synthesis.windows import Piece, SampledPieces, WindowPlan

log = logging.getLogger(__name__)

T = TypeVar("T")

LOW, WAITED, AHEAD = 0, 1, 2  # urgency within a priority class (see _Job.urgency)
_URGENCY = {LOW: "its listener runs out of audio", WAITED: "its listener waits for it", AHEAD: "rendered ahead"}
LIVE = 0  # priority of requests somebody is waiting for
BACKGROUND = 10  # priority of precompute work
_IDLE_POLL_S = 0.05  # how often an idle lane checks for shutdown
RESERVE_DIVISOR = 4  # capacity // this many decode slots are kept for requests that are already speaking
MAX_GPT_ATTEMPTS = 3  # decode attempts of one request whose batch failed before it fails too (a safety net)
Clock = Callable[[], float]
__all__ = ["BACKGROUND", "LIVE", "DeviceWorker"]


@dataclass(eq=False)
class _Job:
    priority: int
    deadline: float | None  # clock() limit on waiting for the lane, None for no limit (a sentence's: its own)
    loop: asyncio.AbstractEventLoop | None
    future: asyncio.Future[Any] | None
    cancel: threading.Event = field(default_factory=threading.Event)
    order: tuple[Any, ...] = ()
    submitted: float = 0.0  # clock() when it was queued
    sentence: Sentence | None = None  # the sentence it is for: its urgency and wait bound are the sentence's
    done: Callable[[Any, BaseException | None], None] | None = None  # the worker's own work: its result goes here
    what: str = ""  # what it is, for the trace

    def urgency(self, now: float) -> int:
        """The sort key's urgency: :data:`LOW` when its request is speaking and about to run out of audio,
        :data:`WAITED` when somebody waits for the result already, else :data:`AHEAD`."""
        s = self.sentence
        if s is None:
            return AHEAD
        if s.request.low(now):
            return LOW
        return WAITED if s.started != math.inf else AHEAD

    def expired(self, now: float) -> bool:
        """Has it waited past its bound (a float is an absolute ``clock()`` limit)?"""
        if self.sentence is not None:
            return now > self.sentence.limit(self.submitted)
        return self.deadline is not None and now > self.deadline

    def resolve(self, result: Any = None, error: BaseException | None = None) -> None:
        """Complete it from any thread: the worker's own work hands its outcome on, a caller's future is set (ignored
        if the caller already gave up)."""
        if self.done is not None:
            self.done(result, error)
            return
        assert self.future is not None and self.loop is not None
        complete(self.loop, self.future, result, error)


@dataclass(eq=False)
class _GptJob(_Job):
    request: SemanticRequest | None = None
    elapsed: float = 0.0
    on_tokens: Callable[[np.ndarray], None] | None = None  # new tokens as they are decoded (device thread)
    produced: int = 0  # tokens decoded in the current attempt
    forwarded: int = 0  # tokens handed to on_tokens over all attempts (a retry re-decodes the same tokens)
    failures: int = 0  # decode batches that failed while this request was in them

    def restart(self) -> None:
        """Forget the current attempt (preempted, or its batch failed): it decodes again from the start."""
        self.elapsed = 0.0
        self.produced = 0


@dataclass(eq=False)
class _CallJob(_Job):
    fn: Callable[[], Any] | None = None


class DeviceWorker:
    """Owns an engine; runs GPT batches and vocoder calls on one thread (CPU) or two (GPU)."""

    def __init__(self, engine: Engine, *, overlap: bool | None = None, clock: Clock = time.monotonic) -> None:
        self.engine = engine
        self.clock = clock  # the time deadlines are measured in (tests may pass a virtual clock)
        # On a CPU the two kinds of work share the same cores, and their BLAS thread pools must not belong to two
        # threads (a GEMV from a second thread using the pool ran several times slower). So on a CPU one device
        # thread interleaves them, a GPT step or a vocoder call at a time, earliest sentence first; two lanes were
        # slower with the onnx engine's own pools too (see FINDINGS.md#one-device-thread-on-a-cpu). On a GPU two
        # threads overlap them.
        self.overlap = (not engine.device.startswith("cpu")) if overlap is None else overlap
        self._seq = itertools.count()
        self._gpt_queue: queue.PriorityQueue[tuple[int, tuple[Any, ...], int, _GptJob]] = queue.PriorityQueue()
        self._call_queue: queue.PriorityQueue[tuple[int, tuple[Any, ...], int, _CallJob]] = queue.PriorityQueue()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._active_gpt = 0
        self.gpt_steps = 0
        self.gpt_failures = 0  # decode steps or admissions that raised (each failed or retried its requests)
        self._gpt = _GptState()
        self._requests: dict[int, Speaking] = {}  # the requests being spoken (the device threads' alone)
        self._rids = itertools.count()  # admission order (live and background requests share it)
        self._live = 0  # live requests open
        self._inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()  # from the event loop, in order
        self._state = threading.RLock()  # the requests' state, between the two device threads of a GPU
        if self.overlap:
            targets = [(self._gpt_loop, "voicebot-gpt"), (self._call_loop, "voicebot-vocoder")]
        else:
            targets = [(self._device_loop, "voicebot-device")]
        self._threads = [threading.Thread(target=t, name=n, daemon=True) for t, n in targets]
        for t in self._threads:
            t.start()

    # ---- async API -------------------------------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Jobs waiting or running on either lane."""
        return self._gpt_queue.qsize() + self._call_queue.qsize() + self._active_gpt

    def next_request(self) -> int:
        """The next place in the admission order (the requests admitted first are finished first)."""
        return next(self._rids)

    def open(self, *, priority: int = LIVE, at: float = math.inf) -> RequestHandle:
        """A request to speak, admitted now: its sentences are handed over through the handle
        (:meth:`~synthesis.speaking.RequestHandle.sentence`); ``at`` is an overall ``clock()`` limit on its waiting."""
        state = Speaking(self.next_request(), priority, at, live=priority == LIVE)
        self._post(Opened(state))
        return RequestHandle(state, self._post, self.clock)

    async def semantic(self, request: SemanticRequest, *, priority: int = LIVE,
                       deadline: float | None = None, order: tuple[Any, ...] = (),
                       on_tokens: Callable[[np.ndarray], None] | None = None) -> tuple[np.ndarray, float]:
        """Run the GPT for one sentence: (new tokens ``[Ts]`` int64, seconds the batch spent on it).

        ``deadline`` bounds the wait for a decode slot (``clock()`` time); once decoding, the request finishes.
        ``on_tokens(new_tokens)`` is called on the caller's event loop as tokens are decoded (token streaming),
        each token once, even when the request is decoded again after its batch failed.
        """
        loop = asyncio.get_running_loop()
        forward: Callable[[np.ndarray], None] | None = None
        if on_tokens is not None:
            def to_caller(tokens: np.ndarray) -> None:
                loop.call_soon_threadsafe(on_tokens, tokens)

            forward = to_caller

        job = _GptJob(priority, deadline, loop, loop.create_future(), order=order, request=request,
                      on_tokens=forward)
        self._submit(self._gpt_queue, job)
        return await self._await(job)

    async def call(self, fn: Callable[[], T], *, priority: int = LIVE, deadline: float | None = None,
                   order: tuple[Any, ...] = (), sentence: Sentence | None = None) -> T:
        """Run ``fn()`` on the vocoder lane and return its result (``deadline`` bounds the wait for the lane; for a
        sentence's work, see :meth:`~synthesis.speaking.SentenceHandle.call`)."""
        loop = asyncio.get_running_loop()
        job = _CallJob(priority, deadline, loop, loop.create_future(), order=order, sentence=sentence, fn=fn)
        self._submit(self._call_queue, job)
        return await self._await(job)

    @property
    def alive(self) -> bool:
        """Every lane's thread is running (a replica's health check)."""
        return all(t.is_alive() for t in self._threads)

    def close(self) -> None:
        """Stop the lanes; every job still queued or running fails with :class:`WorkerClosed`."""
        self._closed.set()
        for t in self._threads:
            t.join(timeout=5)
        self._fail_queued()
        if not any(t.is_alive() for t in self._threads):
            self._fail_running(WorkerClosed("the synthesis worker shut down before this request was done"))
            self._fail_sentences()

    # ---- messages from the event loop (applied on a device thread, between two steps) --------------------------

    def _post(self, message: Message) -> bool:
        """Queue a message for the device thread; False when the worker is closed (the message is dropped)."""
        if self._closed.is_set():
            return False
        self._inbox.put(message)
        self._wake.set()
        if self._closed.is_set():  # closed meanwhile: the lanes may be gone, so nobody else would answer it
            self._fail_sentences()
        return True

    def _apply_inbox(self) -> None:
        with self._state:
            while True:
                try:
                    message = self._inbox.get_nowait()
                except queue.Empty:
                    return
                self._apply(message)

    def _apply(self, m: Message) -> None:
        if isinstance(m, Opened):
            self._opened(m.request)
        elif isinstance(m, Registered):
            self._registered(m.sentence)
        elif isinstance(m, Handed):
            s = m.sentence
            s.loop, s.future, s.on_audio = m.loop, m.future, m.on_audio
            self._handed(s, m.utterance, m.tokens, m.request)
        elif isinstance(m, Waiting):
            if m.sentence.started == math.inf:
                m.sentence.started = m.now
        elif isinstance(m, Played):
            m.request.runs_out = m.runs_out
        elif isinstance(m, Cancelled):
            self._cancelled(m.sentence)
        elif isinstance(m, Settled):
            if m.sentence.utterance is None:  # (its audio was cached, or it failed before its work was handed over)
                self._cancelled(m.sentence)
        else:
            self._closed_request(m.request)

    def _opened(self, r: Speaking) -> None:
        self._requests[r.rid] = r
        self._live += r.live

    def _registered(self, s: Sentence) -> None:
        if s.request.closed:
            s.ended = True
        s.request.sentences[s.index] = s

    def _handed(self, s: Sentence, u: Utterance, tokens: np.ndarray | None, request: SemanticRequest | None) -> None:
        """A sentence's work: its tokens (a prosody-cache hit) or its GPT request, then its decodes."""
        if s.ended:  # cancelled, or its request closed, before the message came
            s.deliver(error=WorkerClosed("the request ended before this sentence was spoken"))
            return
        r = s.request
        s.utterance = u
        if u.sampled:
            s.sampled = SampledPieces(u.sample_rate)
        else:
            s.plan = WindowPlan(u.first_window, u.speed, u.sample_rate)
        if tokens is not None:
            s.all_known(tokens)
        else:
            assert request is not None
            s.gpt = _GptJob(r.priority, None, None, None, order=(r.rid, s.index), sentence=s,
                            what=f"request {r.rid} sentence {s.index}: GPT",
                            done=lambda result, error: self._gpt_ended(s, result, error), request=request,
                            on_tokens=lambda new: self._fed(s, new))
        self._advance(r)

    def _cancelled(self, s: Sentence) -> None:
        """A sentence nobody waits for any more: nothing more of it runs, the sentence after it goes on."""
        if not s.ended:
            s.ended = True
            if s.gpt is not None:
                s.gpt.cancel.set()
            self._advance(s.request)

    def _closed_request(self, r: Speaking) -> None:
        r.closed = True
        for s in list(r.sentences.values()):
            self._cancelled(s)
        if self._requests.pop(r.rid, None) is not None:
            self._live -= r.live

    def _fail_sentences(self) -> None:
        """The worker is closed: every sentence still awaited fails."""
        self._apply_inbox()
        with self._state:
            for r in list(self._requests.values()):
                for s in list(r.sentences.values()):
                    if not s.ended:
                        s.deliver(error=WorkerClosed("the synthesis worker shut down before this request was done"))

    # ---- sentences: which decode of which sentence is due (the device threads) --------------------------------

    def _advance(self, r: Speaking) -> None:
        """Start what of a request's sentences may start now: a sentence's GPT once the GPT of the one before it
        ended (sentence i+1's GPT runs while sentence i is decoded), its decodes once the one before it made its
        first audio."""
        for i in sorted(r.sentences):
            s = r.sentences[i]
            prev = r.sentences.get(i - 1)
            job = s.gpt
            if job is not None and not s.ended and not s.gpt_queued and \
                    (prev is None or prev.tokens is not None or prev.ended):
                s.gpt_queued = True
                self._enqueue(self._gpt_queue, job)
            self._schedule(s)
        for i in [i for i, s in r.sentences.items() if s.ended]:  # (an ended sentence holds nobody back)
            del r.sentences[i]

    def _schedule(self, s: Sentence) -> None:
        """Queue the sentence's next decode if its plan has one due and none of it is queued or running."""
        u = s.utterance
        if u is None or s.busy or s.ended:
            return
        prev = s.request.sentences.get(s.index - 1)
        if prev is not None and not (prev.first_out or prev.ended):
            return
        piece: Piece | None = None
        if s.sampled is not None:
            if s.tokens is None:
                return
        else:
            piece = s.next_piece(windows=u.keep_windows or self._alone_or_speaking(s.request))
            if piece is None:
                return
        s.busy = True
        r = s.request
        what = "a sampler chunk" if piece is None else \
            f"tokens {piece.start}-{piece.end if piece.window else s.known}{' (a window)' if piece.window else ''}"
        self._enqueue(self._call_queue, _CallJob(r.priority, None, None, None, order=(r.rid, s.index), sentence=s,
                                                  done=lambda _, error: self._decode_failed(s, error),
                                                  what=f"request {r.rid} sentence {s.index}: decode of {what}",
                                                  fn=lambda: self._decode(s, piece)))

    def _alone_or_speaking(self, r: Speaking) -> bool:
        """May this request's first sentence speak in windows? Beside another live request that has not started, the
        rest of a first sentence could not follow its early words in time on 2 cores, while one stream alone keeps
        them (see FINDINGS.md#early-words-beside-another-stream): its windows are held back then (and, without a
        seed, not decoded at all: they cost the device 30-45 tokens of vocoder work a stream)."""
        return r.speaking or self._live <= 1

    def _decode(self, s: Sentence, piece: Piece | None) -> None:
        """Run a sentence's next decode (on the vocoder lane) and hand its audio on."""
        u = s.utterance
        assert u is not None
        t0 = time.perf_counter()
        if s.sampled is not None:
            if s.pieces is None:
                assert s.tokens is not None
                s.pieces = iter(self.engine.decode_stream(s.tokens, u.phones, u.prompt, u.speed, u.noise_scale, u.seed,
                                                          steps=u.steps, cfg=u.cfg))
            chunk = next(s.pieces, None)
            audio = None if chunk is None else np.asarray(chunk, np.float32)
        else:
            assert piece is not None
            audio = np.asarray(self.engine.decode(s.all_tokens()[piece.start:piece.end], u.phones, u.prompt, u.speed,
                                                  u.noise_scale, u.seed, piece.noise_offset, steps=u.steps,
                                                  cfg=u.cfg), np.float32)
        self._apply_inbox()  # (what came meanwhile, e.g. another request: whether this window may go out now)
        with self._state:
            s.vocoder_s += time.perf_counter() - t0
            s.busy = False
            if s.ended:
                return
            if s.sampled is not None:
                out = None if audio is None else s.sampled.add(audio)
                if audio is None:
                    self._spoken(s, s.sampled.whole())
                elif out is not None:
                    s.first_out = True
                    s.emit(out)
            else:
                assert piece is not None and s.plan is not None and audio is not None
                if piece.window:
                    out = s.plan.window_out(piece, audio)
                    s.first_out = True
                    if self._alone_or_speaking(s.request):
                        s.emit(out)
                    else:
                        s.held.append(out)  # the same samples go out with the rest of the sentence
                else:
                    self._spoken(s, s.plan.whole(piece, audio, s.known))
            self._advance(s.request)

    def _spoken(self, s: Sentence, audio: np.ndarray) -> None:
        assert s.tokens is not None
        s.first_out = True
        s.deliver(SentenceAudio(audio, s.emitted, s.tokens, s.gpt_s, s.vocoder_s))

    def _decode_failed(self, s: Sentence, error: BaseException | None) -> None:
        if error is None:
            return
        with self._state:
            s.busy = False
            s.deliver(error=error)
            self._advance(s.request)

    def _fed(self, s: Sentence, tokens: np.ndarray) -> None:
        """New tokens of a sentence's GPT (on the GPT's thread): a window may be due."""
        with self._state:
            if not s.ended and s.tokens is None:
                s.feed(tokens)
                self._schedule(s)

    def _gpt_ended(self, s: Sentence, result: Any, error: BaseException | None) -> None:
        with self._state:
            if error is not None:
                s.deliver(error=error)
            elif not s.ended:
                tokens, s.gpt_s = result
                s.all_known(tokens)
            self._advance(s.request)

    # ---- internals -------------------------------------------------------------------------------------------

    def _enqueue(self, q: queue.PriorityQueue[Any], job: _Job) -> None:
        """Queue the worker's own work (a closed worker fails its sentences instead: see :meth:`close`)."""
        if not self._closed.is_set():
            self._submit(q, job)

    def _submit(self, q: queue.PriorityQueue[Any], job: _Job) -> None:
        if self._closed.is_set():
            raise WorkerClosed("the synthesis worker is shut down")
        job.submitted = self.clock()
        q.put((job.priority, job.order, next(self._seq), job))
        self._wake.set()
        if self._closed.is_set():  # closed meanwhile: the lanes may be gone, so nobody else would answer it
            self._fail_queued()

    def _fail_queued(self) -> None:
        """Fail every queued job (the worker is closed)."""
        for q in (self._gpt_queue, self._call_queue):
            while True:
                try:
                    job = q.get_nowait()[-1]
                except queue.Empty:
                    break
                job.resolve(error=WorkerClosed("the synthesis worker shut down before this request was done"))

    def _fail_running(self, error: BaseException) -> None:
        """Fail the GPT requests in the batch and forget the batch."""
        g = self._gpt
        for job in g.running.values():
            job.resolve(error=error)
        g.running.clear()
        g.batch = None
        self._active_gpt = 0

    @staticmethod
    async def _await(job: _Job) -> Any:
        assert job.future is not None
        try:
            return await job.future
        except asyncio.CancelledError:
            job.cancel.set()  # the lane drops it before its next step
            raise

    # ---- the loops ------------------------------------------------------------------------------------------

    def _bind(self) -> None:
        """Let the engine set up the calling thread (CPU thread count, a CUDA stream)."""
        self.engine.bind_thread()

    def _device_loop(self) -> None:
        """One thread for everything: the most urgent of (next vocoder call, next GPT step) runs next."""
        self._bind()
        ticked = False  # the last thing run was a GPT step
        while not self._closed.is_set():
            try:
                self._apply_inbox()
                call_prio = self._call_priority()
                gpt_prio = self._gpt_priority()
                # A call somebody waits for gets a turn after every GPT step even when the GPT's work is more
                # urgent: a decode of hundreds of steps must not hold back the audio another listener waits for;
                # but not before the GPT of a request about to run out of audio, unless that call is for one too.
                interleave = (ticked and call_prio is not None and gpt_prio is not None and call_prio[1] <= WAITED
                              and call_prio[0] <= gpt_prio[0] and (gpt_prio[1] != LOW or call_prio[1] == LOW))
                if call_prio is not None and (gpt_prio is None or call_prio <= gpt_prio or interleave):
                    self._run_call(block=False)
                    ticked = False
                elif gpt_prio is not None:
                    self._gpt_tick()
                    ticked = True
                else:
                    self._wake.wait(_IDLE_POLL_S)
                    self._wake.clear()
            except Exception:  # never lose the lane (and with it every later request): log and go on
                log.exception("the device lane hit an unexpected error; continuing")
        self._lane_exit()

    def _gpt_loop(self) -> None:
        self._bind()
        while not self._closed.is_set():
            try:
                self._apply_inbox()
                if self._gpt_priority() is None:
                    self._wake.wait(_IDLE_POLL_S)
                    self._wake.clear()
                    continue
                self._gpt_tick()
            except Exception:
                log.exception("the GPT lane hit an unexpected error; continuing")
        self._lane_exit()

    def _call_loop(self) -> None:
        self._bind()
        while not self._closed.is_set():
            try:
                self._apply_inbox()
                self._run_call(block=True)
            except Exception:
                log.exception("the vocoder lane hit an unexpected error; continuing")
        self._fail_queued()

    def _lane_exit(self) -> None:
        """The GPT's lane ends: fail what it still holds."""
        self._fail_running(WorkerClosed("the synthesis worker shut down before this request was done"))
        self._fail_queued()
        self._fail_sentences()

    def _key(self, job: _Job, now: float | None = None) -> tuple[int, int, tuple[Any, ...]]:
        """How urgent a job is: (priority class, urgency, order)."""
        return job.priority, job.urgency(self.clock() if now is None else now), job.order

    def _call_priority(self) -> tuple[int, int, tuple[Any, ...]] | None:
        """The key of the most urgent queued vocoder call (None: none queued)."""
        q, now = self._call_queue, self.clock()
        with q.mutex:
            return min((self._key(e[-1], now) for e in q.queue), default=None)

    def _gpt_priority(self) -> tuple[int, int, tuple[Any, ...]] | None:
        """The key of the most urgent GPT work (running or queued), None when there is none."""
        now = self.clock()
        candidates = [self._key(j, now) for j in list(self._gpt.running.values())]
        q = self._gpt_queue
        with q.mutex:
            candidates.extend(self._key(e[-1], now) for e in q.queue)
        return min(candidates) if candidates else None

    def _take_call(self, *, block: bool) -> _CallJob | None:
        """Remove and return the most urgent queued call (waiting up to a poll interval when ``block``)."""
        entry = self._take_best(self._call_queue, block=block)
        return None if entry is None else entry[-1]

    def _take_best(self, q: queue.PriorityQueue[Any], *, block: bool = False) -> Any:
        """Remove and return the queue entry of the most urgent job, or None when the queue is empty."""
        with q.not_empty:
            if block and not q.queue:
                q.not_empty.wait(_IDLE_POLL_S)
            if not q.queue:
                return None
            # a job's urgency changes while it is queued, so the heap's order is only a start
            now = self.clock()
            best = min(q.queue, key=lambda e: (self._key(e[-1], now), e[2]))
            q.queue.remove(best)
            heapq.heapify(q.queue)
            return best

    def _run_call(self, *, block: bool) -> None:
        job = self._take_call(block=block)
        if job is None:
            return
        if job.cancel.is_set() or (job.done is not None and job.sentence is not None and job.sentence.ended):
            return
        if job.expired(self.clock()):
            job.resolve(error=DeadlineError("the request waited longer than its deadline for the vocoder"))
            return
        assert job.fn is not None
        self._trace(job, "runs")
        try:
            job.resolve(job.fn())
        except SpeechError as e:
            job.resolve(error=e)
        except Exception as e:  # a backend failure must reach the caller, not kill the worker
            log.exception("vocoder job failed")
            job.resolve(error=EngineError(f"synthesis failed: {e}"))

    def _trace(self, job: _Job, what: str) -> None:
        """Why a job ran when it did, at DEBUG (``logging.getLogger("synthesis.scheduler")``): what it is, how long
        it waited for its turn, and what placed it (class, urgency, order)."""
        if log.isEnabledFor(logging.DEBUG):
            now = self.clock()
            s = job.sentence
            name = job.what or (f"request {s.request.rid} sentence {s.index}: a call" if s is not None else "a call")
            log.debug("%s %s after %.0f ms (%s, %s, order %s)", name, what, 1000 * (now - job.submitted),
                      "live" if job.priority == LIVE else f"priority {job.priority}", _URGENCY[job.urgency(now)],
                      job.order)

    def _gpt_tick(self) -> None:
        """Admit queued requests, drop cancelled ones, run one decode step, deliver finished requests."""
        g = self._gpt
        try:
            if g.batch is None:
                g.batch = self.engine.open_batch(on_chunk=self._route_tokens)
            if not self._admit(g):  # dropped after a refused request: its requests are queued again
                return
            self._drop_cancelled(g.batch, g.running)
            self._active_gpt = len(g.running)
            if not g.running:
                return
            t0 = time.perf_counter()
            try:
                finished = g.batch.step()
            except Exception as e:
                self._step_failed(e)
                return
            dt = time.perf_counter() - t0
            self.gpt_steps += 1
            for job in g.running.values():
                job.elapsed += dt
            for rid, tokens in finished:
                job = g.running.pop(rid)
                job.resolve((tokens, job.elapsed))
            self._active_gpt = len(g.running)
        except Exception as e:  # the batch itself is broken (cannot open, cancel failed): fail what it held
            log.exception("the GPT batch failed; failing its %d running requests", len(g.running))
            self.gpt_failures += 1
            self._fail_running(_engine_error(e, "GPT decode failed"))

    def _step_failed(self, error: Exception) -> None:
        """A decode step raised: it is not known which request broke it, so decode them again in a new batch.

        A request that failed alone is the culprit and fails. The others go back to the queue as *suspects*,
        each decoded later with no other request beside it (see :meth:`_admit`), so the one that breaks the
        batch is found and fails, and the rest finish (seeded sampling makes the retry give the same tokens).
        """
        g = self._gpt
        self.gpt_failures += 1
        jobs = list(g.running.values())
        g.running.clear()
        g.batch = None  # the batch's state is unknown after a failed step: a fresh one is opened next tick
        self._active_gpt = 0
        err = _engine_error(error, "GPT decode failed")
        if len(jobs) == 1:
            log.warning("GPT decode failed for one request: %s", error)
            jobs[0].resolve(error=err)
            return
        log.warning("GPT decode failed with %d requests in the batch (%s); decoding them again one by one",
                    len(jobs), error)
        for job in jobs:
            job.failures += 1
            if job.failures >= MAX_GPT_ATTEMPTS:
                job.resolve(error=err)
                continue
            self._requeue(job)

    def _route_tokens(self, request_id: int, tokens: np.ndarray) -> None:
        """The batch's token stream, handed to the job that asked for it (each token once over all attempts)."""
        job = self._gpt.running.get(request_id)
        if job is None or job.on_tokens is None:
            return
        start = job.produced
        job.produced += len(tokens)
        skip = max(0, job.forwarded - start)  # already delivered by an earlier attempt
        if skip >= len(tokens):
            return
        job.forwarded += len(tokens) - skip
        try:
            job.on_tokens(tokens[skip:])
        except Exception:  # e.g. the caller's loop closed: its request is gone, the batch goes on
            log.debug("token callback of request %s failed", request_id, exc_info=True)

    def _admit(self, g: _GptState) -> bool:
        """Move queued requests into free slots; a live request preempts a background one when full.

        A request that the engine refuses (``batch.add`` raises) fails alone. A suspect (its batch failed
        before) is decoded with no other request beside it. False when the batch was dropped (``g.batch`` None).
        """
        batch, running = g.batch, g.running
        assert batch is not None
        while True:
            entry = self._take_best(self._gpt_queue)
            if entry is None:
                return True
            prio, _, _, job = entry
            if job.cancel.is_set():
                continue
            if job.expired(self.clock()):
                job.resolve(error=DeadlineError("the request waited longer than its deadline for the GPT"))
                continue
            alone = any(j.failures for j in running.values())
            if alone or (job.failures and running):
                self._gpt_queue.put(entry)  # after the batch drains
                return True
            opens = job.sentence is not None and job.sentence.opens
            peers = sum(1 for j in running.values() if j.priority <= prio)  # background work would make way
            if opens and batch.capacity - peers <= batch.capacity // RESERVE_DIVISOR:
                # a new request's first sentence leaves the last slots to requests already speaking: a running
                # decode is never stopped, so a full batch would make their next sentences wait for it
                self._gpt_queue.put(entry)
                return True
            if batch.active >= batch.capacity:
                victim = next((rid for rid, j in running.items() if j.priority > prio), None)
                if victim is None:
                    self._gpt_queue.put(entry)
                    return True
                preempted = running.pop(victim)
                batch.cancel(victim)
                self._requeue(preempted)
            rid = next(g.ids)
            assert job.request is not None
            self._trace(job, "joins the GPT batch")
            t0 = time.perf_counter()
            running[rid] = job  # before add: the prefill may already stream tokens
            try:
                batch.add(rid, job.request)
            except Exception as e:
                running.pop(rid, None)
                self.gpt_failures += 1
                log.warning("the GPT refused a request: %s", e)
                job.resolve(error=_engine_error(e, "the GPT could not start this sentence"))
                try:
                    batch.cancel(rid)  # in case it got half way in
                except Exception:
                    log.debug("cancelling a refused request failed", exc_info=True)
                if batch.active != len(running):  # the batch no longer matches what we hold: start afresh
                    log.warning("the GPT batch is inconsistent after a refused request; decoding its %d "
                                "requests again", len(running))
                    for other in running.values():
                        self._requeue(other)
                    running.clear()
                    g.batch = None
                    return False
                continue
            job.elapsed += time.perf_counter() - t0

    def _requeue(self, job: _GptJob) -> None:
        """Queue a request again to be decoded from the start (its wait starts again too)."""
        job.restart()
        job.submitted = self.clock()
        self._gpt_queue.put((job.priority, job.order, next(self._seq), job))

    @staticmethod
    def _drop_cancelled(batch: SemanticBatch, running: dict[int, _GptJob]) -> None:
        for rid in [r for r, j in running.items() if j.cancel.is_set()]:
            running.pop(rid)
            batch.cancel(rid)


def _engine_error(error: Exception, what: str) -> SpeechError:
    """A SpeechError as it is; anything else wrapped so the caller gets a message, not a traceback."""
    return error if isinstance(error, SpeechError) else EngineError(f"{what}: {error}")


@dataclass
class _GptState:
    """The GPT's running batch, owned by the thread that steps it."""

    batch: SemanticBatch | None = None
    running: dict[int, _GptJob] = field(default_factory=dict[int, _GptJob])
    ids: itertools.count[int] = field(default_factory=itertools.count)
