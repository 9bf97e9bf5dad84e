"""``python -m bot bench``: the speed table — GPT decode tokens/s, time to first audio, RTF, peak memory.

Every engine is measured in the same run, at the real v2 sizes (seeded random weights: the speed of the maths does
not depend on the values) and at the tiny test sizes, next to a naive baseline: the eager PyTorch loop that grows
its KV cache with ``torch.cat`` and syncs every token, as upstream does. The random GPT's EOS row is zeroed so that
decoding runs for exactly the requested number of steps (``early_stop_num``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import resource
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

log = logging.getLogger(__name__)

SENTENCE_10_WORDS = "The quick brown fox jumps over the lazy dog today."
TOKENS_10_WORDS = 75  # semantic tokens (3 s of audio) a 10-word sentence takes at a natural pace
TEXT_SENTENCES = 4  # whole-text RTF: this many such sentences
PROMPT_TOKENS = 150  # a 5.4 s reference (HuBERT 25 Hz + the 0.6 s pad)
PROMPT_PHONES = 40
TTFA_REPEATS = 3


@dataclass
class Row:
    engine: str
    precision: str
    device: str
    size: str
    batch: int
    tokens_per_s: float | None
    ttfa_s: float | None
    rtf: float | None
    peak_mem_mb: float | None


def _peak_mem_mb(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    # VmHWM belongs to this process's own address space (ru_maxrss would carry the parent's over exec)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _requests(batch: int, steps: int, rng: np.random.Generator):  # type: ignore[no-untyped-def]
    from engines.base import SamplingParams, SemanticRequest, VoicePrompt

    voice = VoicePrompt(prompt_tokens=rng.integers(0, 1024, PROMPT_TOKENS).astype(np.int64),
                        ge=np.zeros((512, 1), np.float32),
                        prompt_phones=rng.integers(1, 732, PROMPT_PHONES).astype(np.int64),
                        prompt_bert=np.zeros((1024, PROMPT_PHONES), np.float32))
    out = []
    for i in range(batch):
        phones = rng.integers(1, 732, 45).astype(np.int64)
        out.append(SemanticRequest(phones, np.zeros((1024, phones.size), np.float32), voice,
                                   SamplingParams(top_k=15, seed=1000 + i, early_stop_num=steps)))
    return out


def _time_batch(engine: Any, batch: int, steps: int) -> float:
    """Decode tokens/s of ``batch`` rows through the engine's continuous batch (prefill excluded)."""
    rng = np.random.default_rng(0)
    reqs = _requests(batch, steps, rng)
    b = engine.open_batch()
    for i, r in enumerate(reqs):
        b.add(i, r)
    b.step()  # first step: warm-up (allocations, kernel selection)
    done = 0
    t0 = time.perf_counter()
    n = 0
    while done < batch:
        done += len(b.step())
        n += 1
    dt = time.perf_counter() - t0
    return batch * n / dt


def _naive_tokens_per_s(gpt: Any, steps: int) -> float:
    """Decode tokens/s of the naive loop, prefill excluded as for the engines: a ``steps`` run minus a 1-step run."""
    import dataclasses

    from engines.gpt_sovits.naive import naive_generate
    from engines.gpt_sovits.generate import request_inputs

    (req,) = _requests(1, steps, np.random.default_rng(0))
    phones, bert, prompt = request_inputs(req)

    def timed(n: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        tokens = naive_generate(gpt, phones, bert, prompt, dataclasses.replace(req.params, early_stop_num=n))
        return time.perf_counter() - t0, len(tokens)

    timed(steps)  # warm-up
    t_one, n_one = min(timed(1), timed(1))  # prefill + one step
    t_all, n_all = timed(steps)
    return (n_all - n_one) / max(t_all - t_one, 1e-9)


def _zero_eos_in_file(gpt_path: Path) -> None:
    """Random weights: make EOS never win (its output row zeroed in the checkpoint), so every backend decodes
    exactly ``early_stop_num`` steps."""
    import torch

    ckpt = torch.load(gpt_path, map_location="cpu", weights_only=True)
    ckpt["weight"]["model.ar_predict_layer.weight"][1024].zero_()
    torch.save(ckpt, gpt_path)


def _ttfa_and_rtf(engine: Any, decode_gpt: Callable[[Any], np.ndarray], gin: int) -> tuple[float, float]:
    """Time to first audio for a 10-word sentence (median of a few passes after a warm-up one), and the RTF of a
    4-sentence text (no overlap credit)."""
    from synthesis.text import text_to_phonemes

    rng = np.random.default_rng(1)
    (req,) = _requests(1, TOKENS_10_WORDS, rng)
    times = []
    for _ in range(1 + TTFA_REPEATS):  # the first pass pays one-time costs (dictionaries, kernel selection)
        t0 = time.perf_counter()
        ph = text_to_phonemes(SENTENCE_10_WORDS, "en")
        req = type(req)(ph.ids, np.zeros((1024, ph.ids.size), np.float32), req.voice, req.params)
        tokens = decode_gpt(req)
        wav = engine.decode(tokens, ph.ids, _voice_with_ge(req.voice, gin), 1.0, 0.5, 0)
        times.append(time.perf_counter() - t0)
    ttfa = float(np.median(times[1:]))
    t0 = time.perf_counter()
    audio = 0
    for _ in range(TEXT_SENTENCES):
        tokens = decode_gpt(req)
        audio += engine.decode(tokens, ph.ids, _voice_with_ge(req.voice, gin), 1.0, 0.5, 0).size
    rtf = (time.perf_counter() - t0) / (audio / 32000)
    assert wav.size > 0
    return ttfa, rtf


def _voice_with_ge(voice: Any, gin: int) -> Any:
    import dataclasses

    return dataclasses.replace(voice, ge=np.full((gin, 1), 0.1, np.float32))


def _engine_gpt(engine: Any) -> Callable[[Any], np.ndarray]:
    def run(req: Any) -> np.ndarray:
        b = engine.open_batch()
        b.add(0, req)
        while True:
            for _, tokens in b.step():
                return tokens

    return run


def _naive_gpt(engine: Any) -> Callable[[Any], np.ndarray]:
    from engines.gpt_sovits.naive import naive_generate
    from engines.gpt_sovits.generate import request_inputs

    def run(req: Any) -> np.ndarray:
        phones, bert, prompt = request_inputs(req)
        return np.asarray(naive_generate(engine.gpt, phones, bert, prompt, req.params))

    return run


def bench_size(size: str, engines: list[str], batches: list[int], steps: int, device: str,
               threads: int) -> tuple[list[Row], list[PipelineRow]]:
    """Every requested measurement at one model size. Each engine, precision and batch size runs in a fresh process
    of its own with the engine sized for that batch (its static KV cache included), so a row's peak memory is that
    configuration's own and no earlier run's thread pools slow it down."""
    from engines.gpt_sovits.checkpoint import load_sovits_checkpoint
    from engines.gpt_sovits.tiny import write_model_set

    rows: list[Row] = []
    pipeline_rows: list[PipelineRow] = []
    with tempfile.TemporaryDirectory(prefix=f"voicebot-bench-{size}-") as tmp:
        paths = write_model_set(Path(tmp), size=size, seed=0)
        no_eos = paths["gpt"].with_name("bench-no-eos.ckpt")  # decode-speed runs; the pipeline keeps EOS
        shutil.copyfile(paths["gpt"], no_eos)
        _zero_eos_in_file(no_eos)
        gin = int(load_sovits_checkpoint(paths["sovits"]).config["model"]["gin_channels"])
        models = {k: str(v) for k, v in paths.items()}
        decode_models = {**models, "gpt": str(no_eos)}
        jobs: list[tuple[str, str]] = []
        if "naive" in engines:
            jobs.append(("naive", "fp32" if device == "cpu" else "fp16"))
        if "torch" in engines:
            jobs += [("torch", p) for p in (["fp32"] if device == "cpu" else ["fp16", "bf16"])]
        if "int8" in engines and device == "cpu":
            jobs.append(("torch", "int8"))
        if "onnx" in engines:
            jobs += [("onnx", "fp32"), ("onnx", "int8")]
        for engine, precision in jobs:
            for batch in [1] if engine == "naive" else batches:
                rows.extend(_isolated(_bench_engine, engine, precision, decode_models, tmp, size, batch,
                                      batch == min(batches), steps, device, threads, gin))
        if "pipeline" in engines:
            for precision in ["fp32" if device == "cpu" else "fp16"] + (
                    ["int8"] if "int8" in engines and device == "cpu" else []):
                pipeline_rows.extend(_isolated(_pipeline_in_process, models, tmp, size, device, threads, precision))
    return rows, pipeline_rows


def _isolated(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)`` in a fresh spawned process and return its result."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def _bench_engine(engine: str, precision: str, models: dict[str, str], tmp: str, size: str, batch: int,
                  latency: bool, steps: int, device: str, threads: int, gin: int) -> list[Row]:
    """One engine at one precision and batch size: decode tokens/s, and (``latency``) ttfa and RTF, in a process of
    its own."""
    from engines.loader import set_cpu_threads
    from engines.torch_engine import TorchEngine

    if device == "cpu":
        set_cpu_threads(threads)
    paths = argparse.Namespace(**{k: Path(v) for k, v in models.items()})
    if engine == "onnx":
        from engines.onnx_engine import OnnxEngine

        eng: Any = OnnxEngine.from_files(paths, Path(tmp) / "onnx", device=device, precision=precision,
                                         threads=threads, max_batch=batch)
    else:
        eng = TorchEngine.from_files(paths, device=device, precision=precision, max_batch=batch,
                                     cuda_graphs=engine == "torch")
    if engine == "naive":
        tps = _naive_tokens_per_s(eng.gpt, steps)
        ttfa, rtf = _ttfa_and_rtf(eng, _naive_gpt(eng), gin)
        return [Row("naive", precision, device, size, 1, tps, ttfa, rtf, _peak_mem_mb(device))]
    ttfa, rtf = _ttfa_and_rtf(eng, _engine_gpt(eng), gin) if latency else (None, None)
    tps = _time_batch(eng, batch, steps)
    log.info("%s %s %s b%d: %.1f tok/s", engine, precision, size, batch, tps)
    return [Row(engine, precision, device, size, batch, tps, ttfa, rtf, _peak_mem_mb(device))]


def _pipeline_in_process(models: dict[str, str], tmp: str, size: str, device: str, threads: int,
                         precision: str) -> list[PipelineRow]:
    return asyncio.run(_bench_pipeline(argparse.Namespace(**models), Path(tmp), size, device, threads, precision))


@dataclass
class PipelineRow:
    precision: str
    size: str
    case: str  # cold | prosody-hit | audio-hit
    ttfa_s: float
    rtf: float
    audio_s: float


PIPELINE_TEXT = ("The weather is lovely this morning. We could walk to the river after lunch. "
                 "Bring a jacket, it may rain later.")


def _reference_wav() -> bytes:
    """A synthetic reference recording (no real voices here) as WAV bytes."""
    import io

    import soundfile as sf

    from bot.bench_http import synthetic_speech

    buf = io.BytesIO()
    sf.write(buf, synthetic_speech(), 32000, format="WAV")
    return buf.getvalue()


async def _bench_pipeline(models: Any, tmp: Path, size: str, device: str, threads: int,
                          precision: str) -> list[PipelineRow]:
    """Synthesizer.stream end to end (text front-end, GPT, SoVITS, caches), cold / prosody-hit / audio-hit."""
    import dataclasses

    from bot.config import Config, config_from_dict
    from bot.services import build_synthesizer
    from synthesis.types import SynthesisParams

    cfg: Config = config_from_dict({
        "models": {k: str(getattr(models, k)) for k in ("gpt", "sovits", "hubert", "bert")},
        "engine": {"backend": "torch", "device": "cpu" if device == "cpu" else "cuda", "threads": threads,
                   "precision": precision},
        "voices": {"dir": str(tmp / f"voices-{precision}")}, "cache": {"dir": str(tmp / f"cache-{precision}")},
    })
    synth = build_synthesizer(cfg)
    rows = []
    try:
        await synth.warm_up()
        voice, _ = await synth.create_voice("bench", _reference_wav(), "bench.wav", language="en",
                                            transcript="This is a short recording of my voice.",
                                            consent={"user_id": 0, "text": "synthetic benchmark signal"})
        params = SynthesisParams(language="en", seed=7)
        faster = dataclasses.replace(params, speed=1.05)  # same prosody key, new audio key
        for case, p in (("cold", params), ("prosody-hit", faster), ("audio-hit", faster)):
            t0 = time.perf_counter()
            ttfa = None
            audio = 0
            async for chunk in synth.stream(PIPELINE_TEXT, voice, p):
                ttfa = ttfa if ttfa is not None else time.perf_counter() - t0
                audio += chunk.audio.size
            total = time.perf_counter() - t0
            rows.append(PipelineRow(precision, size, case, ttfa or 0.0, total / (audio / 32000), audio / 32000))
        await synth.delete_voice(voice.id)
    finally:
        await synth.close()
    return rows


def format_pipeline_table(rows: list[PipelineRow]) -> str:
    head = f"{'prec':5} {'size':5} {'case':12} {'ttfa s':>8} {'RTF':>7} {'audio s':>8}"
    lines = [f"Synthesizer.stream, 3 sentences ({len(PIPELINE_TEXT.split())} words):", head, "-" * len(head)]
    lines += [f"{r.precision:5} {r.size:5} {r.case:12} {r.ttfa_s:8.3f} {r.rtf:7.3f} {r.audio_s:8.2f}" for r in rows]
    return "\n".join(lines)


def format_table(rows: list[Row]) -> str:
    base = {r.size: r.tokens_per_s for r in rows if r.engine == "naive"}
    head = f"{'engine':7} {'prec':5} {'device':7} {'size':5} {'batch':>5} {'tok/s':>9} {'x naive':>8} " \
           f"{'ttfa s':>8} {'RTF':>7} {'peak MB':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = (r.tokens_per_s / base[r.size]) if r.tokens_per_s and base.get(r.size) else None
        lines.append(
            f"{r.engine:7} {r.precision:5} {r.device:7} {r.size:5} {r.batch:5d} "
            f"{r.tokens_per_s or 0:9.1f} {('%.2fx' % ratio) if ratio else '-':>8} "
            f"{('%.3f' % r.ttfa_s) if r.ttfa_s is not None else '-':>8} "
            f"{('%.3f' % r.rtf) if r.rtf is not None else '-':>7} {r.peak_mem_mb or 0:8.0f}")
    return "\n".join(lines)


def run_bench(config: Any, args: argparse.Namespace) -> int:
    from engines.loader import resolve_device

    device = resolve_device(config.engine.device)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    batches = [int(b) for b in args.batches.split(",")]
    rows: list[Row] = []
    pipeline_rows: list[PipelineRow] = []
    for size in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        r, p = bench_size(size, engines, batches, args.steps, device, config.engine.threads)
        rows.extend(r)
        pipeline_rows.extend(p)
    print(format_table(rows))
    if pipeline_rows:
        print()
        print(format_pipeline_table(pipeline_rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows] + [
            {"engine": "pipeline", **asdict(p)} for p in pipeline_rows], indent=1))
        print(f"wrote {args.json}")
    return 0
