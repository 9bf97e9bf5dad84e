"""The device worker under bad requests and failures: a bad request fails alone, and every job ends.

The real tiny engine runs the GPT. Where a failure must be provoked inside a decode step, a thin wrapper around the
real batch raises for one marked request (fault injection: the scheduler is the layer under test).
"""

from __future__ import annotations

import asyncio
import math
import threading

import numpy as np
import pytest

from engines.base import EngineError, SamplingParams, SemanticRequest, VoicePrompt
from synthesis.scheduler import BACKGROUND, LIVE, DeviceWorker
from synthesis.speaking import LOW_BUFFER_S, Utterance, WorkerClosed
from synthesis.types import DeadlineError

HANG_GUARD_S = 300  # only against a hang: a job that never ends fails the test instead of blocking the run
REFERENCE_FREE = VoicePrompt(np.zeros(0, np.int64), np.zeros((512, 1), np.float32), np.zeros(0, np.int64),
                             np.zeros((1024, 0), np.float32))


def _request(n_phones: int, seed: int, steps: int = 30) -> SemanticRequest:
    phones = (np.arange(n_phones, dtype=np.int64) * 7 + seed) % 300 + 1
    return SemanticRequest(phones, np.zeros((1024, n_phones), np.float32), REFERENCE_FREE,
                           SamplingParams(seed=seed, early_stop_num=steps))


def _utterance(engine, request: SemanticRequest) -> Utterance:
    """What the vocoder needs for the request's sentence, with a voice made from silence (reference-free)."""
    _, ge = engine.encode_reference(None, [np.zeros(32000, np.float32)])
    prompt = VoicePrompt(np.zeros(0, np.int64), np.asarray(ge, np.float32), np.zeros(0, np.int64),
                         np.zeros((1024, 0), np.float32))
    return Utterance(request.phones, prompt, 1.0, 0.5, 7, None, None, engine.sample_rate)


async def _ended(aw):
    """The result or the exception of an awaitable (the hang guard aside)."""
    try:
        return await asyncio.wait_for(aw, HANG_GUARD_S)
    except asyncio.TimeoutError:
        raise AssertionError("a job never ended") from None
    except Exception as e:  # noqa: BLE001 - the test inspects it
        return e


@pytest.fixture
def worker(tiny_engine):
    w = DeviceWorker(tiny_engine)
    yield w
    w.close()


async def _solo(worker: DeviceWorker, requests: list[SemanticRequest]) -> list[np.ndarray]:
    return [(await worker.semantic(r))[0] for r in requests]


async def test_a_request_the_gpt_refuses_fails_alone(worker):
    good = [_request(12 + i, seed=i) for i in range(3)]
    alone = await _solo(worker, good)
    too_long = _request(2100, seed=9)  # more phones than the GPT's context holds
    results = await asyncio.gather(*(_ended(worker.semantic(r)) for r in [good[0], too_long, good[1], good[2]]))
    assert isinstance(results[1], EngineError) and "too long" in str(results[1])
    for got, want in zip([results[0], results[2], results[3]], alone):
        assert not isinstance(got, Exception), got
        assert np.array_equal(got[0], want)  # the others decoded exactly as they do alone
    assert worker.gpt_failures == 1
    await _ended(_drained(worker))  # and nothing is left behind on the worker


async def _drained(worker: DeviceWorker) -> None:
    while worker.queue_depth:
        await asyncio.sleep(0.01)


class _PoisonedEngine:
    """The real engine, whose batches raise in ``step()`` while a request with ``phones[0] == POISON`` is in them."""

    POISON = 299

    def __init__(self, engine) -> None:
        self._engine = engine
        self.failed_steps = 0

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def open_batch(self, on_chunk=None):
        return _PoisonedBatch(self, self._engine.open_batch(on_chunk=on_chunk))


class _PoisonedBatch:
    def __init__(self, owner: _PoisonedEngine, batch) -> None:
        self._owner, self._batch, self._poisoned = owner, batch, set()

    active = property(lambda self: self._batch.active)
    capacity = property(lambda self: self._batch.capacity)

    def add(self, rid, request):
        self._batch.add(rid, request)
        if int(request.phones[0]) == _PoisonedEngine.POISON:
            self._poisoned.add(rid)

    def step(self):
        if self._poisoned:
            self._owner.failed_steps += 1
            raise RuntimeError("injected decode failure")
        return self._batch.step()

    def cancel(self, rid):
        self._poisoned.discard(rid)
        self._batch.cancel(rid)


async def test_a_failing_decode_step_fails_only_the_request_that_breaks_it(tiny_engine):
    good = [_request(10 + i, seed=20 + i) for i in range(4)]
    worker = DeviceWorker(tiny_engine)
    try:
        alone = await _solo(worker, good)
    finally:
        worker.close()
    poisoned_engine = _PoisonedEngine(tiny_engine)
    worker = DeviceWorker(poisoned_engine)  # type: ignore[arg-type]
    try:
        bad = SemanticRequest(np.full(9, _PoisonedEngine.POISON, np.int64), np.zeros((1024, 9), np.float32),
                              REFERENCE_FREE, SamplingParams(seed=5, early_stop_num=30))
        results = await asyncio.gather(*(_ended(worker.semantic(r)) for r in [good[0], good[1], bad, good[2],
                                                                            good[3]]))
    finally:
        worker.close()
    assert isinstance(results[2], EngineError) and "injected decode failure" in str(results[2])
    for got, want in zip(results[:2] + results[3:], alone):
        assert not isinstance(got, Exception), got
        assert np.array_equal(got[0], want)  # decoded again from the start, the same tokens
    assert poisoned_engine.failed_steps >= 2  # the shared batch failed, then the culprit alone


async def test_retried_requests_stream_each_token_once(tiny_engine):
    """A request decoded again after its batch failed does not hand its first tokens to on_tokens twice."""
    good = _request(11, seed=31, steps=40)
    worker = DeviceWorker(tiny_engine)
    try:
        want = (await worker.semantic(good))[0]
    finally:
        worker.close()
    worker = DeviceWorker(_PoisonedEngine(tiny_engine))  # type: ignore[arg-type]
    streamed: list[np.ndarray] = []
    try:
        bad = SemanticRequest(np.full(9, _PoisonedEngine.POISON, np.int64), np.zeros((1024, 9), np.float32),
                              REFERENCE_FREE, SamplingParams(seed=5, early_stop_num=30))
        got, err = await asyncio.gather(_ended(worker.semantic(good, on_tokens=streamed.append)),
                                        _ended(worker.semantic(bad)))
        await asyncio.sleep(0)  # the last forwarded callbacks run on this loop
    finally:
        worker.close()
    assert isinstance(err, EngineError)
    assert np.array_equal(got[0], want)
    assert np.array_equal(np.concatenate(streamed), want)


async def test_a_failing_vocoder_call_fails_alone(worker):
    def boom():
        raise RuntimeError("vocoder exploded")

    results = await asyncio.gather(_ended(worker.call(lambda: 1)), _ended(worker.call(boom)),
                                   _ended(worker.call(lambda: 3)))
    assert results[0] == 1 and results[2] == 3
    assert isinstance(results[1], EngineError) and "vocoder exploded" in str(results[1])


async def test_every_job_ends_when_the_worker_closes(tiny_engine):
    worker = DeviceWorker(tiny_engine)
    gate = threading.Event()
    blocker = asyncio.ensure_future(worker.call(lambda: gate.wait(HANG_GUARD_S)))  # holds the device thread
    await asyncio.sleep(0.05)
    queued = [asyncio.ensure_future(worker.semantic(_request(10, seed=i))) for i in range(3)]
    queued += [asyncio.ensure_future(worker.call(lambda: 1, priority=BACKGROUND))]
    talk = worker.open()  # and sentences handed over: one's GPT queued, the next one's waiting for it
    queued += [asyncio.ensure_future(talk.sentence(i).speak(_utterance(tiny_engine, r), request=r))
               for i, r in enumerate([_request(10, seed=5), _request(11, seed=6)])]
    await asyncio.sleep(0.05)
    closing = asyncio.get_running_loop().run_in_executor(None, worker.close)
    await asyncio.sleep(0.05)
    gate.set()
    await closing
    results = await asyncio.gather(*(_ended(f) for f in queued))
    assert all(isinstance(r, WorkerClosed) for r in results), results
    assert await _ended(blocker) is True  # the call that was running finished
    with pytest.raises(WorkerClosed):
        await worker.call(lambda: 1)
    with pytest.raises(WorkerClosed):
        await talk.sentence(2).speak(_utterance(tiny_engine, _request(10, seed=7)), request=_request(10, seed=7))


async def test_a_wait_bound_limits_waiting_not_running(tiny_engine):
    """A sentence's work whose listener is not waiting yet never expires; once waited for, it may wait ``wait_s``
    from when it was queued or from when the waiting began, whichever is later; a plain call's deadline is a time."""
    now = [100.0]
    worker = DeviceWorker(tiny_engine, clock=lambda: now[0])
    try:
        talk = worker.open()
        pending = talk.sentence(0, 5.0)  # nobody waits for it yet
        now[0] += 50.0
        assert await pending.call(worker, lambda: "ran") == "ran"
        late = talk.sentence(1, 5.0)
        now[0] -= 6.0
        late.waiting()  # somebody has waited 6 s already, and the job is queued after that
        now[0] += 6.0
        gate = threading.Event()
        blocker = asyncio.ensure_future(worker.call(lambda: gate.wait(HANG_GUARD_S)))
        await asyncio.sleep(0.05)
        job = asyncio.ensure_future(late.call(worker, lambda: "ran"))
        await asyncio.sleep(0.05)
        now[0] += 1.0  # the job waited 1 s in the queue; the wait counted from the waiting's start would be over
        gate.set()
        assert await _ended(blocker) is True
        assert await _ended(job) == "ran"  # bound: max(started, submitted) + 5 s, and it was queued 1 s ago
        started = talk.sentence(2, 2.0)
        started.waiting()
        gate2 = threading.Event()
        blocker = asyncio.ensure_future(worker.call(lambda: gate2.wait(HANG_GUARD_S)))
        await asyncio.sleep(0.05)
        job = asyncio.ensure_future(started.call(worker, lambda: "ran"))
        gpt = asyncio.ensure_future(worker.semantic(_request(10, seed=4), deadline=now[0] + 2.0))
        await asyncio.sleep(0.05)
        now[0] += 3.0  # waited 3 s, bound 2 s
        gate2.set()
        await _ended(blocker)
        assert isinstance(await _ended(job), DeadlineError)
        assert isinstance(await _ended(gpt), DeadlineError)
        talk.played(now[0] + 1.0)  # once the request speaks, only its overall limit applies: it is finished
        speaking = talk.sentence(3, 0.0)
        speaking.waiting()
        now[0] += 10.0
        assert await _ended(speaking.call(worker, lambda: "ran")) == "ran"
        talk.close()
    finally:
        worker.close()


async def test_live_work_of_earlier_requests_goes_first(tiny_engine):
    """Within a priority class, ``order`` decides: the request admitted first is served first."""
    worker = DeviceWorker(tiny_engine)
    ran: list[str] = []
    try:
        gate = threading.Event()
        blocker = asyncio.ensure_future(worker.call(lambda: gate.wait(HANG_GUARD_S)))
        await asyncio.sleep(0.05)
        jobs = [asyncio.ensure_future(worker.call(lambda n=n: ran.append(n), priority=prio, order=order))
                for n, prio, order in [("bg", BACKGROUND, (0,)), ("r2s0", LIVE, (2, 0)), ("r1s3", LIVE, (1, 3)),
                                       ("r1s1", LIVE, (1, 1))]]
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(blocker, *jobs)
    finally:
        worker.close()
    assert ran == ["r1s1", "r1s3", "r2s0", "bg"]


async def test_a_request_running_out_of_audio_goes_first(tiny_engine):
    """A speaking request with less than LOW_BUFFER_S of audio left to play goes before everything else of its
    priority class, also before work somebody waits for and before requests admitted earlier."""
    now = [100.0]
    worker = DeviceWorker(tiny_engine, overlap=False, clock=lambda: now[0])
    plenty, opening, low = worker.open(), worker.open(), worker.open()  # admitted in this order
    plenty.played(now[0] + 10 * LOW_BUFFER_S)
    low.played(now[0] + LOW_BUFFER_S / 2)
    ahead = [plenty.sentence(i) for i in range(3)][2]  # a sentence rendered ahead of the one being played
    first = opening.sentence(0)
    first.waiting()  # somebody waits for a first sentence
    running_out = [low.sentence(i) for i in range(2)][1]
    ran: list[str] = []
    try:
        gate = threading.Event()
        blocker = asyncio.ensure_future(worker.call(lambda: gate.wait(HANG_GUARD_S)))
        await asyncio.sleep(0.05)
        jobs = [asyncio.ensure_future(work.call(worker, lambda n=n: ran.append(n)))
                for n, work in [("ahead, plenty left", ahead), ("first sentence", first),
                                ("ahead, running out", running_out)]]
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(blocker, *jobs)
    finally:
        worker.close()
    assert ran == ["ahead, running out", "first sentence", "ahead, plenty left"]


@pytest.mark.parametrize("running_out", [False, True])
async def test_a_waited_for_call_interleaves_unless_the_gpt_keeps_speech_going(tiny_engine, running_out):
    """On one device thread a call somebody waits for runs after the next GPT step even when the GPT's work is more
    urgent; not when that GPT work is for a request about to run out of audio and the call is not."""
    now = [100.0]
    worker = DeviceWorker(tiny_engine, overlap=False, clock=lambda: now[0])
    speaking, opening = worker.open(), worker.open()
    if running_out:
        speaking.played(now[0] + LOW_BUFFER_S / 2)
    spoken, second = [speaking.sentence(i) for i in range(2)]
    spoken.settle()  # (sentence 0 was spoken: sentence 1's GPT may run)
    second.waiting()
    first = opening.sentence(0)
    first.waiting()
    steps_at_call: list[int] = []
    try:
        gate = threading.Event()
        blocker = asyncio.ensure_future(worker.call(lambda: gate.wait(HANG_GUARD_S)))
        await asyncio.sleep(0.05)
        request = _request(12, seed=5, steps=40)
        gpt = asyncio.ensure_future(second.speak(_utterance(tiny_engine, request), request=request))
        call = asyncio.ensure_future(first.call(worker, lambda: steps_at_call.append(worker.gpt_steps)))
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(blocker, gpt, call)
    finally:
        worker.close()
    assert worker.gpt_steps >= 3  # (a decode of several steps, so the two cases differ)
    assert steps_at_call == ([worker.gpt_steps] if running_out else [1])
