"""One worker per device: it owns the engine and runs everything that touches it.

Two lanes, each a thread, so the GPT of sentence i+1 overlaps the SoVITS decode of sentence i:

* the GPT lane drives a continuous batch (``Engine.open_batch``): requests join between decode steps and leave
  when they finish or are cancelled; live requests go before background ones (and preempt them when the batch is
  full);
* the vocoder lane runs one callable at a time (SoVITS decode, BERT features, reference encoding), by priority.

Callers are async: every job resolves an asyncio future. Cancelling the awaiting task cancels the job; for the GPT
that takes effect before the next decode step.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import numpy as np

from engines.base import Engine, EngineError, SemanticBatch, SemanticRequest, SpeechError
from synthesis.types import DeadlineError

log = logging.getLogger(__name__)

T = TypeVar("T")

LIVE = 0  # priority of requests somebody is waiting for
BACKGROUND = 10  # priority of precompute work
_IDLE_POLL_S = 0.05  # how often an idle lane checks for shutdown


class WorkerClosed(SpeechError):
    """The synthesis worker has shut down."""


@dataclass(eq=False)
class _Job:
    priority: int
    deadline: float | None  # time.monotonic() limit, None for no limit
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    cancel: threading.Event = field(default_factory=threading.Event)
    started: float = 0.0

    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

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


@dataclass(eq=False)
class _CallJob(_Job):
    fn: Callable[[], Any] | None = None


class DeviceWorker:
    """Owns an engine; runs GPT batches and vocoder calls on one thread (CPU) or two (GPU)."""

    def __init__(self, engine: Engine, *, overlap: bool | None = None) -> None:
        self.engine = engine
        # On a CPU the two kinds of work share the same cores, and their BLAS thread pools must not belong to two
        # threads: measured on 2 cores, a GEMV called from a second thread that also uses the pool ran 3.4x slower
        # (single-threaded). So on a CPU one device thread interleaves them, a GPT step or a vocoder call at a
        # time, earliest sentence first. On a GPU two threads overlap them.
        self.overlap = (not engine.device.startswith("cpu")) if overlap is None else overlap
        self._seq = itertools.count()
        self._gpt_queue: queue.PriorityQueue[tuple[int, int, _GptJob]] = queue.PriorityQueue()
        self._call_queue: queue.PriorityQueue[tuple[int, int, _CallJob]] = queue.PriorityQueue()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._active_gpt = 0
        self.gpt_steps = 0
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

    async def semantic(self, request: SemanticRequest, *, priority: int = LIVE, deadline: float | None = None,
                       on_tokens: Callable[[np.ndarray], None] | None = None) -> tuple[np.ndarray, float]:
        """Run the GPT for one sentence: (new tokens ``[Ts]`` int64, seconds the batch spent on it).

        ``on_tokens(new_tokens)`` is called on the caller's event loop as tokens are decoded (token streaming).
        """
        loop = asyncio.get_running_loop()
        forward = None
        if on_tokens is not None:
            def forward(tokens: np.ndarray) -> None:
                loop.call_soon_threadsafe(on_tokens, tokens)

        job = _GptJob(priority, deadline, loop, loop.create_future(), request=request, on_tokens=forward)
        self._submit(self._gpt_queue, job)
        return await self._await(job)

    async def call(self, fn: Callable[[], T], *, priority: int = LIVE, deadline: float | None = None) -> T:
        """Run ``fn()`` on the vocoder lane and return its result."""
        job = _CallJob(priority, deadline, asyncio.get_running_loop(), asyncio.get_running_loop().create_future(),
                       fn=fn)
        self._submit(self._call_queue, job)
        return await self._await(job)

    def close(self) -> None:
        self._closed.set()
        for t in self._threads:
            t.join(timeout=5)

    # ---- internals -------------------------------------------------------------------------------------------

    def _submit(self, q: queue.PriorityQueue[Any], job: _Job) -> None:
        if self._closed.is_set():
            raise WorkerClosed("the synthesis worker is shut down")
        q.put((job.priority, next(self._seq), job))
        self._wake.set()

    @staticmethod
    async def _await(job: _Job) -> Any:
        try:
            return await job.future
        except asyncio.CancelledError:
            job.cancel.set()  # the lane drops it before its next step
            raise

    # ---- the loops ------------------------------------------------------------------------------------------

    def _bind(self) -> None:
        """Let the engine set up the calling thread (CPU thread count) if it needs to."""
        bind = getattr(self.engine, "bind_thread", None)
        if bind is not None:
            bind()

    def _device_loop(self) -> None:
        """One thread for everything: the most urgent of (next vocoder call, next GPT step) runs next."""
        self._bind()
        while not self._closed.is_set():
            call_prio = self._peek_priority(self._call_queue)
            gpt_prio = self._gpt_priority()
            if call_prio is not None and (gpt_prio is None or call_prio <= gpt_prio):
                self._run_call(block=False)
            elif gpt_prio is not None:
                self._gpt_tick()
            else:
                self._wake.wait(_IDLE_POLL_S)
                self._wake.clear()
        self._active_gpt = 0

    def _gpt_loop(self) -> None:
        self._bind()
        while not self._closed.is_set():
            if self._gpt_priority() is None:
                self._wake.wait(_IDLE_POLL_S)
                self._wake.clear()
                continue
            self._gpt_tick()
        self._active_gpt = 0

    def _call_loop(self) -> None:
        self._bind()
        while not self._closed.is_set():
            self._run_call(block=True)

    @staticmethod
    def _peek_priority(q: queue.PriorityQueue[Any]) -> int | None:
        with q.mutex:
            return q.queue[0][0] if q.queue else None

    def _gpt_priority(self) -> int | None:
        """Priority of the most urgent GPT work (running or queued), None when there is none."""
        running = [j.priority for j in self._gpt.running.values()]
        queued = self._peek_priority(self._gpt_queue)
        candidates = running + ([queued] if queued is not None else [])
        return min(candidates) if candidates else None

    def _run_call(self, *, block: bool) -> None:
        try:
            _, _, job = self._call_queue.get(timeout=_IDLE_POLL_S) if block else self._call_queue.get_nowait()
        except queue.Empty:
            return
        if job.cancel.is_set():
            return
        if job.expired():
            job.resolve(error=DeadlineError("the request ran past its deadline before it could be rendered"))
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
            self._admit(g.batch, g.running, g.ids)
            self._drop_cancelled(g.batch, g.running)
            self._active_gpt = len(g.running)
            if not g.running:
                return
            t0 = time.perf_counter()
            finished = g.batch.step()
            dt = time.perf_counter() - t0
            self.gpt_steps += 1
            for job in g.running.values():
                job.elapsed += dt
            for rid, tokens in finished:
                job = g.running.pop(rid)
                job.resolve((tokens, job.elapsed))
            self._active_gpt = len(g.running)
        except Exception as e:
            log.exception("GPT decode failed; failing its %d running requests", len(g.running))
            err = e if isinstance(e, SpeechError) else EngineError(f"GPT decode failed: {e}")
            for job in g.running.values():
                job.resolve(error=err)
            g.running.clear()
            g.batch = None
            self._active_gpt = 0

    def _route_tokens(self, request_id: int, tokens: np.ndarray) -> None:
        """The batch's token stream, handed to the job that asked for it."""
        job = self._gpt.running.get(request_id)
        if job is not None and job.on_tokens is not None:
            job.on_tokens(tokens)

    def _admit(self, batch: SemanticBatch, running: dict[int, _GptJob], ids: itertools.count[int]) -> None:
        """Move queued requests into free slots; a more urgent request preempts a background one when full."""
        while True:
            try:
                prio, seq, job = self._gpt_queue.get_nowait()
            except queue.Empty:
                return
            if job.cancel.is_set():
                continue
            if job.expired():
                job.resolve(error=DeadlineError("the request ran past its deadline while waiting for the GPT"))
                continue
            if batch.active >= batch.capacity:
                victim = next((rid for rid, j in running.items() if j.priority > prio), None)
                if victim is None:
                    self._gpt_queue.put((prio, seq, job))
                    return
                preempted = running.pop(victim)
                batch.cancel(victim)
                preempted.elapsed = 0.0
                self._gpt_queue.put((preempted.priority, next(self._seq), preempted))
            rid = next(ids)
            assert job.request is not None
            t0 = time.perf_counter()
            batch.add(rid, job.request)
            job.elapsed += time.perf_counter() - t0
            running[rid] = job

    @staticmethod
    def _drop_cancelled(batch: SemanticBatch, running: dict[int, _GptJob]) -> None:
        for rid in [r for r, j in running.items() if j.cancel.is_set() or j.expired()]:
            job = running.pop(rid)
            batch.cancel(rid)
            if not job.cancel.is_set():
                job.resolve(error=DeadlineError("the request ran past its deadline during the GPT"))


@dataclass
class _GptState:
    """The GPT's running batch, owned by the thread that steps it."""

    batch: SemanticBatch | None = None
    running: dict[int, _GptJob] = field(default_factory=dict)
    ids: itertools.count[int] = field(default_factory=itertools.count)
