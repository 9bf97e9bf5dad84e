"""``ray.storage: served``: the voices and caches of the synthesis replicas, served by one Ray actor on the machine
that holds them, so that replicas on other machines can use them.

The voice database and the caches are SQLite in WAL mode, which works only among the processes of one machine
(its index is shared memory), and SQLite advises against network filesystems. So with ``served`` one process opens
``voices.dir`` and ``cache.dir`` for all replicas: :class:`StorageActor` (no CPU reserved), pinned to the node of the
client that deploys the replicas (the bot / API machine, which must be a Ray node and opens the same folders itself).
A replica's local synthesizer gets :class:`ServedVoices` and :class:`ServedCache`, which stand in for its
:class:`~synthesis.voices.VoiceStore` and its caches (a :class:`~synthesis.cache_lane.SpeechCache` to the stages, a
:class:`~synthesis.cache.VoiceCache` to the voice store) and send every call to the actor:

* Voices: a lookup (every request that names its voice) is one call that returns the voice's stamp
  (:meth:`VoiceStore.stamp`); the prompt arrays travel only when the replica does not hold that stamp's yet, so a
  replaced voice's arrays are replaced, and a deleted voice's are dropped, at its next lookup. Creating, replacing
  and deleting run the store's own steps on the actor (crash rules, cache retirement: as locally).
* Caches: a lookup's answer is awaited (its Ray future, on the replica's event loop, which goes on meanwhile:
  :data:`CALL_TIMEOUT_S` at most); a store is sent without waiting for it, at most :data:`MAX_PENDING_STORES` per
  replica at once (past that a store is skipped: a cache entry is an optimisation, and the actor's backlog stays
  bounded). The actor runs lookups on
  threads of their own (:data:`LOOKUP_THREADS`), so a lookup never waits behind the stores, which run one at a
  time. The actor's cache, bound to its voice store like every cache, refuses and takes back an entry of a deleted
  voice.
* Health: the replicas send their state to the actor, which writes the state files of ``<cache.dir>/replicas/``
  with its own clock, on a thread of their own, where the client reads them (``/healthz``, ``/metrics``).
* Failures: a call to an actor that is gone (the client machine down, its process killed) fails in one line that
  says so and what to do; the actor is looked up again by name first, so a client that started a new one (after a
  reboot of its machine) is found. A replica that cannot reach the actor at start does not start, and says why.

Ray is imported here at the top: only the ``ray`` backend imports this module (the client and the replicas).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import importlib
import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from engines import EngineError, SpeechError
from synthesis.cache import may_store
from synthesis.cluster.stores import FileReports, Stores, SynthStores
from synthesis.types import Voice, VoiceNotFound
from synthesis.voices import DB_FILE, HeldVoices, Removed, VoiceError, VoiceStore

log = logging.getLogger(__name__)
ray: Any = importlib.import_module("ray")  # Ray's own type information is partial: used as Any
rx: Any = importlib.import_module("ray.exceptions")

NAMESPACE = "voicebot"  # the Ray namespace of the storage actors (clients and replicas find them there by name)
CALL_TIMEOUT_S = 10.0  # the longest a replica waits for the actor before the request fails
MAX_PENDING_STORES = 32  # cache stores a replica has sent and the actor not yet done; past that one is skipped
LOOKUP_THREADS = 4  # the actor's threads for voice and cache lookups (stores and voice changes: one thread each)
# the actor's concurrency groups: lookups beside each other, cache stores in order on their own thread, state
# reports on theirs (a replica counts as healthy only while its report is under 5 s old, so none may wait behind a
# slow voice change); the rest (voice changes) on the default thread
GROUPS = {"lookups": LOOKUP_THREADS, "stores": 1, "reports": 1}
_GROUP_OF = {"describe": "lookups", "voice": "lookups", "find": "lookups", "lookup_cache": "lookups",
             "store_cache": "stores", "report": "reports", "remove_report": "reports"}
START_TIMEOUT_S = 120.0  # the longest a client waits for a new actor to open the folders
Stamp = tuple[int, int]  # VoiceStore.stamp: (row version, folder inode)
_VOICE_CALLS = frozenset({"create", "replace", "delete", "delete_owner", "meta", "load_clip", "list", "stamp",
                          "present", "add_clips", "put_style", "remove_style", "load_clips", "load_style_clip"})
_NEW_VERSIONS = frozenset({"create", "replace", "add_clips", "put_style", "remove_style"})  # answer (stamp, voice)
_CACHE_LOOKUPS = frozenset({"get_tokens", "get_audio", "is_retired", "stats"})
_CACHE_STORES = frozenset({"put_tokens", "put_audio"})
_CACHE_CHANGES = frozenset({"invalidate_voice", "retire_voice"})


def actor_name(app_name: str) -> str:
    """The storage actor of the Serve application ``app_name``."""
    return f"{app_name}-storage"


# ---- the actor ---------------------------------------------------------------------------------------------------


class StorageActor:
    """The voice store and caches of ``open_stores()``, opened in this process, and the replicas' state files.

    A threaded actor (:data:`GROUPS`): lookups run beside each other and beside the one running store or change;
    the stores' own locking (SQLite's, the cache's write lock) orders the writes, as among the processes of this
    machine (the client, the CLI).
    """

    def __init__(self, open_stores: Callable[[], Stores], report_dir: str) -> None:
        self.voices, self.cache = open_stores()
        self.reports = FileReports(Path(report_dir))

    def describe(self) -> dict[str, Any]:
        """Where this actor runs and what it holds (the client checks the node, replicas take the settings)."""
        return {"node": ray.get_runtime_context().get_node_id(), "voices_dir": str(self.voices.root),
                "cache_dir": str(self.cache.dir), "reuse_random": self.cache.reuse_random}

    def voice(self, voice_id: str, known: Stamp | None) -> tuple[Stamp, Voice | None]:
        """The voice's stamp, and the voice unless the caller holds that stamp already (``known``)."""
        for _ in range(3):
            stamp = self.voices.stamp(voice_id)
            if stamp == known:
                return stamp, None
            voice = self.voices.get(voice_id)
            if self.voices.stamp(voice_id) == stamp:  # not replaced while its arrays were read
                return stamp, voice
        raise VoiceError(f"voice {voice_id!r} is being changed right now; try again in a moment")

    def find(self, name: str, owner_id: int | None) -> str:
        """The id of the voice with this name (VoiceNotFound, or VoiceError when ambiguous)."""
        return self.voices.find(name, owner_id).id

    def call_voices(self, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """One VoiceStore call; a create or replace answers (stamp, voice)."""
        assert method in _VOICE_CALLS, method
        result = getattr(self.voices, method)(*args, **kwargs)
        return (self.voices.stamp(result.id), result) if method in _NEW_VERSIONS else result

    def lookup_cache(self, method: str, *args: Any) -> Any:
        """One SynthesisCache lookup (get_tokens, get_audio, is_retired, stats)."""
        assert method in _CACHE_LOOKUPS, method
        return getattr(self.cache, method)(*args)

    def store_cache(self, method: str, *args: Any) -> None:
        """One SynthesisCache store (put_tokens, put_audio)."""
        assert method in _CACHE_STORES, method
        getattr(self.cache, method)(*args)

    def change_cache(self, method: str, *args: Any) -> int:
        """invalidate_voice or retire_voice: how many entries went."""
        assert method in _CACHE_CHANGES, method
        return int(getattr(self.cache, method)(*args))

    def report(self, replica: str, state: Mapping[str, Any]) -> None:
        """A replica's state, stamped with this machine's clock (the one the client compares with)."""
        self.reports.write(replica, {**state, "at": time.time()})

    def remove_report(self, replica: str) -> None:
        self.reports.remove(replica)


# ---- the client's side -------------------------------------------------------------------------------------------


def start_storage(open_stores: Callable[[], Stores], app_name: str, report_dir: Path) -> str:
    """Start the storage actor of ``app_name`` on this node (or find the running one) and return its name.

    Raises SpeechError when the running one is on another node: every client of a served application runs on the
    machine that holds its folders.
    """
    here = ray.get_runtime_context().get_node_id()
    name = actor_name(app_name)
    remote_class: Any = ray.remote(concurrency_groups=GROUPS)(StorageActor)
    actor = remote_class.options(
        name=name, namespace=NAMESPACE, get_if_exists=True, lifetime="detached",  # outlives this client
        num_cpus=0, max_restarts=-1,  # a crashed actor comes back, on this node only: the folders are here
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
    ).remote(open_stores, str(report_dir))
    try:
        described: dict[str, Any] = _result(actor.describe.remote(), START_TIMEOUT_S)
    except BaseException as e:
        raise SpeechError(f"the voice and cache storage actor {name!r} (ray.storage: served) did not start on this "
                          f"node: {_first_line(e)}") from None
    if described["node"] != here:
        raise SpeechError(
            f"the voice and cache storage of the application {app_name!r} (ray.storage: served) runs on another "
            f"machine (Ray node {described['node'][:12]}, folders {described['voices_dir']}, "
            f"{described['cache_dir']}): run this client there, or remove the application first (README \"Cluster\")")
    log.info("voice and cache storage %r: %s, %s", name, described["voices_dir"], described["cache_dir"])
    return name


def stop_storage(app_name: str) -> None:
    """End the storage actor of ``app_name``, if it runs (with the application: its replicas are gone)."""
    try:
        actor = ray.get_actor(actor_name(app_name), namespace=NAMESPACE)
    except ValueError:
        return
    ray.kill(actor)


# ---- the replica's side ------------------------------------------------------------------------------------------


def connect(name: str) -> tuple[SynthStores, StorageLink]:
    """In a replica: the stand-ins for its voice store and caches, and where its state reports go."""
    link = StorageLink(name)
    described: dict[str, Any] = link.call("describe")
    cache = ServedCache(link, reuse_random=bool(described["reuse_random"]))
    return (ServedVoices(link, Path(described["voices_dir"]), cache), cache), link


class StorageLink:
    """Calls to the storage actor ``name``: answers or one clear error, never a hang; also the replica's
    :class:`~synthesis.cluster.stores.Reports`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.call_s: collections.deque[float] = collections.deque(maxlen=1024)  # recent round trips
        self.skipped = 0  # cache stores skipped (MAX_PENDING_STORES were under way)
        self._pending = 0  # stores sent, not yet done
        self._sending: set[concurrent.futures.Future[Any]] = set()  # their answers (ServedCache.drain awaits them)
        self._lock = threading.Lock()
        self._actor = self._find()

    def call(self, method: str, *args: Any) -> Any:
        """``method(*args)`` on the actor; its own exceptions (VoiceNotFound ...) are raised as they are."""
        for attempt in range(2):
            actor = self._actor
            started = time.perf_counter()
            try:
                result = _result(_method(actor, method).remote(*args), CALL_TIMEOUT_S)
                self.call_s.append(time.perf_counter() - started)
                return result
            except rx.RayActorError as e:
                if attempt == 0 and self._refind(actor):
                    continue  # a new actor under the name (the client restarted): once more with it
                raise self._gone(type(e).__name__) from None
            except BaseException as e:
                raise self._failure(e) from None
        raise AssertionError("unreachable")

    async def acall(self, method: str, *args: Any) -> Any:
        """:meth:`call` from an event loop: the answer's Ray future is awaited, and the loop goes on meanwhile."""
        for attempt in range(2):
            actor = self._actor
            started = time.perf_counter()
            try:
                answer = asyncio.wrap_future(_method(actor, method).remote(*args).future())
                result = await asyncio.wait_for(answer, CALL_TIMEOUT_S)
                self.call_s.append(time.perf_counter() - started)
                return result
            except rx.RayActorError as e:
                if attempt == 0 and await asyncio.to_thread(self._refind, actor):
                    continue  # a new actor under the name (the client restarted): once more with it
                raise self._gone(type(e).__name__) from None
            except asyncio.CancelledError:
                raise
            except BaseException as e:
                raise self._failure(e) from None
        raise AssertionError("unreachable")

    def send(self, method: str, *args: Any) -> None:
        """``method(*args)`` on the actor without waiting (skipped while :data:`MAX_PENDING_STORES` are under way);
        a failure is logged."""
        with self._lock:
            if self._pending >= MAX_PENDING_STORES:
                self.skipped += 1
                if self.skipped % 100 == 1:
                    log.warning("the voice and cache storage %r is behind: %d cache stores skipped so far",
                                self.name, self.skipped)
                return
            self._pending += 1
        try:
            future: concurrent.futures.Future[Any] = _method(self._actor, method).remote(*args).future()
        except BaseException:
            with self._lock:
                self._pending -= 1
            raise
        with self._lock:
            self._sending.add(future)
        future.add_done_callback(self._sent)

    def sending(self) -> list[concurrent.futures.Future[Any]]:
        """The answers of the stores sent and not yet done."""
        with self._lock:
            return list(self._sending)

    def write(self, replica: str, state: Mapping[str, Any]) -> None:
        self.call("report", replica, dict(state))  # (off the event loop; a call finds a restarted actor)

    def remove(self, replica: str) -> None:
        self.call("remove_report", replica)

    def _find(self) -> Any:
        try:
            return ray.get_actor(self.name, namespace=NAMESPACE)
        except ValueError:
            raise self._gone("no actor of that name runs") from None

    def _refind(self, failed: Any) -> bool:
        """Look the actor up again; True when another one runs under the name now."""
        with self._lock:
            try:
                actor = self._find()
            except EngineError:
                return False
            if actor._actor_id == failed._actor_id:  # pyright: ignore[reportPrivateUsage]
                return False
            self._actor = actor
            return True

    def _failure(self, error: BaseException) -> BaseException:
        """What a failed call raises: the actor's own exception, or one line saying the actor is out of reach."""
        if isinstance(error, rx.RayTaskError):
            cause: object = getattr(error, "cause", None)
            return cause if isinstance(cause, BaseException) else error
        if isinstance(error, TimeoutError):  # (concurrent.futures' and asyncio's are this one)
            return self._gone(f"it did not answer within {CALL_TIMEOUT_S:g} s")
        return error

    def _gone(self, why: str) -> EngineError:
        return EngineError(f"this replica cannot reach the voice and cache storage {self.name!r} (ray.storage: "
                           f"served; {why}): it runs with the bot / API that deployed the replicas, on the machine "
                           "that holds voices.dir and cache.dir; start that again, or check that machine's Ray node")

    def _sent(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._pending -= 1
            self._sending.discard(future)
        error = future.exception()
        if error is not None:
            log.warning("a write to the voice and cache storage %r failed: %s", self.name, _first_line(error))


def _method(actor: Any, name: str) -> Any:
    """The actor's method ``name``, in its concurrency group."""
    group = _GROUP_OF.get(name)
    method = getattr(actor, name)
    return method if group is None else method.options(concurrency_group=group)


def _result(ref: Any, timeout_s: float) -> Any:
    """Wait for one call's result (a future, not ``ray.get``, which Ray warns about inside a replica, a process that
    runs an event loop)."""
    return ref.future().result(timeout=timeout_s)


def _first_line(error: BaseException) -> str:
    cause = getattr(error, "cause", None)
    lines = str(cause if isinstance(cause, BaseException) else error).strip().splitlines()
    return lines[-1] if lines else type(error).__name__


# ---- the stand-ins -----------------------------------------------------------------------------------------------


class ServedCache:
    """A replica's caches: every call goes to the storage actor's (see the module docstring).

    To the stages a :class:`~synthesis.cache_lane.SpeechCache`: a lookup awaits the actor's answer through the link's
    Ray future (:meth:`StorageLink.acall`), so the replica's event loop goes on meanwhile; a write is sent without
    waiting (:meth:`StorageLink.send`). To :class:`ServedVoices` a :class:`~synthesis.cache.VoiceCache`, called
    synchronously from the voice store's thread. The seed policy is computed here with the actor's
    ``reuse_random``; the keys are pure functions (``SynthesisCache.prosody_key``, ``audio_key``).
    """

    def __init__(self, link: StorageLink, *, reuse_random: bool) -> None:
        self.reuse_random = reuse_random
        self._link = link
        self.write_failures = 0  # the actor's cache writes and counts them; the pipeline's metrics read this one

    def cacheable(self, sampling: Mapping[str, Any]) -> bool:
        return may_store(sampling, reuse_random=self.reuse_random)

    async def get_tokens(self, key: str) -> np.ndarray | None:
        tokens: np.ndarray | None = await self._link.acall("lookup_cache", "get_tokens", key)
        return None if tokens is None else np.array(tokens)  # writable, as the local cache's

    async def put_tokens(self, key: str, tokens: np.ndarray, voice_id: str) -> None:
        self._link.send("store_cache", "put_tokens", key, np.asarray(tokens), voice_id)

    async def get_audio(self, key: str) -> np.ndarray | None:
        audio: np.ndarray | None = await self._link.acall("lookup_cache", "get_audio", key)
        return None if audio is None else np.array(audio)  # writable, not the object store's read-only view

    async def put_audio(self, key: str, audio: np.ndarray, voice_id: str) -> None:
        self._link.send("store_cache", "put_audio", key, np.asarray(audio, np.float32), voice_id)

    async def stats(self) -> dict[str, dict[str, int]]:
        """The actor's counts: every replica's hits and misses together."""
        return await self._link.acall("lookup_cache", "stats")

    async def drain(self) -> None:
        """Wait until the stores this replica sent are done (a failed one is logged by the link)."""
        sending = self._link.sending()
        if sending:
            await asyncio.wait([asyncio.wrap_future(f) for f in sending])

    async def close(self) -> None:
        """Wait for the stores sent; the actor holds the files."""
        await self.drain()

    def invalidate_voice(self, voice_id: str) -> int:
        return int(self._link.call("change_cache", "invalidate_voice", voice_id))

    def retire_voice(self, voice_id: str) -> int:
        return int(self._link.call("change_cache", "retire_voice", voice_id))

    def bind_voices(self, voice_exists: Callable[[str], bool]) -> None:
        """Nothing to do: the actor's cache is bound to the actor's voice store."""

    def is_retired(self, voice_id: str) -> bool:
        return bool(self._link.call("lookup_cache", "is_retired", voice_id))


class ServedVoices(VoiceStore):
    """A replica's :class:`VoiceStore`: every call goes to the storage actor's; the prompt arrays of the voices it
    used are kept here per stamp (see the module docstring)."""

    def __init__(self, link: StorageLink, root: Path, cache: ServedCache) -> None:
        # (the base class's __init__ opens the database; here it is the actor's)
        self.root = root
        self.cache = cache
        self.db_path = root / DB_FILE
        self._link = link
        self._held = HeldVoices()

    def close(self) -> None:
        """Forget the arrays held here (the actor holds the database)."""
        self._held.clear()

    def create(self, *args: Any, **kwargs: Any) -> Voice:  # type: ignore[override]  # VoiceStore.create's arguments
        return self._keep(*self._link.call("call_voices", "create", args, kwargs))

    def replace(self, *args: Any, **kwargs: Any) -> Voice:  # type: ignore[override]  # VoiceStore.replace's arguments
        return self._keep(*self._link.call("call_voices", "replace", args, kwargs))

    def add_clips(self, *args: Any, **kwargs: Any) -> Voice:  # type: ignore[override]  # VoiceStore's arguments
        return self._keep(*self._link.call("call_voices", "add_clips", args, kwargs))

    def put_style(self, *args: Any, **kwargs: Any) -> Voice:  # type: ignore[override]  # VoiceStore's arguments
        return self._keep(*self._link.call("call_voices", "put_style", args, kwargs))

    def remove_style(self, *args: Any, **kwargs: Any) -> Voice:  # type: ignore[override]  # VoiceStore's arguments
        return self._keep(*self._link.call("call_voices", "remove_style", args, kwargs))

    def load_clips(self, voice_id: str) -> list[np.ndarray]:
        return [np.array(c) for c in self._link.call("call_voices", "load_clips", (voice_id,), {})]

    def load_style_clip(self, voice_id: str, name: str) -> np.ndarray:
        return np.array(self._link.call("call_voices", "load_style_clip", (voice_id, name), {}))

    def delete(self, voice_id: str) -> Removed:
        try:
            return self._link.call("call_voices", "delete", (voice_id,), {})
        finally:
            self._drop(voice_id)

    def delete_owner(self, owner_id: int) -> list[Removed]:
        removed: list[Removed] = self._link.call("call_voices", "delete_owner", (owner_id,), {})
        for r in removed:
            self._drop(r.voice_id)
        return removed

    def get(self, voice_id: str) -> Voice:
        """The voice, its arrays from here when this replica holds its current stamp (one call either way)."""
        held = self._held.get(voice_id)
        try:
            stamp, voice = self._link.call("voice", voice_id, None if held is None else held[0])
        except VoiceNotFound:
            self._drop(voice_id)
            raise
        if voice is None:
            assert held is not None, "the actor answers without the voice only for the stamp held here"
            return held[1]
        return self._keep(stamp, voice)

    def stamp(self, voice_id: str) -> tuple[int, int]:
        return self._link.call("call_voices", "stamp", (voice_id,), {})

    def meta(self, voice_id: str) -> dict[str, Any]:
        return self._link.call("call_voices", "meta", (voice_id,), {})

    def load_clip(self, voice_id: str) -> np.ndarray:
        return np.array(self._link.call("call_voices", "load_clip", (voice_id,), {}))

    def find(self, name: str, owner_id: int | None = None) -> Voice:
        return self.get(self._link.call("find", name, owner_id))

    def list(self, owner_id: int | None = None) -> list[Voice]:
        """Every voice (of one owner when given), with its arrays: for tools, not the hot path."""
        return self._link.call("call_voices", "list", (owner_id,), {})

    def present(self, voice_ids: Sequence[str]) -> list[str]:
        return self._link.call("call_voices", "present", (list(voice_ids),), {})

    def _keep(self, stamp: Stamp, voice: Voice) -> Voice:
        return self._held.put(stamp, voice)

    def _drop(self, voice_id: str) -> None:
        self._held.drop(voice_id)
