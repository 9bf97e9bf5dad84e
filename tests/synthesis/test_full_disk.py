"""A full disk (issue 35): reading works, writing fails in one line leaving nothing, a cache write never fails speech.

The disk is a small filesystem the test makes itself (a tmpfs, where the test may mount one), filled to its last
bytes; where it may not, the cache's case injects the error SQLite raises there.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pytest

from bot import __main__ as cli
from bot.services import build_synthesizer, open_stores
from synthesis.cache import SynthesisCache
from synthesis.types import SynthesisParams, VoiceNotFound
from synthesis.voices import VoiceError, VoiceStore
from tests.audio_samples import speech_like_wav
from tests.synthesis.test_voices import create, files_under

DISK_BYTES = 8 << 20  # the small filesystem: room for a few voices and both caches
SEEDED = SynthesisParams(language="en", seed=1234, noise_scale=0.5)
CONSENT = {"user_id": 1, "text": "this is my own voice"}


@pytest.fixture
def disk(tmp_path: Path):
    """A small filesystem of its own (tmpfs, :data:`DISK_BYTES`), unmounted after the test."""
    path = tmp_path / "disk"
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here ({done.stderr.strip()}): needs root")
    yield path
    subprocess.run(["umount", "-l", str(path)], check=True)


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill ``disk`` until ``leave`` bytes (rounded to its 4 KiB blocks) are free; returns the filler file."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while (free := os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize) > leave:
            try:
                os.write(fd, b"\0" * min(1 << 20, max(4096, free - leave)))
            except OSError:
                break
    finally:
        os.close(fd)
    return filler


def on(config, disk: Path):
    """``config`` with its voices, caches and database on ``disk``."""
    return dataclasses.replace(
        config, voices=dataclasses.replace(config.voices, dir=disk / "voices"),
        cache=dataclasses.replace(config.cache, dir=disk / "cache"),
        discord=dataclasses.replace(config.discord, database=disk / "voicebot.sqlite3"))


def test_every_command_reads_its_voices_on_a_full_disk(disk: Path, tiny_config, capsys):
    config = on(tiny_config, disk)
    store, cache = open_stores(config)
    v = create(store)
    store.close()
    cache.close()
    fill(disk)
    assert os.statvfs(disk).f_bavail == 0
    # before: "disk I/O error; check the folder's permissions" from each of them
    assert cli._voices_list(config, argparse.Namespace()) == 0  # voices list
    assert "Alice" in capsys.readouterr().out
    assert cli._find_voice(config, "Alice").id == v.id  # say --voice
    store, cache = open_stores(config)  # serve's start-up
    got = store.get(v.id)
    assert got.name == "Alice" and got.prompt.prompt_tokens.size == 110
    assert cache.get_tokens("0" * 64) is None  # a cache that could not open misses
    store.close()
    cache.close()


@pytest.mark.parametrize("free_kb", [0, 64, 128, 200])
def test_a_voice_written_on_a_full_disk_fails_in_one_line_leaving_nothing(disk: Path, free_kb: int):
    """Before: with 64-200 KB free, ``voices add`` ended in a traceback (ENOSPC, or a bare AssertionError)."""
    cache = SynthesisCache(disk / "cache", 1 << 20, 1 << 20)
    store = VoiceStore(disk / "voices", cache=cache)
    first = create(store)
    store.close()
    cache.close()
    before = files_under(disk / "voices")
    filler = fill(disk, leave=free_kb * 1024)
    store = VoiceStore(disk / "voices")
    with pytest.raises(VoiceError) as refused:
        create(store, name="Bob", seed=1)
    message = str(refused.value)
    assert "\n" not in message and "no space left" in message and "free some space" in message
    assert [x.id for x in store.list()] == [first.id]  # nothing half-written, the voice before intact
    assert files_under(disk / "voices") == before
    store.close()
    filler.unlink()  # space again: writing works
    store = VoiceStore(disk / "voices")
    assert create(store, name="Bob", seed=1).name == "Bob"
    store.close()


@pytest.fixture
async def synth(tiny_config):
    s = build_synthesizer(tiny_config)
    yield s
    await s.close()


async def _speak(synth, text: str):
    try:
        v = synth.voices.find("alice")
    except VoiceNotFound:
        v, _ = await synth.voicing.create("alice", speech_like_wav(seed=2), "alice.wav",
                                          transcript="Hello, this is my voice.", language="en", consent=CONSENT)
    return [c async for c in synth.stream(text, v, SEEDED)]


async def test_a_cache_write_the_disk_refuses_never_fails_speech(synth, monkeypatch, caplog):
    """Before: every /tts answered 500 ("database or disk is full" from the cache write) until space was freed."""
    def full(*args, **kwargs):  # what SQLite raises on a full disk
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(synth.cache.store._prosody, "set", full)
    monkeypatch.setattr(synth.cache.store._audio, "set", full)
    with caplog.at_level(logging.WARNING, logger="synthesis.cache"):
        chunks = await _speak(synth, "The weather is nice today. We should go for a walk.")
        await synth.cache.drain()  # (the writes are queued: every one tried)
    assert {c.index for c in chunks} == {0, 1} and all(np.abs(c.audio).max() > 0 for c in chunks)
    failures = synth.metrics()["cache_write_failures"]
    assert failures >= 4  # two sentences, each a prosody and an audio entry
    lines = [r for r in caplog.records if "not stored" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0].getMessage() and lines[0].exc_info is None  # one line
    monkeypatch.undo()
    again = await _speak(synth, "The weather is nice today.")  # space again: entries are stored
    await synth.cache.drain()
    assert again and synth.metrics()["cache_write_failures"] == failures
    assert (await synth.cache.stats())["audio"]["entries"] >= 1


async def test_serve_starts_and_speaks_on_a_full_disk(disk: Path, tiny_config):
    """Voices and caches on one disk, filled after a voice was made: the synthesizer starts (``serve``'s start-up)
    and speaks with the voice, its cache writes counted, not raised."""
    config = on(tiny_config, disk)
    s = build_synthesizer(config)
    try:
        await _speak(s, "Hello.")  # the voice is made while there is space
    finally:
        await s.close()
    fill(disk)
    s = build_synthesizer(config)
    try:
        chunks = await _speak(s, "The weather is nice today. We should go for a walk.")
        assert {c.index for c in chunks} == {0, 1} and all(np.abs(c.audio).max() > 0 for c in chunks)
        await s.cache.drain()  # (the writes are queued: every one tried)
        assert s.metrics()["cache_write_failures"] >= 2
    finally:
        await s.close()
