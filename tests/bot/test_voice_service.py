"""bot.voice_service: one owner for a voice's life. Create, share, delete, forget-me over the real SQLite store, voice
store and cache; and a process killed between any two steps leaves no half-voice once the next start-up recovered.

The model work is stood in for (:class:`StandInVoicing`: a fixed encoding, written by the real voice store), which
isolates the layer under test; the pipeline's own voice work is tested in tests/synthesis.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from bot.store import Store
from bot.voice_service import VoiceService
from synthesis.cache import SynthesisCache
from synthesis.voices import VoiceStore
from tests.synthesis.test_voices import SAMPLING, db_bytes, files_under, make_prompt, make_reference

ALICE, BOB, G1 = 111, 222, 999
REPO = Path(__file__).resolve().parents[2]
CONSENT = {"user_id": ALICE, "statement": "I confirm this recording is my own voice", "guild_id": G1}


class StandInVoicing:
    """``Synthesizer.voicing`` without a model: a fixed prompt stored by the real voice store; a precompute writes one
    real cache entry per phrase."""

    def __init__(self, voices: VoiceStore) -> None:
        self.voices = voices
        self.created: list[str] = []

    async def create(self, name: str, data: bytes, filename: str = "", *, owner_id: int, consent: Any,
                     voice_id: str | None = None, **_: Any) -> tuple[Any, list[str]]:
        voice = await asyncio.to_thread(
            self.voices.create, name, make_reference(), make_prompt(0), owner_id=owner_id, language="en",
            prompt_text="Hello, this is my voice.", model_id="model-a", consent=consent, voice_id=voice_id)
        self.created.append(voice.id)
        return voice, []

    def precompute(self, voice: Any, phrases: list[str], progress: Any = None) -> asyncio.Task[int]:
        cache = self.voices.cache
        assert cache is not None

        async def run() -> int:
            for i, phrase in enumerate(phrases):
                cache.put_tokens(cache.prosody_key("model-a", voice.id, 1, phrase, "en", SAMPLING), np.arange(9),
                                 voice.id)
                if progress is not None:
                    progress("precompute", (i + 1) / len(phrases))
            return len(phrases)

        return asyncio.create_task(run())

    async def delete(self, voice_id: str) -> Any:
        return await asyncio.to_thread(self.voices.delete, voice_id)


def open_all(root: Path) -> tuple[Store, SynthesisCache, VoiceStore, VoiceService]:
    """What a process opens: the database, the cache, the voice store (its start-up recovery), the service."""
    store = Store(root / "voicebot.sqlite3")
    cache = SynthesisCache(root / "cache", 1 << 22, 1 << 22)
    voices = VoiceStore(root / "voices", cache=cache)
    synthesizer = SimpleNamespace(voices=voices, voicing=StandInVoicing(voices))
    return store, cache, voices, VoiceService(store, synthesizer, phrases=["Hello!", "Good night."])  # type: ignore[arg-type]


async def make_voice(service: VoiceService, name: str = "Alice", owner: int = ALICE, **kw: Any) -> Any:
    made = await service.create(name, b"clip", "me.ogg", owner_id=owner, consent={**CONSENT, "user_id": owner},
                                guild_id=G1, **kw)
    if made.phrases is not None:
        await made.phrases
    return made


async def rows_naming(store: Store, text: str) -> list[Any]:
    """Every row of every table whose values mention ``text``."""
    tables = [r[0] for r in await store._read("SELECT name FROM sqlite_master WHERE type = 'table'")]
    found = []
    for table in tables:
        for row in await store._read(f"SELECT * FROM {table}"):
            if text in json.dumps([str(x) for x in row]):
                found.append((table, row))
    return found


def entries(cache: SynthesisCache) -> int:
    s = cache.stats()
    return s["prosody"]["entries"] + s["audio"]["entries"]


def files(root: Path) -> list[str]:
    """Every file under ``root`` but the voice database (see tests.synthesis.test_voices.files_under)."""
    return files_under(root)


@pytest.fixture
async def opened(tmp_path: Path):
    store, cache, voices, service = open_all(tmp_path)
    await store.open()
    yield store, cache, voices, service
    await store.close()
    cache.close()


# ---- the operations ----------------------------------------------------------------------------------------------

async def test_create_stores_the_voice_its_consent_once_and_its_rows(opened) -> None:
    store, cache, voices, service = opened
    progress: list[tuple[int, int]] = []
    made = await make_voice(service, phrase_progress=lambda done, total: progress.append((done, total)))
    voice = made.voice
    assert made.chosen and (await store.user_settings(ALICE))["voice"] == voice.id  # her first voice is hers
    assert made.phrase_count == 2 and progress == [(1, 2), (2, 2)] and entries(cache) == 2
    consent = await service.consent(voice.id)
    assert consent["user_id"] == ALICE and consent["text"] == CONSENT["statement"] and consent["guild_id"] == G1
    assert await store.voice_journal() == []
    # the consent words are in the voice store's row for the voice and nowhere in the bot's database
    assert CONSENT["statement"] not in json.dumps(await rows_naming(store, ""))
    second = await make_voice(service, "Alto")
    assert not second.chosen and (await store.user_settings(ALICE))["voice"] == voice.id
    server = await make_voice(service, "Narrator", BOB, server=True)
    assert await store.guild_voices(G1) == [server.voice.id] and (await store.user_settings(BOB))["voice"] is None
    assert [v.name for v in await service.list(ALICE)] == ["Alice", "Alto"]
    assert [(v.name, kind) for v, kind in await service.usable(G1, ALICE)] == [
        ("Alice", "yours"), ("Alto", "yours"), ("Narrator", "server")]


async def test_a_failed_create_leaves_nothing(opened, monkeypatch: pytest.MonkeyPatch) -> None:
    store, cache, voices, service = opened

    async def refused(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("the database is gone")

    monkeypatch.setattr(store, "commit_voice", refused)  # the files are written, the rows fail
    with pytest.raises(RuntimeError):
        await make_voice(service)
    assert files(voices.root) == [] and await store.voice_journal() == [] and voices.list() == []


async def test_share_delete_and_forget_me_remove_every_row_file_and_entry(opened, tmp_path: Path) -> None:
    store, cache, voices, service = opened
    alice = (await make_voice(service)).voice
    other = (await make_voice(service, "Alto")).voice
    bob = (await make_voice(service, "Bob", BOB)).voice
    assert await service.share(alice, G1, ALICE) is True and await service.share(alice, G1, ALICE) is False
    with pytest.raises(Exception, match="only the owner"):
        await service.share(bob, G1, ALICE)
    await store.set_user_setting(BOB, "voice", alice.id, guild_id=G1)  # Bob picked Alice's shared voice
    counts = await service.delete(alice.id)
    assert counts["voice_shares"] == 1 and counts["user_settings"] == 2
    assert await rows_naming(store, alice.id) == [] and not (voices.root / alice.id).exists()
    assert entries(cache) == 4  # Alto's and Bob's
    await store.set_nickname(G1, ALICE, "Al")
    deleted, counts = await service.forget_user(ALICE)
    assert deleted == 1 and counts["nicknames"] == 1
    assert await rows_naming(store, str(ALICE)) == [] and await rows_naming(store, other.id) == []
    assert [v.id for v in voices.list()] == [bob.id] and entries(cache) == 2
    assert await store.voice_journal() == []


@pytest.mark.parametrize("forget", ["forget-me", "delete"])
async def test_no_byte_of_the_voice_id_stays_in_the_bots_database_while_it_runs(opened, tmp_path: Path,
                                                                                forget: str) -> None:
    """Issue 35: right after /forget-me the voice's id stayed readable in the bot's database files (its journal
    line's delete was never checkpointed) while the bot ran."""
    store, cache, voices, service = opened
    voice = (await make_voice(service)).voice
    await service.share(voice, G1, ALICE)
    if forget == "forget-me":
        await service.forget_user(ALICE)
    else:
        await service.delete(voice.id)
    assert store._conn is not None  # the bot still runs: its connection is open
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("voicebot.sqlite3*"))
    assert raw and voice.id.encode() not in raw


# ---- a crash between any two steps -------------------------------------------------------------------------------

CHILD = """
import asyncio, os, signal, sys
sys.path.insert(0, {repo!r})
from pathlib import Path
import shutil
from synthesis import voices as voices_mod
from tests.bot.test_voice_service import open_all, make_voice, ALICE

root, op, step = Path(sys.argv[1]), sys.argv[2], sys.argv[3]


def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


async def main():
    store, cache, voices, service = open_all(root)
    await store.open()
    voicing = service.synthesizer.voicing
    if step == "voicing.create":  # journalled, nothing written yet
        voicing.create = die
    elif step == "folder rename":  # the voice's files written in its temporary folder, not renamed into place
        real = voices_mod.os.rename
        voices_mod.os.rename = lambda src, dst: die() if ".tmp-" in str(src) else real(src, dst)
    elif step == "after folder rename":  # the folder in place, the voice store's row not committed
        real = voices_mod.os.rename
        voices_mod.os.rename = lambda src, dst: (real(src, dst), die() if ".tmp-" in str(src) else None)[0]
    elif step == "commit_voice":  # the folder in place, the rows not yet written
        store.commit_voice = die
    elif step == "precompute":  # committed: the voice is whole
        service._precompute = die
    elif step == "delete files":  # rows gone, files untouched
        service._delete_files = die
    elif step == "cache retire":  # the folder out of sight, the cache entries still there
        cache.retire_voice = die
    elif step == "trash rmtree":  # the cache clean, the trash folder still there
        real_rmtree = voices_mod.shutil.rmtree
        voices_mod.shutil.rmtree = lambda p, *a, **k: die() if ".trash-" in str(p) else real_rmtree(p, *a, **k)
    elif step == "end_voice":  # everything gone but the journal entry
        store.end_voice = die
    elif step == "second voice":  # forget-me: the first voice's files gone, the second's not
        real_delete = service._delete_files
        calls = []
        async def second(voice_id):
            calls.append(voice_id)
            if len(calls) == 2:
                die()
            await real_delete(voice_id)
        service._delete_files = second
    if op == "create":
        await make_voice(service)
    elif op == "delete":
        (voice,) = await service.list(ALICE)
        await service.delete(voice.id)
    else:
        await service.forget_user(ALICE)
    print("finished without being killed")


asyncio.run(main())
"""


def _run_until_killed(root: Path, op: str, step: str) -> None:
    script = root / "child.py"
    script.write_text(textwrap.dedent(CHILD.format(repo=str(REPO))))
    r = subprocess.run([sys.executable, str(script), str(root), op, step], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stdout, r.stderr)


async def _after_restart(root: Path) -> tuple[Store, SynthesisCache, VoiceStore, VoiceService]:
    store, cache, voices, service = open_all(root)  # the voice store's own start-up recovery runs here
    await store.open()
    await service.recover()
    return store, cache, voices, service


async def _assert_gone(root: Path, store: Store, cache: SynthesisCache, voices: VoiceStore, voice_ids: list[str]) -> None:
    assert await store.voice_journal() == []
    assert files(root / "voices") == [] and voices.list() == []
    assert entries(cache) == 0
    for voice_id in voice_ids:
        assert await rows_naming(store, voice_id) == [] and voice_id.encode() not in db_bytes(root / "voices")


@pytest.mark.parametrize("step", ["voicing.create", "folder rename", "after folder rename", "commit_voice",
                                  "precompute"])
async def test_a_create_killed_at_any_step_is_whole_or_gone(tmp_path: Path, step: str) -> None:
    _run_until_killed(tmp_path, "create", step)
    store, cache, voices, service = await _after_restart(tmp_path)
    try:
        if step == "precompute":  # committed before the kill: the whole voice, rows included
            (voice,) = voices.list()
            assert (await store.user_settings(ALICE))["voice"] == voice.id
            assert (await service.consent(voice.id))["user_id"] == ALICE and await store.voice_journal() == []
        else:  # not committed: undone, to the last byte and row
            await _assert_gone(tmp_path, store, cache, voices, [])
            assert await rows_naming(store, str(ALICE)) == []
        # either way the next create works
        again = await make_voice(service, "Again")
        assert again.voice.id in [v.id for v in voices.list()]
    finally:
        await store.close()
        cache.close()


async def _voice_with_everything(root: Path, name: str = "Alice") -> str:
    store, cache, voices, service = open_all(root)
    await store.open()
    voice = (await make_voice(service, name)).voice
    await service.share(voice, G1, ALICE)
    await store.set_user_setting(BOB, "voice", voice.id, guild_id=G1)
    assert entries(cache) > 0
    await store.close()
    cache.close()
    return voice.id


@pytest.mark.parametrize("step", ["delete files", "cache retire", "trash rmtree", "end_voice"])
async def test_a_delete_killed_at_any_step_is_finished_at_start_up(tmp_path: Path, step: str) -> None:
    voice_id = await _voice_with_everything(tmp_path)
    _run_until_killed(tmp_path, "delete", step)
    store, cache, voices, service = await _after_restart(tmp_path)
    try:
        await _assert_gone(tmp_path, store, cache, voices, [voice_id])
    finally:
        await store.close()
        cache.close()


async def test_a_forget_me_killed_between_two_voices_is_finished_at_start_up(tmp_path: Path) -> None:
    ids = [await _voice_with_everything(tmp_path, "Alice"), await _voice_with_everything(tmp_path, "Alto")]
    _run_until_killed(tmp_path, "forget", "second voice")
    store, cache, voices, service = await _after_restart(tmp_path)
    try:
        await _assert_gone(tmp_path, store, cache, voices, ids)
        assert await rows_naming(store, str(ALICE)) == []
    finally:
        await store.close()
        cache.close()


def test_the_child_script_really_runs_to_the_end_unkilled(tmp_path: Path) -> None:
    """The kill tests are only as good as their child: without a kill it creates the voice completely."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD.format(repo=str(REPO))))
    r = subprocess.run([sys.executable, str(script), str(tmp_path), "create", "none"], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
    assert r.returncode == 0 and "finished without being killed" in r.stdout, r.stderr
    (voice_id,) = [f for f in os.listdir(tmp_path / "voices") if not f.startswith((".", "voices.sqlite3"))]
    assert VoiceStore(tmp_path / "voices").get(voice_id).name == "Alice"
