"""A delete leaves nothing of the voice: whatever is in flight, and wherever a crash interrupts it (issue 16, 5)."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from bot.services import build_synthesizer
from synthesis import voices as voices_mod
from synthesis.cache import SynthesisCache
from synthesis.types import SynthesisParams
from synthesis.voices import TRASH_PREFIX, VoiceStore
from tests.audio_samples import speech_like_wav
from tests.synthesis.test_voices import SAMPLING, create, files_under

CONSENT = {"user_id": 1, "text": "this is my own voice"}
HANG_GUARD_S = 600  # only against a hang


def _fill(cache: SynthesisCache, voice_id: str, n: int = 3) -> None:
    for i in range(n):
        k = cache.prosody_key("model-a", voice_id, 1, f"sentence {i}", "en", SAMPLING)
        cache.put_tokens(k, np.arange(20), voice_id)
        cache.put_audio(cache.audio_key(k, 1.0, 0.5, 1), np.ones(1000, np.float32), voice_id)


def _entries(cache: SynthesisCache) -> int:
    s = cache.stats()
    return s["prosody"]["entries"] + s["audio"]["entries"]


def _open(tmp_path: Path) -> tuple[SynthesisCache, VoiceStore]:
    cache = SynthesisCache(tmp_path / "cache", 1 << 22, 1 << 22)
    return cache, VoiceStore(tmp_path / "voices", cache=cache)


def test_a_kill_before_the_rename_keeps_the_voice_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cache, store = _open(tmp_path)
    v = create(store)
    _fill(cache, v.id)
    real_rename = os.rename

    def killed(src, dst):  # the process dies at the folder's rename, the first step of the delete
        if TRASH_PREFIX in str(dst):
            raise KeyboardInterrupt("killed")
        return real_rename(src, dst)

    monkeypatch.setattr(voices_mod.os, "rename", killed)
    with pytest.raises(KeyboardInterrupt):
        store.delete(v.id)
    monkeypatch.undo()
    cache.close()
    cache, store = _open(tmp_path)  # the restart
    assert [x.id for x in store.list()] == [v.id]  # the voice is whole, its cache too: the user can delete again
    assert _entries(cache) == 6
    store.delete(v.id)
    assert files_under(tmp_path / "voices") == [] and _entries(cache) == 0
    cache.close()


def test_a_kill_between_the_rename_and_the_cache_is_finished_at_start_up(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    cache, store = _open(tmp_path)
    v = create(store)
    _fill(cache, v.id)

    def killed(voice_id):  # the folder is out of sight, its cache entries not yet removed
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(cache, "retire_voice", killed)
    with pytest.raises(KeyboardInterrupt):
        store.delete(v.id)
    monkeypatch.undo()
    _fill(cache, v.id)  # a request in flight finishes meanwhile: its writes are taken back (no folder)
    assert _entries(cache) == 6
    cache.close()
    cache, store = _open(tmp_path)  # the restart finishes the delete
    assert store.list() == [] and files_under(tmp_path / "voices") == [] and _entries(cache) == 0
    cache.close()


def test_a_delete_by_another_process_is_seen_by_this_ones_cache(tmp_path: Path):
    """Issue 16, 5: the writer of one process and the delete of another, in either order, leave no entry."""
    cache, store = _open(tmp_path)
    v = create(store)
    other_cache, other_store = _open(tmp_path)  # another process: its own objects over the same folders
    k = cache.prosody_key("model-a", v.id, 1, "in flight", "en", SAMPLING)
    cache.put_tokens(k, np.arange(20), v.id)  # written before the delete
    other_store.delete(v.id)
    assert _entries(cache) == 0
    _fill(cache, v.id)  # written after it, by the process that did not delete
    assert _entries(cache) == 0 and cache.is_retired(v.id)
    cache.close()
    other_cache.close()


def test_an_entry_written_while_another_process_deletes_is_taken_back(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch):
    """The race itself: the writer checked the voice before the delete and stores after its removal."""
    cache, store = _open(tmp_path)
    v = create(store)
    other_cache, other_store = _open(tmp_path)
    real_set = cache._prosody.set

    def delete_then_set(key, value, **kw):  # the other process deletes between the check and the write
        other_store.delete(v.id)
        return real_set(key, value, **kw)

    monkeypatch.setattr(cache._prosody, "set", delete_then_set)
    cache.put_tokens(cache.prosody_key("model-a", v.id, 1, "racing", "en", SAMPLING), np.arange(20), v.id)
    monkeypatch.undo()
    assert _entries(cache) == 0
    cache.close()
    other_cache.close()


def test_a_kill_after_the_rename_is_finished_at_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cache, store = _open(tmp_path)
    gone, kept = create(store, "Gone"), create(store, "Kept", seed=1)
    _fill(cache, kept.id)
    real_rmtree = shutil.rmtree

    def killed(path, *args, **kwargs):
        if Path(path).name.startswith(TRASH_PREFIX):
            raise KeyboardInterrupt("killed")
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(voices_mod.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        store.delete(gone.id)
    monkeypatch.undo()
    cache.close()
    # entries of the voice that another process (an older version, or a request of this one that raced the
    # delete) wrote after the cache was cleared: start-up recovery removes them with the trash folder
    cache = SynthesisCache(tmp_path / "cache", 1 << 22, 1 << 22)
    _fill(cache, gone.id)
    assert _entries(cache) == 12
    store = VoiceStore(tmp_path / "voices", cache=cache)
    assert _entries(cache) == 6  # only the kept voice's
    assert [x.id for x in store.list()] == [kept.id]
    assert not [f for f in files_under(tmp_path / "voices") if f.startswith(TRASH_PREFIX)]
    cache.close()


def test_a_trash_folder_of_an_older_version_is_purged_from_the_cache_too(tmp_path: Path):
    cache, store = _open(tmp_path)
    v = create(store)
    os.rename(tmp_path / "voices" / v.id, tmp_path / "voices" / f"{TRASH_PREFIX}0123abcd")  # no id in the name
    _fill(cache, v.id)
    cache.close()
    cache, store = _open(tmp_path)
    assert _entries(cache) == 0 and files_under(tmp_path / "voices") == []
    cache.close()


def test_a_deleted_voice_cannot_write_to_the_cache(tmp_path: Path):
    cache, store = _open(tmp_path)
    v = create(store)
    store.delete(v.id)
    _fill(cache, v.id)  # a request that was in flight finishes its sentences
    assert _entries(cache) == 0 and cache.is_retired(v.id)
    cache.close()


def test_no_byte_of_a_deleted_voice_stays_in_the_cache_files_while_the_process_runs(tmp_path: Path):
    """Deleted rows stay readable in SQLite's WAL until a checkpoint: the delete checkpoints, the cache stays open."""
    cache, store = _open(tmp_path)
    v = create(store)
    tokens = (np.arange(20) + 7777).astype("<i2").tobytes()
    for i in range(3):
        k = cache.prosody_key("model-a", v.id, 1, f"sentence {i}", "en", SAMPLING)
        cache.put_tokens(k, np.arange(20) + 7777, v.id)
    blob = lambda: b"".join(p.read_bytes() for p in (tmp_path / "cache").rglob("cache.db*"))  # noqa: E731
    assert v.id.encode() in blob() and tokens in blob()  # (the test can see them)
    store.delete(v.id)
    assert v.id.encode() not in blob() and tokens not in blob()
    cache.close()


# ---- with the pipeline: requests and precomputes in flight ------------------------------------------------------

@pytest.fixture
async def synth(tiny_config):
    s = build_synthesizer(tiny_config)
    yield s
    await s.close()


async def _voice(synth):
    v, _ = await synth.voicing.create("alice", speech_like_wav(), "alice.wav", transcript="Hello, this is my voice.",
                                    language="en", consent=CONSENT)
    return v


async def test_a_request_in_flight_during_the_delete_writes_nothing_after_it(synth):
    voice = await _voice(synth)
    text = " ".join(f"Sentence number {w} is still being made." for w in ("one", "two", "three", "four", "five"))
    stream = synth.stream(text, voice, SynthesisParams(language="en", seed=5))
    async with asyncio.timeout(HANG_GUARD_S):
        await anext(stream)  # the request is under way, its later sentences in flight
        await synth.voicing.delete(voice.id)
        rest = [c async for c in stream]  # it runs to its end with the voice it holds
    assert rest  # (it was really in flight)
    await synth.cache.drain()  # (its writes are queued: every one tried, after the delete)
    assert _entries(synth.cache.store) == 0
    assert files_under(synth.voices.root) == []


async def test_forget_me_during_a_precompute_leaves_no_entry(synth):
    voice = await _voice(synth)
    phrases = [f"Precomputed phrase number {i} for the voice." for i in range(12)]
    progress: list[float] = []
    task = synth.voicing.precompute(voice, phrases, progress=lambda stage, frac: progress.append(frac))
    async with asyncio.timeout(HANG_GUARD_S):
        while not progress:  # under way, with entries already written
            await asyncio.sleep(0.01)
        await synth.cache.drain()  # (its writes are queued)
        assert _entries(synth.cache.store) > 0
        await synth.voicing.delete(voice.id)
        await asyncio.gather(task, return_exceptions=True)
        while synth.worker.queue_depth:  # whatever the worker still held has ended
            await asyncio.sleep(0.01)
    assert task.cancelled() and progress[-1] < 1.0
    await synth.cache.drain()
    assert _entries(synth.cache.store) == 0
    assert files_under(synth.voices.root) == []
