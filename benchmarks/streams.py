"""``python -m bot bench-streams``: how many real-time speech streams this machine holds at once.

For each N of ``--streams``, N requests start together, each speaking its own 4-sentence paragraph (its own text and
no seed, as the bot's default, with the cache keeping no random samples, so no request reuses cache entries) through ``Synthesizer.stream``, as the Discord speakers and the
HTTP streams do, over the models and engine the config names (with a temporary voice folder and caches, as
``bench-http``). Each stream is played as it arrives, like the Discord audio source: playback starts with the first
chunk, and every later chunk must arrive before the audio ahead of it has finished playing, else the listener hears
a gap (an underrun: more than one 20 ms frame late). Per N: time to first audio (median and worst), the streams that
underran, the worst lateness, and the audio seconds produced per wall-clock second. The largest N without an
underrun is how many voice channels (or HTTP streams) the machine serves at once in real time.

With random weights (the real-size set ``python -m bot bench`` writes), give ``--pace 2`` and a GPT whose EOS row is
zeroed: every sentence then lasts as long as speech at a natural pace (2 semantic tokens per phone), where a random
GPT with its EOS stops each clause at random after 0.4-1 s; a trained model needs no pace.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.http import CONSENT, LANGUAGE, TRANSCRIPT, WARMUP_TEXT, bench_config, synthetic_speech
from bot.services import build_local_synthesizer
from engines.base import SAMPLE_RATE
from synthesis import SpeechError, SynthesisParams, Synthesizer, Voice
from synthesis.audio import encode_audio

log = logging.getLogger(__name__)

SENTENCES = (
    "The morning train was late again, so we walked along the river instead.",
    "Please remember to water the plants before you leave for the weekend.",
    "A small bakery on the corner sells the best bread in the whole town.",
    "The meeting has been moved to Thursday afternoon at three o'clock.",
    "Our team finally won the match after a long and difficult season.",
    "She painted the old fence bright yellow and the neighbours loved it.",
    "If the weather stays clear tonight, we should be able to see the stars.",
    "He forgot his umbrella at the library and came home soaking wet.",
    "The new bridge will open next spring, two years later than planned.",
    "Turn left at the second light, and the museum is right in front of you.",
    "My grandmother tells the same funny story every single holiday.",
    "The children built a tall sand castle before the tide came back in.",
)
SENTENCES_PER_STREAM = 4
FRAME_S = 0.02  # one Discord audio frame: lateness up to this is not heard
DEFAULT_STREAMS = "1,2,4,8"


@dataclass
class StreamsRow:
    streams: int
    ttfa_median_s: float
    ttfa_max_s: float
    underruns: int  # streams with at least one gap
    worst_late_s: float  # the latest any chunk came, after the audio before it had finished playing
    audio_s: float  # audio produced by all streams together
    wall_s: float  # from the start to the last chunk of the last stream
    realtime_x: float  # audio_s / wall_s: seconds of speech made per second
    ttfa_s: list[float]  # each stream's time to first audio, in the order they were started (admitted)
    late_s: list[float]  # each stream's worst lateness, in the same order


def paragraph(i: int) -> str:
    """Stream ``i``'s text: 4 of the sentences, a different choice or order for each of the first 12 streams."""
    n = len(SENTENCES)
    return " ".join(SENTENCES[(i + 5 * j) % n] for j in range(SENTENCES_PER_STREAM))


def playback(arrivals: list[tuple[float, float]]) -> tuple[float, int, float]:
    """Chunks as (arrival time, seconds of audio), in order, times from the request's start: (time to first
    audio, gaps heard, worst lateness) when playback starts with the first chunk and never waits."""
    start = arrivals[0][0]
    due, gaps, worst = start, 0, 0.0
    for at, seconds in arrivals:
        late = at - due
        worst = max(worst, late)
        if late > FRAME_S:
            gaps += 1
            due = at  # the listener heard silence; playback resumes when the chunk is there
        due += seconds
    return start, gaps, worst


async def _one_stream(synth: Synthesizer, voice: Voice, params: SynthesisParams, text: str,
                      t0: float) -> list[tuple[float, float]]:
    arrivals = []
    async for chunk in synth.stream(text, voice, params):
        arrivals.append((time.perf_counter() - t0, chunk.audio.size / chunk.sample_rate))
    if not arrivals:
        raise SpeechError("a benchmark stream produced no audio")
    return arrivals


async def _measure(synth: Synthesizer, voice: Voice, params: SynthesisParams, n: int) -> StreamsRow:
    t0 = time.perf_counter()
    # no seed, as the bot's default (the cache keeps no random samples here: every request misses it)
    results = await asyncio.gather(*(
        _one_stream(synth, voice, dataclasses.replace(params, seed=-1), paragraph(i), t0) for i in range(n)))
    wall = max(r[-1][0] for r in results)
    plays = [playback(r) for r in results]
    ttfa = [p[0] for p in plays]
    audio = sum(s for r in results for _, s in r)
    row = StreamsRow(n, float(np.median(ttfa)), max(ttfa), sum(p[1] > 0 for p in plays), max(p[2] for p in plays),
                     audio, wall, audio / wall, ttfa, [p[2] for p in plays])
    log.info("%d streams: ttfa median %.3f s, %d underran, worst %.3f s late, %.2fx real time; each stream's ttfa "
             "%s s, worst lateness %s s", n, row.ttfa_median_s, row.underruns, row.worst_late_s, row.realtime_x,
             " / ".join(f"{t:.2f}" for t in row.ttfa_s), " / ".join(f"{t:.2f}" for t in row.late_s))
    return row


async def _bench(config: Any, counts: list[int], pace: int = 0) -> tuple[list[StreamsRow], dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="voicebot-bench-streams-") as tmp:
        config = bench_config(config, Path(tmp))
        # the bench measures the engine, not the configured queue bound
        config = dataclasses.replace(config, synthesis=dataclasses.replace(
            config.synthesis, queue_size=max(config.synthesis.queue_size, 2 * max(counts))),
            cache=dataclasses.replace(config.cache, reuse_random=False))
        synth = build_local_synthesizer(config)  # the engine inside is what is measured
        if pace:
            from benchmarks.gpt import natural_pace

            natural_pace(synth.engine, pace)
        voice: Voice | None = None
        try:
            await synth.warm_up()
            voice, _ = await synth.voicing.create(f"bench-streams-{os.getpid()}",
                                                encode_audio(synthetic_speech(), SAMPLE_RATE, "wav"), "bench.wav",
                                                consent=CONSENT, transcript=TRANSCRIPT, language=LANGUAGE)
            params = dataclasses.replace(config.synthesis.params, language=LANGUAGE)
            async for _ in synth.stream(WARMUP_TEXT, voice, dataclasses.replace(params, seed=1)):
                pass  # untimed: first-use costs of kernels and caches
            rows = [await _measure(synth, voice, params, n) for n in counts]
            meta = {"engine": synth.engine_name, "device": synth.device, "precision": synth.precision,
                    "gpt": str(config.models.gpt), "sentences_per_stream": SENTENCES_PER_STREAM,
                    "vocoder": getattr(synth.engine, "vocoder_precision", "fp32"), "pace": pace}
            return rows, meta
        finally:
            if voice is not None:
                await synth.voicing.delete(voice.id)
            await synth.close()


def format_table(rows: list[StreamsRow]) -> str:
    head = f"{'streams':>7} {'ttfa median s':>13} {'ttfa max s':>10} {'underran':>8} {'worst late s':>12} " \
           f"{'audio s':>8} {'wall s':>7} {'x real time':>11}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.streams:7d} {r.ttfa_median_s:13.3f} {r.ttfa_max_s:10.3f} {r.underruns:8d} "
                     f"{r.worst_late_s:12.3f} {r.audio_s:8.1f} {r.wall_s:7.1f} {r.realtime_x:11.2f}")
    return "\n".join(lines)


def parse_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpeechError(f"--streams takes numbers separated by commas, like {DEFAULT_STREAMS}; got {text!r}")
    if not counts or min(counts) < 1:
        raise SpeechError(f"--streams needs at least one count of 1 or more, got {text!r}")
    return counts


def run_streams_bench(config: Any, args: argparse.Namespace) -> int:
    """Measure (see the module docstring), print the table, optionally write ``{"meta", "rows"}`` JSON."""
    counts = parse_counts(getattr(args, "streams", None) or DEFAULT_STREAMS)
    pace = int(getattr(args, "pace", 0) or 0)
    if pace < 0:
        raise SpeechError(f"--pace takes semantic tokens per phone (0: off), got {pace}")
    rows, meta = asyncio.run(_bench(config, counts, pace))
    held = [r.streams for r in rows if r.underruns == 0]
    print(f"engine {meta['engine']} on {meta['device']} ({meta['precision']}, {meta['vocoder']} vocoder), GPT "
          f"{meta['gpt']}; {SENTENCES_PER_STREAM} sentences per stream, cold caches"
          + (f", {pace} semantic tokens per phone" if pace else ""))
    print(format_table(rows))
    print(f"held in real time: {max(held)} streams at once" if held else "no stream count held without a gap")
    path = getattr(args, "json", None)
    if path:
        Path(path).write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=1))
        print(f"wrote {path}")
    return 0
