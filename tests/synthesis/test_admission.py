"""The one admission of the local and the remote synthesizer: a place per request from its stream() call to the end
of its stream, however it ends; past the capacity a refusal at the first step, counted."""

from __future__ import annotations

import collections
import gc
from typing import AsyncGenerator, Callable

import numpy as np
import pytest

from synthesis.types import AudioChunk, BusyError
from synthesis.admission import Admission


def _refusal() -> str:
    return "full; try again in a moment"


Body = Callable[[Callable[[], None]], AsyncGenerator[AudioChunk, None]]  # make(release) -> the request's chunks


def _chunks(n: int, started: list[int] | None = None) -> Body:
    """A body of ``n`` chunks of 10 samples; notes in ``started`` when it runs."""

    def make(release: Callable[[], None]) -> AsyncGenerator[AudioChunk, None]:
        async def body() -> AsyncGenerator[AudioChunk, None]:
            if started is not None:
                started.append(1)
            for i in range(n):
                yield AudioChunk(np.full(10, 0.1 * i, np.float32), "s", i)

        return body()

    return make


def _admission(capacity: list[int]) -> tuple[Admission, collections.Counter[str]]:
    counters: collections.Counter[str] = collections.Counter()
    return Admission(lambda: capacity[0], counters), counters


async def test_past_the_capacity_a_request_is_refused_at_its_first_step_and_counted() -> None:
    admission, counters = _admission([2])
    first, second = admission.stream(_chunks(3), _refusal), admission.stream(_chunks(3), _refusal)
    assert admission.in_flight == 2 and admission.busy
    started: list[int] = []
    third = admission.stream(_chunks(3, started), _refusal)
    assert counters["busy"] == 1 and admission.in_flight == 2
    with pytest.raises(BusyError, match="^full; try again in a moment$"):
        await anext(third)
    assert started == []  # refused before any work
    assert [c.index async for c in first] == [0, 1, 2]  # exhausted: its place is back
    assert admission.in_flight == 1 and not admission.busy
    await second.aclose()  # closed without reading a chunk: its place is back too
    assert admission.in_flight == 0 and counters["busy"] == 1


async def test_a_place_is_given_back_once_however_the_stream_ends() -> None:
    admission, _ = _admission([3])

    def failing(release: Callable[[], None]) -> AsyncGenerator[AudioChunk, None]:
        async def body() -> AsyncGenerator[AudioChunk, None]:
            yield AudioChunk(np.zeros(4, np.float32), "s", 0)
            raise BusyError("a replica was full")

        return body()

    stream = admission.stream(failing, _refusal)
    assert (await anext(stream)).index == 0
    with pytest.raises(BusyError, match="a replica was full"):
        await anext(stream)
    assert admission.in_flight == 0
    await stream.aclose()  # a second end gives nothing back twice
    assert admission.in_flight == 0

    dropped = admission.stream(_chunks(2), _refusal)  # never iterated, never closed: dropped
    assert admission.in_flight == 1
    del dropped
    gc.collect()
    assert admission.in_flight == 0


async def test_a_body_may_give_its_place_back_early_and_background_work_takes_none() -> None:
    admission, counters = _admission([1])
    released: list[Callable[[], None]] = []

    def early(release: Callable[[], None]) -> AsyncGenerator[AudioChunk, None]:
        released.append(release)
        return _chunks(1)(release)

    stream = admission.stream(early, _refusal)
    released[0]()  # (the local pipeline does this when the voice cannot be resolved)
    assert admission.in_flight == 0
    await stream.aclose()
    assert admission.in_flight == 0  # not below: the release counted once

    held = admission.stream(_chunks(1), _refusal)
    background = admission.stream(_chunks(2), _refusal, admitted=False)  # a precompute: full or not
    assert [c.index async for c in background] == [0, 1] and admission.in_flight == 1 and counters["busy"] == 0
    await held.aclose()


async def test_the_capacity_is_read_at_each_request() -> None:
    capacity = [1]
    admission, counters = _admission(capacity)
    held = admission.stream(_chunks(1), _refusal)
    assert admission.busy
    capacity[0] = 2  # (a test, or the remote client's replicas scaled up)
    assert not admission.busy
    more = admission.stream(_chunks(1), _refusal)
    assert admission.in_flight == 2 and counters["busy"] == 0
    for s in (held, more):
        await s.aclose()
