"""The prosody cache (text -> the GPT's semantic tokens) and the audio cache (exact repeats), on disk.

Both are :mod:`diskcache` stores bounded in bytes with least-recently-used eviction, so they survive restarts and
stay within their budget. Every entry is tagged with its voice id, so a voice change or deletion removes all of its
entries at once (:meth:`SynthesisCache.invalidate_voice`); SQLite's ``secure_delete`` overwrites the removed rows.
A deleted voice is *retired* (:meth:`SynthesisCache.retire_voice`): its entries go and later writes for it are
refused, so a request that was in flight when its voice was deleted cannot write its results back. Across processes
(``python -m bot voices delete`` beside a running bot) the voice store's folder is the shared mark: a cache bound
to a voice store (:meth:`SynthesisCache.bind_voices`) stores an entry and then checks that its voice's folder still
exists, taking the entry back out if not, while a delete makes the folder disappear (a rename) before it removes
the entries. So whichever comes first, no entry of a deleted voice survives, and nothing is left to mark it.

Policy for random sampling (``seed == -1``)
-------------------------------------------
A seeded request (``seed >= 0``) is deterministic, and its key includes the seed, so a hit returns exactly what
the model would compute. A request with ``seed == -1`` asks for *a* random sample and does not say which one: the
cache keeps **one sample per key on purpose** and serves it again. This is what makes the configured common phrases
instant (they are precomputed once per voice with the default, random seed), and a repeated phrase sounds the
same, which users expect of an exact repeat. Such an entry is still just one draw; it is never presented as the
result of a particular seed, because the key of a seeded request differs. Callers that want a fresh draw every
time construct the cache with ``reuse_random=False``: :meth:`SynthesisCache.cacheable` then refuses random-seed
requests unless sampling is greedy (``top_k == 1``), and ``get``/``put`` on such keys are skipped by the pipeline.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sqlite3
import threading
import unicodedata
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, cast

import diskcache  # pyright: ignore[reportMissingTypeStubs]  # untyped: _Store below types what is used
import numpy as np

log = logging.getLogger(__name__)

KEY_SCHEMA = 2  # bump when the key layout or value encoding changes (old entries then age out)
TOKEN_DTYPE = np.dtype("<i2")  # semantic tokens are 0..1024, stored as int16 (2 bytes per 40 ms)
AUDIO_DTYPE = np.dtype("<f4")  # audio is stored exactly, float32
OVERSHOOT = 1.1  # the bound may be exceeded by this factor before a batch cull (one entry per store otherwise)
_WS = re.compile(r"\s+")


class _Store(Protocol):
    """The part of ``diskcache.Cache`` this module uses (diskcache ships no type information)."""

    size_limit: int  # a setting, read through the cache's attribute lookup
    _sql: Callable[[str], object]  # runs one SQL statement on the cache's connection

    def get(self, key: str, default: None = None, *, retry: bool = False) -> object: ...
    def set(self, key: str, value: bytes, *, tag: str, retry: bool = False) -> bool: ...
    def delete(self, key: str, *, retry: bool = False) -> bool: ...
    def evict(self, tag: str, *, retry: bool = False) -> int: ...
    def cull(self, *, retry: bool = False) -> int: ...
    def volume(self) -> int: ...
    def close(self) -> None: ...
    def __len__(self) -> int: ...


class VoiceCache(Protocol):
    """What the voice store asks of the caches, synchronously from its own thread: a changed voice's entries removed,
    a deleted voice's writes refused (:class:`SynthesisCache`, or a Ray replica's stand-in for the storage actor's).
    The pipeline's stages use :class:`~synthesis.cache_lane.SpeechCache` instead."""

    def invalidate_voice(self, voice_id: str) -> int: ...
    def retire_voice(self, voice_id: str) -> int: ...
    def bind_voices(self, voice_exists: Callable[[str], bool]) -> None: ...
    def is_retired(self, voice_id: str) -> bool: ...


class SynthesisCache:
    """Two bounded, persistent caches: prosody (semantic tokens) and audio (waveforms).

    Thread- and process-safe (diskcache uses SQLite transactions). Its calls block (SQLite, files): the voice store
    makes them from its own thread, the pipeline through a :class:`~synthesis.cache_lane.CacheLane`.

    Parameters
    ----------
    dir: folder holding ``prosody/`` and ``audio/`` (created if missing).
    prosody_bytes: size bound of the prosody cache, bytes.
    audio_bytes: size bound of the audio cache, bytes.
    reuse_random: serve one stored sample for random-seed requests (see the module docstring).
    """

    def __init__(self, dir: Path, prosody_bytes: int, audio_bytes: int, *, reuse_random: bool = True) -> None:
        if prosody_bytes <= 0 or audio_bytes <= 0:
            raise ValueError(f"cache sizes must be positive, got prosody={prosody_bytes} audio={audio_bytes}")
        self.dir = Path(dir)
        self.reuse_random = reuse_random
        try:
            self._prosody = _open(self.dir / "prosody", prosody_bytes)
            self._audio = _open(self.dir / "audio", audio_bytes)
            self.unavailable: str | None = None
        except (OSError, sqlite3.Error) as e:  # (a full disk: SQLite cannot make its WAL index)
            log.warning("cache: %s cannot be opened (%s); speaking without a cache until restarted with space",
                        self.dir, e)
            self.unavailable = str(e)
            self._prosody = self._audio = cast(_Store, _Unavailable(self.unavailable))
        self._counts = {"prosody": [0, 0], "audio": [0, 0]}  # [hits, misses] since this process opened the cache
        self._retired: set[str] = set()  # deleted voices seen by this process: their writes are refused
        self._voice_exists: Callable[[str], bool] | None = None  # the voice store's folders (bind_voices)
        self._write_lock = threading.Lock()  # a write and a retirement never interleave
        self.write_failures = 0  # writes the disk refused (full, read-only): the speech went out all the same
        self._failing = False  # the last write failed (logged once until one succeeds)

    # --- keys ---------------------------------------------------------------------------------------------------

    @staticmethod
    def prosody_key(
        model_id: str, voice_id: str, voice_version: int, text: str, language: str, sampling: Mapping[str, Any],
        *, reading: str = "", style: str = "", family: str = "",
    ) -> str:
        """The prosody cache key: a SHA-256 hex digest over everything that changes the GPT's output.

        Parameters
        ----------
        model_id: identity of the loaded weights (``Engine.model_id``).
        voice_id, voice_version: the voice and its version (a changed voice never hits old entries).
        text: the sentence (whitespace-collapsed and NFC-normalised here).
        language: the sentence's language code.
        sampling: every sampling parameter, seed included (e.g. ``dataclasses.asdict(SamplingParams)``).
        reading: what the front-end gave the GPT for the sentence (``Phonemes.reading_key``: phones, languages,
            BERT layout), so that another reading of the same text (a front-end change, a pronunciation-dictionary
            entry, G2PW installed) never hits tokens made for the old one.
        style: the voice's named style the GPT was prompted with ("" = its main clip): a style is its own prompt.
        family: the SoVITS family the voice's prompt was made for (``Engine.family``).
        """
        payload = {
            "schema": KEY_SCHEMA,
            "model": model_id,
            "voice": voice_id,
            "version": int(voice_version),
            "text": normalise_text(text),
            "language": language,
            "sampling": {str(k): sampling[k] for k in sorted(sampling)},
        }
        if reading:
            payload["reading"] = reading
        if style:  # (absent for the main clip, so the keys made before styles existed still hit)
            payload["style"] = style
        if family not in ("", "v2", "v2Pro", "v2ProPlus"):  # (absent for these, whose keys predate the field)
            payload["family"] = family
        return _digest(payload)

    @staticmethod
    def audio_key(prosody_key: str, speed: float, noise_scale: float, seed: int | str, *, timbre: str = "",
                  family: str = "", steps: int | None = None, cfg: float | None = None) -> str:
        """The audio cache key: the prosody key plus the SoVITS decode options.

        ``seed`` is the request's seed; -1 (or a marker such as ``"any"``) for a random-seed request. ``timbre``:
        the clips whose ``ge`` was averaged for the decode when other voices' were (``synthesis.styles``), else "".
        ``family``, ``steps``, ``cfg``: a diffusion family's sampler (None: its defaults); "" for the v2 families.
        """
        seed_value: int | str = seed if isinstance(seed, str) else int(seed)
        payload: dict[str, Any] = {"schema": KEY_SCHEMA, "prosody": prosody_key, "speed": float(speed),
                                   "noise_scale": float(noise_scale), "seed": seed_value}
        if timbre:  # (absent for a voice's own clips, so the keys made before aux references existed still hit)
            payload["timbre"] = timbre
        if family:  # (absent for the v2 families, whose decode has no sampler)
            payload["sampler"] = {"family": family, "steps": steps, "cfg": None if cfg is None else float(cfg)}
        return _digest(payload)

    def cacheable(self, sampling: Mapping[str, Any]) -> bool:
        """Whether results for these sampling options may be stored and served (the random-seed policy)."""
        return may_store(sampling, reuse_random=self.reuse_random)

    # --- prosody ------------------------------------------------------------------------------------------------

    def get_tokens(self, key: str) -> np.ndarray | None:
        """Cached semantic tokens ``[Ts]`` int64 for a prosody key, or None."""
        raw = self._get(self._prosody, "prosody", key, TOKEN_DTYPE)
        return None if raw is None else raw.astype(np.int64)

    def put_tokens(self, key: str, tokens: np.ndarray, voice_id: str) -> None:
        """Store semantic tokens ``[Ts]`` (ids 0..1024) under a prosody key, tagged with their voice."""
        t = np.asarray(tokens).reshape(-1)
        if t.size and (t.min() < 0 or t.max() > np.iinfo(TOKEN_DTYPE).max):
            raise ValueError(f"semantic tokens must be in 0..32767, got {t.min()}..{t.max()}")
        self._put(self._prosody, key, t.astype(TOKEN_DTYPE).tobytes(), voice_id)

    # --- audio --------------------------------------------------------------------------------------------------

    def get_audio(self, key: str) -> np.ndarray | None:
        """Cached waveform ``[N]`` float32 for an audio key, or None."""
        raw = self._get(self._audio, "audio", key, AUDIO_DTYPE)
        return None if raw is None else raw.astype(np.float32)

    def put_audio(self, key: str, audio: np.ndarray, voice_id: str) -> None:
        """Store a waveform ``[N]`` float32 under an audio key, tagged with its voice."""
        a = np.asarray(audio, dtype=np.float32).reshape(-1)
        self._put(self._audio, key, a.astype(AUDIO_DTYPE).tobytes(), voice_id)

    # --- maintenance --------------------------------------------------------------------------------------------

    def invalidate_voice(self, voice_id: str) -> int:
        """Remove every entry of a voice from both caches; returns how many entries were removed."""
        with self._write_lock:
            removed = int(self._prosody.evict(voice_id, retry=True)) + int(self._audio.evict(voice_id, retry=True))
        for cache in (self._prosody, self._audio):
            _checkpoint(cache)
        log.info("cache: removed %d entries of voice %s", removed, voice_id)
        return removed

    def retire_voice(self, voice_id: str) -> int:
        """A voice is being deleted: refuse its writes from now on, then remove its entries; returns how many.

        The refusal and the removal happen under the write lock, so no write of this process lands after it;
        another process's writes are taken back by that process (see the module docstring).
        """
        with self._write_lock:
            self._retired.add(voice_id)
        return self.invalidate_voice(voice_id)

    def bind_voices(self, voice_exists: Callable[[str], bool]) -> None:
        """Check every write against the voice store: an entry of a voice with no folder is taken back out."""
        self._voice_exists = voice_exists

    def is_retired(self, voice_id: str) -> bool:
        """Was this voice deleted (by this process, or by any process when the cache is bound to a voice store)?"""
        if voice_id in self._retired:
            return True
        return self._voice_exists is not None and not self._voice_exists(voice_id)

    def stats(self) -> dict[str, dict[str, int]]:
        """Per cache: ``hits``/``misses`` since opened, ``entries``, ``bytes`` on disk, ``limit`` bytes."""
        out: dict[str, dict[str, int]] = {}
        for name, cache in (("prosody", self._prosody), ("audio", self._audio)):
            hits, misses = self._counts[name]
            out[name] = {
                "hits": hits,
                "misses": misses,
                "entries": len(cache),
                "bytes": int(cache.volume()),
                "limit": int(cache.size_limit),
            }
        return out

    def close(self) -> None:
        """Close both stores (their contents stay on disk)."""
        self._prosody.close()
        self._audio.close()

    def __enter__(self) -> SynthesisCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get(self, cache: _Store, name: str, key: str, dtype: np.dtype[Any]) -> np.ndarray | None:
        """Look a key up, count the hit or miss, and drop an entry whose bytes do not decode (a lookup the disk
        refuses, e.g. its access-time update on a full disk, is a miss)."""
        try:
            value = cache.get(key, default=None, retry=True)
        except (OSError, sqlite3.Error) as e:
            if self.unavailable is None:
                log.debug("cache: %s lookup failed (%s); synthesizing instead", name, e)
            value = None
        if not isinstance(value, bytes) or len(value) % dtype.itemsize:
            if value is not None:
                log.warning("cache: dropping unreadable %s entry %s", name, key)
                cache.delete(key, retry=True)
            self._counts[name][1] += 1
            return None
        self._counts[name][0] += 1
        return np.frombuffer(value, dtype=dtype)

    def _put(self, cache: _Store, key: str, value: bytes, voice_id: str) -> bool:
        """Store a value unless its voice is retired; evicts least recently used entries while over the bound. A
        write the disk refuses (full) is logged in one line and counted (``write_failures``), never raised: a
        cache is an optimisation, the speech goes out without it."""
        try:
            stored = self._put_locked(cache, key, value, voice_id)
        except (OSError, sqlite3.Error) as e:
            self.write_failures += 1
            # one line when writes start failing, not one per sentence while the disk stays full
            log.log(logging.DEBUG if self._failing else logging.WARNING,
                    "cache: an entry of voice %s was not stored (%s); speech goes on without it", voice_id, e)
            self._failing = True
            return False
        self._failing = False
        return stored

    def _put_locked(self, cache: _Store, key: str, value: bytes, voice_id: str) -> bool:
        """:meth:`_put` itself: may raise what the disk raises."""
        with self._write_lock:
            if self.is_retired(voice_id):
                log.info("cache: not storing an entry of deleted voice %s", voice_id)
                return False
            cache.set(key, value, tag=voice_id, retry=True)
            if self.is_retired(voice_id):  # deleted meanwhile by another process: its removal may have run first
                cache.delete(key, retry=True)
                log.info("cache: took back an entry of voice %s, deleted while it was written", voice_id)
                return False
        if cache.volume() > cache.size_limit * OVERSHOOT:  # a large value went in: cull in batches until under
            cache.cull(retry=True)
        return True


class _Unavailable:
    """The store of a cache that could not be opened: every lookup misses, every write fails (as on a full disk:
    counted, not raised), every removal raises (the caller cannot know the entries went)."""

    size_limit = 0

    def __init__(self, reason: str) -> None:
        self._reason = reason

    def _fail(self, *args: object, **kwargs: object) -> Any:
        raise sqlite3.OperationalError(f"the cache is not open: {self._reason}")

    get = set = delete = evict = cull = _sql = _fail

    def volume(self) -> int:
        return 0

    def close(self) -> None:
        pass

    def __len__(self) -> int:
        return 0


def may_store(sampling: Mapping[str, Any], *, reuse_random: bool) -> bool:
    """The random-seed policy (see the module docstring): may results for these sampling options be stored and
    served, by a cache that keeps one random sample per key (``reuse_random``) or none?"""
    seed = sampling.get("seed", -1)
    if isinstance(seed, int) and seed >= 0:  # None, -1 or a marker such as "any" mean random
        return True
    return reuse_random or int(sampling.get("top_k", 0)) == 1


def normalise_text(text: str) -> str:
    """The text form used in keys: NFC, whitespace runs collapsed to one space, stripped."""
    return _WS.sub(" ", unicodedata.normalize("NFC", text)).strip()


def _checkpoint(cache: _Store) -> None:
    """Empty the store's SQLite WAL into its database: until then the removed rows stay readable in the WAL."""
    try:
        cache._sql("PRAGMA wal_checkpoint(TRUNCATE)")  # pyright: ignore[reportPrivateUsage]  # no public call for it
    except Exception:  # a reader in another process holds the WAL: the copies go at its next checkpoint
        log.warning("cache: WAL checkpoint after a removal did not complete", exc_info=True)


def _open(path: Path, size_limit: int) -> _Store:
    """A size-bounded LRU diskcache with a tag index and secure deletion."""
    path.mkdir(parents=True, exist_ok=True)
    return cast(_Store, diskcache.Cache(
        str(path),
        size_limit=int(size_limit),
        eviction_policy="least-recently-used",
        cull_limit=1,  # evict one entry per store, strictly in LRU order (diskcache's default culls 10 at once)
        tag_index=True,  # invalidate_voice evicts by tag without a full scan
        sqlite_secure_delete=1,  # deleted rows are overwritten, so a deleted voice leaves no bytes in the db
    ))


def _digest(payload: Mapping[str, Any]) -> str:
    """SHA-256 hex of canonical JSON."""
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()
