"""The cluster tests' Serve applications: their config on the tiny models, the local reference, the teardown."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from tests.cluster.local import LocalCluster

MAX_TEXT_CHARS = 60_000  # the tests' long readings (tens of thousands of characters)


def cluster_config(tiny_models: Path, data: Path, cluster: LocalCluster, **ray: Any):
    """The tiny models' config for the replicas of ``cluster``: engine threads 1 (a replica and a local run compute
    alike), 2 requests per replica (``synthesis.queue_size``), the data folders under ``data``, ``ray`` set."""
    from bot.config import load_config

    cfg = load_config(tiny_models / "config.yaml")
    return dataclasses.replace(
        cfg,
        engine=dataclasses.replace(cfg.engine, threads=1),
        voices=dataclasses.replace(cfg.voices, dir=data / "voices"),
        cache=dataclasses.replace(cfg.cache, dir=data / "cache"),
        synthesis=dataclasses.replace(cfg.synthesis, backend="ray", queue_size=2, max_text_chars=MAX_TEXT_CHARS),
        ray=dataclasses.replace(cfg.ray, address=cluster.address, cpus_per_replica=1.0, **ray),
    )


def local_twin(config):
    """A local synthesizer on the same models and voices, with caches of its own: the reference for every output."""
    from bot.services import build_local_synthesizer

    return build_local_synthesizer(dataclasses.replace(
        config, synthesis=dataclasses.replace(config.synthesis, backend="local"),
        cache=dataclasses.replace(config.cache, dir=config.cache.dir.parent / "local-cache")))


def close_remote(synth, app_name: str) -> None:
    """Close the client, remove its Serve application (its replicas free their CPUs) and disconnect."""
    import ray

    from synthesis.cluster.client import shutdown

    asyncio.run(synth.close())
    shutdown(app_name)
    ray.shutdown()
