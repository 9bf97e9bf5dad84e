"""Voice store: create/get/find/list/replace/delete, atomic writes, crash recovery, cache invalidation."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from engines.base import VoicePrompt
from synthesis import voices as voices_mod
from synthesis.audio import Reference
from synthesis.cache import SynthesisCache
from synthesis.types import VoiceNotFound
from synthesis.voices import Consent, VoiceError, VoiceStore

SAMPLING = {"top_k": 15, "top_p": 1.0, "temperature": 1.0, "repetition_penalty": 1.35, "seed": 1}


def make_reference(seconds: float = 4.0, seed: int = 0) -> Reference:
    rng = np.random.default_rng(seed)
    wav32k = (0.3 * rng.standard_normal(int(32000 * seconds))).clip(-0.9, 0.9).astype(np.float32)
    return Reference(wav32k=wav32k, wav16k=wav32k[::2].copy(), duration_s=seconds, warnings=["noisy"], start_s=1.0,
                     end_s=1.0 + seconds)


def make_prompt(seed: int = 0, tp: int = 110, tpp: int = 37) -> VoicePrompt:
    rng = np.random.default_rng(seed)
    return VoicePrompt(
        prompt_tokens=rng.integers(0, 1024, tp).astype(np.int64),
        ge=rng.standard_normal((512, 1)).astype(np.float32),
        prompt_phones=rng.integers(0, 300, tpp).astype(np.int64),
        prompt_bert=rng.standard_normal((1024, tpp)).astype(np.float32),
    )


CONSENT = Consent(user_id=42, text="I agree that this bot speaks in my voice.", at="2025-01-01T00:00:00+00:00")


def create(store: VoiceStore, name: str = "Alice", owner: int = 42, seed: int = 0):  # type: ignore[no-untyped-def]
    return store.create(name, make_reference(seed=seed), make_prompt(seed), owner_id=owner, language="en",
                        prompt_text="Hello, this is my voice.", model_id="model-a", consent=CONSENT,
                        enrollment_prompt="Read: the quick brown fox.")


def files_under(root: Path) -> list[str]:
    """Every file and folder under ``root`` but the voice database (its rows are checked through the store, and
    :func:`db_bytes` shows what its files hold)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.name.startswith(voices_mod.DB_FILE))


def db_bytes(root: Path) -> bytes:
    """The bytes of the voice database's files (database, WAL, shared memory)."""
    return b"".join(p.read_bytes() for p in root.glob(f"{voices_mod.DB_FILE}*"))


def test_create_get_roundtrip(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path / "voices")
    v = create(store)
    assert (v.name, v.owner_id, v.version, v.language, v.model_id) == ("Alice", 42, 1, "en", "model-a")
    assert v.prompt_text == "Hello, this is my voice."
    assert files_under(tmp_path / "voices") == [v.id, f"{v.id}/clip.flac", f"{v.id}/prompt.npz"]
    assert (tmp_path / "voices" / voices_mod.DB_FILE).is_file()  # the metadata is a row of the database
    # a fresh store (a restart) loads it from disk, bit-exact, with no model anywhere
    again = VoiceStore(tmp_path / "voices").get(v.id)
    p, q = make_prompt(0), again.prompt
    for a, b in ((p.prompt_tokens, q.prompt_tokens), (p.ge, q.ge), (p.prompt_phones, q.prompt_phones),
                 (p.prompt_bert, q.prompt_bert)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    clip = store.load_clip(v.id)
    np.testing.assert_allclose(clip, make_reference().wav32k, atol=2e-7)  # 24-bit FLAC
    meta = store.meta(v.id)
    assert meta["consent"] == {"user_id": 42, "text": CONSENT.text, "at": CONSENT.at}
    assert meta["enrollment_prompt"] == "Read: the quick brown fox."
    assert meta["reference"]["warnings"] == ["noisy"] and meta["reference"]["duration_s"] == 4.0


def test_a_store_holds_the_arrays_of_its_recent_voices_only(tmp_path: Path) -> None:
    """A bot that has spoken in many voices keeps the arrays of the most recently used ``HELD_VOICES`` only; the
    others are read from disk again when next asked for, the same voice."""
    store = VoiceStore(tmp_path / "voices")
    store._held.limit = 3  # white-box: the bound (256 by default), small for the test
    made = [create(store, name=f"V{i}", seed=i) for i in range(5)]
    assert store._held.ids() == [v.id for v in made[2:]]  # created = used; the two oldest left
    store.get(made[2].id)  # used again: now the most recent
    again = store.get(made[0].id)  # read from disk, and the least recently used (made[3]) leaves
    assert store._held.ids() == [made[4].id, made[2].id, made[0].id]
    np.testing.assert_array_equal(again.prompt.prompt_bert, make_prompt(0).prompt_bert)
    assert store.get(made[0].id) is again  # held now: the same arrays, no read
    assert voices_mod.HELD_VOICES == 256


def test_names_validated_and_unique_per_owner(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    create(store, "Alice")
    with pytest.raises(VoiceError, match="you already have a voice named 'alice'"):
        create(store, "alice")
    create(store, "Alice", owner=7)  # another owner may use the name
    for bad in ("", "x" * 33, "a/b", "../etc", " lead", "dot.name"):
        with pytest.raises(VoiceError, match="is not allowed: use 1-32 letters"):
            create(store, bad)
    create(store, "Ünïcode name-2_x")
    assert [v.name for v in store.list(42)] == ["Alice", "Ünïcode name-2_x"]
    assert len(store.list()) == 3


def test_find_and_list(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    a = create(store, "Alice")
    b = create(store, "Bob", owner=7)
    assert store.find("alice").id == a.id and store.find("BOB", owner_id=7).id == b.id
    with pytest.raises(VoiceNotFound, match="no voice of yours named 'Bob'"):
        store.find("Bob", owner_id=42)
    create(store, "Bob", owner=42)
    with pytest.raises(VoiceError, match="2 voices are named 'Bob'"):
        store.find("Bob")
    with pytest.raises(VoiceNotFound, match="no voice with id"):
        store.get("0" * 32)
    with pytest.raises(VoiceNotFound):
        store.get("../../etc/passwd")
    assert [v.name for v in store.list()] == ["Alice", "Bob", "Bob"]


def test_delete_leaves_no_file_or_cache_entry(tmp_path: Path) -> None:
    cache = SynthesisCache(tmp_path / "cache", 1 << 20, 1 << 22)
    store = VoiceStore(tmp_path / "voices", cache=cache)
    gone, kept = create(store, "Gone"), create(store, "Kept", seed=1)
    for v in (gone, kept):
        for i in range(3):
            k = cache.prosody_key("model-a", v.id, v.version, f"sentence {i}", "en", SAMPLING)
            cache.put_tokens(k, np.arange(50), v.id)
            cache.put_audio(cache.audio_key(k, 1.0, 0.5, 1), np.zeros(40_000, np.float32), v.id)
    removed = store.delete(gone.id)
    assert (removed.voice_id, removed.name, removed.files) == (gone.id, "Gone", ["clip.flac", "prompt.npz"])
    assert removed.cache_entries == 6 and removed.bytes > 100_000
    assert files_under(tmp_path / "voices") == [kept.id, f"{kept.id}/clip.flac", f"{kept.id}/prompt.npz"]
    assert gone.id.encode() not in db_bytes(tmp_path / "voices")  # the row is overwritten, the WAL emptied
    s = cache.stats()
    assert s["prosody"]["entries"] == 3 and s["audio"]["entries"] == 3
    with pytest.raises(VoiceNotFound):
        store.get(gone.id)
    assert [r.voice_id for r in store.delete_owner(42)] == [kept.id]
    assert files_under(tmp_path / "voices") == []
    leftover = db_bytes(tmp_path / "voices")
    assert kept.id.encode() not in leftover and CONSENT.text.encode() not in leftover and b"Kept" not in leftover
    cache.close()
    # scan the whole data folder: only the two SQLite databases remain, with no entry of either voice
    leftover = [f for f in files_under(tmp_path / "cache") if not f.endswith(("cache.db", "cache.db-wal", "cache.db-shm"))]
    assert leftover == ["audio", "prosody"]
    blob = b"".join(p.read_bytes() for p in (tmp_path / "cache").rglob("cache.db*"))
    assert gone.id.encode() not in blob and kept.id.encode() not in blob


def test_replace_bumps_version_and_invalidates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a clock that ticks once per reading: "updated" is the replace's time, whatever the machine's speed
    ticks = iter(f"2026-01-01T00:00:{n:02d}.000+00:00" for n in range(60))
    monkeypatch.setattr(voices_mod, "_now", lambda: next(ticks))
    cache = SynthesisCache(tmp_path / "cache", 1 << 20, 1 << 20)
    store = VoiceStore(tmp_path / "voices", cache=cache)
    v = create(store)
    k = cache.prosody_key("model-a", v.id, v.version, "hi", "en", SAMPLING)
    cache.put_tokens(k, np.arange(5), v.id)
    v2 = store.replace(v.id, make_prompt(9), prompt_text="New transcript.", model_id="model-b")
    assert (v2.id, v2.version, v2.prompt_text, v2.model_id) == (v.id, 2, "New transcript.", "model-b")
    np.testing.assert_array_equal(v2.prompt.prompt_tokens, make_prompt(9).prompt_tokens)
    np.testing.assert_allclose(store.load_clip(v.id), make_reference().wav32k, atol=2e-7)  # clip kept
    assert cache.get_tokens(k) is None and cache.stats()["prosody"]["entries"] == 0
    meta = store.meta(v.id)
    assert store.get(v.id).version == 2 and meta["created"] < meta["updated"]  # the create's tick, the replace's
    assert files_under(tmp_path / "voices") == [v.id, f"{v.id}/clip.flac", f"{v.id}/prompt.npz"]
    v3 = store.replace(v.id, make_prompt(3), reference=make_reference(5.0, seed=3))
    assert v3.version == 3 and store.load_clip(v.id).size == 5 * 32000
    cache.close()


def test_crash_mid_create_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = VoiceStore(tmp_path)

    def crash(path: Path, prompt: object, version: int) -> None:  # the clip is written, then the process "dies"
        raise KeyboardInterrupt("simulated crash")

    monkeypatch.setattr(voices_mod, "_write_prompt", crash)
    with pytest.raises(KeyboardInterrupt):
        create(store)
    assert files_under(tmp_path) == [] and store.list() == []


def test_hard_crash_leftovers_are_cleaned_at_startup(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    v = create(store)
    # a process killed mid-create: a half-written temp folder
    tmp = tmp_path / ".tmp-0123"
    tmp.mkdir()
    (tmp / "clip.flac").write_bytes(b"fLaC partial")
    # a process killed mid-replace, between the two renames: the live folder is gone, the old one remains
    (tmp_path / v.id).rename(tmp_path / f".old-{v.id}-abcd")
    # and one killed mid-delete
    (tmp_path / ".trash-99").mkdir()
    assert store.list() == []  # nothing half-done is ever visible
    restarted = VoiceStore(tmp_path)
    assert [x.id for x in restarted.list()] == [v.id] and restarted.get(v.id).version == 1
    assert files_under(tmp_path) == [v.id, f"{v.id}/clip.flac", f"{v.id}/prompt.npz"]


def test_reference_free_voice_and_consent_required(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    empty = VoicePrompt(np.zeros(0, np.int64), np.ones((512, 1), np.float32), np.zeros(0, np.int64),
                        np.zeros((1024, 0), np.float32))
    v = store.create("Free", make_reference(), empty, owner_id=1, language="en", prompt_text="", model_id="m",
                     consent=CONSENT)
    assert store.get(v.id).prompt.reference_free
    for bad in (Consent(user_id=1, text="  "), {"user_id": 1}, {"text": "I agree"}):
        with pytest.raises(VoiceError, match="needs the speaker's consent"):
            store.create("NoConsent", make_reference(), empty, owner_id=1, language="en", prompt_text="",
                         model_id="m", consent=bad)
    with pytest.raises(VoiceError, match="language must be one of"):
        store.create("BadLang", make_reference(), empty, owner_id=1, language="xx", prompt_text="", model_id="m",
                     consent=CONSENT)
    assert VoiceStore(tmp_path).meta(v.id)["prompt_text"] == ""


def test_consent_given_as_a_mapping_keeps_its_fields(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    v = store.create("Mapped", make_reference(), make_prompt(), owner_id=5, language="zh", prompt_text="你好",
                     model_id="m", consent={"user_id": 5, "statement": "I agree.", "at": 0.0, "guild_id": 9})
    assert store.meta(v.id)["consent"] == {"user_id": 5, "text": "I agree.", "at": "1970-01-01T00:00:00+00:00",
                                           "guild_id": 9}


def test_list_is_one_query_and_sees_another_process_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = VoiceStore(tmp_path / "voices")
    a = create(store, "Alice")
    loads: list[str] = []
    real_load = np.load

    def counted(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        loads.append(Path(path).parent.name)
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(voices_mod.np, "load", counted)
    statements: list[str] = []
    store._db().set_trace_callback(statements.append)
    assert [v.name for v in store.list()] == ["Alice"] and store.find("alice").id == a.id
    assert loads == []  # the prompt arrays of a version already read stay in memory: no file is read
    assert [s.split()[0] for s in statements] == ["SELECT", "SELECT"]  # one query each
    other = VoiceStore(tmp_path / "voices")  # another process adds a voice
    b = create(other, "Bob", owner=7, seed=1)
    loads.clear()
    assert [v.name for v in store.list()] == ["Alice", "Bob"]  # seen at once
    assert loads == [b.id]  # only the new voice's arrays are read
    other.delete(a.id)
    assert [v.name for v in store.list()] == ["Bob"]
    other.replace(b.id, make_prompt(5), prompt_text="Changed elsewhere.")
    (bob,) = store.list()
    assert (bob.version, bob.prompt_text) == (2, "Changed elsewhere.")  # the new version, not the one in memory
    np.testing.assert_array_equal(bob.prompt.prompt_tokens, make_prompt(5).prompt_tokens)


# A writer in another process, stopped inside a create: its clip is written to a temporary folder, and it waits for a
# line on stdin before writing the prompt and renaming the folder into place.
_WRITER = """
import sys
from pathlib import Path
from synthesis import voices as voices_mod
from tests.synthesis.test_voices import create

real = voices_mod._write_prompt
def held(path, prompt, version):
    print("writing", flush=True)
    sys.stdin.readline()
    real(path, prompt, version)
voices_mod._write_prompt = held
print(create(voices_mod.VoiceStore(Path(sys.argv[1]))).id, flush=True)
"""


def _start_writer(root: Path):  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout is not None and proc.stdout.readline() == "writing\n"
    return proc


def _temp_folders(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(voices_mod.TMP_PREFIX))


def test_startup_recovery_leaves_a_live_writers_folders_alone(tmp_path: Path) -> None:
    """The CLI opening the store while the bot writes a voice: the bot's temporary folder survives and its voice
    is created; the folder of a writer that died is removed once nobody writes."""
    root = tmp_path / "voices"
    root.mkdir()
    proc = _start_writer(root)
    try:
        (live_tmp,) = _temp_folders(root)
        (root / ".tmp-deadbeef").mkdir()  # a dead writer's leftover, beside the live one
        VoiceStore(root)  # start-up recovery while the writer holds its lock: nothing is touched
        assert _temp_folders(root) == sorted([live_tmp, ".tmp-deadbeef"])
        out, _ = proc.communicate("go\n", timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0
    voice_id = out.strip()
    restarted = VoiceStore(root)  # nobody writes now: the dead writer's folder goes, the new voice stays
    assert [v.id for v in restarted.list()] == [voice_id] and restarted.get(voice_id).name == "Alice"
    assert _temp_folders(root) == []


def test_a_killed_writers_temporary_folder_is_removed_at_the_next_start(tmp_path: Path) -> None:
    root = tmp_path / "voices"
    root.mkdir()
    proc = _start_writer(root)
    proc.kill()  # dies mid-create: the kernel releases its lock
    proc.wait(30)
    assert len(_temp_folders(root)) == 1
    assert VoiceStore(root).list() == [] and files_under(root) == []


# ---- the layout before the database: a meta.json per folder, imported at open ---------------------------------

def write_old_layout(root: Path, name: str, owner: int, seed: int) -> str:
    """A voice folder exactly as the store wrote it before the database: clip.flac, prompt.npz (no version) and
    meta.json (schema 1)."""
    voice_id = f"{seed:032x}"
    folder = root / voice_id
    folder.mkdir(parents=True)
    voices_mod._write_clip(folder / "clip.flac", make_reference(seed=seed).wav32k)
    p = make_prompt(seed)
    np.savez_compressed(folder / "prompt.npz", prompt_tokens=p.prompt_tokens, ge=p.ge, prompt_phones=p.prompt_phones,
                        prompt_bert=p.prompt_bert)
    meta = {"schema": 1, "id": voice_id, "name": name, "owner_id": owner, "version": 3, "language": "en",
            "prompt_text": f"Transcript {seed}.", "enrollment_prompt": None, "model_id": "model-old",
            "created": "2025-05-01T10:00:00.000+00:00", "updated": "2025-06-01T10:00:00.000+00:00",
            "consent": {"user_id": owner, "text": "I agree.", "at": "2025-05-01T10:00:00+00:00", "guild_id": 9},
            "reference": {"duration_s": 4.0, "start_s": 1.0, "end_s": 5.0, "warnings": []}}
    (folder / "meta.json").write_text(json.dumps(meta, ensure_ascii=False, indent=2, sort_keys=True), "utf-8")
    return voice_id


def test_voices_of_the_layout_before_the_database_are_imported_once(tmp_path: Path) -> None:
    root = tmp_path / "voices"
    ids = [write_old_layout(root, "Old One", 42, 1), write_old_layout(root, "Old Two", 7, 2)]
    store = VoiceStore(root)
    assert [(v.id, v.name, v.owner_id, v.version, v.prompt_text, v.model_id) for v in store.list()] == [
        (ids[0], "Old One", 42, 3, "Transcript 1.", "model-old"), (ids[1], "Old Two", 7, 3, "Transcript 2.",
                                                                    "model-old")]
    np.testing.assert_array_equal(store.get(ids[1]).prompt.prompt_tokens, make_prompt(2).prompt_tokens)
    meta = store.meta(ids[0])
    assert meta["consent"] == {"user_id": 42, "text": "I agree.", "at": "2025-05-01T10:00:00+00:00", "guild_id": 9}
    assert (meta["created"], meta["updated"]) == ("2025-05-01T10:00:00.000+00:00", "2025-06-01T10:00:00.000+00:00")
    assert files_under(root) == sorted([*ids, *(f"{i}/{f}" for i in ids for f in ("clip.flac", "prompt.npz"))])
    # the imported voices behave as any other: a replace, a new voice beside them, a delete; a restart keeps them
    assert store.replace(ids[0], make_prompt(9), model_id="model-new").version == 4
    with pytest.raises(VoiceError, match="already have a voice named"):
        create(store, "old one")
    store.delete(ids[1])
    again = VoiceStore(root)
    assert [(v.name, v.version) for v in again.list()] == [("Old One", 4)]


def test_an_interrupted_import_finishes_at_the_next_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "voices"
    voice_id = write_old_layout(root, "Old", 42, 1)
    real_unlink = Path.unlink

    def killed(self: Path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.name == "meta.json":  # the rows are committed, the meta.json files not yet removed
            raise KeyboardInterrupt("killed")
        return real_unlink(self, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", killed)
    with pytest.raises(KeyboardInterrupt):
        VoiceStore(root)
    monkeypatch.undo()
    assert (root / voice_id / "meta.json").exists()
    store = VoiceStore(root)  # imports again: the row is there already, one voice, and meta.json goes
    assert [(v.id, v.version) for v in store.list()] == [(voice_id, 3)]
    assert not (root / voice_id / "meta.json").exists()
    assert [v.id for v in VoiceStore(root).list()] == [voice_id]


def test_a_meta_json_that_cannot_be_imported_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "voices"
    voice_id = write_old_layout(root, "Broken", 42, 1)
    (root / voice_id / "meta.json").write_text("{not json", "utf-8")
    assert VoiceStore(root).list() == []
    assert (root / voice_id / "meta.json").read_text("utf-8") == "{not json"  # not deleted: someone can repair it


# ---- rows against folders ------------------------------------------------------------------------------------------

def test_start_up_removes_a_row_without_its_folder_and_a_folder_without_its_row(tmp_path: Path) -> None:
    cache = SynthesisCache(tmp_path / "cache", 1 << 20, 1 << 20)
    root = tmp_path / "voices"
    store = VoiceStore(root, cache=cache)
    no_folder, incomplete, orphan, whole = (create(store, n, seed=i) for i, n in enumerate(("A", "B", "C", "D")))
    shutil.rmtree(root / no_folder.id)
    (root / incomplete.id / "prompt.npz").unlink()
    with store._transaction() as db:
        db.execute("DELETE FROM voices WHERE id = ?", (orphan.id,))
    for v in (no_folder, incomplete, orphan, whole):
        cache.put_tokens(cache.prosody_key("model-a", v.id, 1, "hi", "en", SAMPLING), np.arange(5), v.id)
    restarted = VoiceStore(root, cache=cache)
    assert [v.id for v in restarted.list()] == [whole.id]
    assert files_under(root) == [whole.id, f"{whole.id}/clip.flac", f"{whole.id}/prompt.npz"]
    assert cache.stats()["prosody"]["entries"] == 1  # only the whole voice's
    cache.close()


# ---- a process killed between any two steps: what the next start-up leaves ----------------------------------------

_KILLED = """
import os, shutil, signal, sys
from pathlib import Path
from synthesis import voices as voices_mod
from tests.synthesis.test_voices import create, make_prompt

root, op, step = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
voice_id = sys.argv[4] if len(sys.argv) > 4 else None


def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)


real_rename = voices_mod.os.rename
moving = {"create": ".tmp-", "replace": ".tmp-", "delete": ".trash-"}[op]  # the rename the step is about


def rename(src, dst):
    if moving in str(src) + str(dst) and step == "before rename":
        die()
    real_rename(src, dst)
    if moving in str(src) + str(dst) and step == "after rename":
        die()


voices_mod.os.rename = rename
store = voices_mod.VoiceStore(root)
if step == "after commit":  # the transaction committed, what follows it not done
    if op == "create":
        store.get = die
    elif op == "replace":
        real_rmtree = shutil.rmtree
        voices_mod.shutil.rmtree = lambda p, *a, **k: die() if ".old-" in str(p) else real_rmtree(p, *a, **k)
    else:
        store._checkpoint = die
if op == "create":
    create(store)
elif op == "replace":
    store.replace(voice_id, make_prompt(7), prompt_text="The second version.")
else:
    store.delete(voice_id)
print("finished without being killed")
"""


def _killed_at(root: Path, op: str, step: str, voice_id: str | None = None) -> None:
    import signal
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _KILLED, str(root), op, step, *([voice_id] if voice_id else [])],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], timeout=120)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stdout, r.stderr)


@pytest.mark.parametrize(("step", "kept"), [("before rename", False),  # the row inserted, not committed
                                             ("after rename", False),  # the folder in place, the row not committed
                                             ("after commit", True)])
def test_a_create_killed_at_any_step_is_whole_or_gone(tmp_path: Path, step: str, kept: bool) -> None:
    root = tmp_path / "voices"
    _killed_at(root, "create", step)
    store = VoiceStore(root)
    if kept:
        (v,) = store.list()
        assert (v.name, v.version) == ("Alice", 1) and store.meta(v.id)["consent"]["text"] == CONSENT.text
        assert files_under(root) == [v.id, f"{v.id}/clip.flac", f"{v.id}/prompt.npz"]
    else:
        assert store.list() == [] and files_under(root) == []
    create(store, "Again")  # either way the store works on


@pytest.mark.parametrize(("step", "version"), [("before rename", 1),  # the old folder out, the new one not in
                                                ("after rename", 1),  # the new folder in, the row not committed
                                                ("after commit", 2)])  # committed, the old folder not removed
def test_a_replace_killed_at_any_step_keeps_one_whole_version(tmp_path: Path, step: str, version: int) -> None:
    root = tmp_path / "voices"
    v = create(VoiceStore(root))
    _killed_at(root, "replace", step, v.id)
    store = VoiceStore(root)
    (again,) = store.list()
    assert again.version == version
    assert again.prompt_text == ("Hello, this is my voice." if version == 1 else "The second version.")
    np.testing.assert_array_equal(again.prompt.prompt_tokens, make_prompt(0 if version == 1 else 7).prompt_tokens)
    assert files_under(root) == [v.id, f"{v.id}/clip.flac", f"{v.id}/prompt.npz"]


@pytest.mark.parametrize(("step", "kept"), [("before rename", True),  # nothing done yet
                                             ("after rename", False),  # out of sight, the row still there
                                             ("after commit", False)])  # the row gone, the trash folder left
def test_a_delete_killed_at_any_step_is_whole_or_finished(tmp_path: Path, step: str, kept: bool) -> None:
    root = tmp_path / "voices"
    v = create(VoiceStore(root))
    _killed_at(root, "delete", step, v.id)
    store = VoiceStore(root)
    assert [x.id for x in store.list()] == ([v.id] if kept else [])
    # opened without its cache, the store keeps an empty trash folder as the mark of the entries it could not
    # remove (tests/synthesis/test_killed_deletes.py): no byte of the voice; the first store with the cache ends it
    marks = [p for p in files_under(root) if p.startswith(voices_mod.TRASH_PREFIX)]
    assert files_under(root) == ([v.id, f"{v.id}/clip.flac", f"{v.id}/prompt.npz"] if kept else marks)
    assert len(marks) == (0 if kept else 1)
    if not kept:
        assert v.id.encode() not in db_bytes(root) and CONSENT.text.encode() not in db_bytes(root)
        VoiceStore(root, cache=SynthesisCache(tmp_path / "cache", 1 << 20, 1 << 20)).close()
        assert files_under(root) == []


def test_a_database_of_a_newer_program_is_refused_with_the_fix(tmp_path: Path) -> None:
    import sqlite3

    VoiceStore(tmp_path).close()
    conn = sqlite3.connect(tmp_path / voices_mod.DB_FILE)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(VoiceError, match="schema version 99, newer than this program .*upgrade voicebot"):
        VoiceStore(tmp_path)


def test_a_read_during_another_processes_replace_waits_for_its_commit(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    root = tmp_path / "voices"
    store = VoiceStore(root)
    v = create(store)
    other = VoiceStore(root)  # another process's store (its own connections)
    swapped, go = threading.Event(), threading.Event()
    real_rename = os.rename

    def paused(src, dst):  # type: ignore[no-untyped-def]
        real_rename(src, dst)
        if voices_mod.OLD_PREFIX in str(dst):  # the live folder is out, the new one not in yet
            swapped.set()
            go.wait(10)

    monkeypatch.setattr(voices_mod.os, "rename", paused)
    writer = threading.Thread(target=other.replace, args=(v.id, make_prompt(4)), kwargs={"prompt_text": "Two."})
    writer.start()
    assert swapped.wait(10)
    threading.Timer(0.2, go.set).start()
    got = store.get(v.id)  # neither "no such voice" nor the new arrays under the old row: the new version
    writer.join(10)
    assert (got.version, got.prompt_text) == (2, "Two.")
    np.testing.assert_array_equal(got.prompt.prompt_tokens, make_prompt(4).prompt_tokens)


def test_a_folder_without_its_row_is_deleted_by_a_delete_too(tmp_path: Path) -> None:
    """A create cut short between its rename and its commit, while another process kept start-up from reconciling:
    deleting the id (the bot's journal undoing that create) removes the folder and its cache entries."""
    cache = SynthesisCache(tmp_path / "cache", 1 << 20, 1 << 20)
    store = VoiceStore(tmp_path / "voices", cache=cache)
    v = create(store)
    with store._transaction() as db:
        db.execute("DELETE FROM voices WHERE id = ?", (v.id,))
    cache.put_tokens(cache.prosody_key("model-a", v.id, 1, "hi", "en", SAMPLING), np.arange(5), v.id)
    removed = store.delete(v.id)
    assert (removed.name, removed.files, removed.cache_entries) == ("", ["clip.flac", "prompt.npz"], 1)
    assert files_under(tmp_path / "voices") == []
    with pytest.raises(VoiceNotFound, match="no voice with id"):
        store.delete(v.id)
    cache.close()
