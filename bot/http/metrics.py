"""The Prometheus text exposition (format 0.0.4) served at ``GET /metrics``, and the HTTP layer's own series.

Two sources are exported. The HTTP layer keeps cumulative series of what its clients saw: requests by protocol and
status, and histograms of time to first audio (request arrival to the first audio byte written) and real-time
factor (request wall time / audio seconds). The synthesizer's ``metrics()`` adds queue depth, cache hit ratios,
counters, and quantiles of its recent time-to-first-audio and RTF samples (Discord requests included), plus an
info series naming the engine, device and precision. No extra dependency: the format is a few lines of text.
"""

from __future__ import annotations

import collections
import math
import re
import time
from typing import Any, Iterable, Mapping, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFA_BUCKETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)  # seconds
RTF_BUCKETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)  # wall seconds per audio second
QUANTILES = (0.5, 0.9, 0.99)  # of the synthesizer's recent samples
PREFIX = "voicebot"
_NAME_BAD = re.compile(r"[^a-zA-Z0-9_]")


class Histogram:
    """A cumulative Prometheus histogram (no labels)."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.bounds = tuple(sorted(buckets))
        self.counts = [0] * (len(self.bounds) + 1)  # last slot: above every bound (+Inf only)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        if not math.isfinite(value):
            return
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                return
        self.counts[-1] += 1

    def lines(self, name: str) -> list[str]:
        """The ``_bucket``/``_sum``/``_count`` sample lines."""
        out, running = [], 0
        for bound, n in zip(self.bounds, self.counts[:-1], strict=True):
            running += n
            out.append(f'{name}_bucket{{le="{_num(bound)}"}} {running}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {_num(self.sum)}")
        out.append(f"{name}_count {self.count}")
        return out


class HttpMetrics:
    """What the HTTP front-ends measured, cumulative since start."""

    def __init__(self) -> None:
        self.started = time.time()
        self.requests: collections.Counter[tuple[str, int]] = collections.Counter()  # (protocol, status)
        self.ttfa = Histogram(TTFA_BUCKETS)
        self.rtf = Histogram(RTF_BUCKETS)
        self.audio_seconds = 0.0
        self.aborted_streams = 0

    def observe_request(self, protocol: str, status: int) -> None:
        self.requests[(protocol, status)] += 1

    def observe_audio(self, ttfa_s: float | None, wall_s: float, audio_s: float) -> None:
        """One finished audio response: time to its first byte, its total wall time and its audio length."""
        if ttfa_s is not None:
            self.ttfa.observe(ttfa_s)
        if audio_s > 0:
            self.rtf.observe(wall_s / audio_s)
            self.audio_seconds += audio_s

    def render(self, synth: Mapping[str, Any]) -> str:
        """The whole exposition: HTTP series, then the synthesizer's."""
        lines: list[str] = []
        name = f"{PREFIX}_http_requests_total"
        lines += [f"# HELP {name} HTTP requests by protocol and status code.", f"# TYPE {name} counter"]
        for (protocol, status), n in sorted(self.requests.items()):
            lines.append(f'{name}{{protocol="{_label(protocol)}",status="{status}"}} {n}')
        name = f"{PREFIX}_http_time_to_first_audio_seconds"
        lines += [f"# HELP {name} Request arrival to the first audio byte sent.", f"# TYPE {name} histogram"]
        lines += self.ttfa.lines(name)
        name = f"{PREFIX}_http_real_time_factor"
        lines += [f"# HELP {name} Response wall time divided by its audio duration.", f"# TYPE {name} histogram"]
        lines += self.rtf.lines(name)
        lines += _simple(f"{PREFIX}_http_audio_seconds_total", "counter", "Seconds of audio sent.",
                         self.audio_seconds)
        lines += _simple(f"{PREFIX}_http_aborted_streams_total", "counter",
                         "Streams cut short by a client disconnect or a synthesis error.", self.aborted_streams)
        lines += _simple(f"{PREFIX}_start_time_seconds", "gauge", "Process start (unix time).", self.started)
        lines += _synth_lines(synth)
        return "\n".join(lines) + "\n"


def _synth_lines(m: Mapping[str, Any]) -> list[str]:
    """The synthesizer's metrics dict as Prometheus series (unknown keys are exported by their type)."""
    lines: list[str] = []
    info = {k: str(v) for k, v in m.items() if isinstance(v, str)}
    if info:
        name = f"{PREFIX}_engine_info"
        labels = ",".join(f'{_metric_name(k)}="{_label(v)}"' for k, v in sorted(info.items()))
        lines += [f"# HELP {name} The loaded engine, device and precision.", f"# TYPE {name} gauge",
                  f"{name}{{{labels}}} 1"]
    for key, value in sorted(m.items()):
        base = f"{PREFIX}_synthesis_{_metric_name(key)}"
        if isinstance(value, bool) or isinstance(value, str):
            continue
        if isinstance(value, (int, float)):
            if _is_counter(key):
                lines += _simple(base + "_total", "counter", f"Synthesizer {key.replace('_', ' ')}.", value)
            else:
                lines += _simple(base, "gauge", f"Synthesizer {key.replace('_', ' ')}.", value)
        elif isinstance(value, Iterable):
            samples = sorted(float(x) for x in value if isinstance(x, (int, float)) and math.isfinite(x))
            name = base + "_recent"
            lines += [f"# HELP {name} Quantiles of the synthesizer's recent {key} samples (all front-ends).",
                      f"# TYPE {name} gauge"]
            for q in QUANTILES:
                v = _quantile(samples, q) if samples else float("nan")
                lines.append(f'{name}{{quantile="{q}"}} {_num(v)}')
            lines += _simple(name + "_samples", "gauge", f"How many recent {key} samples there are.",
                             len(samples))
    return lines


def _is_counter(key: str) -> bool:
    """Monotonic synthesizer counters, by naming convention."""
    return key in ("requests", "busy") or key.endswith(("_hits", "_misses"))


def _simple(name: str, kind: str, help_text: str, value: float) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {_num(value)}"]


def _quantile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank quantile of sorted values."""
    idx = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[idx]


def _metric_name(key: str) -> str:
    name = _NAME_BAD.sub("_", key)
    return name if name and not name[0].isdigit() else "_" + name


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        return repr(value)
    return str(value)
