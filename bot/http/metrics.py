"""``GET /metrics``: the HTTP layer's own series and the synthesizer's, through ``prometheus_client``.

The HTTP layer keeps cumulative series of what its clients saw: requests by protocol and status, histograms of
time to first audio (request arrival to the first audio byte written) and real-time factor (request wall time /
audio seconds), audio seconds sent and streams cut short. The synthesizer's ``metrics()`` is read at each scrape:
queue depth, cache hit ratios, counters, summaries (quantiles over a sliding window, as such summaries have) of its
recent time-to-first-audio and real-time-factor samples (Discord requests included; absent until there is a sample,
never NaN), and an info series naming the engine, device, precision and what the engine plan runs (GPT runner,
weight format, KV dtype, vocoder, BERT, threads). Every name spells its unit out (seconds)
and ``promtool check metrics`` finds nothing to lint. Process metrics (CPU, memory, open files) come with it. The text format or OpenMetrics is chosen by the
scraper's ``Accept`` header.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any, Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

TTFA_BUCKETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)  # seconds
RTF_BUCKETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)  # wall seconds per audio second
QUANTILES = (0.5, 0.9, 0.99)  # of the synthesizer's recent samples
# the synthesizer's keys -> series names with their units spelled out, and help
SAMPLE_SERIES = {
    "ttfa_s": ("time_to_first_audio_seconds", "Seconds from a request's start to its first audio."),
    "rtf": ("real_time_factor", "Synthesis wall seconds per second of audio."),
}
PREFIX = "voicebot"
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_]")


class HttpMetrics:
    """What the HTTP front-ends measured, cumulative since start, in a registry of this app's own.

    ``synth_metrics`` is called at each scrape for the synthesizer's current values.
    """

    def __init__(self, synth_metrics: Callable[[], Mapping[str, Any]] | None = None) -> None:
        self.started = time.time()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(f"{PREFIX}_http_requests", "HTTP requests by protocol and status code.",
                                ("protocol", "status"), registry=r)
        self.ttfa = Histogram(f"{PREFIX}_http_time_to_first_audio_seconds",
                              "Request arrival to the first audio byte sent.", buckets=TTFA_BUCKETS, registry=r)
        self.rtf = Histogram(f"{PREFIX}_http_real_time_factor", "Response wall time divided by its audio duration.",
                             buckets=RTF_BUCKETS, registry=r)
        self.audio_seconds = Counter(f"{PREFIX}_http_audio_seconds", "Seconds of audio sent.", registry=r)
        self.aborted_streams = Counter(f"{PREFIX}_http_aborted_streams",
                                       "Streams cut short by a client disconnect or a synthesis error.", registry=r)
        Gauge(f"{PREFIX}_start_time_seconds", "Process start (unix time).", registry=r).set(self.started)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        if synth_metrics is not None:
            r.register(_SynthCollector(synth_metrics))

    def observe_request(self, protocol: str, status: int) -> None:
        self.requests.labels(protocol, str(status)).inc()

    def observe_audio(self, ttfa_s: float | None, wall_s: float, audio_s: float) -> None:
        """One finished audio response: time to its first byte, its total wall time and its audio length."""
        if ttfa_s is not None and math.isfinite(ttfa_s):
            self.ttfa.observe(ttfa_s)
        if audio_s > 0:
            self.rtf.observe(wall_s / audio_s)
            self.audio_seconds.inc(audio_s)

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The exposition for a scraper's ``Accept`` header: (body, content type)."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type


class _SynthCollector:
    """The synthesizer's metrics dict as Prometheus families, read at scrape time."""

    def __init__(self, source: Callable[[], Mapping[str, Any]]) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        return []  # unknown until scraped: the dict's keys decide the families

    def collect(self) -> Iterable[Metric]:
        m = self._source()
        info = {_metric_name(k): str(v) for k, v in m.items() if isinstance(v, str)}
        if info:
            family = InfoMetricFamily(f"{PREFIX}_engine", "The loaded engine, device, precision and engine plan.")
            family.add_metric([], info)
            yield family
        for key, value in sorted(m.items()):
            if isinstance(value, (bool, str)):
                continue
            name, help_text = SAMPLE_SERIES.get(key, (_metric_name(key), f"Synthesizer {key.replace('_', ' ')}."))
            base = f"{PREFIX}_synthesis_{name}"
            if isinstance(value, (int, float)):
                if _is_counter(key):
                    yield CounterMetricFamily(base, help_text, value=value)
                else:
                    yield GaugeMetricFamily(base, help_text, value=value)
            elif isinstance(value, Iterable):
                samples = sorted(float(x) for x in value if isinstance(x, (int, float)) and math.isfinite(x))
                if samples:  # no sample, no quantile: a NaN breaks alerts and graphs
                    yield _window_summary(base, help_text, samples)


def _window_summary(name: str, help_text: str, sorted_samples: list[float]) -> Metric:
    """A summary of the synthesizer's recent samples: quantiles only, as a sliding-window summary has them (its
    count and sum would not be cumulative; the HTTP histograms and the request counters are)."""
    family = Metric(name, help_text + f" Quantiles over the last {len(sorted_samples)} requests of every door.",
                    "summary")
    for q in QUANTILES:
        family.add_sample(name, {"quantile": str(q)}, _quantile(sorted_samples, q))
    return family


def _is_counter(key: str) -> bool:
    """Monotonic synthesizer counters, by naming convention."""
    return key in ("requests", "busy", "completed", "replica_failures", "remote_errors") \
        or key.endswith(("_hits", "_misses"))


def _quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile of sorted values."""
    idx = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[idx]


def _metric_name(key: str) -> str:
    name = _NAME_BAD.sub("_", key)
    return name if name and not name[0].isdigit() else "_" + name
