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

Then, per family and size, another process writes the family's whole model set (``models make-tiny``'s writer; the
GPT's EOS row zeroed so that each sentence ends after the bench's natural pace of tokens per phone) and times the
whole pipeline on :data:`PIPELINE_TEXT`, after a warm-up sentence, alternating the two paths round by round:

* ``fast``: the product, :meth:`Synthesizer.stream` with the engine ``auto`` builds on the CPU;
* ``naive``: upstream's way on the same files, sentences, phones and token counts
  (:class:`engines.instruments.NaiveDitPipeline`): upstream's GPT loop in fp32, then each sentence whole through the
  eager fp32 DiT at the family's default steps and the eager vocoder.

First audio is the time to the first chunk (naive: to the first sentence's audio), RTF the total time over the
seconds of audio, best of the rounds; ``x naive`` is the naive row's figure over this row's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

DIT_FAMILIES = ("v4", "v5turbo", "v5dev")
PATHS = ("naive", "fp32", "fast")
ROUNDS = 3  # alternating rounds over the paths; the best of them is kept (the first warms every path up)
TIMED_STEPS = 4  # steps of the timed sampler call (fewer where the family's default is fewer)
VOCODER_S = 2.0  # seconds of audio the vocoder makes per timing
PIPELINE_TEXT = "The weather is lovely today. We could walk to the river after lunch."  # English: no BERT runs
PIPELINE_WARM_UP = "Hello there."
PIPELINE_SEED = 7  # the warm-up's; round r speaks with seed + 1 + r, so no round hits the caches
PIPELINE_ROUNDS = {"tiny": 2, "real": 1}  # each round times both paths; a naive real-size sentence takes minutes


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
    kernels: str = "-"  # an int8 DiT's GEMM library and attention dtype (the engine plan's)
    ref_gflops: float = 0.0  # the machine's speed on a fixed fp32 product just before the row's best round
    contend: int = 0
    load_avg: float = 0.0  # the machine's 1-minute load average when the row was measured
    x_dit: float | None = None  # naive ms per step / this row's
    x_vocoder: float | None = None
    x_chunk: float | None = None  # one chunk (default steps + its vocoder) naive / this row


@dataclass
class DitPipelineRow:
    """One family's whole pipeline on one path: first audio and RTF of :data:`PIPELINE_TEXT`."""

    family: str
    path: str  # naive (upstream's way) | fast (the product)
    size: str
    steps: int  # sampler steps per chunk: the family's default, on both paths
    first_audio_s: float  # from the call to the first audio (naive: the first sentence, whole)
    total_s: float  # from the call to the last audio
    rtf: float  # total_s over audio_s
    audio_s: float  # seconds of audio, each sentence's pause after it included
    sentences: int
    gpt: str = "fp32"  # what ran: the GPT's weights (the engine plan's)
    dit: str = "fp32"  # the DiT's precision
    vocoder: str = "torch-fp32"  # and the vocoder's
    rounds: int = 1  # timed rounds, the best kept
    contend: int = 0
    load_avg: float = 0.0  # the machine's 1-minute load average when the row was measured
    x_first: float | None = None  # naive first audio / this row's
    x_rtf: float | None = None  # naive RTF / this row's


def family_rows(family: str, size: str, frames: int, threads: int, tmp: str, device: str = "cpu") -> list[DitRow]:
    """The rows of one family at one size (run in a process of its own); on a CUDA ``device`` the paths are
    upstream's eager fp32, the fast DiT in fp32 stepped eagerly, and the product's fp16 with CUDA graphs."""
    import os

    from engines import instruments

    t = instruments.time_dit_paths(family, size, frames, threads, tmp, ROUNDS, TIMED_STEPS, VOCODER_S, device)
    load = os.getloadavg()[0]
    steps, cfg = int(t["steps"]), float(t["cfg"])
    rows: list[DitRow] = []
    for p in PATHS:
        rec = t["paths"][p]
        best = min(range(len(rec["dit_ms"])), key=rec["dit_ms"].__getitem__)
        rows.append(DitRow(family, p, size, frames, steps, cfg, rec["dit_ms"][best], min(rec["vocoder_rtf"]),
                           dit=rec["precisions"]["dit"],
                           kernels=f"{t['int8_gemm']}/{t['attention']}" if rec["precisions"]["dit"] == "int8" else "-",
                           vocoder=("torch-" if p == "naive" or device != "cpu" else "ort-")
                           + rec["precisions"]["vocoder"],
                           ref_gflops=rec["ref_gflops"][best], load_avg=load))
    target_s = (frames - int(t["prompt_frames"])) / float(t["mel_frame_rate"])
    base = rows[0]
    for r in rows:
        r.x_dit = base.dit_ms_per_step / r.dit_ms_per_step
        r.x_vocoder = base.vocoder_rtf / r.vocoder_rtf
        chunk = steps * r.dit_ms_per_step / 1000 + r.vocoder_rtf * target_s
        r.x_chunk = (steps * base.dit_ms_per_step / 1000 + base.vocoder_rtf * target_s) / chunk
    return rows


def pipeline_rows(family: str, size: str, threads: int, tmp: str, pace: Callable[[Any, int], None],
                  tokens_per_phone: int) -> list[DitPipelineRow]:
    """The naive and fast pipeline rows of one family at one size (run in a process of its own); ``pace(engine,
    tokens_per_phone)`` ends the product's GPT runs after that many tokens per phone (``benchmarks.gpt``'s)."""
    return asyncio.run(_pipeline_rows(family, size, threads, tmp, pace, tokens_per_phone))


async def _pipeline_rows(family: str, size: str, threads: int, tmp: str, pace: Callable[[Any, int], None],
                         tokens_per_phone: int) -> list[DitPipelineRow]:
    """:func:`pipeline_rows`, on its event loop (the product's stream is async; the naive path blocks it)."""
    import os

    from benchmarks.http import CONSENT, TRANSCRIPT, synthetic_speech
    from bot.config import config_from_dict
    from bot.services import build_local_synthesizer
    from engines import instruments, write_model_set
    from engines.base import SAMPLE_RATE, SamplingParams, SemanticRequest
    from synthesis import SynthesisParams
    from synthesis.audio import encode_audio
    from synthesis.text import bert_features, split_sentences, text_to_phonemes

    root = Path(tmp) / f"pipeline-{family}-{size}"
    paths = write_model_set(root, size=size, seed=0, family=family)  # (English: the released-size BERT never runs)
    instruments.zero_eos_in_file(paths["gpt"])  # every GPT run, fast or naive, ends at its early_stop_num
    cfg = config_from_dict({
        "models": {"dir": str(root), "family": family,
                   **{k: str(paths[k]) for k in ("gpt", "sovits", "vocoder", "hubert", "bert")}},
        "engine": {"backend": "auto", "device": "cpu", "threads": threads, "precision": "auto",
                   "onnx_dir": str(root / "onnx")},
        "voices": {"dir": str(root / "voices")},
        "cache": {"dir": str(root / "cache")},
    })
    synth = build_local_synthesizer(cfg)
    pace(synth.engine, tokens_per_phone)
    naive = instruments.NaiveDitPipeline.load(paths["gpt"], paths["sovits"], paths["vocoder"], threads)

    async def fast_run(text: str, voice: Any, p: Any) -> tuple[float, float, float, int]:
        """(first audio s, total s, audio s, sentences) of the product speaking ``text``."""
        t0 = time.perf_counter()
        first: float | None = None
        audio = 0.0
        async for chunk in synth.stream(text, voice, p):
            first = first if first is not None else time.perf_counter() - t0
            audio += chunk.audio.size / chunk.sample_rate
        return first or 0.0, time.perf_counter() - t0, audio, len(split_sentences(text, p.split_method, p.language))

    def naive_run(text: str, voice: Any, p: Any) -> tuple[float, float, float, int]:
        """The same, upstream's way: each sentence made whole, one after the other."""
        t0 = time.perf_counter()
        first: float | None = None
        audio = 0.0
        sentences = split_sentences(text, p.split_method, p.language)  # the product's split and front-end
        for i, sentence in enumerate(sentences):
            ph = text_to_phonemes(sentence, p.language, p.lexicon)
            sampling = SamplingParams(top_k=p.top_k, top_p=p.top_p, temperature=p.temperature,
                                      repetition_penalty=p.repetition_penalty, seed=p.seed + i,
                                      early_stop_num=tokens_per_phone * int(ph.ids.size))  # the fast path's pace
            request = SemanticRequest(ph.ids, bert_features(ph, None), voice.prompt, sampling)  # English: zeros
            wav = naive.speak(request, p.speed, p.seed + i)
            first = first if first is not None else time.perf_counter() - t0
            audio += wav.size / naive.sample_rate + p.fragment_interval  # the pause the product's chunk ends with
        return first or 0.0, time.perf_counter() - t0, audio, len(sentences)

    rounds = PIPELINE_ROUNDS.get(size, 1)
    timed: dict[str, list[tuple[float, float, float, int]]] = {"naive": [], "fast": []}
    try:
        await synth.warm_up()
        voice, _ = await synth.voicing.create("bench", encode_audio(synthetic_speech(), SAMPLE_RATE, "wav"),
                                            "bench.wav", language="en", transcript=TRANSCRIPT, consent=CONSENT)
        params = SynthesisParams(language="en", seed=PIPELINE_SEED)
        await fast_run(PIPELINE_WARM_UP, voice, params)  # the voice's prompt computed, first-call kernels chosen
        naive_run(PIPELINE_WARM_UP, voice, params)
        for r in range(rounds):
            p = dataclasses.replace(params, seed=PIPELINE_SEED + 1 + r)
            for path in ("naive", "fast") if r % 2 == 0 else ("fast", "naive"):
                timed[path].append(naive_run(PIPELINE_TEXT, voice, p) if path == "naive"
                                   else await fast_run(PIPELINE_TEXT, voice, p))
        engine: Any = synth.engine
        gpt, precisions = str(engine.plan.gpt_weights), dict(engine.decoder.precisions)
        await synth.voicing.delete(voice.id)
    finally:
        await synth.close()
    load = os.getloadavg()[0]
    labels = {"naive": ("fp32", naive.decoder.precisions["dit"], "torch-" + naive.decoder.precisions["vocoder"]),
              "fast": (gpt, precisions["dit"], "ort-" + precisions["vocoder"])}
    rows: list[DitPipelineRow] = []
    for path in ("naive", "fast"):
        runs = timed[path]  # each round speaks as many tokens, so as many seconds of audio
        total, audio_s, sentences = min(r[1] for r in runs), runs[-1][2], runs[-1][3]
        rows.append(DitPipelineRow(family, path, size, naive.steps, min(r[0] for r in runs), total, total / audio_s,
                                   audio_s, sentences, *labels[path], rounds=rounds, load_avg=load))
    base = rows[0]
    for row in rows:
        row.x_first = base.first_audio_s / row.first_audio_s
        row.x_rtf = base.rtf / row.rtf
    shutil.rmtree(root, ignore_errors=True)  # a real-size set is gigabytes; the next family writes its own
    return rows


def bench_dit(families: list[str], sizes: list[str], frames: int, threads: int, contend: int,
              isolated: Callable[..., Any], contention: Callable[[int], Any], pace: Callable[[Any, int], None],
              tokens_per_phone: int, device: str = "cpu") -> tuple[list[DitRow], list[DitPipelineRow]]:
    """Every family's rows at every size, and its pipeline rows, each in a process of its own (``isolated(fn,
    *args)``), with ``contention(contend)`` busy processes beside them (the ``bench`` command's own helpers;
    ``pace(engine, tokens_per_phone)``: its natural pace of the GPT, see :func:`pipeline_rows`). On a CUDA
    ``device`` the stage rows only: first audio there is ``bench-streams``' (with a diffusion family's config)."""
    rows: list[DitRow] = []
    piped: list[DitPipelineRow] = []
    with tempfile.TemporaryDirectory(prefix="voicebot-bench-dit-") as tmp, contention(contend):
        for size in sizes:
            for family in families:
                made: list[DitRow] = isolated(family_rows, family, size, frames if size == "real" else 64, threads,
                                              tmp, device)
                whole: list[DitPipelineRow] = [] if device != "cpu" else isolated(
                    pipeline_rows, family, size, threads, tmp, pace, tokens_per_phone)
                for r in made:
                    r.contend = contend
                for w in whole:
                    w.contend = contend
                rows.extend(made)
                piped.extend(whole)
    return rows, piped


def format_dit_table(rows: list[DitRow]) -> str:
    """The DiT and vocoder rows, each path beside its family's naive row."""
    head = (f"{'family':8} {'path':6} {'dit':5} {'gemm/attn':11} {'vocoder':10} {'size':5} {'frames':>6} "
            f"{'ms/step':>9} {'ref GF/s':>8} {'x naive':>8} {'voc RTF':>8} {'x naive':>8} {'steps':>5} {'chunk x':>8} "
            f"{'load':>5} {'contend':>7}")
    lines = ["DiT stage (ms per sampling step of one call of `frames` frames; ref GF/s: the machine's speed on a fixed "
             "fp32 product just before that round, compare rows at like speeds) and 48 kHz vocoder RTF; chunk x: the "
             "family's default steps plus the vocoder, naive / this path:", head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.family:8} {r.path:6} {r.dit:5} {r.kernels:11} {r.vocoder:10} {r.size:5} {r.frames:6d} "
                     f"{r.dit_ms_per_step:9.1f} {r.ref_gflops:8.0f} {r.x_dit or 0:7.2f}x {r.vocoder_rtf:8.3f} "
                     f"{r.x_vocoder or 0:7.2f}x {r.steps:5d} {r.x_chunk or 0:7.2f}x {r.load_avg:5.1f} {r.contend:7d}")
    return "\n".join(lines)


def format_dit_pipeline_table(rows: list[DitPipelineRow]) -> str:
    """The whole-pipeline rows, each fast row beside its family's naive one."""
    head = (f"{'family':8} {'path':6} {'gpt':16} {'dit':5} {'vocoder':10} {'size':5} {'steps':>5} {'first s':>8} "
            f"{'x naive':>8} {'RTF':>8} {'x naive':>8} {'audio s':>8} {'load':>5} {'contend':>7}")
    sentences = rows[0].sentences if rows else 0
    lines = [f"Whole pipeline, {len(PIPELINE_TEXT.split())} words in {sentences} sentences; naive: upstream's way "
             "on the same files and tokens (its GPT loop in fp32, each sentence whole through the eager fp32 DiT at "
             "the default steps and the eager vocoder); fast: Synthesizer.stream as auto runs it:", head,
             "-" * len(head)]
    for r in rows:
        lines.append(f"{r.family:8} {r.path:6} {r.gpt:16} {r.dit:5} {r.vocoder:10} {r.size:5} {r.steps:5d} "
                     f"{r.first_audio_s:8.3f} {r.x_first or 0:7.2f}x {r.rtf:8.3f} {r.x_rtf or 0:7.2f}x "
                     f"{r.audio_s:8.2f} {r.load_avg:5.1f} {r.contend:7d}")
    return "\n".join(lines)
