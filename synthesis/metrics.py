"""What the pipeline counts: hits and misses, requests, refusals, and the recent time-to-first-audio and RTF."""

from __future__ import annotations

import collections
from typing import Mapping

METRIC_WINDOW = 512  # recent samples kept for the ttfa / rtf histograms


class PipelineStats:
    """Counters and recent timings, written by the stages and the stream, read by ``/metrics``.

    Attributes
    ----------
    counters: ``requests``, ``completed``, ``busy``, ``deadline``, ``prosody_hit``/``_miss``, ``audio_hit``/``_miss``,
        ``voice_reencoded``.
    ttfa_s: seconds from a request's start to its first chunk, the last :data:`METRIC_WINDOW` requests.
    rtf: wall seconds per second of audio, the last :data:`METRIC_WINDOW` requests.
    """

    def __init__(self) -> None:
        self.counters: collections.Counter[str] = collections.Counter()
        self.ttfa_s: collections.deque[float] = collections.deque(maxlen=METRIC_WINDOW)
        self.rtf: collections.deque[float] = collections.deque(maxlen=METRIC_WINDOW)

    def snapshot(self, *, queue_depth: int, inflight: int, engine: str, device: str, precision: str,
                 plan: Mapping[str, str] | None = None) -> dict[str, object]:
        """Everything as one plain dict (hit ratios 0.0 before the first lookup); ``plan``: the engine plan's labels
        (``EnginePlan.labels``), strings like the engine's name, so that ``/metrics`` shows them in its engine info."""
        c = self.counters
        ph, pm = c["prosody_hit"], c["prosody_miss"]
        ah, am = c["audio_hit"], c["audio_miss"]
        return {
            "queue_depth": queue_depth, "inflight": inflight, "requests": c["requests"],
            "busy": c["busy"], "prosody_hits": ph, "prosody_misses": pm, "audio_hits": ah, "audio_misses": am,
            "prosody_hit_ratio": ph / (ph + pm) if ph + pm else 0.0,
            "audio_hit_ratio": ah / (ah + am) if ah + am else 0.0,
            "ttfa_s": list(self.ttfa_s), "rtf": list(self.rtf),
            **(plan or {}), "engine": engine, "device": device, "precision": precision,
        }
