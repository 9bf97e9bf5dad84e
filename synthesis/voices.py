"""The voice store: one folder per voice, written atomically, loaded without any model work.

Layout: ``root/<id>/clip.flac`` (the 32 kHz reference), ``prompt.npz`` (prompt_tokens, ge, prompt_phones,
prompt_bert, and sv_emb for a v2Pro/v2ProPlus voice) and ``meta.json`` (identity, owner, version, transcript, model
identity, consent). A voice is built in ``root/.tmp-<uuid>/``, every file and the folder fsynced, then renamed into
place, so a crash at any point leaves either the whole voice or nothing visible. A replacement swaps folders through
``root/.old-<id>-<uuid>/``; start-up restores an interrupted swap and removes stale temporary folders. Those are only
ever a dead process's: every write holds a shared ``flock`` on the root folder while its temporary folders exist, and
start-up recovery runs only when it gets the exclusive lock at once (another process writing a voice, the bot beside
a CLI command, leaves its folders alone; the next start removes what is left). A delete
first renames the folder to ``root/.trash-<id>-<uuid>/`` (the voice is gone for every process: the cache, bound to
the store, refuses and takes back its writes), then retires the voice in the cache (its entries go) and removes the
folder; start-up removes a leftover trash folder and the cache entries of its voice. The model work (HuBERT, VQ, ge,
phones, BERT) is the caller's: it passes the finished
:class:`~engines.base.VoicePrompt` in.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import soundfile as sf

from engines import SAMPLE_RATE, SpeechError, VoicePrompt
from synthesis.audio import Reference
from synthesis.cache import SynthesisCache
from synthesis.types import LANGUAGES, Voice, VoiceNotFound

log = logging.getLogger(__name__)

CLIP_FILE = "clip.flac"  # 32 kHz mono reference, 24-bit FLAC
PROMPT_FILE = "prompt.npz"
META_FILE = "meta.json"
META_SCHEMA = 1  # meta.json layout version
TMP_PREFIX = ".tmp-"  # a voice being written
OLD_PREFIX = ".old-"  # the previous version during a replace (".old-<id>-<uuid>")
TRASH_PREFIX = ".trash-"  # a voice being deleted (".trash-<id>-<uuid>")
NAME_RE = re.compile(r"[\w -]{1,32}")  # letters, digits, underscore, space, hyphen; 1-32 characters
_ID_RE = re.compile(r"[0-9a-f]{32}")
MTIME_SLACK_NS = 50_000_000  # a folder changed less than this long ago may change again unseen (coarse mtimes)


class VoiceError(SpeechError):
    """A voice cannot be stored as asked (bad or taken name, missing consent); the message says what to fix."""


@dataclass(frozen=True)
class Consent:
    """The speaker's consent to have their voice cloned.

    Attributes
    ----------
    user_id: who consented (the person whose voice it is).
    text: what they agreed to, verbatim.
    at: when, ISO 8601 UTC (now when omitted).
    """

    user_id: int
    text: str
    at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))


@dataclass(frozen=True)
class Removed:
    """What :meth:`VoiceStore.delete` removed."""

    voice_id: str
    name: str
    owner_id: int
    files: list[str]  # file names that were in the voice's folder
    bytes: int  # their total size
    cache_entries: int  # prosody + audio cache entries removed


class VoiceStore:
    """Voices on disk, one folder each; see the module docstring for the layout and the atomicity rules.

    Parameters
    ----------
    root: the voices folder (created if missing).
    cache: the synthesis cache whose entries are removed when a voice changes or is deleted.
    """

    def __init__(self, root: Path, *, cache: SynthesisCache | None = None) -> None:
        self.root = Path(root)
        self.cache = cache
        self._lock = threading.RLock()  # name uniqueness check + rename are one step
        self._loaded: dict[str, tuple[tuple[int, int], Voice]] = {}  # id -> (folder stat key, voice)
        # every meta.json, read again only when the root folder changed (a voice created, replaced or deleted,
        # by this process or another: each is a rename in the root, which moves its mtime)
        self._metas_at: int | None = None
        self._metas_cache: list[dict[str, Any]] = []
        self.root.mkdir(parents=True, exist_ok=True)
        if cache is not None:
            cache.bind_voices(self._exists)
        self._recover()

    # --- writing ------------------------------------------------------------------------------------------------

    def create(
        self,
        name: str,
        reference: Reference,
        prompt: VoicePrompt,
        *,
        owner_id: int,
        language: str,
        prompt_text: str,
        model_id: str,
        consent: Consent | Mapping[str, Any],
        enrollment_prompt: str | None = None,
        voice_id: str | None = None,
    ) -> Voice:
        """Store a new voice (version 1) and return it.

        Parameters
        ----------
        name: 1-32 characters of letters, digits, ``_``, space or ``-``; unique per owner (case-insensitive).
        reference: the prepared reference clip (its ``wav32k`` is stored).
        prompt: the model's encoding of the reference (computed by the caller).
        owner_id: the Discord user who owns it (0 for server/CLI voices).
        language: language of ``prompt_text``.
        prompt_text: the reference transcript ("" for reference-free mode).
        model_id: identity of the model that computed ``prompt``.
        consent: the speaker's consent: a :class:`Consent`, or a mapping with ``user_id``, ``text`` (or
            ``statement``) and optionally ``at`` (ISO string or epoch seconds) plus any JSON-serialisable extras,
            which are kept.
        enrollment_prompt: the sentence the bot asked the user to read, if any.
        voice_id: the id to store it under (32 hex digits, not in use), when the caller reserved one first (see
            ``bot.voice_service``); a new one when None.
        """
        check_name(name)
        if voice_id is not None and not _ID_RE.fullmatch(voice_id):
            raise VoiceError(f"a voice id is 32 lowercase hex digits, got {voice_id!r}")
        consent_record = _consent_dict(consent)
        _check_language(language)
        with self._lock:
            if self._find_meta(name, owner_id) is not None:
                raise VoiceError(f"you already have a voice named {name!r}; pick another name or replace that voice")
            if voice_id is None:
                voice_id = uuid.uuid4().hex
            elif (self.root / voice_id).exists():
                raise VoiceError(f"a voice with id {voice_id} exists already")
            now = _now()
            meta = {
                "schema": META_SCHEMA,
                "id": voice_id,
                "name": name,
                "owner_id": int(owner_id),
                "version": 1,
                "language": language,
                "prompt_text": prompt_text,
                "enrollment_prompt": enrollment_prompt,
                "model_id": model_id,
                "created": now,
                "updated": now,
                "consent": consent_record,
                "reference": _reference_dict(reference),
            }
            with self._writing():
                tmp = self._build(meta, prompt, reference.wav32k)
                os.rename(tmp, self.root / voice_id)
                _fsync_dir(self.root)
        log.info("voice %s (%r, owner %s) created", voice_id, name, owner_id)
        return self.get(voice_id)

    def replace(
        self,
        voice_id: str,
        prompt: VoicePrompt,
        *,
        reference: Reference | None = None,
        language: str | None = None,
        prompt_text: str | None = None,
        model_id: str | None = None,
        consent: Consent | Mapping[str, Any] | None = None,
        enrollment_prompt: str | None = None,
    ) -> Voice:
        """Store a new version of a voice (new clip and/or transcript, or a re-encode by a new model).

        Fields left as None keep their stored value (``reference=None`` keeps the clip). The version goes up by
        one and every cache entry of the voice is removed.
        """
        with self._lock:
            old_meta = self.meta(voice_id)
            meta = dict(old_meta)
            meta.update(version=int(old_meta["version"]) + 1, updated=_now())
            for key, value in (("language", language), ("prompt_text", prompt_text), ("model_id", model_id),
                               ("enrollment_prompt", enrollment_prompt)):
                if value is not None:
                    meta[key] = value
            if consent is not None:
                meta["consent"] = _consent_dict(consent)
            if reference is not None:
                meta["reference"] = _reference_dict(reference)
            _check_language(meta["language"])
            clip = reference.wav32k if reference is not None else self.load_clip(voice_id)
            with self._writing():
                tmp = self._build(meta, prompt, clip)
                live = self.root / voice_id
                old = self.root / f"{OLD_PREFIX}{voice_id}-{uuid.uuid4().hex}"
                os.rename(live, old)  # from here until the next rename, start-up recovery restores `old`
                os.rename(tmp, live)
                _fsync_dir(self.root)
                shutil.rmtree(old, ignore_errors=True)
            self._loaded.pop(voice_id, None)
        removed = self.cache.invalidate_voice(voice_id) if self.cache is not None else 0
        log.info("voice %s replaced (version %d, %d cache entries removed)", voice_id, meta["version"], removed)
        return self.get(voice_id)

    def delete(self, voice_id: str) -> Removed:
        """Delete a voice: its folder (every file) and every cache entry. Returns what was removed.

        The folder is renamed out of sight first: from then on the voice is gone for every process, and a cache
        bound to this store (in any process) takes back an entry of it written later. Then its cache entries go,
        then its bytes. A crash after the rename leaves a trash folder that start-up removes together with every
        cache entry of the voice; a crash before it leaves the voice whole.
        """
        with self._lock:
            meta = self.meta(voice_id)
            live = self.root / voice_id
            files = sorted(p.name for p in live.iterdir())
            size = sum(p.stat().st_size for p in live.iterdir())
            trash = self.root / f"{TRASH_PREFIX}{voice_id}-{uuid.uuid4().hex}"
            with self._writing():
                os.rename(live, trash)  # invisible at once; the entries and the bytes go next (or at next start-up)
                _fsync_dir(self.root)
                entries = self.cache.retire_voice(voice_id) if self.cache is not None else 0
                shutil.rmtree(trash)
            self._loaded.pop(voice_id, None)
        log.info("voice %s (%r) deleted: %d files, %d bytes, %d cache entries", voice_id, meta["name"], len(files),
                 size, entries)
        return Removed(voice_id, meta["name"], int(meta["owner_id"]), files, size, entries)

    def delete_owner(self, owner_id: int) -> list[Removed]:
        """Delete every voice of an owner (a user leaving / asking for erasure)."""
        return [self.delete(v.id) for v in self.list(owner_id)]

    # --- reading ------------------------------------------------------------------------------------------------

    def get(self, voice_id: str) -> Voice:
        """The voice with this id (prompt arrays read from disk once per version, then kept in memory)."""
        folder = self._folder(voice_id)
        try:
            st = folder.stat()
        except FileNotFoundError:
            raise VoiceNotFound(f"no voice with id {voice_id!r}; list voices to see the ids") from None
        stamp = (st.st_ino, st.st_mtime_ns)
        hit = self._loaded.get(voice_id)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        meta = self.meta(voice_id)
        with np.load(folder / PROMPT_FILE, allow_pickle=False) as z:
            prompt = VoicePrompt(
                prompt_tokens=z["prompt_tokens"].astype(np.int64),
                ge=z["ge"].astype(np.float32),
                prompt_phones=z["prompt_phones"].astype(np.int64),
                prompt_bert=z["prompt_bert"].astype(np.float32),
                # v2Pro/v2ProPlus voices only; a v2 voice (or one stored before v2Pro support) has none
                sv_emb=z["sv_emb"].astype(np.float32) if "sv_emb" in z.files else None,
            )
        voice = Voice(
            id=meta["id"],
            name=meta["name"],
            owner_id=int(meta["owner_id"]),
            version=int(meta["version"]),
            language=meta["language"],
            prompt_text=meta["prompt_text"],
            prompt=prompt,
            model_id=meta["model_id"],
        )
        self._loaded[voice_id] = (stamp, voice)
        return voice

    def meta(self, voice_id: str) -> dict[str, Any]:
        """The voice's ``meta.json`` (consent, enrollment prompt, timestamps, reference info), as a new dict."""
        path = self._folder(voice_id) / META_FILE
        try:
            return dict(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise VoiceNotFound(f"no voice with id {voice_id!r}; list voices to see the ids") from None

    def load_clip(self, voice_id: str) -> np.ndarray:
        """The stored reference ``[N]`` float32 @ 32 kHz (for re-encoding with a new model)."""
        path = self._folder(voice_id) / CLIP_FILE
        if not path.exists():
            raise VoiceNotFound(f"no voice with id {voice_id!r}; list voices to see the ids")
        data, rate = sf.read(str(path), dtype="float32", always_2d=False)
        assert rate == SAMPLE_RATE, f"stored clip at {rate} Hz"
        return np.asarray(data, dtype=np.float32)

    def find(self, name: str, owner_id: int | None = None) -> Voice:
        """The voice with this name (case-insensitive), of this owner when given."""
        with self._lock:
            matches = [m for m in self._metas() if m["name"].casefold() == name.casefold()
                       and (owner_id is None or int(m["owner_id"]) == owner_id)]
        if not matches:
            whose = "" if owner_id is None else " of yours"
            raise VoiceNotFound(f"no voice{whose} named {name!r}; list voices to see the names")
        if len(matches) > 1:
            raise VoiceError(f"{len(matches)} voices are named {name!r}; pick one by its owner or id")
        return self.get(matches[0]["id"])

    def list(self, owner_id: int | None = None) -> list[Voice]:
        """All voices (of one owner when given), sorted by name."""
        metas = [m for m in self._metas() if owner_id is None or int(m["owner_id"]) == owner_id]
        voices: list[Voice] = []
        for m in sorted(metas, key=lambda m: (m["name"].casefold(), m["id"])):
            try:
                voices.append(self.get(m["id"]))
            except VoiceNotFound:  # deleted meanwhile
                continue
        return voices

    # --- internals ----------------------------------------------------------------------------------------------

    def _exists(self, voice_id: str) -> bool:
        """Is this voice in the store? (Ids of another shape are not the store's to answer for: True.)"""
        return not _ID_RE.fullmatch(voice_id) or (self.root / voice_id).is_dir()

    def _build(self, meta: dict[str, Any], prompt: VoicePrompt, clip32k: np.ndarray) -> Path:
        """Write a complete voice folder under a temporary name; remove it again if anything fails."""
        tmp = self.root / f"{TMP_PREFIX}{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            _write_clip(tmp / CLIP_FILE, clip32k)
            _write_prompt(tmp / PROMPT_FILE, prompt)
            _write_json(tmp / META_FILE, meta)
            _fsync_dir(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return tmp

    def _folder(self, voice_id: str) -> Path:
        """The folder of a voice id (refusing anything that is not an id, so no path can escape the root)."""
        if not _ID_RE.fullmatch(voice_id):
            raise VoiceNotFound(f"no voice with id {voice_id!r}; list voices to see the ids")
        return self.root / voice_id

    def _metas(self) -> list[dict[str, Any]]:
        """meta.json of every visible voice (read from disk only when the root folder changed since last time)."""
        with self._lock:
            stamp = self.root.stat().st_mtime_ns
            if stamp == self._metas_at:
                return self._metas_cache
            out: list[dict[str, Any]] = []
            for folder in self.root.iterdir():
                if _ID_RE.fullmatch(folder.name) and folder.is_dir():
                    try:
                        out.append(json.loads((folder / META_FILE).read_text(encoding="utf-8")))
                    except FileNotFoundError:  # deleted meanwhile
                        continue
            # a change within the clock's resolution of this read would look unchanged next time: keep it only
            # when the folder is older than that
            self._metas_at = stamp if time.time_ns() - stamp > MTIME_SLACK_NS else None
            self._metas_cache = out
            return out

    def _find_meta(self, name: str, owner_id: int) -> dict[str, Any] | None:
        """An existing voice of this owner with this name (case-insensitive)."""
        for m in self._metas():
            if int(m["owner_id"]) == owner_id and m["name"].casefold() == name.casefold():
                return m
        return None

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Held while this process has temporary folders in the root: a shared lock on the root folder, released
        by the kernel when the process dies (so recovery can tell a live writer's folders from a dead one's)."""
        fd = os.open(self.root, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a start-up recovery runs
            yield
        finally:
            os.close(fd)  # releases the lock

    def _recover(self) -> None:
        """Finish or undo what a crash interrupted: restore swapped-out voices, remove temporary folders. Only when
        no live process is writing (the exclusive lock on the root, taken without waiting): then every temporary
        folder is a dead process's."""
        fd = os.open(self.root, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("another process is writing a voice in %s: its temporary folders are left alone", self.root)
                return
            self._recover_locked()
        finally:
            os.close(fd)

    def _recover_locked(self) -> None:
        """The recovery itself, under the exclusive lock."""
        for folder in sorted(self.root.iterdir()):
            if folder.name.startswith(OLD_PREFIX):
                voice_id = folder.name[len(OLD_PREFIX) :].split("-", 1)[0]
                live = self.root / voice_id
                if not live.exists() and _ID_RE.fullmatch(voice_id):
                    os.rename(folder, live)  # the replace never completed: keep the previous version
                    log.warning("voice %s: restored the previous version after an interrupted replace", voice_id)
                    continue
            if folder.name.startswith(TRASH_PREFIX):  # a delete was interrupted: finish it, caches included
                voice_id = _trashed_voice_id(folder)
                if voice_id is not None and self.cache is not None:
                    self.cache.invalidate_voice(voice_id)
            if folder.name.startswith((TMP_PREFIX, OLD_PREFIX, TRASH_PREFIX)):
                shutil.rmtree(folder, ignore_errors=True)
                log.info("removed leftover %s", folder.name)
        _fsync_dir(self.root)


def _trashed_voice_id(folder: Path) -> str | None:
    """The voice id of a trash folder: from its name (``.trash-<id>-<uuid>``), else from its meta.json."""
    head = folder.name[len(TRASH_PREFIX):].split("-", 1)[0]
    if _ID_RE.fullmatch(head) and "-" in folder.name[len(TRASH_PREFIX):]:
        return head
    try:  # a trash folder named before the id was part of the name
        voice_id = json.loads((folder / META_FILE).read_text(encoding="utf-8")).get("id")
    except (OSError, ValueError, AttributeError):
        return None
    return voice_id if isinstance(voice_id, str) and _ID_RE.fullmatch(voice_id) else None


def check_name(name: str) -> None:
    """Refuse a name that is not 1-32 characters of letters, digits, ``_``, space or ``-``.

    Raises
    ------
    VoiceError
        The name is not allowed; the message says which characters are.
    """
    if not NAME_RE.fullmatch(name) or name.strip() != name:
        raise VoiceError(
            f"voice name {name!r} is not allowed: use 1-32 letters, digits, spaces, '_' or '-', "
            "not starting or ending with a space"
        )


def _check_language(language: str) -> None:
    """Refuse an unknown language code."""
    if language not in LANGUAGES:
        raise VoiceError(f"language must be one of {', '.join(LANGUAGES)}, got {language!r}")


def _consent_dict(consent: Consent | Mapping[str, Any]) -> dict[str, Any]:
    """The consent record as stored in meta.json (``user_id``, ``text``, ``at`` ISO UTC, then any extras)."""
    if isinstance(consent, Consent):
        raw: dict[str, Any] = {"user_id": consent.user_id, "text": consent.text, "at": consent.at}
    else:
        raw = dict(consent)
        raw.setdefault("text", raw.pop("statement", ""))
    text = raw.get("text")
    if not isinstance(text, str) or not text.strip() or raw.get("user_id") is None:
        raise VoiceError("a voice needs the speaker's consent: give the user_id and the text they agreed to")
    at = raw.get("at")
    if at is None:
        at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    elif isinstance(at, (int, float)):
        at = datetime.fromtimestamp(float(at), timezone.utc).isoformat(timespec="seconds")
    try:
        record = {**raw, "user_id": int(raw["user_id"]), "text": text, "at": str(at)}
        json.dumps(record)
    except (TypeError, ValueError) as e:
        raise VoiceError(f"the consent record must be plain JSON data (user_id, text, at): {e}") from e
    return record


def _reference_dict(reference: Reference) -> dict[str, Any]:
    """What meta.json records about the reference clip."""
    return {
        "duration_s": round(float(reference.duration_s), 3),
        "start_s": round(float(reference.start_s), 3),
        "end_s": round(float(reference.end_s), 3),
        "warnings": list(reference.warnings),
    }


def _now() -> str:
    """Current UTC time, ISO 8601 with milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _write_clip(path: Path, clip32k: np.ndarray) -> None:
    """Write the 32 kHz reference as 24-bit FLAC and fsync it."""
    with open(path, "wb") as f:
        sf.write(f, np.clip(np.asarray(clip32k, np.float32), -1.0, 1.0), SAMPLE_RATE, format="FLAC", subtype="PCM_24")
        f.flush()
        os.fsync(f.fileno())


def _write_prompt(path: Path, prompt: VoicePrompt) -> None:
    """Write the prompt arrays (compressed: BERT is all zeros for non-Chinese transcripts) and fsync; ``sv_emb`` is
    stored only when the voice has one (v2Pro/v2ProPlus), so its absence on load means a v2 voice."""
    arrays = {
        "prompt_tokens": np.asarray(prompt.prompt_tokens, np.int64),
        "ge": np.asarray(prompt.ge, np.float32),
        "prompt_phones": np.asarray(prompt.prompt_phones, np.int64),
        "prompt_bert": np.asarray(prompt.prompt_bert, np.float32),
    }
    if prompt.sv_emb is not None:
        arrays["sv_emb"] = np.asarray(prompt.sv_emb, np.float32)
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)
        f.flush()
        os.fsync(f.fileno())


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON and fsync it."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    """fsync a directory so renames inside it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
