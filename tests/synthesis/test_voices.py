"""Voice store: create/get/find/list/replace/delete, atomic writes, crash recovery, cache invalidation."""

from __future__ import annotations

import json
import os
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
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_create_get_roundtrip(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path / "voices")
    v = create(store)
    assert (v.name, v.owner_id, v.version, v.language, v.model_id) == ("Alice", 42, 1, "en", "model-a")
    assert v.prompt_text == "Hello, this is my voice."
    assert files_under(tmp_path / "voices") == [v.id, f"{v.id}/clip.flac", f"{v.id}/meta.json", f"{v.id}/prompt.npz"]
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
    assert (removed.voice_id, removed.name, removed.files) == (gone.id, "Gone", ["clip.flac", "meta.json", "prompt.npz"])
    assert removed.cache_entries == 6 and removed.bytes > 100_000
    assert files_under(tmp_path / "voices") == [kept.id, f"{kept.id}/clip.flac", f"{kept.id}/meta.json",
                                               f"{kept.id}/prompt.npz"]
    s = cache.stats()
    assert s["prosody"]["entries"] == 3 and s["audio"]["entries"] == 3
    with pytest.raises(VoiceNotFound):
        store.get(gone.id)
    assert [r.voice_id for r in store.delete_owner(42)] == [kept.id]
    assert files_under(tmp_path / "voices") == []
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
    assert files_under(tmp_path / "voices") == [v.id, f"{v.id}/clip.flac", f"{v.id}/meta.json", f"{v.id}/prompt.npz"]
    v3 = store.replace(v.id, make_prompt(3), reference=make_reference(5.0, seed=3))
    assert v3.version == 3 and store.load_clip(v.id).size == 5 * 32000
    cache.close()


def test_crash_mid_create_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = VoiceStore(tmp_path)

    def crash(path: Path, data: object) -> None:  # the clip and prompt are written, then the process "dies"
        raise KeyboardInterrupt("simulated crash")

    monkeypatch.setattr(voices_mod, "_write_json", crash)
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
    assert files_under(tmp_path) == [v.id, f"{v.id}/clip.flac", f"{v.id}/meta.json", f"{v.id}/prompt.npz"]


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
    assert json.loads((tmp_path / v.id / "meta.json").read_text())["prompt_text"] == ""


def test_consent_given_as_a_mapping_keeps_its_fields(tmp_path: Path) -> None:
    store = VoiceStore(tmp_path)
    v = store.create("Mapped", make_reference(), make_prompt(), owner_id=5, language="zh", prompt_text="你好",
                     model_id="m", consent={"user_id": 5, "statement": "I agree.", "at": 0.0, "guild_id": 9})
    assert store.meta(v.id)["consent"] == {"user_id": 5, "text": "I agree.", "at": "1970-01-01T00:00:00+00:00",
                                           "guild_id": 9}


def test_list_reads_the_metadata_again_only_when_a_voice_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = VoiceStore(tmp_path / "voices")
    a = create(store, "Alice")
    reads: list[str] = []
    real_read = Path.read_text

    def counted(self: Path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if self.name == "meta.json":
            reads.append(self.parent.name)
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counted)
    os.utime(tmp_path / "voices", ns=(1, 1))  # the folder's last change is long past (mtimes can be coarse)
    assert [v.name for v in store.list()] == ["Alice"]
    first = len(reads)
    assert [v.name for v in store.list()] == ["Alice"] and store.find("alice").id == a.id
    assert len(reads) == first  # nothing changed: no meta.json read again
    other = VoiceStore(tmp_path / "voices")  # another process adds a voice
    create(other, "Bob", owner=7, seed=1)
    assert [v.name for v in store.list()] == ["Alice", "Bob"]  # seen at once
    other.delete(a.id)
    assert [v.name for v in store.list()] == ["Bob"]


# A writer in another process, stopped inside a create: its clip and prompt are written to a temporary folder, and it
# waits for a line on stdin before writing meta.json and renaming the folder into place.
_WRITER = """
import sys
from pathlib import Path
from synthesis import voices as voices_mod
from tests.synthesis.test_voices import create

real = voices_mod._write_json
def held(path, data):
    print("writing", flush=True)
    sys.stdin.readline()
    real(path, data)
voices_mod._write_json = held
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
