"""The caches as the pipeline's stages see them (:class:`SpeechCache`): lookups awaited, writes queued.

The stages look a sentence up and store it on the event loop that also hands every listener its chunks, while the
storage under them (:class:`~synthesis.cache.SynthesisCache`: SQLite and files; on a Ray replica, a call to the
storage actor) blocks. So nothing of it runs on the loop:

* :class:`CacheLane`, over this process's storage: every lookup and write on one thread of its own
  (``voicebot-cache``), as the bot's database runs on its own. A lookup is awaited; a write is queued and not
  awaited, and the one thread keeps the writes and the lookups after them in order, so a lookup through the lane
  sees every write queued before it. :meth:`CacheLane.drain` and :meth:`CacheLane.close` wait for the queued writes.
* :class:`~synthesis.cluster.storage.ServedCache`, on a Ray replica: the storage actor's answers awaited, its writes
  sent without waiting.

The cache keys are pure functions (``SynthesisCache.prosody_key``, ``SynthesisCache.audio_key``), the same for every
implementation. The voice store keeps calling the storage itself, synchronously, from its own thread
(:class:`~synthesis.cache.VoiceCache`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Mapping, Protocol, TypeVar

import numpy as np

from synthesis.cache import SynthesisCache

log = logging.getLogger(__name__)

T = TypeVar("T")
MAX_QUEUED_WRITES = 64  # writes queued at once; past that one is skipped (an entry is an optimisation, memory is not)


class SpeechCache(Protocol):
    """What the stages ask of the prosody and audio caches, from the event loop.

    Lookups are awaited and never block the loop; writes are queued (a ``put_*`` returns once its write is queued,
    not written) and never raise: a write that fails is counted in :attr:`write_failures`, and speech goes on.
    """

    @property
    def write_failures(self) -> int:
        """Writes that were not stored (a full disk, a backlog): the speech went out all the same."""
        ...

    def cacheable(self, sampling: Mapping[str, Any]) -> bool:
        """May results for these sampling options be stored and served (``SynthesisCache.cacheable``)?"""
        ...

    async def get_tokens(self, key: str) -> np.ndarray | None:
        """Cached semantic tokens ``[Ts]`` int64 for a prosody key, or None."""
        ...

    async def put_tokens(self, key: str, tokens: np.ndarray, voice_id: str) -> None:
        """Queue a write of semantic tokens ``[Ts]`` under a prosody key, tagged with their voice."""
        ...

    async def get_audio(self, key: str) -> np.ndarray | None:
        """Cached waveform ``[N]`` float32 for an audio key, or None."""
        ...

    async def put_audio(self, key: str, audio: np.ndarray, voice_id: str) -> None:
        """Queue a write of a waveform ``[N]`` float32 under an audio key, tagged with its voice."""
        ...

    async def stats(self) -> dict[str, dict[str, int]]:
        """Per cache: ``hits``, ``misses``, ``entries``, ``bytes``, ``limit`` (``SynthesisCache.stats``)."""
        ...

    async def drain(self) -> None:
        """Wait until every write queued so far is done (stored, refused or counted as failed)."""
        ...

    async def close(self) -> None:
        """Finish the queued writes, then let go of the storage."""
        ...


class CacheLane:
    """A :class:`SpeechCache` over this process's :class:`~synthesis.cache.SynthesisCache`, whose every call runs
    on one dedicated thread.

    The arrays handed to ``put_*`` are read when the write runs: the caller does not change them afterwards.

    Parameters
    ----------
    store: the storage. The voice store may call it from its own thread meanwhile (it is thread-safe); the lane
        closes it (:meth:`close`).
    """

    def __init__(self, store: SynthesisCache) -> None:
        self.store = store
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="voicebot-cache")
        self._lock = threading.Lock()  # the counters below: changed on the event loop and on the lane's thread
        self._queued = 0  # writes queued, not yet done
        self._lost = 0  # writes skipped (backlog) or failed where the storage did not count them
        self._failing = False  # the last write was lost (logged once until one succeeds)
        self._closed = False

    @property
    def write_failures(self) -> int:
        return self.store.write_failures + self._lost

    def cacheable(self, sampling: Mapping[str, Any]) -> bool:
        return self.store.cacheable(sampling)

    async def get_tokens(self, key: str) -> np.ndarray | None:
        return await self._call(lambda: self.store.get_tokens(key))

    async def put_tokens(self, key: str, tokens: np.ndarray, voice_id: str) -> None:
        self._queue(lambda: self.store.put_tokens(key, tokens, voice_id), voice_id)

    async def get_audio(self, key: str) -> np.ndarray | None:
        return await self._call(lambda: self.store.get_audio(key))

    async def put_audio(self, key: str, audio: np.ndarray, voice_id: str) -> None:
        self._queue(lambda: self.store.put_audio(key, audio, voice_id), voice_id)

    async def stats(self) -> dict[str, dict[str, int]]:
        return await self._call(self.store.stats)  # (after the queued writes: they are counted)

    async def drain(self) -> None:
        await self._call(lambda: None)  # the one thread runs its calls in order: every earlier write is done

    async def close(self) -> None:
        """Finish the queued writes, close the storage (its entries stay on disk) and end the lane's thread."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._call(self.store.close)
        finally:
            self._thread.shutdown(wait=False)  # (idle: nothing is queued after the close)

    async def _call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the lane's thread, after everything queued before it."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn)

    def _queue(self, write: Callable[[], object], voice_id: str) -> None:
        """Queue a write without waiting for it: an entry goes to SQLite and, for audio, to a file (milliseconds, far
        more on a busy or slow disk), while the chunk it came with is due to a listener now."""
        with self._lock:
            full = self._queued >= MAX_QUEUED_WRITES
            why = "the cache is closed" if self._closed else f"{self._queued} writes are queued: the disk is slow"
            if not (full or self._closed):
                self._queued += 1
        if full or self._closed:
            self._lose(voice_id, why, None)
            return
        self._thread.submit(self._write, write, voice_id)

    def _write(self, write: Callable[[], object], voice_id: str) -> None:
        """One queued write, on the lane's thread (what the disk refuses, the storage counts and logs itself)."""
        try:
            write()
        except Exception as e:  # noqa: BLE001 - a cache entry is an optimisation: never fail speech for one
            self._lose(voice_id, str(e), e)
        else:
            with self._lock:
                self._failing = False
        finally:
            with self._lock:
                self._queued -= 1

    def _lose(self, voice_id: str, why: str, error: BaseException | None) -> None:
        """Count a write that was not made; log it in one line when writes start being lost."""
        with self._lock:
            self._lost += 1
            first, self._failing = not self._failing, True
        log.log(logging.WARNING if first else logging.DEBUG, "cache: an entry of voice %s was not stored (%s); speech "
                "goes on without it", voice_id, why, exc_info=error if first and error is not None else None)
