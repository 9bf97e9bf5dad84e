"""``python -m bot bench``: the speed table — GPT decode tokens/s, time to first audio, RTF, peak memory.

Every engine is measured in the same run, at the real v2 sizes (seeded random weights: the speed of the maths does
not depend on the values) and at the tiny test sizes, next to a naive baseline: the eager PyTorch loop that grows
its KV cache with ``torch.cat`` and syncs every token, as upstream does. The random GPT's EOS row is zeroed so that
decoding runs for exactly the requested number of steps (``early_stop_num``); in the pipeline rows each sentence
then ends after :data:`TOKENS_PER_PHONE` tokens per target phone, a natural speaking pace (with EOS kept, the random
GPT stopped each clause at random, after 0.4-1 s of audio, or ran to the 60 s cap when its EOS row was scaled down:
neither is the work a trained model does).

The figures say where they came from: the CPU model and its ISA flags, the runtimes' versions and the kernels they
dispatched to, and the memory read bandwidth measured here, from which each GPT row gets its ratio to the floor of
reading the decoder's weights once per step. ``--contend N`` runs N busy-looping processes beside the measurements
(a shared VPS, or the bot's own event loop and Opus encoder on the same cores); ``--contend 0,1`` measures both in
one run. The row of what ``engine.backend: auto`` / ``engine.precision: auto`` pick here carries ``default``; each
lower precision is also compared with its backend's fp32 along one teacher-forced path (argmax agreement, top-15
overlap, logit cosine). ``families`` also times the SoVITS vocoder of a v2Pro and a v2ProPlus model set (random
weights at the same size: the released files' shapes at the real size) beside v2's, on the torch and onnx engines,
each with a style and speaker-verification features the engine encoded from one synthetic reference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
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
TOKENS_PER_PHONE = 2  # pipeline rows: semantic tokens per target phone (English: ~12.5 phones and 25 tokens a second)
TTFA_REPEATS = 3
VOCODER_TOKENS = 150  # vocoder RTF: 6 s of audio (25 tokens per second)
VOC32 = "onnx-v32"  # row label: the onnx engine, int8 GPT with the fp32 vocoder (what auto's int8 vocoder replaced)
FAMILIES = ("v2", "v2Pro", "v2ProPlus")  # SoVITS families whose vocoders ``families`` times
REFERENCE_S = 3  # seconds of the synthetic reference a family's voice is encoded from
CONTEND_LIMIT_S = 3600  # a competitor process ends by itself after this, whatever happens to the bench
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")
ISA_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "OMP_WAIT_POLICY",
           "OMP_NUM_THREADS", "VOICEBOT_MARCH", "LD_PRELOAD")  # knobs that change which kernels run: reported when set


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
    vocoder_rtf: float | None = None  # SoVITS decode of 6 s of audio, seconds per second of audio
    floor_ms: float | None = None  # reading the decoder's weights once at the measured bandwidth (batch-1 floor)
    x_floor: float | None = None  # measured ms per step / floor_ms (1.0 = at the memory floor)
    contend: int = 0  # busy-looping processes running beside the measurement
    default: bool = False  # what engine.backend / engine.precision ``auto`` pick on this machine
    vocoder: str = "fp32"  # the vocoder's precision that ran (engine.vocoder_precision resolved)


@dataclass
class AccuracyRow:
    """A lower precision against its backend's fp32, teacher-forced along fp32's greedy path (real size)."""

    engine: str
    precision: str
    size: str
    steps: int
    argmax_agree: float  # share of steps whose argmax is fp32's
    top15_overlap: float  # mean share of fp32's top 15 tokens also in this precision's top 15
    cosine_mean: float  # logit cosine against fp32, mean and worst step
    cosine_min: float


@dataclass
class VocoderRow:
    """The SoVITS vocoder of one family on one engine: seconds of decode per second of audio (6 s of speech)."""

    engine: str
    precision: str
    device: str
    size: str
    family: str  # v2 | v2Pro | v2ProPlus
    vocoder_rtf: float
    contend: int = 0
    vocoder: str = "fp32"  # the vocoder's precision that ran


def machine_info(threads: int) -> dict[str, Any]:
    """What the figures depend on: CPU model and ISA flags, runtime versions, the kernels they dispatch to, the
    ISA-limiting environment knobs that are set, and the measured memory read bandwidth (GB/s, ``threads``)."""
    import os
    import platform

    from engines import instruments

    flags: set[str] = set()
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and ":" in line:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    runtimes = instruments.runtime_info()
    info: dict[str, Any] = {
        "cpu": model, "cores": len(os.sched_getaffinity(0)),
        "isa": {f: f in flags for f in ISA_FLAGS},
        **{k: runtimes[k] for k in ("torch", "torch_cpu_capability", "torch_quantized_engine")},
        "env": {k: os.environ[k] for k in ISA_ENV if k in os.environ},
    }
    hidden = hidden_isa(info["isa"])
    if hidden:
        info["isa_hidden"] = hidden
    info.update({k: v for k, v in runtimes.items() if k not in info})
    info["read_gb_s"] = read_bandwidth_gb_s(threads)
    return info


def hidden_isa(isa: dict[str, bool]) -> list[str]:
    """The flags of ``isa`` (from /proc/cpuinfo) that the libraries do not see (CPUID masked, ``make bench-avx2``):
    the kernels that run are the narrower ISA's."""
    from engines import instruments

    seen = instruments.isa_seen()
    return [flag for flag, on in isa.items() if on and seen.get(flag) is False]


def read_bandwidth_gb_s(threads: int) -> float:
    """Memory read bandwidth in GB/s with ``threads`` threads (0: every core); see
    :func:`engines.instruments.read_bandwidth_gb_s`."""
    from engines import instruments

    return instruments.read_bandwidth_gb_s(threads)


def gpt_weight_bytes(cfg: Any, precision: str) -> int:
    """Bytes a decode step of the GPT ``cfg`` (a :class:`engines.instruments.GptConfig`) reads in weights: the
    transformer's linears (1 byte each in int8, 2 in fp16/bf16, else 4) and the fp32 output head. Embeddings are
    gathered (one row per token) and do not count, nor does the KV cache (it grows with the sentence)."""
    linears = cfg.layers * (cfg.dim * 3 * cfg.dim + cfg.dim * cfg.dim + 2 * cfg.dim * cfg.ffn)
    per = {"int8": 1, "fp16": 2, "bf16": 2}.get(precision, 4)
    return linears * per + cfg.dim * cfg.vocab * 4


def _busy(until: float) -> None:
    """A competitor: spin on one core until ``until`` (time.monotonic), or until the bench that started it is gone
    (a killed bench cannot stop it: its parent then changes)."""
    import os

    parent = os.getppid()
    while time.monotonic() < until and os.getppid() == parent:
        for _ in range(100_000):  # a few ms of pure spinning between the checks
            pass


class Contention:
    """``n`` busy-looping processes for the ``with`` block: started on entry, stopped on exit (and each ends by
    itself after :data:`CONTEND_LIMIT_S`, so none outlives a killed bench)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[Any] = []

    def __enter__(self) -> Contention:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        until = time.monotonic() + CONTEND_LIMIT_S  # CLOCK_MONOTONIC is system-wide on Linux
        self.procs = [ctx.Process(target=_busy, args=(until,), daemon=True) for _ in range(self.n)]
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.join(5)
        self.procs = []


def auto_choice(device: str) -> tuple[str, str]:
    """(backend, precision) that ``engine.backend: auto`` and ``engine.precision: auto`` pick on ``device``."""
    import importlib.util

    from engines import instruments

    precision = instruments.resolve_precision("auto", device)
    return (instruments.choose_backend("auto", device, precision, importlib.util.find_spec("tensorrt") is not None),
            precision)


def _peak_mem_mb(device: str) -> float:
    from engines import instruments

    return instruments.peak_mem_mb(device)


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
    """Decode tokens/s of ``batch`` rows through the engine's continuous batch (prefill excluded), on the second of
    two identical runs: the first meets each cache length once (on a GPU, the first use of a decode shape in a
    process took 0.36 s on an H200, two of them in a 100-step run, which a long-running bot pays once)."""

    def run() -> float:
        b = engine.open_batch()
        for i, r in enumerate(_requests(batch, steps, np.random.default_rng(0))):
            b.add(i, r)
        b.step()  # first step: warm-up (allocations, kernel selection)
        done = n = 0
        t0 = time.perf_counter()
        while done < batch:
            done += len(b.step())
            n += 1
        return batch * n / (time.perf_counter() - t0)

    run()
    return run()


def _naive_tokens_per_s(gpt: Any, steps: int) -> float:
    """Decode tokens/s of the naive loop, prefill excluded as for the engines: a ``steps`` run minus a 1-step run."""
    import dataclasses

    from engines import instruments

    (req,) = _requests(1, steps, np.random.default_rng(0))
    phones, bert, prompt = instruments.request_inputs(req)

    def timed(n: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        tokens = instruments.naive_generate(gpt, phones, bert, prompt, dataclasses.replace(req.params, early_stop_num=n))
        return time.perf_counter() - t0, len(tokens)

    timed(steps)  # warm-up
    t_one, n_one = min(timed(1), timed(1))  # prefill + one step
    t_all, n_all = timed(steps)
    return (n_all - n_one) / max(t_all - t_one, 1e-9)


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
    from engines import instruments

    def run(req: Any) -> np.ndarray:
        phones, bert, prompt = instruments.request_inputs(req)
        return np.asarray(instruments.naive_generate(engine.gpt, phones, bert, prompt, req.params))

    return run


def _vocoder_rtf(engine: Any, gin: int, voice: Any = None) -> float:
    """Seconds of SoVITS decode per second of audio for 6 s of speech (best of 2 after a warm-up); ``voice``: the
    voice to decode with (default: the request's, with a constant style of ``gin`` values)."""
    rng = np.random.default_rng(2)
    (req,) = _requests(1, 1, rng)
    tokens = rng.integers(0, 1024, VOCODER_TOKENS).astype(np.int64)
    voice = voice if voice is not None else _voice_with_ge(req.voice, gin)
    engine.decode(tokens[:25], req.phones, voice, 1.0, 0.5, 0)
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        wav = engine.decode(tokens, req.phones, voice, 1.0, 0.5, 0)
        best = min(best, time.perf_counter() - t0)
    return best / (wav.size / 32000)


def _accuracy_in_process(backend: str, precisions: list[str], models: dict[str, str], tmp: str, size: str,
                         steps: int, threads: int) -> list[AccuracyRow]:
    """Each lower precision of ``backend`` against its fp32, teacher-forced along fp32's argmax path."""
    from engines import instruments

    instruments.set_cpu_threads(threads)
    (req,) = _requests(1, steps, np.random.default_rng(0))
    phones, bert, prompt = instruments.request_inputs(req)

    def gpt(precision: str) -> Any:
        eng = _build(backend, precision, models, tmp, "cpu", 1, threads)
        return eng.new_gpt() if backend in ("onnx", "graph") else eng.gpt

    ref, fed = instruments.forced_logits(gpt("fp32"), phones, bert, prompt, steps)
    rows = []
    for precision in precisions:
        low, _ = instruments.forced_logits(gpt(precision), phones, bert, prompt, steps, fed)
        top_ref, top_low = np.argsort(-ref, 1)[:, :15], np.argsort(-low, 1)[:, :15]
        overlap = np.mean([len(set(a) & set(b)) / 15 for a, b in zip(top_ref, top_low)])
        cos = (ref * low).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(low, axis=1)
        rows.append(AccuracyRow(backend, precision, size, steps, float(np.mean(ref.argmax(1) == low.argmax(1))),
                                float(overlap), float(cos.mean()), float(cos.min())))
    return rows


def bench_size(size: str, engines: list[str], batches: list[int], steps: int, device: str, threads: int,
               contend: int = 0, bandwidth_gb_s: float | None = None,
               ) -> tuple[list[Row], list[PipelineRow], list[AccuracyRow], list[VocoderRow]]:
    """Every requested measurement at one model size, with ``contend`` busy processes beside it; GPT rows get their
    ratio to the weights-read floor at ``bandwidth_gb_s`` (CPU; measured here when None). Each engine,
    precision and batch size runs in a fresh process of its own with the engine sized for that batch (its static KV
    cache included), so a row's peak memory is that configuration's own and no earlier run's thread pools slow it
    down."""
    from engines import instruments, write_model_set

    rows: list[Row] = []
    pipeline_rows: list[PipelineRow] = []
    accuracy: list[AccuracyRow] = []
    vocoders: list[VocoderRow] = []
    auto = auto_choice(device)
    with tempfile.TemporaryDirectory(prefix=f"voicebot-bench-{size}-") as tmp:
        # at the real size HuBERT and BERT too (the Chinese pipeline row runs the BERT: a stand-in of 2 layers made
        # its 0.1-0.2 s a sentence look free)
        paths = write_model_set(Path(tmp), size=size, seed=0, full=size == "real")
        no_eos = paths["gpt"].with_name("bench-no-eos.ckpt")  # every run stops at its early_stop_num
        shutil.copyfile(paths["gpt"], no_eos)
        instruments.zero_eos_in_file(no_eos)
        gin = int(instruments.load_sovits_checkpoint(paths["sovits"]).config["model"]["gin_channels"])
        gpt_cfg = instruments.GptConfig.from_dict(instruments.load_gpt_checkpoint(paths["gpt"]).config)
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
        if "graph" in engines and device == "cpu":  # the onnx engine with the GPT step graphs (what the fused step beat)
            jobs += [("graph", "fp32"), ("graph", "int8")]
        if "voc32" in engines and device == "cpu":  # the onnx engine's int8 GPT with the fp32 vocoder
            jobs.append((VOC32, "int8"))
        if device == "cpu" and any(e in engines for e in ("onnx", "graph", "voc32")):  # exported once, outside the timed processes
            _isolated(_export_once, decode_models, tmp)
        family_sets = {"v2": models}
        if "families" in engines:  # the same sizes and seed, each family's SoVITS (and SV model) in a folder of its own
            for family in FAMILIES[1:]:
                family_paths = write_model_set(Path(tmp) / family, size=size, seed=0, family=family)
                family_sets[family] = {k: str(v) for k, v in family_paths.items()}
        with Contention(contend):
            for engine, precision in jobs:
                for batch in [1] if engine == "naive" else batches:
                    rows.extend(_isolated(_bench_engine, engine, precision, decode_models, tmp, size, batch,
                                          batch == min(batches), steps, device, threads, gin))
            if "pipeline" in engines:
                backend = auto[0] if auto[0] in ("torch", "onnx") else "torch"
                runs = [("fp32" if device == "cpu" else "fp16", "auto")]
                if device == "cpu" and ("int8" in engines or auto[1] == "int8"):  # the default's rows always
                    runs.append(("int8", "auto"))
                if "voc32" in engines and device == "cpu" and backend == "onnx":
                    runs.append(("int8", "fp32"))
                for precision, vocoder in runs:
                    made = _isolated(_pipeline_in_process, backend, decode_models, tmp, size, device, threads,
                                     precision, vocoder)
                    for p in made:  # what auto picks: the auto backend and precision, and the auto vocoder
                        p.default = (p.backend, p.precision) == auto and vocoder == "auto"
                    pipeline_rows.extend(made)
            if "families" in engines:
                for engine, precision in _vocoder_jobs(device, engines):
                    vocoders.extend(_isolated(_vocoders_in_process, engine, precision, family_sets, tmp, size, device,
                                              threads))
        if "accuracy" in engines and device == "cpu" and contend == 0:
            for backend in [b for b in ("torch", "onnx", "graph")
                            if (b != "torch" and b in engines) or (b == "torch" and "int8" in engines)]:
                accuracy.extend(_isolated(_accuracy_in_process, backend, ["int8"], decode_models, tmp, size,
                                          steps, threads))
    bandwidth = bandwidth_gb_s or (read_bandwidth_gb_s(threads) if device == "cpu" else None)
    for r in rows:
        r.contend = contend
        r.default = (r.engine, r.precision) == auto
        if bandwidth and r.tokens_per_s:
            r.floor_ms = gpt_weight_bytes(gpt_cfg, r.precision) / (bandwidth * 1e9) * 1000
            r.x_floor = 1000 * r.batch / r.tokens_per_s / r.floor_ms
    for p in pipeline_rows:
        p.contend = contend
    for v in vocoders:
        v.contend = contend
    return rows, pipeline_rows, accuracy, vocoders


def _vocoder_jobs(device: str, engines: list[str]) -> list[tuple[str, str]]:
    """(engine, precision) pairs whose vocoders ``families`` times: torch (fp32: its int8 quantises the GPT only),
    onnx fp32 (the fp32 vocoder) and onnx int8 (with vocoder_precision auto: the int8 vocoder where its proof holds;
    the row says which ran)."""
    if device != "cpu":
        return [("torch", "fp16")]
    return [("torch", "fp32"), ("onnx", "fp32"), ("onnx", "int8")]


def _vocoders_in_process(engine: str, precision: str, family_sets: dict[str, dict[str, str]], tmp: str, size: str,
                         device: str, threads: int) -> list[VocoderRow]:
    """Each family's vocoder RTF on one engine (one engine at a time, in a process of their own); the voice (style,
    and the SV features for v2Pro/v2ProPlus) is what the engine encodes from a synthetic reference, as at
    enrollment."""
    import dataclasses

    from engines import instruments

    if device == "cpu":
        instruments.set_cpu_threads(threads)
    t = np.arange(REFERENCE_S * 32000) / 32000  # a harmonic "voice" at 120-160 Hz: [N] float32 @ 32 kHz
    f0 = 140 + 20 * np.sin(2 * np.pi * 3 * t)
    clip = np.zeros_like(t)
    for h in range(1, 10):
        clip += np.sin(2 * np.pi * np.cumsum(f0 * h) / 32000) / h
    clip = (0.1 * clip).astype(np.float32)
    (req,) = _requests(1, 1, np.random.default_rng(2))
    rows = []
    for family, models in family_sets.items():
        eng = _build(engine, precision, models, tmp, device, 1, threads)
        eng.bind_thread()
        sv = eng.encode_speaker([clip])  # None for v2
        _, ge = eng.encode_reference(None, [clip], sv_emb=sv)
        voice = dataclasses.replace(req.voice, ge=np.asarray(ge, np.float32), sv_emb=sv)
        rows.append(VocoderRow(engine, precision, device, size, family, _vocoder_rtf(eng, int(ge.size), voice),
                               vocoder=getattr(eng, "vocoder_precision", "fp32")))
        log.info("%s %s %s %s vocoder: RTF %.3f", engine, precision, size, family, rows[-1].vocoder_rtf)
        del eng
    return rows


def _isolated(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)`` in a fresh spawned process and return its result.

    A process pool that raises when its worker dies (killed for memory, a crash): ``multiprocessing.Pool`` would
    quietly start another worker and wait for the lost result for ever (seen once at the real size on a loaded
    machine)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def _export_once(models: dict[str, str], tmp: str) -> None:
    """Export the ONNX graphs and the int8 step graph (the engines' first start does this once per model)."""
    from engines import instruments

    folder = instruments.ensure_onnx(argparse.Namespace(**{k: Path(v) for k, v in models.items()}), Path(tmp) / "onnx")
    instruments.quantize_step_int8(folder)
    instruments.choose_vocoder(folder, "auto")  # the int8 vocoder and its proof


def _build(engine: str, precision: str, models: dict[str, str], tmp: str, device: str, batch: int,
           threads: int) -> Any:
    """The engine a row measures (``naive`` runs the torch engine's GPT through the naive loop)."""
    from engines import instruments

    paths = argparse.Namespace(**{k: Path(v) for k, v in models.items()})
    if engine in ("onnx", "graph", VOC32):
        return instruments.OnnxEngine.from_files(paths, Path(tmp) / "onnx", device=device, precision=precision,
                                                 threads=threads, max_batch=batch,
                                                 gpt="graph" if engine == "graph" else "auto",
                                                 vocoder="fp32" if engine == VOC32 else "auto")
    return instruments.TorchEngine.from_files(paths, device=device, precision=precision, max_batch=batch,
                                              cuda_graphs=engine == "torch", threads=threads,
                                              proofs=Path(tmp) / "onnx" / "torch")  # int8 proven once per run


def _bench_engine(engine: str, precision: str, models: dict[str, str], tmp: str, size: str, batch: int,
                  latency: bool, steps: int, device: str, threads: int, gin: int) -> list[Row]:
    """One engine at one precision and batch size: decode tokens/s, and (``latency``) ttfa, RTF and the vocoder's
    RTF, in a process of its own."""
    from engines import instruments

    if device == "cpu":
        instruments.set_cpu_threads(threads)
    eng = _build(engine, precision, models, tmp, device, batch, threads)
    if hasattr(eng, "bind_thread"):
        eng.bind_thread()  # as the synthesis worker does: this thread owns the engine's CPU threads
    if engine == "naive":
        tps = _naive_tokens_per_s(eng.gpt, steps)
        ttfa, rtf = _ttfa_and_rtf(eng, _naive_gpt(eng), gin)
        return [Row("naive", precision, device, size, 1, tps, ttfa, rtf, _peak_mem_mb(device),
                    vocoder_rtf=_vocoder_rtf(eng, gin))]
    ttfa, rtf = _ttfa_and_rtf(eng, _engine_gpt(eng), gin) if latency else (None, None)
    voc = _vocoder_rtf(eng, gin) if latency else None
    tps = _time_batch(eng, batch, steps)
    log.info("%s %s %s b%d: %.1f tok/s", engine, precision, size, batch, tps)
    return [Row(engine, precision, device, size, batch, tps, ttfa, rtf, _peak_mem_mb(device), vocoder_rtf=voc,
                vocoder=getattr(eng, "vocoder_precision", "fp32"))]


def _pipeline_in_process(backend: str, models: dict[str, str], tmp: str, size: str, device: str, threads: int,
                         precision: str, vocoder: str = "fp32") -> list[PipelineRow]:
    return asyncio.run(_bench_pipeline(argparse.Namespace(**models), Path(tmp), size, device, threads, precision,
                                       backend, vocoder))


@dataclass
class PipelineRow:
    precision: str
    size: str
    case: str  # cold | prosody-hit | audio-hit | cold-zh
    ttfa_s: float
    rtf: float
    audio_s: float
    backend: str = "torch"
    contend: int = 0
    default: bool = False
    vocoder: str = "fp32"  # the vocoder's precision that ran (engine.vocoder_precision resolved)
    bert: str = "-"  # the Chinese BERT's precision that ran (cold-zh; int8 where its proof held), else "-"
    # the process's peak memory in MiB after this case (RSS high-water mark on a CPU): the models of a bot that has
    # spoken English and Chinese (the BERT loads before the first case), its caches, and any first-run proof
    peak_mem_mb: float | None = None


PIPELINE_TEXT = ("The weather is lovely this morning. We could walk to the river after lunch. "
                 "Bring a jacket, it may rain later.")
PIPELINE_TEXT_ZH = "今天早上的天气很好。午饭以后我们可以去河边散步。带上外套，晚上可能会下雨。"  # the same, in Chinese


def _reference_wav() -> bytes:
    """A synthetic reference recording (no real voices here) as WAV bytes."""
    import io

    import soundfile as sf

    from benchmarks.http import synthetic_speech

    buf = io.BytesIO()
    sf.write(buf, synthetic_speech(), 32000, format="WAV")
    return buf.getvalue()


async def _bench_pipeline(models: Any, tmp: Path, size: str, device: str, threads: int,
                          precision: str, backend: str = "torch", vocoder: str = "fp32") -> list[PipelineRow]:
    """Synthesizer.stream end to end (text front-end, GPT, SoVITS, caches), cold / prosody-hit / audio-hit, and the
    same text in Chinese cold (its sentences run the BERT too)."""
    import dataclasses

    from bot.config import config_from_dict
    from bot.services import build_local_synthesizer
    from synthesis import SynthesisParams

    cfg = config_from_dict({
        "models": {k: str(getattr(models, k)) for k in ("gpt", "sovits", "hubert", "bert")},
        "engine": {"backend": backend, "device": "cpu" if device == "cpu" else "cuda", "threads": threads,
                   "precision": precision, "vocoder_precision": vocoder, "onnx_dir": str(tmp / "onnx")},
        "voices": {"dir": str(tmp / f"voices-{precision}-{vocoder}")},
        "cache": {"dir": str(tmp / f"cache-{precision}-{vocoder}")},
    })
    synth = build_local_synthesizer(cfg)  # the engine inside is what is measured
    natural_pace(synth.engine, TOKENS_PER_PHONE)
    rows = []
    try:
        await synth.warm_up()
        voice, _ = await synth.voicing.create("bench", _reference_wav(), "bench.wav", language="en",
                                            transcript="This is a short recording of my voice.",
                                            consent={"user_id": 0, "text": "synthetic benchmark signal"})
        params = SynthesisParams(language="en", seed=7)
        # same prosody key, new audio key, at speed 1: the first sentence's early words go out as a default user
        # hears them (the speed 1.05 used here before decoded the whole first sentence first)
        other = dataclasses.replace(params, noise_scale=params.noise_scale * 0.9)
        zh = dataclasses.replace(params, language="zh")
        async for _ in synth.stream("你好。", voice, zh):  # BERT and the Chinese front-end loaded and warm, as in a bot
            pass  # that spoke Chinese before (they load at the first Chinese sentence, or at start when zh is default)
        encoders = getattr(synth.engine, "encoders", None)
        proof = getattr(encoders, "bert_proof", None)
        if proof is not None:  # and the int8 BERT's proof over (engines.bert_int8): what then runs is measured
            await asyncio.to_thread(proof.join)
        for case, text, p in (("cold", PIPELINE_TEXT, params), ("prosody-hit", PIPELINE_TEXT, other),
                              ("audio-hit", PIPELINE_TEXT, other), ("cold-zh", PIPELINE_TEXT_ZH, zh)):
            t0 = time.perf_counter()
            ttfa = None
            audio = 0
            async for chunk in synth.stream(text, voice, p):
                ttfa = ttfa if ttfa is not None else time.perf_counter() - t0
                audio += chunk.audio.size
            total = time.perf_counter() - t0
            bert = getattr(encoders, "bert_precision", "fp32") if p is zh else "-"
            rows.append(PipelineRow(precision, size, case, ttfa or 0.0, total / (audio / 32000), audio / 32000,
                                    backend, vocoder=getattr(synth.engine, "vocoder_precision", "fp32"), bert=bert,
                                    peak_mem_mb=_peak_mem_mb(device)))
        await synth.voicing.delete(voice.id)
    finally:
        await synth.close()
    return rows


def natural_pace(engine: Any, tokens_per_phone: int) -> None:
    """Make ``engine``'s GPT runs (a random GPT with its EOS row zeroed) end after ``tokens_per_phone`` tokens per
    target phone, as a trained GPT ends a sentence spoken at that pace (:data:`TOKENS_PER_PHONE`: a natural one)."""
    import dataclasses

    open_batch = engine.open_batch

    def paced_open_batch(*args: Any, **kwargs: Any) -> Any:
        batch = open_batch(*args, **kwargs)
        add = batch.add

        def paced_add(request_id: Any, request: Any, *more: Any, **named: Any) -> Any:
            stop = tokens_per_phone * int(len(request.phones))
            request = dataclasses.replace(request, params=dataclasses.replace(request.params, early_stop_num=stop))
            return add(request_id, request, *more, **named)

        batch.add = paced_add
        return batch

    engine.open_batch = paced_open_batch


def format_pipeline_table(rows: list[PipelineRow]) -> str:
    head = f"{'backend':7} {'prec':5} {'voc':5} {'bert':5} {'size':5} {'case':12} {'ttfa s':>8} {'RTF':>7} " \
           f"{'audio s':>8} {'peak MB':>8} {'contend':>7}"
    lines = [f"Synthesizer.stream, 3 sentences ({len(PIPELINE_TEXT.split())} words, {TOKENS_PER_PHONE} semantic tokens "
             f"per phone); * = what auto picks here:",
             head, "-" * len(head)]
    lines += [f"{r.backend:7} {r.precision:5} {r.vocoder:5} {r.bert:5} {r.size:5} {r.case:12} {r.ttfa_s:8.3f} "
              f"{r.rtf:7.3f} {r.audio_s:8.2f} {r.peak_mem_mb or 0:8.0f} {r.contend:7d}{' *' if r.default else ''}"
              for r in rows]
    return "\n".join(lines)


def format_table(rows: list[Row]) -> str:
    """The decode table; ``x naive`` is against the naive row of the same size and contention."""
    base = {(r.size, r.contend): r.tokens_per_s for r in rows if r.engine == "naive"}
    quiet = {(r.engine, r.precision, r.size, r.batch): r.tokens_per_s for r in rows if r.contend == 0}
    head = f"{'engine':8} {'prec':5} {'voc':5} {'device':7} {'size':5} {'batch':>5} {'tok/s':>9} {'x naive':>8} " \
           f"{'x floor':>7} {'ttfa s':>8} {'RTF':>7} {'voc RTF':>7} {'peak MB':>8} {'contend':>7} {'x quiet':>7}"
    lines = [head, "-" * len(head)]

    def f(x: float | None, fmt: str) -> str:
        return fmt % x if x is not None else "-"

    for r in rows:
        b = base.get((r.size, r.contend))
        ratio = (r.tokens_per_s / b) if r.tokens_per_s and b else None
        q = quiet.get((r.engine, r.precision, r.size, r.batch)) if r.contend else None
        kept = (r.tokens_per_s / q) if r.tokens_per_s and q else None  # share of the quiet speed kept
        lines.append(
            f"{r.engine:8} {r.precision:5} {r.vocoder:5} {r.device:7} {r.size:5} {r.batch:5d} "
            f"{r.tokens_per_s or 0:9.1f} {f(ratio, '%.2fx'):>8} {f(r.x_floor, '%.2f'):>7} "
            f"{f(r.ttfa_s, '%.3f'):>8} {f(r.rtf, '%.3f'):>7} {f(r.vocoder_rtf, '%.3f'):>7} "
            f"{r.peak_mem_mb or 0:8.0f} {r.contend:7d} {f(kept and 100 * kept, '%.0f%%'):>7}"
            f"{' *' if r.default else ''}")
    return "\n".join(lines)


def format_vocoder_table(rows: list[VocoderRow]) -> str:
    """The vocoder RTF of each SoVITS family side by side, one line per engine, size and contention."""
    head = f"{'engine':7} {'prec':5} {'voc':5} {'device':7} {'size':5} " + " ".join(f"{f:>9}" for f in FAMILIES) + \
        f" {'contend':>7}"
    lines = ["SoVITS vocoder RTF by family (6 s of audio; seconds per second of audio):", head, "-" * len(head)]
    groups: dict[tuple[str, str, str, str, str, int], dict[str, float]] = {}
    for r in rows:
        groups.setdefault((r.engine, r.precision, r.vocoder, r.device, r.size, r.contend), {})[r.family] = \
            r.vocoder_rtf
    for (engine, precision, vocoder, device, size, contend), rtf in groups.items():
        cells = " ".join(f"{rtf[f]:9.3f}" if f in rtf else f"{'-':>9}" for f in FAMILIES)
        lines.append(f"{engine:7} {precision:5} {vocoder:5} {device:7} {size:5} {cells} {contend:7d}")
    return "\n".join(lines)


def format_accuracy_table(rows: list[AccuracyRow]) -> str:
    head = f"{'engine':7} {'prec':5} {'size':5} {'steps':>5} {'argmax':>7} {'top-15':>7} {'cos mean':>9} {'cos min':>8}"
    lines = ["Lower precision vs fp32, teacher-forced along fp32's greedy path:", head, "-" * len(head)]
    lines += [f"{r.engine:7} {r.precision:5} {r.size:5} {r.steps:5d} {r.argmax_agree:7.1%} {r.top15_overlap:7.1%} "
              f"{r.cosine_mean:9.5f} {r.cosine_min:8.5f}" for r in rows]
    return "\n".join(lines)


def format_machine(info: dict[str, Any]) -> str:
    isa = " ".join(f for f, on in info["isa"].items() if on) or "none of " + ", ".join(info["isa"])
    ort = f"onnxruntime {info['onnxruntime']} ({', '.join(info.get('onnxruntime_providers', []))})" \
        if info.get("onnxruntime") else "onnxruntime not installed"
    env = " ".join(f"{k}={v}" for k, v in info["env"].items())
    if info.get("isa_hidden"):
        isa += f" (hidden from the libraries: {' '.join(info['isa_hidden'])}; they run that CPU's narrower kernels)"
    return (f"CPU: {info['cpu']}, {info['cores']} cores usable; ISA: {isa}\n"
            f"torch {info['torch']} (ATen kernels {info['torch_cpu_capability']}, quantized engine "
            f"{info['torch_quantized_engine']}); {ort}\n"
            f"fused CPU decode step: {info.get('fused_step', 'not checked')}\n"
            f"memory read {info['read_gb_s']:.1f} GB/s"
            + (f"; ISA limited by {env}" if env else ""))


def parse_contend(text: str) -> list[int]:
    """``--contend`` as a list of competitor counts (``"0,1"``: quiet and with one busy process)."""
    try:
        levels = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 0:
        from engines import SpeechError

        raise SpeechError(f"--contend takes counts of busy processes like 1 or 0,1; got {text!r}")
    return levels


def run_bench(config: Any, args: argparse.Namespace) -> int:
    from engines import instruments

    device = instruments.resolve_device(config.engine.device)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    batches = [int(b) for b in args.batches.split(",")]
    levels = parse_contend(getattr(args, "contend", "0") or "0")
    threads = config.engine.threads
    info = machine_info(threads)
    info["auto"] = dict(zip(("backend", "precision"), auto_choice(device)))
    print(format_machine(info))
    print(f"auto picks here: engine.backend {info['auto']['backend']}, engine.precision {info['auto']['precision']}")
    rows: list[Row] = []
    pipeline_rows: list[PipelineRow] = []
    accuracy: list[AccuracyRow] = []
    vocoders: list[VocoderRow] = []
    dit_rows: list[Any] = []
    dit_pipeline: list[Any] = []
    for contend in levels:
        for size in [s.strip() for s in args.sizes.split(",") if s.strip()]:
            if [e for e in engines if e != "dit"]:
                r, p, a, v = bench_size(size, engines, batches, args.steps, device, threads, contend,
                                        info["read_gb_s"] if device == "cpu" else None)
                rows.extend(r)
                pipeline_rows.extend(p)
                accuracy.extend(a)
                vocoders.extend(v)
            if "dit" in engines:
                from benchmarks.dit import bench_dit

                d, w = bench_dit([f.strip() for f in args.dit_families.split(",") if f.strip()], [size],
                                 args.dit_frames, threads, contend, _isolated, Contention, natural_pace,
                                 TOKENS_PER_PHONE, device)
                dit_rows.extend(d)
                dit_pipeline.extend(w)
    if rows:
        print(format_table(rows))
    if pipeline_rows:
        print()
        print(format_pipeline_table(pipeline_rows))
    if vocoders:
        print()
        print(format_vocoder_table(vocoders))
    if accuracy:
        print()
        print(format_accuracy_table(accuracy))
    if dit_rows:
        from benchmarks.dit import format_dit_table

        print()
        print(format_dit_table(dit_rows))
    if dit_pipeline:
        from benchmarks.dit import format_dit_pipeline_table

        print()
        print(format_dit_pipeline_table(dit_pipeline))
    if args.json:
        args.json.write_text(json.dumps({"meta": info, "rows": [asdict(r) for r in rows] + [
            {"engine": "pipeline", **asdict(p)} for p in pipeline_rows], "accuracy": [asdict(a) for a in accuracy],
            "families": [asdict(v) for v in vocoders], "dit": [asdict(d) for d in dit_rows],
            "dit_pipeline": [asdict(w) for w in dit_pipeline]}, indent=1))
        print(f"wrote {args.json}")
    return 0
