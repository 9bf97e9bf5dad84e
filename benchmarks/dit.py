"""``python -m bot bench --engines dit``: the diffusion families' DiT and vocoder, each decoder path beside the naive one.

Per family (``--dit-families``, default v4, v5turbo, v5dev) and size, one process loads the family's SoVITS and
vocoder (seeded random weights: the released shapes at the real size) three times, as
:meth:`engines.gpt_sovits.diffusion.DiffusionDecoder.load` offers them: ``naive`` (upstream's eager fp32 forward every
step, the vocoder in eager torch), ``fp32`` (the fast path without int8) and ``fast`` (the default: int8 where its
proof holds on this model, the row says what ran). Then, alternating the paths round by round so that a load change
on the machine hits them alike, it times:

* the DiT stage: ms per sampling step of one sampler call of ``--dit-frames`` frames and :data:`TIMED_STEPS` steps,
  the call's own preparation included (the family's prompt of at most 500 frames, the rest target; v5dev with its
  guidance, whose negative the naive path runs as a second forward), best of the rounds;
* the vocoder: seconds per second of audio for :data:`VOCODER_S` seconds of mel, best of the rounds.

``x naive`` is each row against the naive row of the same family; ``chunk x`` is the ratio for one whole chunk of
speech: the family's default steps over ``--dit-frames`` frames plus the vocoder over its target frames.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger(__name__)

DIT_FAMILIES = ("v4", "v5turbo", "v5dev")
PATHS = ("naive", "fp32", "fast")
ROUNDS = 3  # alternating rounds over the paths; the best of them is kept (the first warms every path up)
TIMED_STEPS = 4  # steps of the timed sampler call (fewer where the family's default is fewer)
VOCODER_S = 2.0  # seconds of audio the vocoder makes per timing


@dataclass
class DitRow:
    """One decoder path of one family: the DiT's ms per step and the vocoder's RTF."""

    family: str
    path: str  # naive | fp32 | fast
    size: str
    frames: int  # frames per sampler call (prompt + target)
    steps: int  # the family's default sampling steps (for the chunk ratio)
    cfg: float
    dit_ms_per_step: float
    vocoder_rtf: float
    dit: str = "fp32"  # what ran: the DiT's precision
    vocoder: str = "fp32"  # and the vocoder's (onnxruntime where not naive)
    contend: int = 0
    load_avg: float = 0.0  # the machine's 1-minute load average when the row was measured
    x_dit: float | None = None  # naive ms per step / this row's
    x_vocoder: float | None = None
    x_chunk: float | None = None  # one chunk (default steps + its vocoder) naive / this row


def family_rows(family: str, size: str, frames: int, threads: int, tmp: str) -> list[DitRow]:
    """The rows of one family at one size (run in a process of its own)."""
    import os

    from engines import instruments

    t = instruments.time_dit_paths(family, size, frames, threads, tmp, ROUNDS, TIMED_STEPS, VOCODER_S)
    load = os.getloadavg()[0]
    steps, cfg = int(t["steps"]), float(t["cfg"])
    rows: list[DitRow] = []
    for p in PATHS:
        rec = t["paths"][p]
        rows.append(DitRow(family, p, size, frames, steps, cfg, min(rec["dit_ms"]), min(rec["vocoder_rtf"]),
                           dit=rec["precisions"]["dit"],
                           vocoder=("torch-" if p == "naive" else "ort-") + rec["precisions"]["vocoder"],
                           load_avg=load))
    target_s = (frames - int(t["prompt_frames"])) / float(t["mel_frame_rate"])
    base = rows[0]
    for r in rows:
        r.x_dit = base.dit_ms_per_step / r.dit_ms_per_step
        r.x_vocoder = base.vocoder_rtf / r.vocoder_rtf
        chunk = steps * r.dit_ms_per_step / 1000 + r.vocoder_rtf * target_s
        r.x_chunk = (steps * base.dit_ms_per_step / 1000 + base.vocoder_rtf * target_s) / chunk
    return rows


def bench_dit(families: list[str], sizes: list[str], frames: int, threads: int, contend: int,
              isolated: Callable[..., Any], contention: Callable[[int], Any]) -> list[DitRow]:
    """Every family's rows at every size, each family in a process of its own (``isolated(fn, *args)``), with
    ``contention(contend)`` busy processes beside them (the ``bench`` command's own helpers)."""
    rows: list[DitRow] = []
    with tempfile.TemporaryDirectory(prefix="voicebot-bench-dit-") as tmp, contention(contend):
        for size in sizes:
            for family in families:
                made: list[DitRow] = isolated(family_rows, family, size, frames if size == "real" else 64, threads,
                                              tmp)
                for r in made:
                    r.contend = contend
                rows.extend(made)
    return rows


def format_dit_table(rows: list[DitRow]) -> str:
    """The DiT and vocoder rows, each path beside its family's naive row."""
    head = (f"{'family':8} {'path':6} {'dit':5} {'vocoder':10} {'size':5} {'frames':>6} {'ms/step':>9} {'x naive':>8} "
            f"{'voc RTF':>8} {'x naive':>8} {'steps':>5} {'chunk x':>8} {'load':>5} {'contend':>7}")
    lines = ["DiT stage (ms per sampling step of one call of `frames` frames) and 48 kHz vocoder RTF; chunk x: the "
             "family's default steps plus the vocoder, naive / this path:", head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.family:8} {r.path:6} {r.dit:5} {r.vocoder:10} {r.size:5} {r.frames:6d} "
                     f"{r.dit_ms_per_step:9.1f} {r.x_dit or 0:7.2f}x {r.vocoder_rtf:8.3f} {r.x_vocoder or 0:7.2f}x "
                     f"{r.steps:5d} {r.x_chunk or 0:7.2f}x {r.load_avg:5.1f} {r.contend:7d}")
    return "\n".join(lines)
