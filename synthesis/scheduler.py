"""One worker per device: it owns the engine and runs everything that touches it.

Two lanes, each a thread, so the GPT of sentence i+1 overlaps the SoVITS decode of sentence i:

* the GPT lane drives a continuous batch (``Engine.open_batch``): requests join between decode steps and leave
  when they finish or are cancelled; live requests go before background ones (and preempt them when the batch is
  full);
* the vocoder lane runs one callable at a time (SoVITS decode, BERT features, reference encoding), by priority.

Callers are async: every job resolves an asyncio future, with a result or an error, whatever raises where (a
request the engine refuses fails alone, a failed decode step is retried without the request that broke it, a
closed worker fails what it still holds). Cancelling the awaiting task cancels the job; for the GPT that takes
effect before the next decode step.

Order: ``priority`` (a class: :data:`LIVE` before :data:`BACKGROUND`), then urgency: first the work of requests
whose listener is about to run out of audio (:class:`Playback`), then jobs somebody already waits for (their
:class:`Deadline` started: the sentence being played next goes before sentences rendered ahead), then ``order`` (any tuple; the pipeline passes (request, sentence), so the requests admitted first are
finished first), then arrival. A deadline bounds how long a job may *wait* for its lane; a job that has started
is finished. So that a request that starts speaking is finished even under overload, a new request's first
sentence leaves a quarter of the decode slots to requests already speaking, and on a CPU's single device thread
a vocoder call somebody waits for gets a turn after every GPT step (unless that GPT work keeps a listener who is
about to run out of audio going and the call does not).
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
from synthesis.types import DeadlineError

log = logging.getLogger(__name__)

T = TypeVar("T")

LOW, WAITED, AHEAD = 0, 1, 2  # urgency within a priority class (see _Job.urgency)
LIVE = 0  # priority of requests somebody is waiting for
BACKGROUND = 10  # priority of precompute work
_IDLE_POLL_S = 0.05  # how often an idle lane checks for shutdown
RESERVE_DIVISOR = 4  # capacity // this many decode slots are kept for requests that are already speaking
MAX_GPT_ATTEMPTS = 3  # decode attempts of one request whose batch failed before it fails too (a safety net)
Clock = Callable[[], float]


class WorkerClosed(SpeechError):
    """The synthesis worker has shut down."""


# A speaking request with less audio than this left to play: its work goes first (see Playback). Shorter guards let
# more streams than the cores keep up with break each other's speech (see FINDINGS.md#playback-guard).
LOW_BUFFER_S = 3.0


class Playback:
    """When a speaking request's listener runs out of audio (``runs_out``, a ``clock()`` time; inf until it speaks),
    shared by the :class:`Deadline` of each of its sentences: written by the pipeline as chunks go out, read by the
    worker. While less than :data:`LOW_BUFFER_S` is left, the request's work goes before other work, also before
    the first sentences of requests that have not started (a later start is heard less than a gap in speech)."""

    __slots__ = ("runs_out",)

    def __init__(self) -> None:
        self.runs_out = math.inf

    @property
    def speaking(self) -> bool:
        return self.runs_out != math.inf

    def low(self, now: float) -> bool:
        return self.runs_out - now < LOW_BUFFER_S


class Deadline:
    """How long a request's job may wait for its lane, in ``clock()`` seconds.

    A job may wait ``wait_s`` from when it was submitted or from when somebody started waiting for its result
    (:meth:`start`), whichever is later, and never past ``at`` (an overall limit). A sentence rendered ahead is
    submitted before anybody waits for it: until :meth:`start`, only ``at`` applies. One object is shared by
    all the jobs of one sentence (BERT, GPT, vocoder).
    """

    __slots__ = ("wait_s", "at", "started", "opens", "playback")

    def __init__(self, wait_s: float = math.inf, *, at: float = math.inf, opens: bool = False,
                 playback: Playback | None = None) -> None:
        self.wait_s = wait_s
        self.at = at
        self.started = math.inf  # when somebody began waiting (inf: nobody yet)
        self.opens = opens  # the first sentence of a request: it starts new work rather than finishing some
        self.playback = playback  # the request's, when it is spoken as it comes

    def start(self, now: float) -> None:
        """Somebody waits for this sentence from ``now`` on (the first call counts)."""
        if self.started == math.inf:
            self.started = now

    def limit(self, submitted: float) -> float:
        """The time by which a job submitted at ``submitted`` must have left its queue."""
        if self.started == math.inf:
            return self.at
        return min(self.at, max(self.started, submitted) + self.wait_s)

    def __repr__(self) -> str:
        return f"Deadline(wait_s={self.wait_s}, at={self.at}, started={self.started})"


@dataclass(eq=False)
class _Job:
    priority: int
    deadline: float | Deadline | None  # clock() limit on waiting for the lane, None for no limit
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    cancel: threading.Event = field(default_factory=threading.Event)
    order: tuple[Any, ...] = ()
    submitted: float = 0.0  # clock() when it was queued

    def urgency(self, now: float) -> int:
        """The sort key's urgency: :data:`LOW` when its request is speaking and about to run out of audio,
        :data:`WAITED` when somebody waits for the result already, else :data:`AHEAD`."""
        d = self.deadline
        if not isinstance(d, Deadline):
            return AHEAD
        if d.playback is not None and d.playback.low(now):
            return LOW
        return WAITED if d.started != math.inf else AHEAD

    def expired(self, now: float) -> bool:
        """Has it waited past its deadline (a float is an absolute ``clock()`` limit)?"""
        d = self.deadline
        if d is None:
            return False
        return now > (d.limit(self.submitted) if isinstance(d, Deadline) else float(d))

    def resolve(self, result: Any = None, error: BaseException | None = None) -> None:
        """Complete the future from any thread (ignored if the caller already gave up)."""

        def _set() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)

        try:
            self.loop.call_soon_threadsafe(_set)
        except RuntimeError:  # the caller's loop is closed
            pass


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

    async def semantic(self, request: SemanticRequest, *, priority: int = LIVE,
                       deadline: float | Deadline | None = None, order: tuple[Any, ...] = (),
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

    async def call(self, fn: Callable[[], T], *, priority: int = LIVE, deadline: float | Deadline | None = None,
                   order: tuple[Any, ...] = ()) -> T:
        """Run ``fn()`` on the vocoder lane and return its result (``deadline`` bounds the wait for the lane)."""
        loop = asyncio.get_running_loop()
        job = _CallJob(priority, deadline, loop, loop.create_future(), order=order, fn=fn)
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

    # ---- internals -------------------------------------------------------------------------------------------

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
                self._run_call(block=True)
            except Exception:
                log.exception("the vocoder lane hit an unexpected error; continuing")
        self._fail_queued()

    def _lane_exit(self) -> None:
        """The GPT's lane ends: fail what it still holds."""
        self._fail_running(WorkerClosed("the synthesis worker shut down before this request was done"))
        self._fail_queued()

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
        if job.cancel.is_set():
            return
        if job.expired(self.clock()):
            job.resolve(error=DeadlineError("the request waited longer than its deadline for the vocoder"))
            return
        assert job.fn is not None
        try:
            job.resolve(job.fn())
        except SpeechError as e:
            job.resolve(error=e)
        except Exception as e:  # a backend failure must reach the caller, not kill the worker
            log.exception("vocoder job failed")
            job.resolve(error=EngineError(f"synthesis failed: {e}"))

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
            opens = isinstance(job.deadline, Deadline) and job.deadline.opens
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
