"""Bounded soak: the HTTP API on the tiny models over loopback, good and bad requests in a loop, RSS printed over time.

Issue 16 (item 7) saw RSS rise 4.5 MB/min without a plateau. This runs the server and its clients in one process
for ``--seconds``, prints the resident set size every ``--every`` seconds, and at the end the growth per minute over
the second half and the last 40 % (after the warm-up: models, caches, allocator pools). ``--trace`` also prints the Python allocations
that grew most between the first and the last sample (tracemalloc; slower).

Run from the repository root: ``python tests/tools/soak.py --seconds 300``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import os
import random
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

WORDS = ("river stone light garden window morning travel quiet orange paper seven music bright winter road "
         "friend table silver market yellow number thunder basket").split()
BAD_QUERIES = [  # the bad-input corpus's kinds: each must be a 4xx, never a 500
    {"text": "Hi.", "text_lang": "en", "ref_audio_path": "a\x00b"},
    {"text": "Hi.", "text_lang": "en", "ref_audio_path": "n" * 300},
    {"text": "1" * 40, "text_lang": "en", "ref_audio_path": "alice"},
    {"text": "Hi.", "text_lang": "xx", "ref_audio_path": "alice"},
    {"text": "Hi.", "text_lang": "en", "ref_audio_path": "alice", "temperature": "1e308"},
    {"text": "Hi.", "text_lang": "en", "ref_audio_path": "nobody"},
]
DEEP = "[" * 50_000 + "]" * 50_000


def rss_mb() -> float:
    """Resident set size of this process, MB (from /proc)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


async def client(url: str, stop: float, seed: int, counts: dict[str, int]) -> None:
    """One client: a random mix of good requests (new texts: cache misses), repeats (cache hits) and bad ones."""
    rng = random.Random(seed)
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < stop:
            kind = rng.random()
            try:
                if kind < 0.45:
                    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) + "."
                    q = {"text": text, "text_lang": "en", "ref_audio_path": rng.choice(["alice", "bob"]),
                         "seed": str(rng.randint(0, 10**6)), "media_type": rng.choice(["wav", "ogg", "mp3"])}
                    async with session.get(url + "/tts", params=q) as r:
                        await r.read()
                        status = str(r.status)
                elif kind < 0.6:
                    q = {"text": "The same words again.", "text_lang": "en", "ref_audio_path": "alice", "seed": "7"}
                    async with session.get(url + "/tts", params=q) as r:
                        await r.read()
                        status = str(r.status)
                elif kind < 0.7:
                    async with session.ws_connect(url + "/v1/tts/stream-input?voice=bob") as ws:
                        await ws.receive_json()
                        await ws.send_json({"text": "A streamed sentence arrives.", "close": True})
                        async for _ in ws:  # audio frames until the server closes
                            pass
                        status = f"ws {ws.close_code}"
                elif kind < 0.8:
                    async with session.post(url + "/tts", data=DEEP) as r:
                        await r.read()
                        status = str(r.status)
                else:
                    async with session.get(url + "/tts", params=rng.choice(BAD_QUERIES)) as r:
                        await r.read()
                        status = str(r.status)
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                counts[f"client error {type(e).__name__}"] = counts.get(f"client error {type(e).__name__}", 0) + 1
                continue
            counts[status] = counts.get(status, 0) + 1


async def soak(seconds: float, every: float, clients: int, trace: bool, models: Path | None) -> int:
    from bot.__main__ import main as cli
    from bot.config import load_config
    from bot.http import start_server
    from bot.services import Services, build_synthesizer
    from tests.audio_samples import speech_like_wav

    tmp = Path(tempfile.mkdtemp(prefix="voicebot-soak-"))
    if models is None:
        models = tmp / "models"
        assert cli(["models", "make-tiny", str(models)]) == 0
    cfg = load_config(models / "config.yaml")
    cfg = dataclasses.replace(
        cfg,
        voices=dataclasses.replace(cfg.voices, dir=tmp / "voices"),
        cache=dataclasses.replace(cfg.cache, dir=tmp / "cache"),
        discord=dataclasses.replace(cfg.discord, database=tmp / "voicebot.sqlite3"),
        http=dataclasses.replace(cfg.http, token_env="VOICEBOT_SOAK_NO_TOKEN", rate_limit_per_min=0),
    )
    synth = build_synthesizer(cfg)
    for name, f0 in (("alice", 140.0), ("bob", 230.0)):
        await synth.voicing.create(name, speech_like_wav(4.0, f0, 0), f"{name}.wav", transcript="Hello, this is my voice.",
                                   language="en", consent={"user_id": 1, "text": "this is my own voice"})
    runner = await start_server(Services(cfg, synth), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    counts: dict[str, int] = {}
    start = time.monotonic()
    stop = start + seconds
    tasks = [asyncio.create_task(client(url, stop, i, counts)) for i in range(clients)]
    samples: list[tuple[float, float]] = []
    first_snapshot = last_snapshot = None
    print(f"soak: {clients} clients for {seconds:.0f} s against {url} (tiny models)", flush=True)
    print("   t_s  rss_MB  requests")
    try:
        while time.monotonic() < stop:
            await asyncio.sleep(min(every, max(0.0, stop - time.monotonic())))
            gc.collect()
            t, mb = time.monotonic() - start, rss_mb()
            samples.append((t, mb))
            print(f"{t:6.0f} {mb:7.1f}  {sum(counts.values())}", flush=True)
            if trace and first_snapshot is None and t >= seconds / 2:
                tracemalloc.start(12)  # from the middle on: what is allocated then and still held at the end
                first_snapshot = tracemalloc.take_snapshot()
        await asyncio.gather(*tasks)
        gc.collect()
        last_snapshot = tracemalloc.take_snapshot() if first_snapshot is not None else None
    finally:
        await runner.cleanup()
        await synth.close()
    if first_snapshot is not None and last_snapshot is not None:
        print("Python allocations that grew most over the second half:")
        for stat in last_snapshot.compare_to(first_snapshot, "traceback")[:10]:
            print(f"  {stat.size_diff / 1e3:+9.1f} KB {stat.count_diff:+7d} blocks")
            for line in stat.traceback.format(most_recent_first=True)[:8]:
                print("     ", line)
    for label, share in (("second half", 0.5), ("last 40 %", 0.6)):
        part = [s for s in samples if s[0] >= seconds * share]
        if len(part) >= 2:
            (t0, m0), (t1, m1) = part[0], part[-1]
            slope = (m1 - m0) / max(t1 - t0, 1e-9) * 60.0
            print(f"{label}: {m0:.1f} -> {m1:.1f} MB ({min(m for _, m in part):.1f}-{max(m for _, m in part):.1f}), "
                  f"{slope:+.2f} MB/min")
    print(f"responses {dict(sorted(counts.items()))}")
    if any(k == "500" for k in counts):
        print("FAIL: 500 answers")
        return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--every", type=float, default=10.0, help="seconds between RSS samples")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--trace", action="store_true", help="tracemalloc: what grew over the second half")
    ap.add_argument("--models", type=Path, default=None, help="a tiny model folder (default: make one)")
    args = ap.parse_args()
    return asyncio.run(soak(args.seconds, args.every, args.clients, args.trace, args.models))


if __name__ == "__main__":
    sys.exit(main())
