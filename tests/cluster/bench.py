"""Replica benchmark: throughput and time to first audio for 1, 2, 3 ... synthesis replicas on a local Ray cluster,
and the remote path's overhead against a local synthesizer on the same models.

    python -m tests.cluster.bench --models DIR [--replicas 1,2,3] [--requests 24] [--concurrency 6] [--cpus 1]

``DIR`` holds a model set and its ``config.yaml`` (``python -m bot models make-tiny DIR`` writes a tiny one; for real
figures, a folder with the downloaded models and a config.yaml naming them). The cluster has as many worker nodes
as the largest replica count, ``--cpus`` CPUs each; its processes are stopped at the end. Prints one JSON object.
Every request's text is distinct (no cache hit), and the local reference runs on as many engine threads as a
replica. Measurements:

* ``overhead``: one request at a time, the same texts, local then remote: median first-chunk latency and median
  gap between chunks of each, and their differences;
* ``replicas[n]``: with n replicas, ``--concurrency`` requests kept in flight (the same for every n) until
  ``--requests`` are done: seconds of speech made per wall second, requests per second, time to first audio (median
  and 95th percentile).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from synthesis import SynthesisParams
from tests.audio_samples import speech_like_wav

CONSENT = {"user_id": 1, "text": "benchmark voice, my own"}
PARAMS = SynthesisParams(seed=11, language="en")
WARM_UP = "Warm up first. A second sentence, like the measured ones."  # each side once before measuring


def texts(n: int, tag: str) -> list[str]:
    """n distinct two-sentence paragraphs (distinct: no cache hit between requests)."""
    return [f"Benchmark {tag} request {i} begins here. It ends with a second sentence." for i in range(n)]


async def timed(synth: Any, text: str, voice: str) -> tuple[float, list[float], float]:
    """(seconds to the first chunk, gaps between chunks, seconds of audio)."""
    start = time.perf_counter()
    arrivals, audio_s = [], 0.0
    async for chunk in synth.stream(text, voice, PARAMS):
        arrivals.append(time.perf_counter() - start)
        audio_s += chunk.audio.size / chunk.sample_rate
    return arrivals[0], [b - a for a, b in zip(arrivals, arrivals[1:])], audio_s


async def overhead(local: Any, remote: Any, voice: str, n: int) -> dict[str, float]:
    """First-chunk latency and per-chunk gap, one request at a time: local, remote, and remote minus local."""
    out: dict[str, float] = {}
    for name, synth in (("local", local), ("remote", remote)):
        firsts, gaps = [], []
        for text in texts(n, f"overhead-{name}"):
            first, gap, _ = await timed(synth, text, voice)
            firsts.append(first)
            gaps += gap
        out[f"{name}_first_chunk_s"] = statistics.median(firsts)
        out[f"{name}_chunk_gap_s"] = statistics.median(gaps) if gaps else 0.0
    out["first_chunk_overhead_s"] = out["remote_first_chunk_s"] - out["local_first_chunk_s"]
    out["chunk_gap_overhead_s"] = out["remote_chunk_gap_s"] - out["local_chunk_gap_s"]
    return out


async def throughput(remote: Any, voice: str, requests: int, concurrency: int, tag: str = "load") -> dict[str, float]:
    """``requests`` requests, ``concurrency`` in flight at a time: speech per second, requests per second, TTFA.
    ``tag`` makes the texts distinct from other runs' on the same caches (a cache hit would not be measured)."""
    todo = texts(requests, f"{tag}-{concurrency}")
    ttfa: list[float] = []
    audio = 0.0

    async def client() -> None:
        nonlocal audio
        while todo:
            first, _, seconds = await timed(remote, todo.pop(), voice)
            ttfa.append(first)
            audio += seconds

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    ttfa.sort()
    return {"requests": requests, "concurrency": concurrency, "wall_s": wall, "speech_per_s": audio / wall,
            "requests_per_s": requests / wall, "ttfa_median_s": statistics.median(ttfa),
            "ttfa_p95_s": ttfa[min(len(ttfa) - 1, int(0.95 * len(ttfa)))]}


def main(argv: list[str] | None = None) -> int:
    from bot.config import load_config
    from tests.cluster.local import LocalCluster

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, required=True, help="folder with the models and their config.yaml")
    ap.add_argument("--replicas", default="1,2,3")
    ap.add_argument("--requests", type=int, default=24, help="requests per replica count")
    ap.add_argument("--concurrency", type=int, default=6, help="requests in flight at once")
    ap.add_argument("--overhead-requests", type=int, default=5)
    ap.add_argument("--cpus", type=float, default=1, help="CPUs per worker node (and per replica)")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.replicas.split(",")]
    base = load_config(args.models / "config.yaml")
    data = Path(tempfile.mkdtemp(prefix="voicebot-bench-"))
    base = dataclasses.replace(base, voices=dataclasses.replace(base.voices, dir=data / "voices"),
                               cache=dataclasses.replace(base.cache, dir=data / "cache"))
    report: dict[str, Any] = {"replicas": {}}
    with LocalCluster(workers=max(counts), cpus=args.cpus) as cluster:
        try:
            _measure(cluster, base, data, counts, args, report)
        except BaseException:
            traceback.print_exc()  # now: Ray's own hook would first wait a minute for the cluster stopped below
            raise
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


def _measure(cluster: Any, base: Any, data: Path, counts: list[int], args: argparse.Namespace,
             report: dict[str, Any]) -> None:
    from bot.services import build_local_synthesizer, build_synthesizer

    import ray
    from ray import serve

    # the reference runs on as many engine threads as a replica (engine.threads: 0 is a replica's CPUs there)
    threads = base.engine.threads or max(1, int(args.cpus))
    local = build_local_synthesizer(dataclasses.replace(
        base, engine=dataclasses.replace(base.engine, threads=threads),
        cache=dataclasses.replace(base.cache, dir=data / "local-cache")))
    voice = ""
    for n in counts:
        cfg = dataclasses.replace(
            base, synthesis=dataclasses.replace(base.synthesis, backend="ray"),
            ray=dataclasses.replace(base.ray, address=cluster.address, num_replicas=n,
                                    cpus_per_replica=args.cpus, app_name=f"voicebot-bench-{n}"))
        remote = build_synthesizer(cfg)

        async def measure() -> None:
            nonlocal voice
            if not voice:
                v, _ = await remote.voicing.create("bench", speech_like_wav(), "bench.wav", consent=CONSENT,
                                                   transcript="Hello, this is my voice.", language="en")
                voice = v.id
                await timed(local, WARM_UP, voice)
            await timed(remote, WARM_UP, voice)
            if n == counts[0]:
                report["overhead"] = await overhead(local, remote, voice, args.overhead_requests)
            report["replicas"][str(n)] = await throughput(remote, voice, args.requests, args.concurrency,
                                                          f"load-{n}-replicas")

        asyncio.run(measure())
        asyncio.run(remote.close())
        serve.delete(f"voicebot-bench-{n}")
    asyncio.run(local.close())
    ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
