"""The client of the synthesis replicas: :class:`RemoteSynthesizer`, what the bot and the HTTP API get when
``synthesis.backend`` is ``ray``, and :func:`connect_cluster`, which attaches to the Serve application (deploying it
when it does not run). See :mod:`synthesis.cluster` for cancellation, overload, failures, storage and health.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import importlib
import json
import logging
import threading
import time
import warnings
from pathlib import Path
from typing import Any, AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence

import numpy as np

from engines import EngineError, SpeechError
from engines.base import SAMPLE_RATE
from synthesis.admission import Admission, AdmittedStream
from synthesis.cache import SynthesisCache
from synthesis.cluster.options import ClusterOptions
from synthesis.cluster.replica import Build, Served, SynthesisReplica, open_served, open_shared
from synthesis.cluster.stores import Reports, Stores, SynthStores
from synthesis.pipeline import stream_sentences
from synthesis.types import AudioChunk, BusyError, Limits, SynthesisParams, Voice
from synthesis.voices import Removed, VoiceStore
from synthesis.voicing import Progress, VoiceOrder, VoiceTasks, create_voice

log = logging.getLogger(__name__)

DEPLOYMENT = "synthesis"  # the Serve deployment's name inside the application
STALE_S = 5.0  # a state file older than this: the replica is not reporting (dead, or stuck)
FORGET_S = 300.0  # a state file older than this is removed (a replica that died without its goodbye)
DRAIN_POLL_S = 0.5  # a replica being removed checks this often whether its last request has finished
METRICS_PUSH_S = 10.0  # autoscaling: how often a client reports its requests in flight (at most; Serve's default)
LOOKAHEAD = 2  # streamed text: sentences requested ahead of the one being yielded
INSTALL_HINT = "Ray Serve is not installed: pip install 'voicebot[cluster]' (or set synthesis.backend: local)"


# ---- connecting --------------------------------------------------------------------------------------------------


def connect_cluster(build: Build, open_stores: Callable[[], Stores], options: ClusterOptions, *,
                    defaults: SynthesisParams, limits: Limits) -> RemoteSynthesizer:
    """Attach to the Serve application ``options.app_name`` (deploying it with ``build`` when it is not running)
    and return the client. Blocks until the replicas are ready (their models loaded).

    ``open_stores`` opens the voice store and caches of this machine: for this client, for every replica with
    ``ray.storage: shared``, for the storage actor (started here when it does not run) with ``served``.
    """
    try:  # Ray's own type information is partial: used as Any
        ray: Any = importlib.import_module("ray")
        serve: Any = importlib.import_module("ray.serve")
    except ImportError:
        raise SpeechError(INSTALL_HINT) from None
    voices, cache = open_stores()
    report_dir = cache.dir / "replicas"
    if not ray.is_initialized():
        try:
            # a cluster started here runs its replicas at the bot's priority (Ray's default is nice 15: starved by
            # any busy process on the machine)
            local = {"_system_config": {"worker_niceness": 0}} if options.address == "local" else {}
            ray.init(address=options.address, log_to_driver=False, configure_logging=False, **local)
        except ConnectionError as e:
            raise SpeechError(f"cannot reach the Ray cluster at ray.address={options.address!r}: {e}; start it "
                              "(`make cluster`, or `ray start --head` on the head node) or fix the address") from e
    if options.storage == "served":  # before the replicas: they look it up as they start
        from synthesis.cluster.storage import start_storage

        actor = start_storage(open_stores, options.app_name, report_dir)
        storage: Callable[[], tuple[SynthStores, Reports]] = functools.partial(open_served, actor)
    else:
        storage = functools.partial(open_shared, open_stores, str(report_dir))
    status = serve.status().applications.get(options.app_name)
    if status is not None and str(status.status).endswith("RUNNING"):
        handle = serve.get_app_handle(options.app_name)
        log.info("attached to the running synthesis application %r", options.app_name)
    else:
        serve.start(proxy_location="Disabled")
        scale = ({"autoscaling_config": _autoscaling(options)} if options.autoscaling
                 else {"num_replicas": options.num_replicas})
        # metrics_interval_s is deprecated in favour of environment variables that this Serve does not read yet
        warnings.filterwarnings("ignore", message="The `metrics_interval_s` field", category=DeprecationWarning)
        deployment = serve.deployment(
            SynthesisReplica, name=DEPLOYMENT,
            ray_actor_options={"num_cpus": options.cpus_per_replica, "num_gpus": options.gpus_per_replica},
            max_ongoing_requests=limits.queue_size, max_queued_requests=options.max_queued_requests,
            health_check_period_s=5.0, graceful_shutdown_timeout_s=options.drain_timeout_s,
            graceful_shutdown_wait_loop_s=DRAIN_POLL_S, **scale)
        log.info("deploying the synthesis application %r (%s)", options.app_name,
                 scale.get("num_replicas", "autoscaling"))
        handle = _run_bounded(lambda: serve.run(deployment.bind(build, storage), name=options.app_name,
                                                route_prefix=None), options)
    # a blocking call, made on a thread of its own: Serve refuses one from a thread that runs an event loop (`serve`
    # connects from inside its loop)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="voicebot-connect") as pool:
        info = pool.submit(lambda: handle.options(method_name="info").remote().result(
            timeout_s=options.ready_timeout_s)).result()
    return RemoteSynthesizer(handle, info, options, voices=voices, cache=cache, defaults=defaults, limits=limits,
                             report_dir=report_dir)


def _autoscaling(options: ClusterOptions) -> dict[str, Any]:
    """Serve's autoscaling config: follow the requests per replica (running + queued, as every client's handle
    reports them) between min and max replicas."""
    return {"min_replicas": options.min_replicas, "max_replicas": options.max_replicas,
            "initial_replicas": options.min_replicas, "target_ongoing_requests": options.target_queue,
            "upscale_delay_s": options.upscale_delay_s, "downscale_delay_s": options.downscale_delay_s,
            "look_back_period_s": options.scale_window_s,
            # how often the handles report their load: Serve's 10 s default would leave a short window empty
            "metrics_interval_s": min(METRICS_PUSH_S, options.scale_window_s / 4)}


def _run_bounded(run: Callable[[], Any], options: ClusterOptions) -> Any:
    """``serve.run`` returns once every replica has started (its model loaded and warmed up), and waits for ever
    when the cluster cannot place them: wait at most ``ready_timeout_s``."""
    done = threading.Event()
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(run())
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            outcome.append(e)
        done.set()

    threading.Thread(target=target, name="voicebot-serve-run", daemon=True).start()
    if not done.wait(options.ready_timeout_s):
        raise SpeechError(
            f"the {options.num_replicas if not options.autoscaling else options.min_replicas} synthesis replica(s) "
            f"did not start within ray.ready_timeout_s={options.ready_timeout_s:g} s: check `ray status` (each needs "
            f"{options.cpus_per_replica:g} CPU and {options.gpus_per_replica:g} GPU) and the Serve logs")
    if isinstance(outcome[0], BaseException):
        raise SpeechError(f"deploying the synthesis replicas failed: {outcome[0]}") from outcome[0]
    return outcome[0]


def shutdown(app_name: str) -> None:
    """Remove the Serve application (its replicas stop once their requests are done), then its storage actor
    (``ray.storage: served``) if it has one."""
    from ray import serve

    serve.delete(app_name)
    from synthesis.cluster.storage import stop_storage

    stop_storage(app_name)


# ---- the client --------------------------------------------------------------------------------------------------


class RemoteSynthesizer:
    """The bot's and the HTTP API's synthesizer when the replicas run on Ray Serve (see the module docstring).

    Parameters
    ----------
    handle: the Serve application's handle.
    info: what :meth:`SynthesisReplica.info` said (engine, device, precision).
    options: the cluster options.
    voices, cache: the shared voice store and caches, opened here too (listing voices, deleting them).
    defaults, limits: as for the local synthesizer (the replicas have the same).
    report_dir: where the replicas write their state.
    """

    def __init__(self, handle: Any, info: Mapping[str, Any], options: ClusterOptions, *, voices: VoiceStore,
                 cache: SynthesisCache, defaults: SynthesisParams, limits: Limits, report_dir: Path) -> None:
        self._handle = handle
        self._info = dict(info)
        self.options = options
        self.voices = voices
        self.cache = cache
        self.defaults = defaults
        self.limits = limits
        self.report_dir = report_dir
        self.counters: collections.Counter[str] = collections.Counter()
        self.ttfa_s: collections.deque[float] = collections.deque(maxlen=512)
        self.voicing = RemoteVoicing(self)
        self.admission = Admission(lambda: self.capacity, self.counters)

    @property
    def engine_name(self) -> str:
        return str(self._info.get("engine", "?"))

    @property
    def device(self) -> str:
        return str(self._info.get("device", "?"))

    @property
    def precision(self) -> str:
        return str(self._info.get("precision", "?"))

    @property
    def sample_rate(self) -> int:
        """Hz of the replicas' audio (their model's)."""
        return int(self._info.get("sample_rate", SAMPLE_RATE))

    @property
    def capacity(self) -> int:
        """Requests this client may have in flight: every replica's slots plus Serve's queue."""
        return self.options.capacity_replicas * self.limits.queue_size + self.options.max_queued_requests

    @property
    def busy(self) -> bool:
        """True when a new request would be refused at once."""
        return self.admission.busy

    # ---- speech ------------------------------------------------------------------------------------------------

    def stream(self, text: str | AsyncIterator[str], voice: Voice | str, params: SynthesisParams | None = None, *,
               deadline: float | None = None, priority: int = 0) -> RemoteStream:
        """Yield audio sentence by sentence, from a replica (see ``Synthesizer.stream``; ``deadline`` is in
        ``time.monotonic()`` seconds). A string is one request to one replica; streamed text is spoken sentence by
        sentence as it completes, each sentence its own request (:data:`LOOKAHEAD` ahead)."""
        del priority  # every remote request is live
        serving = _Serving()

        def start(release: Callable[[], None]) -> AsyncGenerator[AudioChunk, None]:
            del release  # the place is given back when the stream ends (the remote body has no early exit)
            self.counters["requests"] += 1
            return self._timed(self._one(text, voice, params, deadline, on_served=serving.serve)
                               if isinstance(text, str) else self._pieces(text, voice, params, deadline, serving.serve))

        return RemoteStream(self.admission.stream(
            start, lambda: (f"all synthesis replicas are full ({self.admission.in_flight} requests in flight); "
                            "try again in a moment")), serving)

    async def _timed(self, chunks: AsyncGenerator[AudioChunk, None]) -> AsyncGenerator[AudioChunk, None]:
        started, first = time.perf_counter(), True
        try:
            async for chunk in chunks:
                if first:
                    self.ttfa_s.append(time.perf_counter() - started)
                    first = False
                yield chunk
            self.counters["completed"] += 1
        finally:
            await chunks.aclose()

    async def _one(self, text: str, voice: Voice | str, params: SynthesisParams | None, deadline: float | None,
                   index: int | None = None, *, on_served: Callable[[Served], None] | None = None
                   ) -> AsyncGenerator[AudioChunk, None]:
        """One remote request: its chunks (their sentence index set to ``index`` when given)."""
        remaining = None if deadline is None else deadline - time.monotonic()
        response = self._handle.options(stream=True, method_name="stream").remote(text, voice, params, remaining)
        served: Served | None = None
        finished = False
        try:
            async for item in response:
                if isinstance(item, Served):
                    served = item
                    if on_served is not None:
                        on_served(item)
                    continue
                yield item if index is None else dataclasses.replace(item, index=index)
            finished = True
        except Exception as e:  # noqa: BLE001 - every remote failure becomes a SpeechError with a clear message
            raise self._translate(e, served) from None
        finally:
            if not finished:
                _cancel(response)  # the caller went away (or it failed): stop the replica's work

    async def _pieces(self, pieces: AsyncIterator[str], voice: Voice | str, params: SynthesisParams | None,
                      deadline: float | None, on_served: Callable[[Served], None]
                      ) -> AsyncGenerator[AudioChunk, None]:
        """Streamed text: each complete sentence a request, up to :data:`LOOKAHEAD` ahead, yielded in order."""
        p = params or self.defaults
        ahead: asyncio.Queue[asyncio.Queue[AudioChunk | BaseException | None] | None] = asyncio.Queue(LOOKAHEAD)
        tasks: list[asyncio.Task[None]] = []

        async def fetch(sentence: str, index: int, out: asyncio.Queue[AudioChunk | BaseException | None]) -> None:
            try:
                async for chunk in self._one(sentence, voice, p, deadline, index, on_served=on_served):
                    await out.put(chunk)
                await out.put(None)
            except Exception as e:  # noqa: BLE001 - handed to the consumer
                await out.put(e)

        async def produce() -> None:
            try:
                index = 0
                async for sentence in stream_sentences(pieces, p, self.limits):
                    out: asyncio.Queue[AudioChunk | BaseException | None] = asyncio.Queue()
                    tasks.append(asyncio.create_task(fetch(sentence, index, out)))
                    await ahead.put(out)
                    index += 1
            except Exception as e:  # noqa: BLE001 - the text source failed: the consumer raises it
                failed: asyncio.Queue[AudioChunk | BaseException | None] = asyncio.Queue()
                failed.put_nowait(e)
                await ahead.put(failed)
            await ahead.put(None)

        producer = asyncio.create_task(produce())
        try:
            while (out := await ahead.get()) is not None:
                while (item := await out.get()) is not None:
                    if isinstance(item, BaseException):
                        raise item
                    yield item
        finally:
            for task in (producer, *tasks):
                task.cancel()
            await asyncio.gather(producer, *tasks, return_exceptions=True)

    async def synthesize(self, text: str, voice: Voice | str,
                         params: SynthesisParams | None = None) -> tuple[np.ndarray, list[AudioChunk]]:
        """The whole text as one waveform ``[N]`` float32 @ 32 kHz, plus the chunks."""
        chunks = [c async for c in self.stream(text, voice, params)]
        audio = np.concatenate([c.audio for c in chunks]) if chunks else np.zeros(0, np.float32)
        return audio, chunks

    def _translate(self, error: BaseException, served: Served | None) -> SpeechError:
        """A remote failure as the error the local path would raise, in one line."""
        from ray import exceptions as rx
        from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError, ReplicaUnavailableError

        where = f"replica {served.replica} (pid {served.pid})" if served is not None else "a synthesis replica"
        if isinstance(error, BackPressureError):
            self.counters["busy"] += 1
            return BusyError("all synthesis replicas are full and their queue too; try again in a moment")
        cause = getattr(error, "cause", None)
        if isinstance(error, rx.RayTaskError) and isinstance(cause, SpeechError):
            if isinstance(cause, BusyError):
                self.counters["busy"] += 1
            return cause
        if isinstance(error, SpeechError):
            return error
        if isinstance(error, DeploymentUnavailableError):
            return EngineError(f"the synthesis replicas are not running ({error}); see `ray status` and the "
                               "Serve logs, or restart the bot to deploy them again")
        if isinstance(error, (rx.RayActorError, rx.NodeDiedError, rx.WorkerCrashedError, ReplicaUnavailableError)):
            self.counters["replica_failed"] += 1
            return EngineError(f"{where} stopped while serving this request ({type(error).__name__}); "
                               "the request is lost, a retry goes to a live replica")
        self.counters["remote_error"] += 1
        first_line = str(cause if cause is not None else error).strip().splitlines()
        return EngineError(f"{where} failed: {first_line[-1] if first_line else type(error).__name__}")

    async def call(self, method: str, *args: Any) -> Any:
        """One plain (non-streaming) call on some replica, its failure translated."""
        try:
            return await self._handle.options(method_name=method).remote(*args)
        except Exception as e:  # noqa: BLE001
            raise self._translate(e, None) from None

    # ---- state -------------------------------------------------------------------------------------------------

    def replicas(self) -> list[dict[str, Any]]:
        """Each replica's last reported state (``healthy`` is False once its report is older than
        :data:`STALE_S`): replica, pid, healthy, queue_depth, inflight, requests, busy, queue_size, engine, device."""
        states: list[dict[str, Any]] = []
        now = time.time()
        for path in sorted(self.report_dir.glob("*.json")):
            try:
                state = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if now - float(state.get("at", 0)) > FORGET_S:
                path.unlink(missing_ok=True)
                continue
            state["healthy"] = bool(state.get("healthy")) and now - float(state.get("at", 0)) <= STALE_S
            states.append(state)
        return states

    def metrics(self) -> dict[str, object]:
        """This client's counters and the replicas' summed load, for ``/metrics`` and ``/health``."""
        live = [s for s in self.replicas() if s["healthy"]]
        c = self.counters
        return {
            "queue_depth": sum(int(s["queue_depth"]) for s in live), "inflight": self.admission.in_flight,
            "requests": c["requests"], "busy": c["busy"], "completed": c["completed"],
            "replica_failures": c["replica_failed"], "remote_errors": c["remote_error"],
            "replicas": len(live), "ttfa_s": list(self.ttfa_s),
            "engine": self.engine_name, "device": self.device, "precision": self.precision,
        }

    # ---- lifecycle ---------------------------------------------------------------------------------------------

    async def warm_up(self) -> None:
        """Nothing to do: every replica warms its engine up before it takes requests."""

    async def close(self) -> None:
        """Stop this client's background work; the replicas keep running for the other clients."""
        await self.voicing.stop_precompute()
        # the handle's router reports this client's load to the autoscaler in the background until it is shut down
        await self._handle.shutdown_async()
        await asyncio.to_thread(self.cache.close)  # (SQLite: off the event loop)
        self.voices.close()


class RemoteVoicing:
    """``Synthesizer.voicing`` for the remote synthesizer: the model work on a replica, the files shared."""

    def __init__(self, synth: RemoteSynthesizer) -> None:
        self.synth = synth
        self.last_replica = ""  # the replica that encoded the last voice created here (tests, logs)
        self._precomputing = VoiceTasks()

    create = create_voice  # the argument handling, one body with the local ``Voicing.create``

    async def make(self, order: VoiceOrder, data: bytes, filename: str,
                   progress: Progress) -> tuple[Voice, list[str]]:
        """Encode and store a checked order on a replica (stored in the shared voice folder)."""
        progress("encoding", 0.0)
        voice, warnings, replica = await self.synth.call("create_voice", order, data, filename)
        self.last_replica = replica
        progress("done", 1.0)
        return voice, list(warnings)

    def precompute(self, voice: Voice, phrases: Sequence[str], progress: Progress | None = None,
                   params: SynthesisParams | None = None) -> asyncio.Task[int]:
        """Compute the prosody of ``phrases`` on a replica; cancelling the task cancels the replica's work."""

        async def run() -> int:
            done = await self.synth.call("precompute", voice.id, list(phrases), params)
            if progress is not None:
                progress("done", 1.0)
            return int(done)

        return self._precomputing.start(voice.id, run())

    async def stop_precompute(self, voice_id: str | None = None) -> None:
        await self._precomputing.stop(voice_id)

    async def add_clips(self, voice: Voice, uploads: Sequence[tuple[bytes, str]], *,
                        consent: Mapping[str, Any]) -> tuple[Voice, list[str]]:
        """As ``Voicing.add_clips``, on a replica."""
        return await self.synth.call("change_voice", "add_clips", voice.id, (list(uploads),),
                                     {"consent": dict(consent)})

    async def add_style(self, voice: Voice, style: str, data: bytes, filename: str, *, consent: Mapping[str, Any],
                        transcript: str = "", language: str = "auto") -> tuple[Voice, list[str]]:
        """As ``Voicing.add_style``, on a replica."""
        return await self.synth.call("change_voice", "add_style", voice.id, (style, data, filename),
                                     {"consent": dict(consent), "transcript": transcript, "language": language})

    async def remove_style(self, voice: Voice, style: str) -> Voice:
        """As ``Voicing.remove_style``, on a replica."""
        return (await self.synth.call("change_voice", "remove_style", voice.id, (style,), {}))[0]

    async def delete(self, voice_id: str) -> Removed:
        """Remove the voice and every derived byte from the shared folders (every replica reads the same ones)."""
        await self.stop_precompute(voice_id)
        return await asyncio.to_thread(self.synth.voices.delete, voice_id)


# ---- helpers -----------------------------------------------------------------------------------------------------


class _Serving:
    """The replica serving a request, once known (for streamed text: the one serving its latest sentence)."""

    def __init__(self) -> None:
        self.served: Served | None = None

    def serve(self, served: Served) -> None:
        self.served = served


class RemoteStream:
    """A remote request's chunks (an admitted stream) and the replica serving it (:attr:`served`, once known)."""

    def __init__(self, chunks: AdmittedStream, serving: _Serving) -> None:
        self._chunks = chunks
        self._serving = serving

    @property
    def served(self) -> Served | None:
        return self._serving.served

    def __aiter__(self) -> RemoteStream:
        return self

    async def __anext__(self) -> AudioChunk:
        return await anext(self._chunks)

    async def aclose(self) -> None:
        await self._chunks.aclose()


def _cancel(response: Any) -> None:
    """Cancel a Serve request. One that never reached a replica (refused by Serve's queue bound, or the deployment
    gone) re-raises its failure from ``cancel``: that failure is already the caller's, so it is not raised again."""
    try:
        response.cancel()
    except Exception:  # noqa: BLE001 - see above
        log.debug("cancelling a request that never reached a replica", exc_info=True)
