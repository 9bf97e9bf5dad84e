"""A synthesis replica on Ray Serve: one local :class:`~synthesis.pipeline.Synthesizer` in the replica's process.

The replica owns its engine, its device worker with the continuous batching and its own admission limit. A request
is one streaming call: the replica yields a small header (:class:`Served`: which replica, which process), then the
request's :class:`~synthesis.types.AudioChunk` s as the local pipeline yields them. Every :data:`REPORT_S` it reports
its health and load (:class:`~synthesis.cluster.stores.Reports`); Serve's health check restarts a replica whose device
worker died.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from synthesis.cache_lane import CacheLane
from synthesis.cluster.stores import FileReports, Reports, Stores, SynthStores
from synthesis.types import AudioChunk, SynthesisParams, Voice
from synthesis.voicing import VoiceOrder

if TYPE_CHECKING:
    from synthesis.pipeline import Synthesizer

log = logging.getLogger(__name__)

REPORT_S = 1.0  # how often a replica writes its state file
Build = Callable[[SynthStores], "Synthesizer"]  # makes a replica's synthesizer (engine, worker) around its stores
_VOICE_CHANGES = ("add_clips", "add_style", "remove_style")  # what a replica's change_voice runs


def open_shared(open_stores: Callable[[], Stores], report_dir: str) -> tuple[SynthStores, Reports]:
    """``ray.storage: shared``, in a replica: the configured folders, opened by the replica itself (its pipeline's
    cache calls on a thread of their own, :class:`~synthesis.cache_lane.CacheLane`)."""
    voices, cache = open_stores()
    return (voices, CacheLane(cache)), FileReports(Path(report_dir))


def open_served(actor: str) -> tuple[SynthStores, Reports]:
    """``ray.storage: served``, in a replica: stand-ins that call the storage actor ``actor``."""
    from synthesis.cluster import storage

    return storage.connect(actor)


@dataclass(frozen=True)
class Served:
    """The first item of every streamed response: who serves it."""

    replica: str  # Serve's replica id
    pid: int  # the replica's process


class SynthesisReplica:
    """One Serve replica: a local :class:`Synthesizer`, built by ``build`` in the replica's process.

    Parameters
    ----------
    build: makes the synthesizer (engine, worker) around the stores.
    storage: opens the voice store and caches in this process (the folders, or stand-ins for the storage actor's)
        and says where the replica's state goes: :func:`open_shared` or :func:`open_served`, bound to its arguments.
    """

    async def __init__(self, build: Build,  # type: ignore[misc]
                       storage: Callable[[], tuple[SynthStores, Reports]]) -> None:
        from ray import serve

        stores, self._reports = await asyncio.to_thread(storage)
        self.synth = build(stores)
        await self.synth.warm_up()
        # any replica may be asked to make a voice: HuBERT loads now, not in that request
        await asyncio.to_thread(self.synth.engine.load_encoder, "hubert")
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.pid = os.getpid()
        self._reporter = asyncio.create_task(self._report_forever())
        log.info("synthesis replica %s (pid %d) ready: %s", self.replica, self.pid, self.synth.engine_name)

    async def stream(self, text: str, voice: Voice | str, params: SynthesisParams | None,
                     remaining_s: float | None) -> AsyncIterator[Served | AudioChunk]:
        """The request's header, then its chunks; ``remaining_s``: the caller's deadline, as time left."""
        yield Served(self.replica, self.pid)
        deadline = None if remaining_s is None else self.synth.clock() + remaining_s
        chunks = self.synth.stream(text, voice, params, deadline=deadline)
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            await chunks.aclose()

    async def create_voice(self, order: VoiceOrder, data: bytes, filename: str) -> tuple[Voice, list[str], str]:
        """Encode and store a voice (in the shared voice folder): (voice, warnings, this replica)."""
        voice, warnings = await self.synth.voicing.make(order, data, filename)
        return voice, warnings, self.replica

    async def change_voice(self, change: str, voice_id: str, args: tuple[Any, ...],
                           kwargs: dict[str, Any]) -> tuple[Voice, list[str]]:
        """Add clips or a style to a stored voice, or remove a style (``Voicing.add_clips``, ``add_style``,
        ``remove_style``): (the new version, warnings)."""
        if change not in _VOICE_CHANGES:
            raise ValueError(f"unknown voice change {change!r}")
        voice = await asyncio.to_thread(self.synth.voices.get, voice_id)
        done: Voice | tuple[Voice, list[str]] = await getattr(self.synth.voicing, change)(voice, *args, **kwargs)
        return done if isinstance(done, tuple) else (done, [])

    async def precompute(self, voice_id: str, phrases: list[str], params: SynthesisParams | None) -> int:
        """Compute the prosody of ``phrases`` for a stored voice (background priority); returns how many."""
        voice = await asyncio.to_thread(self.synth.voices.get, voice_id)
        return await self.synth.voicing.precompute(voice, phrases, None, params)

    def info(self) -> dict[str, Any]:
        """The engine this replica runs, and the replica."""
        s = self.synth
        return {"engine": s.engine_name, "device": s.device, "precision": s.precision, "replica": self.replica,
                "pid": self.pid, "sample_rate": s.sample_rate}

    def state(self) -> dict[str, Any]:
        """Health and load, as written to the state file."""
        s, m = self.synth, self.synth.metrics()
        return {"replica": self.replica, "pid": self.pid, "healthy": self._healthy(), "at": time.time(),
                "queue_depth": m["queue_depth"], "inflight": m["inflight"], "requests": m["requests"],
                "busy": m["busy"], "queue_size": s.limits.queue_size, "engine": s.engine_name,
                "device": s.device}

    async def __del__(self) -> None:
        """Serve's shutdown of this replica (scale-down, redeploy), after its requests are done: stop reporting, say
        goodbye in the state folder, close the synthesizer. Also called when ``__init__`` failed part way (a model
        missing): only what was made is undone."""
        done: dict[str, Any] = vars(self)
        if "_reporter" in done:
            self._reporter.cancel()
            try:
                await asyncio.to_thread(self._reports.remove, self.replica)
            except Exception:  # noqa: BLE001 - the state goes stale instead, and is forgotten later
                log.warning("replica %s could not remove its state", self.replica, exc_info=True)
        if "synth" in done:
            await self.synth.close()

    def check_health(self) -> None:
        """Serve's health check: a replica whose device worker died is restarted."""
        if not self._healthy():
            raise RuntimeError(f"replica {self.replica}: the device worker's threads have stopped")

    def _healthy(self) -> bool:
        return self.synth.worker.alive

    async def _report_forever(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self._reports.write, self.replica, self.state())
                # a voice deleted through another replica or client: its arrays leave this one's memory too
                await asyncio.to_thread(self.synth.voices.forget_deleted)
            except Exception:  # a full disk (or the storage gone) must not stop the replica; the state goes stale
                log.warning("replica %s could not write its state", self.replica, exc_info=True)
            await asyncio.sleep(REPORT_S)
