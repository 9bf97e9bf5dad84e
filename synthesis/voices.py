"""The voice store: each voice's metadata as a row of one SQLite database, its artefacts in one folder per voice.

Layout: ``root/voices.sqlite3`` (WAL) holds one row per voice: identity, owner, name, version, language, transcript,
enrollment prompt, model identity, timestamps, consent and reference info; it is the source of truth, so listing
voices (autocomplete) is one query. ``root/<id>/`` holds the artefacts: ``clip.flac`` (the 32 kHz reference) and
``prompt.npz`` (prompt_tokens, ge, prompt_phones, prompt_bert, sv_emb for a v2Pro/v2ProPlus voice, family and ref_mel
for a v3/v4/v5 voice, and the version of the row it belongs to). A voice may also hold extra clips (``extra-1.flac``, ...: their ``ge`` is averaged with
the main clip's, each clip's kept as ``clip_ges`` in ``prompt.npz``, their facts in the row's ``reference.extras``)
and named styles (``style-<file id>.flac``, their prompt arrays under ``style.<file id>.`` in ``prompt.npz``, their
name, transcript and language in the row's ``styles``); every such change is a new version, written as a replace
is. Each extra clip and each style carries its own consent record (``consent`` in its entry: who, when, what they
agreed to), as the voice's own; it goes with the style, and with the voice. Entries written before consent was
kept per clip have none. The model work (HuBERT, VQ, ge, phones, BERT) is the caller's: it passes the finished
:class:`~engines.base.VoicePrompt` in.

Steps, and what a crash (the process killed) between any two of them leaves once the next start-up reconciled:

* create: the folder is built in ``root/.tmp-<uuid>/`` (every file and the folder fsynced) -> one transaction:
  the row inserted, the folder renamed into place, commit. Before the commit: nothing (the temporary folder is
  removed; a folder in place without its row goes to trash). After it: the whole voice.
* replace: one transaction: the new folder built under a temporary name, the live one renamed to
  ``root/.old-<id>-<uuid>/``, the new one into place, the row's version raised, commit; then the old folder goes.
  Before the commit the previous version comes back (the folder in place carries the new version, the row the old
  one); after it the new version stays.
* delete: the folder renamed to ``root/.trash-<id>-<uuid>/`` (the voice is gone for every process: the cache, bound
  to the store, refuses and takes back its writes) -> the row deleted -> the voice retired in the cache (its entries
  go) -> the folder removed. A crash before the rename leaves the voice whole; after it, start-up finishes the
  delete (the row, the cache entries, the folder).

Start-up reconciles only what a dead process left: every write holds a shared ``flock`` on the root folder for
its whole sequence, and reconciliation runs only when it gets the exclusive lock at once (another process writing a
voice, the bot beside a CLI command, keeps its folders; the next start sees to what is left). It restores or drops
swapped-out folders, removes temporary and trash folders (a trash folder's voice's cache entries too), deletes a
row whose folder is missing or incomplete (no ``prompt.npz``: a voice without its clip still speaks, and says how to
fix it when it must be re-encoded), and sends a folder without a committed row to trash.

Voices stored before the database (a ``meta.json`` in each folder) are imported at every open: a folder with a
``meta.json`` and no row gets its row (``INSERT OR IGNORE``, committed), then its ``meta.json`` is removed. That is
idempotent, so an interrupted import finishes at the next open, and it needs no exclusive lock.

Several processes (the bot, the CLI, Ray replicas on one machine) may open the same root: SQLite's own locking
orders the writers (``busy_timeout``), and nothing is cached in memory but each voice's prompt arrays, keyed on the
row's version as read by every call, so another process's change is seen at once.

Network filesystems: SQLite advises against them. WAL keeps its index in shared memory, which only the processes of
one machine share, and NFS/SMB locks are often unreliable, so a database there can be corrupted or diverge. Keep
the voice root on a local disk and every process that opens it on that machine; replicas on other machines reach
it through the storage actor of ``ray.storage: served`` (:mod:`synthesis.cluster.storage`), never through an NFS
mount. The store logs a warning at open when the root is on a network filesystem.
"""

from __future__ import annotations

import errno
import fcntl
import io
import json
import logging
import os
import re
import shutil
import sqlite3
import threading
import time
import uuid
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Generator, Mapping, Sequence

import numpy as np
import soundfile as sf  # pyright: ignore[reportMissingTypeStubs]  # untyped; its source gives the types

from engines import SpeechError
from engines.base import SAMPLE_RATE, VoicePrompt
from synthesis.audio import Reference
from synthesis.cache import VoiceCache
from synthesis.types import LANGUAGES, Voice, VoiceNotFound, VoiceStyle

log = logging.getLogger(__name__)

DB_FILE = "voices.sqlite3"  # the voices' metadata, in the voice root
CLIP_FILE = "clip.flac"  # 32 kHz mono reference, 24-bit FLAC
PROMPT_FILE = "prompt.npz"
SPEAKS_WITH = PROMPT_FILE  # without it a voice cannot speak: its row goes (without the clip it still speaks)
META_FILE = "meta.json"  # the metadata of a voice stored before the database (imported at open, then removed)
TMP_PREFIX = ".tmp-"  # a voice being written
OLD_PREFIX = ".old-"  # the previous version during a replace (".old-<id>-<uuid>")
FULL_BELOW_BYTES = 1 << 20  # bytes: below this much free space, SQLite's "disk I/O error" means a full disk
TRASH_PREFIX = ".trash-"  # a voice being deleted (".trash-<id>-<uuid>")
NAME_RE = re.compile(r"[\w -]{1,32}")  # letters, digits, underscore, space, hyphen; 1-32 characters
_ID_RE = re.compile(r"[0-9a-f]{32}")
BUSY_TIMEOUT_MS = 30_000  # how long a write waits for another process's write transaction
REPLACE_WAIT_S = 2.0  # how long a read waits for another process's replace to commit
# voices whose prompt arrays a process keeps in memory (about 0.2 MB each: the prompt's BERT features are 1024 floats
# per phone); the least recently used leaves first and is read from disk again when next asked for
HELD_VOICES = 256
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "9p", "fuse.sshfs", "afs")
EXTRA_FILE = "extra-{}.flac"  # the voice's extra clips (1, 2, ...): their ge is averaged with the main clip's
STYLE_FILE = "style-{}.flac"  # a named style's clip, by the style's file id (8 hex digits)
STYLE_ARRAYS = "style.{}."  # prefix of a named style's prompt arrays in prompt.npz, by its file id
MAX_EXTRA_CLIPS = 8  # extra clips per voice (upstream sets no bound; each costs one ge encode per model change)
MAX_STYLES = 16  # named styles per voice
SCHEMA_VERSION = 2  # PRAGMA user_version of the database (2: the styles column)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS voices (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    name_key TEXT NOT NULL,  -- the name casefolded: names are unique per owner, case-insensitively
    owner_id INTEGER NOT NULL,
    version INTEGER NOT NULL,
    language TEXT NOT NULL,
    prompt_text TEXT NOT NULL,
    enrollment_prompt TEXT,
    model_id TEXT NOT NULL,
    created TEXT NOT NULL,
    updated TEXT NOT NULL,
    consent TEXT NOT NULL,  -- JSON: user_id, text, at (ISO UTC), and the front-end's extras
    reference TEXT NOT NULL,  -- JSON: duration_s, start_s, end_s, clip_s, left_out_s, kept, warnings, extras
    styles TEXT NOT NULL DEFAULT '{}'  -- JSON: name key -> name, file, language, prompt_text, reference
);
CREATE INDEX IF NOT EXISTS voices_owner ON voices (owner_id, name_key);
CREATE INDEX IF NOT EXISTS voices_name ON voices (name_key);
"""
_COLUMNS = ("id", "name", "owner_id", "version", "language", "prompt_text", "enrollment_prompt", "model_id",
            "created", "updated", "consent", "reference", "styles")
_WRITE_COLUMNS = (*_COLUMNS, "name_key")
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM voices"
_INSERT = f"INSERT INTO voices ({', '.join(_WRITE_COLUMNS)}) VALUES ({', '.join('?' * len(_WRITE_COLUMNS))})"
_UPDATE = f"UPDATE voices SET {', '.join(f'{c} = ?' for c in _WRITE_COLUMNS[1:])} WHERE id = ?"


# a new version's change: (row metadata, prompt arrays, clips to write) edited in place -> file names to leave out
_Edit = Callable[[dict[str, Any], dict[str, np.ndarray], dict[str, np.ndarray]], list[str]]


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


class HeldVoices:
    """The voices a process used lately, each with the stamp it was read at (``(version, folder inode)``): at most
    ``limit``, the least recently used dropped first, so a bot that has spoken in thousands of voices holds only the
    ones in use. Thread-safe."""

    def __init__(self, limit: int = HELD_VOICES) -> None:
        self.limit = limit
        self._voices: OrderedDict[str, tuple[tuple[int, int], Voice]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, voice_id: str) -> tuple[tuple[int, int], Voice] | None:
        """The (stamp, voice) held for ``voice_id``, now the most recently used; None when not held."""
        with self._lock:
            held = self._voices.get(voice_id)
            if held is not None:
                self._voices.move_to_end(voice_id)
            return held

    def put(self, stamp: tuple[int, int], voice: Voice) -> Voice:
        with self._lock:
            self._voices[voice.id] = (stamp, voice)
            self._voices.move_to_end(voice.id)
            while len(self._voices) > self.limit:
                self._voices.popitem(last=False)
        return voice

    def drop(self, voice_id: str) -> None:
        with self._lock:
            self._voices.pop(voice_id, None)

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._voices)

    def clear(self) -> None:
        with self._lock:
            self._voices.clear()

    def __len__(self) -> int:
        return len(self._voices)


class VoiceStore:
    """Voices: rows of one SQLite database plus one folder each; see the module docstring for the steps and the
    crash rules.

    Parameters
    ----------
    root: the voices folder (created if missing); the database is ``root/voices.sqlite3``.
    cache: the synthesis cache whose entries are removed when a voice changes or is deleted.
    """

    def __init__(self, root: Path, *, cache: VoiceCache | None = None) -> None:
        self.root = Path(root)
        self.cache = cache
        self.db_path = self.root / DB_FILE
        self._local = threading.local()  # this thread's connection (sqlite3 connections are not shared)
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        self._held = HeldVoices()  # the prompt arrays of the voices used lately
        self._full: str | None = None  # why the database opened read-only (its disk is full), else None
        self.root.mkdir(parents=True, exist_ok=True)
        fs = _network_filesystem(self.root)
        if fs is not None:
            log.warning("the voice folder %s is on a network filesystem (%s): SQLite's database there can break "
                        "when several machines use it; keep voices.dir on a local disk (see synthesis.voices)",
                        self.root, fs)
        try:
            self._upgrade()
        except (VoiceError, sqlite3.Error) as e:
            if not _out_of_space(e, self.root):
                raise
            self._read_only(e)  # reading needs no space: the voices stay usable, writes fail in one line
        if cache is not None:
            cache.bind_voices(self._exists)
        if self._full is None:
            self._recover()
        else:
            log.warning("the voice folder %s has no space left: its voices open read-only, and an interrupted "
                        "write is finished at the next start with space", self.root)

    def _upgrade(self) -> None:
        """Create the tables, or bring an older schema up to this program's."""
        with self._transaction() as db:
            found = int(db.execute("PRAGMA user_version").fetchone()[0])
            if found > SCHEMA_VERSION:
                raise VoiceError(f"the voice database {self.db_path} is at schema version {found}, newer than this "
                                 f"program ({SCHEMA_VERSION}): upgrade voicebot or point voices.dir elsewhere")
            for statement in _SCHEMA.split(";"):  # (executescript would commit the transaction)
                if statement.strip():
                    db.execute(statement)
            if found == 1:  # schema 1 -> 2: voices gain named styles
                db.execute("ALTER TABLE voices ADD COLUMN styles TEXT NOT NULL DEFAULT '{}'")
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _read_only(self, error: BaseException) -> None:
        """Reopen the database read-only (on a full disk SQLite cannot make its WAL index), at this program's
        schema, or fail in one line."""
        self.close()
        self._full = str(error)
        found = int(self._db().execute("PRAGMA user_version").fetchone()[0])
        if found != SCHEMA_VERSION:
            raise VoiceError(f"the voice database {self.db_path} needs an upgrade, and its disk is full "
                             f"({error}): free some space, then start again") from error

    def close(self) -> None:
        """Close this store's database connections (every thread's); a later call opens them again."""
        with self._connections_lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()
        self._local = threading.local()

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
        Extra clips and named styles come later, each a new version (:meth:`add_clips`, :meth:`put_style`).
        """
        check_name(name)
        if voice_id is not None and not _ID_RE.fullmatch(voice_id):
            raise VoiceError(f"a voice id is 32 lowercase hex digits, got {voice_id!r}")
        consent_record = _consent_dict(consent)
        _check_language(language)
        self._check_free(self._db(), name, owner_id, voice_id)  # refused before the files are written
        voice_id = voice_id or uuid.uuid4().hex
        now = _now()
        meta: dict[str, Any] = {
            "id": voice_id, "name": name, "owner_id": int(owner_id), "version": 1, "language": language,
            "prompt_text": prompt_text, "enrollment_prompt": enrollment_prompt, "model_id": model_id,
            "created": now, "updated": now, "consent": consent_record,
            "reference": _reference_dict(reference), "styles": {},
        }
        live = self.root / voice_id
        with self._writing():
            tmp = self._build({CLIP_FILE: reference.wav32k}, _prompt_arrays(prompt), version=1)
            placed = False
            try:
                with self._transaction() as db:
                    self._check_free(db, name, owner_id, voice_id)  # again, under the write lock of every process
                    db.execute(_INSERT, _row_values(meta))
                    os.rename(tmp, live)  # in place, but a voice only once the row commits
                    placed = True
                    _fsync_dir(self.root)
            except BaseException:
                if placed:  # the row did not commit: the folder is not a voice
                    self._discard(live)
                shutil.rmtree(tmp, ignore_errors=True)
                raise
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
        clip_ges: np.ndarray | None = None,
        style_prompts: Mapping[str, VoicePrompt] | None = None,
    ) -> Voice:
        """Store a new version of a voice (new clip and/or transcript, or a re-encode by a new model).

        Fields left as None keep their stored value (``reference=None`` keeps the clip). The version goes up by
        one and every cache entry of the voice is removed. Replaces of one voice by several processes happen one
        after the other (each reads the version the previous one wrote). ``clip_ges``: each clip's ``ge`` again
        (a re-encode of a voice with extra clips); left None with a new clip or model, the stored ones go (the
        voice then fuses as one clip, ``prompt.ge``). ``style_prompts``: the named styles' new encodings, by name.
        """
        if language is not None:
            _check_language(language)
        consent_record = _consent_dict(consent) if consent is not None else None

        def edit(meta: dict[str, Any], arrays: dict[str, np.ndarray], clips: dict[str, np.ndarray]) -> list[str]:
            changed_model = model_id is not None and model_id != meta["model_id"]
            for key, value in (("language", language), ("prompt_text", prompt_text), ("model_id", model_id),
                               ("enrollment_prompt", enrollment_prompt), ("consent", consent_record)):
                if value is not None:
                    meta[key] = value
            if reference is not None:
                meta["reference"] = {**_reference_dict(reference), "extras": meta["reference"].get("extras", [])}
                clips[CLIP_FILE] = reference.wav32k
            _set_prompt(arrays, prompt)
            if clip_ges is not None:
                _check_extras(len(meta["reference"].get("extras", [])), clip_ges)
                arrays["clip_ges"] = np.asarray(clip_ges, np.float32)
            elif reference is not None or changed_model:
                arrays.pop("clip_ges", None)
            for name, style_prompt in (style_prompts or {}).items():
                _set_prompt(arrays, style_prompt, STYLE_ARRAYS.format(_style_of(meta, name)["file"]))
            return []

        return self._swap(voice_id, edit, "replaced")

    def add_clips(self, voice_id: str, references: Sequence[Reference], prompt: VoicePrompt,
                  clip_ges: np.ndarray, *, consent: Consent | Mapping[str, Any]) -> Voice:
        """Store extra clips with a voice (a new version): their ``ge`` is averaged with the voice's clips'.

        Parameters
        ----------
        references: the new clips, prepared like the main one.
        prompt: the voice's prompt with ``ge`` the mean over every clip (its tokens and transcript the main clip's).
        clip_ges: every clip's ``ge`` ``[K, gin, 1]``, main clip first, the stored extras, then the new ones.
        consent: the speaker's consent to these clips (as :meth:`create` takes it), kept with each of them.
        """
        record = _consent_dict(consent)  # refused before anything is written

        def edit(meta: dict[str, Any], arrays: dict[str, np.ndarray], clips: dict[str, np.ndarray]) -> list[str]:
            extras: list[dict[str, Any]] = list(meta["reference"].get("extras", []))
            for ref in references:
                extras.append({**_reference_dict(ref), "consent": record})
                clips[EXTRA_FILE.format(len(extras))] = ref.wav32k
            _check_extras(len(extras), clip_ges)
            meta["reference"] = {**meta["reference"], "extras": extras}
            _set_prompt(arrays, prompt)
            arrays["clip_ges"] = np.asarray(clip_ges, np.float32)
            return []

        return self._swap(voice_id, edit, f"given {len(references)} extra clip(s)")

    def put_style(self, voice_id: str, name: str, reference: Reference, prompt: VoicePrompt, *, language: str,
                  prompt_text: str, consent: Consent | Mapping[str, Any]) -> Voice:
        """Store a named style of a voice (a new version): a reference of its own, chosen per request. A style of
        that name (case-insensitive) is replaced.

        Parameters
        ----------
        name: 1-32 letters, digits, spaces, ``_`` or ``-`` ("calm", "excited").
        reference, prompt: its prepared clip and the model's encoding of it (the voice's model).
        language, prompt_text: its transcript and the transcript's language ("" text: reference-free).
        consent: the speaker's consent to this clip (as :meth:`create` takes it), kept with the style.
        """
        check_name(name, "style name")
        _check_language(language)
        record = _consent_dict(consent)

        def edit(meta: dict[str, Any], arrays: dict[str, np.ndarray], clips: dict[str, np.ndarray]) -> list[str]:
            styles: dict[str, Any] = meta["styles"]
            old = styles.get(name.casefold())
            if old is None and len(styles) >= MAX_STYLES:
                raise VoiceError(f"voice {meta['name']!r} has {MAX_STYLES} styles already, the most it can have; "
                                 "remove one first")
            file_id = uuid.uuid4().hex[:8]
            styles[name.casefold()] = {"name": name, "file": file_id, "language": language,
                                       "prompt_text": prompt_text, "reference": _reference_dict(reference),
                                       "consent": record}
            clips[STYLE_FILE.format(file_id)] = reference.wav32k
            arrays.update(_prompt_arrays(prompt, STYLE_ARRAYS.format(file_id)))
            return [] if old is None else _forget_style(arrays, old["file"])

        return self._swap(voice_id, edit, f"given style {name!r}")

    def remove_style(self, voice_id: str, name: str) -> Voice:
        """Remove a named style of a voice (a new version): its clip, its arrays, its cache entries, its consent
        record (the database is checkpointed, so the record does not linger in its WAL)."""
        def edit(meta: dict[str, Any], arrays: dict[str, np.ndarray], clips: dict[str, np.ndarray]) -> list[str]:
            old = _style_of(meta, name)
            del meta["styles"][name.casefold()]
            return _forget_style(arrays, old["file"])

        voice = self._swap(voice_id, edit, f"without style {name!r}")
        self._checkpoint()
        return voice

    def _swap(self, voice_id: str, edit: _Edit, what: str) -> Voice:
        """A new version of a voice: its folder copied under a temporary name, changed by ``edit`` (the row's
        metadata, the prompt arrays and the clips to write, in place; it returns the files to leave out), swapped in
        and the row updated in one transaction (see the module docstring: replace)."""
        live = self._folder(voice_id)
        old = self.root / f"{OLD_PREFIX}{voice_id}-{uuid.uuid4().hex}"
        tmp: Path | None = None
        with self._writing():
            try:
                with self._transaction() as db:
                    meta = self._meta_in(db, voice_id)
                    meta.update(version=int(meta["version"]) + 1, updated=_now())
                    arrays = _read_arrays(live / PROMPT_FILE)
                    clips: dict[str, np.ndarray] = {}
                    drop = edit(meta, arrays, clips)
                    tmp = self._build(clips, arrays, version=meta["version"], base=live, drop=drop)
                    os.rename(live, old)  # from here until the commit, start-up brings `old` back
                    os.rename(tmp, live)
                    _fsync_dir(self.root)
                    db.execute(_UPDATE, [*_row_values(meta)[1:], voice_id])
            except BaseException:
                if old.exists():  # undo the swap (after a crash, start-up does)
                    if live.exists():
                        self._discard(live)
                    os.rename(old, live)
                if tmp is not None:
                    shutil.rmtree(tmp, ignore_errors=True)
                raise
        shutil.rmtree(old, ignore_errors=True)
        self._held.drop(voice_id)
        removed = self.cache.invalidate_voice(voice_id) if self.cache is not None else 0
        log.info("voice %s %s (version %d, %d cache entries removed)", voice_id, what, meta["version"], removed)
        return self.get(voice_id)

    def delete(self, voice_id: str) -> Removed:
        """Delete a voice: its row, its folder (every file) and every cache entry. Returns what was removed.

        The folder is renamed out of sight first: from then on the voice is gone for every process, and a cache
        bound to this store (in any process) takes back an entry of it written later. Then its row goes, then its
        cache entries, then its bytes. A crash after the rename is finished by start-up; before it, the voice is
        whole. The database is checkpointed, so the row's bytes (consent included) do not linger in its WAL. A folder
        without a row (a create a crash cut short, not yet reconciled) is deleted the same way.
        """
        live = self._folder(voice_id)
        names: list[str] = []
        size, trash = 0, None
        with self._writing():
            # the write transaction: a replace of the voice by another process runs wholly before or after, and no
            # create is between its rename and its commit, so a folder without a row is nobody's voice
            with self._transaction() as db:
                row = db.execute(f"{_SELECT} WHERE id = ?", (voice_id,)).fetchone()
                if row is None and not live.exists():
                    raise VoiceNotFound(f"no voice with id {voice_id!r}; list voices to see the ids")
                meta: dict[str, Any] = _meta_of(row) if row is not None else {"name": "", "owner_id": 0}
                try:
                    names = sorted(p.name for p in live.iterdir())
                    size = sum((live / n).stat().st_size for n in names)
                    trash = self.root / f"{TRASH_PREFIX}{voice_id}-{uuid.uuid4().hex}"
                    os.rename(live, trash)  # invisible at once; the row, the entries and the bytes go next
                    _fsync_dir(self.root)
                except FileNotFoundError:  # a delete a crash interrupted: finish it
                    names, size, trash = [], 0, None
                db.execute("DELETE FROM voices WHERE id = ?", (voice_id,))
            self._checkpoint()
            self._held.drop(voice_id)
            entries = self.cache.retire_voice(voice_id) if self.cache is not None else 0
            if trash is not None and self.cache is None:  # (the entries: by the next store with the cache)
                self._purge_trash(trash, voice_id)
            elif trash is not None:
                shutil.rmtree(trash)
        log.info("voice %s (%r) deleted: %d files, %d bytes, %d cache entries", voice_id, meta["name"], len(names),
                 size, entries)
        return Removed(voice_id, meta["name"], int(meta["owner_id"]), names, size, entries)

    def delete_owner(self, owner_id: int) -> list[Removed]:
        """Delete every voice of an owner (a user leaving / asking for erasure)."""
        return [self.delete(v.id) for v in self.list(owner_id)]

    # --- reading ------------------------------------------------------------------------------------------------

    def get(self, voice_id: str) -> Voice:
        """The voice with this id (prompt arrays read from disk once per version, then kept in memory)."""
        return self._voice(self._meta_in(self._db(), voice_id))

    def stamp(self, voice_id: str) -> tuple[int, int]:
        """What names the voice's current prompt arrays: (row version, folder inode). It changes with every replace,
        and with a delete and a new create under the same id, so a copy of the arrays kept elsewhere (a replica with
        ``ray.storage: served``) is current exactly while its stamp is. VoiceNotFound when there is no such voice."""
        row = self._db().execute("SELECT version FROM voices WHERE id = ?", (self._folder(voice_id).name,)).fetchone()
        try:
            if row is not None:
                return int(row[0]), (self.root / voice_id).stat().st_ino
        except FileNotFoundError:  # being deleted (its folder renamed away first)
            pass
        raise VoiceNotFound(f"no voice with id {voice_id!r}; list voices to see the ids")

    def meta(self, voice_id: str) -> dict[str, Any]:
        """The voice's metadata (id, name, owner_id, version, language, prompt_text, enrollment_prompt, model_id,
        created, updated, consent, reference), as a new dict."""
        return self._meta_in(self._db(), voice_id)

    def load_clip(self, voice_id: str) -> np.ndarray:
        """The stored reference ``[N]`` float32 @ 32 kHz (for re-encoding with a new model)."""
        path = self._folder(voice_id) / CLIP_FILE
        if not path.exists():
            raise VoiceNotFound(f"no voice with id {voice_id!r}; list voices to see the ids")
        return _read_clip(path)

    def load_clips(self, voice_id: str) -> list[np.ndarray]:
        """Every clip of a voice whose ``ge`` it fuses, ``[N]`` float32 @ 32 kHz each: the main one, then the extras
        (for re-encoding with a new model)."""
        extras = self._meta_in(self._db(), voice_id)["reference"].get("extras", [])
        folder = self._folder(voice_id)
        return [self.load_clip(voice_id), *(_read_clip(folder / EXTRA_FILE.format(i + 1)) for i in range(len(extras)))]

    def load_style_clip(self, voice_id: str, name: str) -> np.ndarray:
        """A named style's clip ``[N]`` float32 @ 32 kHz (for re-encoding with a new model)."""
        style = _style_of(self._meta_in(self._db(), voice_id), name)
        return _read_clip(self._folder(voice_id) / STYLE_FILE.format(style["file"]))

    def find(self, name: str, owner_id: int | None = None) -> Voice:
        """The voice with this name (case-insensitive), of this owner when given."""
        where, args = "name_key = ?", [name.casefold()]
        if owner_id is not None:
            where, args = where + " AND owner_id = ?", [*args, int(owner_id)]
        metas = [_meta_of(r) for r in self._db().execute(f"{_SELECT} WHERE {where}", args)]
        if not metas:
            whose = "" if owner_id is None else " of yours"
            raise VoiceNotFound(f"no voice{whose} named {name!r}; list voices to see the names")
        if len(metas) > 1:
            raise VoiceError(f"{len(metas)} voices are named {name!r}; pick one by its owner or id")
        return self._voice(metas[0])

    def lookup(self, key: str) -> Voice:
        """The voice with the id ``key``, else the one named ``key`` (:meth:`find`): a voice as a person names it."""
        try:
            return self.get(key)
        except VoiceNotFound:
            return self.find(key)

    def list(self, owner_id: int | None = None) -> list[Voice]:
        """All voices (of one owner when given), sorted by name: one query, then the prompt arrays from memory
        (read from disk only for a version not seen yet)."""
        where, args = ("", ()) if owner_id is None else (" WHERE owner_id = ?", (int(owner_id),))
        rows = self._db().execute(f"{_SELECT}{where} ORDER BY name_key, id", args).fetchall()
        if owner_id is None:  # forget the arrays of voices deleted elsewhere
            for gone in set(self._held.ids()) - {str(r[0]) for r in rows}:
                self._held.drop(gone)
        voices: list[Voice] = []
        for row in rows:
            try:
                voices.append(self._voice(_meta_of(row), wait=False))
            except VoiceNotFound:  # being deleted or replaced right now: a list never waits
                continue
        return voices

    def present(self, voice_ids: Sequence[str]) -> list[str]:
        """Which of ``voice_ids`` have a row (one query)."""
        ids = [str(v) for v in voice_ids]
        if not ids:
            return []
        marks = ", ".join("?" * len(ids))
        return [str(r[0]) for r in self._db().execute(f"SELECT id FROM voices WHERE id IN ({marks})", ids)]

    def forget_deleted(self) -> int:
        """Drop the prompt arrays held in memory of voices deleted since (by any process); how many went. A
        process that serves many voices calls it now and then, so that a deleted voice's arrays do not stay in its
        memory until somebody asks for that voice again."""
        held = self._held.ids()
        gone: set[str] = set(held) - set(self.present(held)) if held else set()  # (none held: no query)
        for voice_id in gone:
            self._held.drop(voice_id)
        return len(gone)

    # --- internals ----------------------------------------------------------------------------------------------

    def _exists(self, voice_id: str) -> bool:
        """Is this voice's folder in place? (The first step of a delete removes it; ids of another shape are not
        the store's to answer for: True.)"""
        return not _ID_RE.fullmatch(voice_id) or (self.root / voice_id).is_dir()

    def _voice(self, meta: dict[str, Any], *, wait: bool = True) -> Voice:
        """The voice of a row, its prompt arrays from memory when this version's are there. While another process
        replaces it, wait for its commit (``wait=False``: VoiceNotFound at once, as for a voice being deleted)."""
        voice_id, version = str(meta["id"]), int(meta["version"])
        folder = self.root / voice_id
        deadline = time.monotonic() + (REPLACE_WAIT_S if wait else 0.0)
        while True:
            try:
                inode = folder.stat().st_ino
                hit = self._held.get(voice_id)
                if hit is not None and hit[0] == (version, inode):
                    return hit[1]
                arrays = _read_arrays(folder / PROMPT_FILE)
                stamp = int(arrays["version"]) if "version" in arrays else None
                if stamp is None or stamp == version:
                    break
            except FileNotFoundError:  # deleted, or between the two renames of another process's replace
                if not wait or not any(self.root.glob(f"{OLD_PREFIX}{voice_id}-*")):
                    raise VoiceNotFound(f"no voice with id {voice_id!r}; list voices to see the ids") from None
            # another process is replacing the voice (or died doing so, until the next start-up): wait for it
            if not wait:
                raise VoiceNotFound(f"voice {voice_id!r} is being changed right now")
            if time.monotonic() > deadline:
                raise VoiceError(f"voice {meta['name']!r} is being changed right now; try again in a moment")
            time.sleep(0.01)
            meta = self._meta_in(self._db(), voice_id)
            version = int(meta["version"])
        styles = {key: VoiceStyle(str(st["name"]), str(st["language"]), str(st["prompt_text"]),
                                  _prompt_of(arrays, STYLE_ARRAYS.format(st["file"])))
                  for key, st in meta["styles"].items()}
        clip_ges = arrays["clip_ges"].astype(np.float32) if "clip_ges" in arrays else None
        voice = Voice(id=voice_id, name=meta["name"], owner_id=int(meta["owner_id"]), version=version,
                      language=meta["language"], prompt_text=meta["prompt_text"], prompt=_prompt_of(arrays),
                      model_id=meta["model_id"], clip_ges=clip_ges, styles=styles)
        return self._held.put((version, inode), voice)

    def _meta_in(self, db: sqlite3.Connection, voice_id: str) -> dict[str, Any]:
        """A voice's row as a dict (VoiceNotFound when there is none)."""
        if not _ID_RE.fullmatch(voice_id):
            raise VoiceNotFound(f"no voice with id {voice_id!r}; list voices to see the ids")
        row = db.execute(f"{_SELECT} WHERE id = ?", (voice_id,)).fetchone()
        if row is None:
            raise VoiceNotFound(f"no voice with id {voice_id!r}; list voices to see the ids")
        return _meta_of(row)

    def _check_free(self, db: sqlite3.Connection, name: str, owner_id: int, voice_id: str | None) -> None:
        """Refuse a name the owner already uses, or an id in use."""
        taken = db.execute("SELECT 1 FROM voices WHERE owner_id = ? AND name_key = ?",
                           (int(owner_id), name.casefold())).fetchone()
        if taken is not None:
            raise VoiceError(f"you already have a voice named {name!r}; pick another name or replace that voice")
        if voice_id is not None and (db.execute("SELECT 1 FROM voices WHERE id = ?", (voice_id,)).fetchone()
                                     is not None or (self.root / voice_id).exists()):
            raise VoiceError(f"a voice with id {voice_id} exists already")

    def _build(self, clips: Mapping[str, np.ndarray], arrays: Mapping[str, np.ndarray], *, version: int,
               base: Path | None = None, drop: Sequence[str] = ()) -> Path:
        """Write a complete voice folder under a temporary name: the files of ``base`` (hard-linked: a voice's
        files are never written in place) but ``drop``, then ``clips`` (file name -> ``[N]`` float32 @ 32 kHz) and
        the prompt ``arrays`` with ``version``; remove it again if anything fails."""
        tmp = self.root / f"{TMP_PREFIX}{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            for path in sorted(base.iterdir()) if base is not None else []:
                if path.name not in clips and path.name not in drop and path.name != PROMPT_FILE:
                    try:
                        os.link(path, tmp / path.name)
                    except OSError:  # a filesystem without hard links
                        shutil.copy2(path, tmp / path.name)
            for name, clip32k in clips.items():
                _write_clip(tmp / name, clip32k)
            _write_prompt(tmp / PROMPT_FILE, arrays, version)
            _fsync_dir(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return tmp

    def _discard(self, folder: Path, voice_id: str | None = None, *, deleted: bool = False) -> None:
        """Send a folder that is not (or no longer) a voice to trash, its cache entries after it, and remove it
        (``deleted``: a voice that was committed, whose entries a store without the cache leaves marked)."""
        voice_id = voice_id or folder.name
        trash = self.root / f"{TRASH_PREFIX}{voice_id}-{uuid.uuid4().hex}"
        os.rename(folder, trash)
        _fsync_dir(self.root)
        if _ID_RE.fullmatch(voice_id) and (deleted or self.cache is not None):
            self._purge_trash(trash, voice_id)
        else:
            shutil.rmtree(trash, ignore_errors=True)

    def _purge_trash(self, trash: Path, voice_id: str) -> None:
        """Remove a deleted voice's bytes and its cache entries. A store opened without its cache (``voices list``)
        cannot reach the entries: it keeps the trash folder, emptied, as the mark that a store with the cache
        (any other command) removes them at its start-up."""
        if self.cache is not None:
            try:
                self.cache.invalidate_voice(voice_id)
            except (OSError, sqlite3.Error) as e:  # (its disk is full: the mark stays for the next start)
                log.warning("voice %s: its cache entries could not be removed yet (%s)", voice_id, e)
            else:
                shutil.rmtree(trash, ignore_errors=True)
                return
        for path in list(trash.iterdir()) if trash.is_dir() else []:
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)

    def _folder(self, voice_id: str) -> Path:
        """The folder of a voice id (refusing anything that is not an id, so no path can escape the root)."""
        if not _ID_RE.fullmatch(voice_id):
            raise VoiceNotFound(f"no voice with id {voice_id!r}; list voices to see the ids")
        return self.root / voice_id

    def _db(self) -> sqlite3.Connection:
        """This thread's connection to the database (opened on first use; a forked child opens its own)."""
        held: tuple[int, sqlite3.Connection] | None = getattr(self._local, "conn", None)
        if held is not None and held[0] == os.getpid():
            return held[1]
        try:
            conn = self._open_read_only() if self._full is not None else None
        except sqlite3.Error as e:
            raise VoiceError(f"cannot read the voice database {self.db_path} on its full disk: {e}; free some "
                             "space, then try again") from e
        try:
            conn = conn or sqlite3.connect(self.db_path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                                           check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")  # a committed voice survives a power cut, not only a crash
            conn.execute("PRAGMA secure_delete = ON")  # a deleted voice's row is overwritten, not just unlinked
        except sqlite3.Error as e:
            if _out_of_space(e, self.root):
                raise VoiceError(_full_message(self.root, e)) from e
            raise VoiceError(f"cannot open the voice database {self.db_path}: {e}; check the folder's permissions "
                             "and that it is on a local disk") from e
        with self._connections_lock:
            self._connections.append(conn)
        self._local.conn = (os.getpid(), conn)
        return conn

    def _open_read_only(self) -> sqlite3.Connection:
        """A read-only connection: ``mode=ro`` (other processes' writes are seen) where SQLite can map its WAL
        index, else ``immutable`` (nothing can be written on the full disk anyway)."""
        uri = self.db_path.resolve().as_uri()
        for flags in ("mode=ro", "immutable=1"):
            conn = sqlite3.connect(f"{uri}?{flags}", uri=True, isolation_level=None, check_same_thread=False)
            try:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
                return conn
            except sqlite3.Error:
                conn.close()
                if flags == "immutable=1":
                    raise
        raise AssertionError("unreachable")

    @contextmanager
    def _transaction(self) -> Generator[sqlite3.Connection, None, None]:
        """One write transaction (BEGIN IMMEDIATE: the writers of every process take turns), committed at the end,
        rolled back on any exception."""
        if self._full is not None:
            raise VoiceError(_full_message(self.root, self._full))
        db = self._db()
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            raise VoiceError(f"the voice database {self.db_path} stayed busy for {BUSY_TIMEOUT_MS // 1000} s "
                             f"({e}); try again") from e
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def _checkpoint(self) -> None:
        """Empty the WAL into the database (and truncate it): until then a deleted row stays readable there."""
        try:
            self._db().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error:  # another process reads: its next checkpoint copies the pages
            log.warning("voices: WAL checkpoint after a delete did not complete", exc_info=True)

    @contextmanager
    def _writing(self) -> Generator[None, None, None]:
        """Held while this process has a write sequence under way in the root: a shared lock on the root folder,
        released by the kernel when the process dies (so reconciliation can tell a live writer's leftovers from
        a dead one's)."""
        fd = os.open(self.root, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a start-up reconciliation runs
            try:
                yield
            except (OSError, sqlite3.Error) as e:  # (what was written is undone by the step that failed)
                if not _out_of_space(e, self.root):
                    raise
                raise VoiceError(_full_message(self.root, e)) from e
        finally:
            os.close(fd)  # releases the lock

    def _recover(self) -> None:
        """Import voices stored before the database, then (only when no live process is writing: the exclusive
        lock on the root, taken without waiting) finish or undo what a crash interrupted."""
        self._import_meta_files()
        fd = os.open(self.root, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("another process is writing a voice in %s: its folders are left alone", self.root)
                return
            self._recover_locked()
        finally:
            os.close(fd)

    def _recover_locked(self) -> None:
        """The reconciliation itself, under the exclusive lock: folders first, then rows against folders."""
        db = self._db()
        for folder in sorted(self.root.iterdir()):
            if folder.name.startswith(OLD_PREFIX):
                voice_id = folder.name[len(OLD_PREFIX):].split("-", 1)[0]
                if _ID_RE.fullmatch(voice_id) and self._restore_old(db, voice_id, folder):
                    continue
            if folder.name.startswith(TRASH_PREFIX):  # a delete was interrupted: finish it, caches included
                voice_id = _trashed_voice_id(folder)
                if voice_id is not None:
                    self._purge_trash(folder, voice_id)
                    continue
            if folder.name.startswith((TMP_PREFIX, OLD_PREFIX, TRASH_PREFIX)):
                shutil.rmtree(folder, ignore_errors=True)
                log.info("removed leftover %s", folder.name)
        self._import_meta_files()  # a restored folder of the old layout
        rows = {str(r[0]) for r in db.execute("SELECT id FROM voices")}
        for voice_id in sorted(rows):
            folder = self.root / voice_id
            if not (folder / SPEAKS_WITH).is_file():
                log.warning("voice %s: its folder is missing or incomplete; its row goes", voice_id)
                with self._transaction() as tx:
                    tx.execute("DELETE FROM voices WHERE id = ?", (voice_id,))
                if folder.exists():
                    self._discard(folder, deleted=True)
                elif not any(f.name.startswith(f"{TRASH_PREFIX}{voice_id}-") for f in self.root.iterdir()):
                    # (without the cache: an empty trash folder marks its entries for the next store with it)
                    marker = self.root / f"{TRASH_PREFIX}{voice_id}-{uuid.uuid4().hex}"
                    marker.mkdir()
                    self._purge_trash(marker, voice_id)
        for folder in sorted(self.root.iterdir()):
            if (_ID_RE.fullmatch(folder.name) and folder.is_dir() and folder.name not in rows
                    and not (folder / META_FILE).exists()):
                log.warning("voice folder %s has no committed row (a create was interrupted): removed", folder.name)
                self._discard(folder)
        _fsync_dir(self.root)
        self._checkpoint()  # a row deleted here, or by a delete a crash cut short, leaves nothing in the WAL

    def _restore_old(self, db: sqlite3.Connection, voice_id: str, old: Path) -> bool:
        """An interrupted replace: bring the previous version back unless the new one committed; True when ``old``
        was put back in place."""
        live = self.root / voice_id
        if not live.exists():  # between the two renames
            os.rename(old, live)
            log.warning("voice %s: restored the previous version after an interrupted replace", voice_id)
            return True
        row = db.execute("SELECT version FROM voices WHERE id = ?", (voice_id,)).fetchone()
        live_stamp = _prompt_stamp(live / PROMPT_FILE)
        if row is not None and live_stamp is not None and live_stamp != int(row[0]):  # the new one never committed
            self._discard(live)
            os.rename(old, live)
            log.warning("voice %s: restored the previous version after an interrupted replace", voice_id)
            return True
        return False

    def _import_meta_files(self) -> int:
        """Give each voice folder of the layout before the database (``meta.json``, no row) its row, then remove
        its ``meta.json``. Idempotent; returns how many rows were added."""
        found: list[tuple[Path, dict[str, Any]]] = []
        for folder in sorted(self.root.iterdir()):
            path = folder / META_FILE
            if not _ID_RE.fullmatch(folder.name) or not path.is_file():
                continue
            try:
                meta = _meta_from_json(json.loads(path.read_text(encoding="utf-8")), folder.name)
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("voice folder %s: its %s cannot be imported (%s); left as it is", folder.name, META_FILE, e)
                continue
            found.append((path, meta))
        if not found:
            return 0
        with self._transaction() as db:
            before = db.total_changes
            for _, meta in found:
                db.execute(_INSERT.replace("INSERT", "INSERT OR IGNORE", 1), _row_values(meta))
            added = db.total_changes - before
        for path, _ in found:  # committed: the files are no longer the truth
            path.unlink(missing_ok=True)
            _fsync_dir(path.parent)
        log.info("imported %d voice(s) stored before the voice database (%d already had their row)", added,
                 len(found) - added)
        return added


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


def check_name(name: str, what: str = "voice name") -> None:
    """Refuse a name (``what``: of a voice, a style) that is not 1-32 letters, digits, ``_``, space or ``-``.

    Raises
    ------
    VoiceError
        The name is not allowed; the message says which characters are.
    """
    if not NAME_RE.fullmatch(name) or name.strip() != name:
        raise VoiceError(
            f"{what} {name!r} is not allowed: use 1-32 letters, digits, spaces, '_' or '-', "
            "not starting or ending with a space"
        )


def _check_language(language: str) -> None:
    """Refuse an unknown language code."""
    if language not in LANGUAGES:
        raise VoiceError(f"language must be one of {', '.join(LANGUAGES)}, got {language!r}")


def _row_values(meta: Mapping[str, Any]) -> tuple[Any, ...]:
    """A voice's metadata as the values of :data:`_WRITE_COLUMNS` (consent and reference as JSON)."""
    values = {**meta, "consent": json.dumps(meta["consent"], ensure_ascii=False, sort_keys=True),
              "reference": json.dumps(meta["reference"], ensure_ascii=False, sort_keys=True),
              "styles": json.dumps(meta.get("styles") or {}, ensure_ascii=False, sort_keys=True),
              "name_key": str(meta["name"]).casefold(), "owner_id": int(meta["owner_id"]),
              "version": int(meta["version"])}
    return tuple(values[c] for c in _WRITE_COLUMNS)


def _meta_of(row: tuple[Any, ...]) -> dict[str, Any]:
    """A row of :data:`_SELECT` as the metadata dict."""
    meta: dict[str, Any] = dict(zip(_COLUMNS, row))
    meta["consent"] = json.loads(meta["consent"])
    meta["reference"] = json.loads(meta["reference"])
    meta["styles"] = json.loads(meta["styles"] or "{}")
    return meta


def _meta_from_json(raw: Mapping[str, Any], folder_id: str) -> dict[str, Any]:
    """The metadata of a ``meta.json`` written before the database (schema 1), checked enough to be a row."""
    if raw.get("id") != folder_id:
        raise ValueError(f"its id {raw.get('id')!r} is not its folder's name")
    consent: Any = raw["consent"]
    reference: Any = raw.get("reference") or {}
    if not isinstance(consent, dict) or not isinstance(reference, dict):
        raise ValueError("consent and reference must be objects")
    return {"id": folder_id, "name": str(raw["name"]), "owner_id": int(raw["owner_id"]),
            "version": int(raw["version"]), "language": str(raw["language"]), "prompt_text": str(raw["prompt_text"]),
            "enrollment_prompt": raw.get("enrollment_prompt"), "model_id": str(raw["model_id"]),
            "created": str(raw["created"]), "updated": str(raw.get("updated", raw["created"])),
            "consent": consent, "reference": reference, "styles": {}}


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of a voice's prompt file (the main prompt, ``clip_ges``, the styles' prompts, ``version``)."""
    with np.load(path, allow_pickle=False) as z:
        return {key: np.asarray(z[key]) for key in z.files}


def _prompt_of(arrays: Mapping[str, np.ndarray], prefix: str = "") -> VoicePrompt:
    """The prompt stored under ``prefix`` ("": the voice's own; a style's: :data:`STYLE_ARRAYS`)."""
    sv = arrays.get(f"{prefix}sv_emb")
    family = arrays.get(f"{prefix}family")  # absent: a v2-family voice (the SV features tell which)
    ref_mel = arrays.get(f"{prefix}ref_mel")
    return VoicePrompt(
        prompt_tokens=arrays[f"{prefix}prompt_tokens"].astype(np.int64),
        ge=arrays[f"{prefix}ge"].astype(np.float32),
        prompt_phones=arrays[f"{prefix}prompt_phones"].astype(np.int64),
        prompt_bert=arrays[f"{prefix}prompt_bert"].astype(np.float32),
        # v2Pro/v2ProPlus voices only; a v2 voice (or one stored before v2Pro support) has none
        sv_emb=sv.astype(np.float32) if sv is not None else None,
        family=str(family) if family is not None else "v2",
        # v3/v4/v5 voices only: the mel prompt of the diffusion families
        ref_mel=ref_mel.astype(np.float32) if ref_mel is not None else None,
    )


def _prompt_arrays(prompt: VoicePrompt, prefix: str = "") -> dict[str, np.ndarray]:
    """A prompt as the arrays of a prompt file, under ``prefix``; ``sv_emb`` only when the voice has one
    (v2Pro/v2ProPlus), so its absence on load means a v2 voice."""
    arrays = {
        f"{prefix}prompt_tokens": np.asarray(prompt.prompt_tokens, np.int64),
        f"{prefix}ge": np.asarray(prompt.ge, np.float32),
        f"{prefix}prompt_phones": np.asarray(prompt.prompt_phones, np.int64),
        f"{prefix}prompt_bert": np.asarray(prompt.prompt_bert, np.float32),
    }
    if prompt.sv_emb is not None:
        arrays[f"{prefix}sv_emb"] = np.asarray(prompt.sv_emb, np.float32)
    if prompt.family != "v2":
        arrays[f"{prefix}family"] = np.asarray(prompt.family)  # a 0-d string array: no pickle needed to read it
    if prompt.ref_mel is not None:
        arrays[f"{prefix}ref_mel"] = np.asarray(prompt.ref_mel, np.float32)
    return arrays


def _set_prompt(arrays: dict[str, np.ndarray], prompt: VoicePrompt, prefix: str = "") -> None:
    """Put a prompt's arrays in place of those stored under ``prefix`` (a v2 prompt leaves no v2Pro ``sv_emb``)."""
    for key in ("sv_emb", "family", "ref_mel"):  # what one family stores and another does not
        arrays.pop(f"{prefix}{key}", None)
    arrays.update(_prompt_arrays(prompt, prefix))


def _style_of(meta: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A style's record in a voice's row (VoiceNotFound, naming the styles there are, when it has none so named)."""
    style = meta["styles"].get(name.casefold())
    if style is None:
        have = ", ".join(sorted(st["name"] for st in meta["styles"].values())) or "none yet"
        raise VoiceNotFound(f"voice {meta['name']!r} has no style {name!r} (its styles: {have})")
    return style


def _forget_style(arrays: dict[str, np.ndarray], file_id: str) -> list[str]:
    """Drop a style's arrays; the file names to leave out of the new folder."""
    prefix = STYLE_ARRAYS.format(file_id)
    for key in [k for k in arrays if k.startswith(prefix)]:
        del arrays[key]
    return [STYLE_FILE.format(file_id)]


def _check_extras(extras: int, clip_ges: np.ndarray | None) -> None:
    """Refuse more extra clips than :data:`MAX_EXTRA_CLIPS`, or per-clip styles that are not one per clip."""
    if extras > MAX_EXTRA_CLIPS:
        raise VoiceError(f"a voice takes at most {MAX_EXTRA_CLIPS} extra clips, this would make {extras}; "
                         "remove the voice's clips by making it again")
    if (extras or clip_ges is not None) and (clip_ges is None or np.asarray(clip_ges).shape[0] != extras + 1):
        raise VoiceError(f"{extras + 1} clips need {extras + 1} ge rows (main clip first)")


def _read_clip(path: Path) -> np.ndarray:
    """A stored clip, ``[N]`` float32 @ 32 kHz."""
    data, rate = sf.read(str(path), dtype="float32", always_2d=False)
    assert rate == SAMPLE_RATE, f"stored clip at {rate} Hz"
    return np.asarray(data, dtype=np.float32)


def _prompt_stamp(path: Path) -> int | None:
    """The row version a prompt file was written for (None: unreadable, or written before versions were)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return int(z["version"]) if "version" in z.files else None
    except (OSError, ValueError):
        return None


def _network_filesystem(path: Path) -> str | None:
    """The filesystem type when ``path`` is on a network filesystem (from /proc/mounts), else None."""
    try:
        mounts = Path("/proc/mounts").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    target, best, kind = str(path.resolve()), "", None
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        point = parts[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, parts[2]
    return kind if kind is not None and kind.startswith(NETWORK_FS) else None


def check_consent(consent: Consent | Mapping[str, Any]) -> dict[str, Any]:
    """The consent record as the store keeps it (``user_id``, ``text``, ``at`` ISO UTC, then any extras).

    Raises
    ------
    VoiceError
        It does not say who consented and to what; the message says what to give.
    """
    return _consent_dict(consent)


def _consent_dict(consent: Consent | Mapping[str, Any]) -> dict[str, Any]:
    """The consent record as stored with the voice (``user_id``, ``text``, ``at`` ISO UTC, then any extras)."""
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
    """What the voice's row records about the reference clip."""
    return {
        "duration_s": round(float(reference.duration_s), 3),
        "start_s": round(float(reference.start_s), 3),
        "end_s": round(float(reference.end_s), 3),
        "clip_s": round(float(reference.clip_s), 3),  # the upload's length: start_s-end_s of clip_s were kept
        "left_out_s": round(float(reference.left_out_s), 3),  # seconds of its speech outside them
        "kept": reference.kept,  # the line the person was told about what was kept and why ("" when nothing was cut)
        "warnings": list(reference.warnings),
    }


def _now() -> str:
    """Current UTC time, ISO 8601 with milliseconds."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _write_clip(path: Path, clip32k: np.ndarray) -> None:
    """Write the 32 kHz reference as 24-bit FLAC and fsync it."""
    flac = io.BytesIO()  # encoded first: libsndfile writing to a full disk fails with a bare AssertionError
    sf.write(flac, np.clip(np.asarray(clip32k, np.float32), -1.0, 1.0), SAMPLE_RATE, format="FLAC", subtype="PCM_24")
    with open(path, "wb") as f:
        f.write(flac.getbuffer())
        f.flush()
        os.fsync(f.fileno())


def _write_prompt(path: Path, arrays: Mapping[str, np.ndarray], version: int) -> None:
    """Write a voice's prompt arrays (compressed: BERT is all zeros for non-Chinese transcripts) and the version of
    the row they belong to, and fsync."""
    content = {**arrays, "version": np.asarray(version, np.int64)}
    with open(path, "wb") as f:
        # (numpy's stub lets a ** mapping fill allow_pickle too, so pyright checks the arrays against bool)
        np.savez_compressed(f, **content)  # pyright: ignore[reportArgumentType]
        f.flush()
        os.fsync(f.fileno())


def _out_of_space(error: BaseException | str, root: Path) -> bool:
    """Did this error come from a full disk? (ENOSPC; SQLite's "full", or its "disk I/O error" with under a
    megabyte free, which is how it reports a WAL index it could not make.)"""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(error)
    if "database or disk is full" in text:
        return True
    cause = error.__cause__ if isinstance(error, BaseException) else None
    if cause is not None and _out_of_space(cause, root):
        return True
    return "disk I/O error" in text and shutil.disk_usage(root).free < FULL_BELOW_BYTES


def _full_message(root: Path, error: BaseException | str) -> str:
    return (f"the voice folder {root} has no space left ({shutil.disk_usage(root).free // 1024} KB free: {error}); "
            "nothing was changed: free some space, then try again")


def _fsync_dir(path: Path) -> None:
    """fsync a directory so renames inside it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
