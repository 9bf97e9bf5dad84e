"""A delete killed at any step, then any command: every derived byte goes, the cache's entries included (issue 35).

``voices list`` and ``say --voice`` opened the voice store without the cache: they finished the delete's folder and
row, and its cache entries stayed for good (12 of 26 killed deletes, 94 entries).
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import pytest

from bot import __main__ as cli
from bot.services import open_stores
from synthesis.types import VoiceNotFound
from synthesis import voices as voices_mod
from synthesis.cache import SynthesisCache
from synthesis.voices import TRASH_PREFIX, VoiceStore
from tests.synthesis.test_delete import _entries, _fill
from tests.synthesis.test_voices import create


class Killed(BaseException):
    """The process dies here (a BaseException: nothing on the way catches it, as nothing runs after a kill)."""


def _kill_at_rename(monkeypatch: pytest.MonkeyPatch, store: VoiceStore) -> None:
    rename = os.rename

    def killed(src, dst):
        if TRASH_PREFIX in str(dst):
            raise Killed
        return rename(src, dst)

    monkeypatch.setattr(voices_mod.os, "rename", killed)


def _kill_before_the_row_commits(monkeypatch: pytest.MonkeyPatch, store: VoiceStore) -> None:
    fsync_dir = voices_mod._fsync_dir

    def killed(path):  # the folder is in trash, the row's delete not yet committed
        fsync_dir(path)
        if any(p.name.startswith(TRASH_PREFIX) for p in Path(path).iterdir()):
            raise Killed

    monkeypatch.setattr(voices_mod, "_fsync_dir", killed)


def _kill_before_the_cache(monkeypatch: pytest.MonkeyPatch, store: VoiceStore) -> None:
    def killed(voice_id):  # row gone, the entries not yet
        raise Killed

    assert store.cache is not None
    monkeypatch.setattr(store.cache, "retire_voice", killed)


def _kill_before_the_bytes(monkeypatch: pytest.MonkeyPatch, store: VoiceStore) -> None:
    def killed(path, *args, **kwargs):  # entries gone, the trash folder's files not yet
        raise Killed

    monkeypatch.setattr(voices_mod.shutil, "rmtree", killed)


STEPS = [_kill_at_rename, _kill_before_the_row_commits, _kill_before_the_cache, _kill_before_the_bytes]


def _voices_list(config) -> None:
    assert cli._voices_list(config, argparse.Namespace()) == 0


def _say_voice(config) -> None:  # `say --voice Alice`: the voice is looked up before the engine loads
    try:
        cli._find_voice(config, "Alice")
    except VoiceNotFound:
        pass


def _serve_start(config) -> None:
    store, cache = open_stores(config)
    store.close()
    cache.close()


COMMANDS = [_voices_list, _say_voice, _serve_start]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("step", STEPS, ids=lambda f: f.__name__[len("_kill_"):])
def test_a_killed_delete_then_any_command_leaves_nothing(tiny_config, monkeypatch: pytest.MonkeyPatch, step,
                                                        command, capsys):
    store, cache = open_stores(tiny_config)
    v = create(store)
    _fill(cache, v.id)
    assert _entries(cache) == 6
    step(monkeypatch, store)
    with pytest.raises(Killed):
        store.delete(v.id)
    monkeypatch.undo()
    store.close()
    cache.close()
    command(tiny_config)  # the next command, in a new process
    listed = capsys.readouterr().out
    store, cache = VoiceStore(tiny_config.voices.dir), SynthesisCache(tiny_config.cache.dir, 1 << 22, 1 << 22)
    try:
        if step is _kill_at_rename:  # before its first step the voice is whole: nothing was deleted
            assert [x.id for x in store.list()] == [v.id] and _entries(cache) == 6
            return
        assert store.list() == [] and "Alice" not in listed
        assert _entries(cache) == 0  # every entry went, whichever command ran next
        assert [p.name for p in Path(tiny_config.voices.dir).iterdir() if not p.name.startswith("voices.sqlite3")] == []
    finally:
        store.close()
        cache.close()


def test_a_store_without_its_cache_keeps_the_mark_until_one_with_it_opens(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    """A program that opens the voices alone finishes the delete's bytes and row, and keeps an empty trash folder
    as the mark: the first store opened with the cache removes the entries, then the mark."""
    cache = SynthesisCache(tmp_path / "cache", 1 << 22, 1 << 22)
    store = VoiceStore(tmp_path / "voices", cache=cache)
    v = create(store)
    _fill(cache, v.id)
    _kill_before_the_cache(monkeypatch, store)
    with pytest.raises(Killed):
        store.delete(v.id)
    monkeypatch.undo()
    store.close()
    cache.close()
    alone = VoiceStore(tmp_path / "voices")
    assert alone.list() == []
    marks = [p for p in (tmp_path / "voices").iterdir() if p.name.startswith(TRASH_PREFIX)]
    assert len(marks) == 1 and list(marks[0].iterdir()) == []  # no byte of the voice, only the mark
    alone.close()
    cache = SynthesisCache(tmp_path / "cache", 1 << 22, 1 << 22)
    assert _entries(cache) == 6
    store = VoiceStore(tmp_path / "voices", cache=cache)
    assert _entries(cache) == 0 and not any(p.name.startswith(TRASH_PREFIX) for p in (tmp_path / "voices").iterdir())
    store.close()
    cache.close()
    shutil.rmtree(tmp_path / "voices")
