"""The cache lane: the pipeline's cache calls off the event loop, all on one thread, its writes queued in order,
drained on close, and a write the disk refuses counted, never raised."""

from __future__ import annotations

import asyncio
import errno
import logging
import threading
from pathlib import Path

import numpy as np
import pytest

from synthesis.cache import SynthesisCache
from synthesis.cache_lane import MAX_QUEUED_WRITES, CacheLane
from synthesis.types import SynthesisParams

MB = 1 << 20
PARAMS = SynthesisParams(language="en", seed=1234, noise_scale=0.5)
WAIT_S = 60.0  # a bound against a hang only: every wait below ends as soon as the test itself releases it


@pytest.fixture
async def lane(tmp_path: Path):
    lane = CacheLane(SynthesisCache(tmp_path / "cache", MB, 4 * MB))
    yield lane
    await lane.close()


async def test_a_lookup_in_progress_leaves_the_event_loop_running(lane):
    entered, release = threading.Event(), threading.Event()
    store_get = lane.store.get_tokens

    def held(key: str):
        entered.set()
        assert release.wait(WAIT_S), "the test never released the lookup"
        return store_get(key)

    lane.store.get_tokens = held
    lookup = asyncio.create_task(lane.get_tokens("k"))
    assert await asyncio.to_thread(entered.wait, WAIT_S)  # the lookup is under way
    ran = []
    for i in range(3):  # other coroutines run to completion meanwhile
        await asyncio.sleep(0)
        ran.append(i)
    assert ran == [0, 1, 2] and not lookup.done()
    release.set()
    assert await lookup is None  # (a miss)


async def test_every_cache_call_of_a_request_runs_on_the_one_cache_thread(synth, voice):
    store = synth.cache.store
    calls: list[tuple[str, str]] = []
    for name in ("get_tokens", "put_tokens", "get_audio", "put_audio"):
        def recorded(*args, _name=name, _real=getattr(store, name)):
            calls.append((_name, threading.current_thread().name))
            return _real(*args)

        setattr(store, name, recorded)
    for _ in range(2):  # a miss (the GPT, SoVITS, both stored), then the audio hit
        chunks = [c async for c in synth.stream("The lane keeps the loop free.", voice, PARAMS)]
    assert chunks[-1].timings["audio_hit"] == 1.0
    await synth.cache.drain()
    assert {name for name, _ in calls} == {"get_tokens", "put_tokens", "get_audio", "put_audio"}
    threads = {thread for _, thread in calls}
    assert len(threads) == 1 and threads.pop().startswith("voicebot-cache")
    assert threading.current_thread().name not in {thread for _, thread in calls}


async def test_a_write_is_seen_by_the_next_lookup_and_close_drains_the_queued_ones(tmp_path: Path):
    lane = CacheLane(SynthesisCache(tmp_path / "cache", MB, 4 * MB))
    await lane.put_tokens("t", np.arange(7), "v1")
    assert np.array_equal(await lane.get_tokens("t"), np.arange(7))  # queued before it: the lookup sees it
    entered, release = threading.Event(), threading.Event()
    store_put = lane.store.put_audio

    def held(*args):
        entered.set()
        assert release.wait(WAIT_S), "the test never released the write"
        store_put(*args)

    lane.store.put_audio = held
    await lane.put_audio("a1", np.ones(640, np.float32), "v1")  # returns at once: the write is only queued
    await lane.put_audio("a2", np.full(320, 0.5, np.float32), "v1")
    assert await asyncio.to_thread(entered.wait, WAIT_S)
    closing = asyncio.create_task(lane.close())
    for _ in range(3):
        await asyncio.sleep(0)
    assert not closing.done()  # the close waits for the queued writes
    release.set()
    await closing
    fresh = SynthesisCache(tmp_path / "cache", MB, 4 * MB)
    try:
        assert np.array_equal(fresh.get_audio("a1"), np.ones(640, np.float32))
        assert np.array_equal(fresh.get_audio("a2"), np.full(320, 0.5, np.float32))
        assert np.array_equal(fresh.get_tokens("t"), np.arange(7))
    finally:
        fresh.close()
    await lane.put_tokens("late", np.arange(3), "v1")  # after the close: counted, not raised
    assert lane.write_failures == 1


async def test_a_write_the_disk_refuses_never_fails_speech_and_counts_once(synth, voice, monkeypatch, caplog):
    def enospc(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(synth.cache.store._audio, "set", enospc)  # white-box: the audio store's write
    with caplog.at_level(logging.WARNING, logger="synthesis.cache"):
        chunks = [c async for c in synth.stream("One sentence to keep.", voice, PARAMS)]
        await synth.cache.drain()
    assert len(chunks) == 1 and np.abs(chunks[0].audio).max() > 0
    assert synth.metrics()["cache_write_failures"] == 1  # its audio entry; its tokens were stored
    assert len([r for r in caplog.records if "not stored" in r.getMessage()]) == 1  # one line
    assert (await synth.cache.stats())["prosody"]["entries"] == 1


async def test_past_the_backlog_a_write_is_skipped_and_counted(lane):
    release = threading.Event()
    store_put = lane.store.put_tokens

    def held(*args):
        assert release.wait(WAIT_S), "the test never released the write"
        store_put(*args)

    lane.store.put_tokens = held
    for i in range(MAX_QUEUED_WRITES + 2):
        await lane.put_tokens(f"k{i}", np.arange(3), "v1")
    assert lane.write_failures == 2  # the queue was full for the last two
    release.set()
    await lane.drain()
    stats = await lane.stats()
    assert stats["prosody"]["entries"] == MAX_QUEUED_WRITES and lane.write_failures == 2
