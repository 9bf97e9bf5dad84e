"""Synthesis on Ray Serve replicas, and the client that stands in for a local synthesizer in front of them.

Each replica (:mod:`~synthesis.cluster.replica`, one Serve replica = one process) owns one local ``Synthesizer``: its
engine, its device worker with the continuous batching, its own admission limit. A request is one streaming call:
the replica yields a small header (which replica, which process) and then the request's chunks as the local
pipeline yields them, so a sentence's audio reaches the caller while the next one is still being made. The client
(:mod:`~synthesis.cluster.client`) is a :class:`~synthesis.backend.SpeechBackend` like the local synthesizer, so
nothing above it changes.

* Cancellation: closing the stream or cancelling the consuming task cancels the Serve request; the replica's
  generator is cancelled and the local pipeline stops its model work within one GPT step (as it does locally).
* Overload: a replica takes at most ``synthesis.queue_size`` requests at once (Serve's ``max_ongoing_requests``);
  past the replicas' slots a caller waits in Serve's bounded queue of ``ray.max_queued_requests``, and past that
  it gets :class:`~synthesis.types.BusyError` at once, like the local path (the same
  :class:`~synthesis.admission.Admission`).
* Failures: a replica that dies fails only the requests it was serving, with an :class:`~engines.EngineError`
  that says so; Serve starts a replacement and routes the next requests to live replicas.
* Voices and caches (``ray.storage``): with ``shared`` every replica opens the configured voice and cache folders
  itself, so every node must run on the machine that holds them (SQLite in WAL mode); a voice made through one
  replica is read by all, and a delete (folder renamed first, then its cache entries removed, see
  :mod:`synthesis.voices`) reaches every replica: their caches are the same files, and a write racing the delete is
  taken back by the writer. With ``served`` one storage actor on the client's machine opens them, and the replicas,
  on any machine, call it (:mod:`~synthesis.cluster.storage`): the same steps, run in one process of that machine.
* Health and queue depth: every replica reports its state each ``REPORT_S`` (``shared``: it writes
  ``<cache dir>/replicas/<replica>.json`` itself; ``served``: the storage actor writes it); the client's
  ``replicas()`` reads them, and Serve's health check restarts a replica whose device worker died.

The modules, none importing another in a circle: ``options`` (config ``ray:``, no Ray, no pipeline: the config loads
it), ``stores`` (what replicas and the storage actor share), ``storage`` (the actor of ``ray.storage: served`` and
the replicas' stand-ins for it), ``replica``, ``client``. Ray is imported only in the last three, and only when a
cluster is used: ``pip install 'voicebot[cluster]'``. The ``synthesis`` face exports ``connect_cluster``; callers
import ``RemoteSynthesizer`` and ``ClusterOptions`` from their modules. This face exports nothing itself, so that
importing the options loads nothing else.
"""

from __future__ import annotations

__all__: list[str] = []
