"""The Engine contract, one test per clause over every engine that runs here (torch and ONNX Runtime, fp32 and
int8, CPU; torch fp32 on CUDA where a GPU is), on the golden models and inputs.

What every engine must do: identify its weights; stream and return semantic tokens as int64 in ``[0, EOS)``; run
the continuous batch (``open_batch``: add, step, cancel, capacity) the scheduler drives; decode ``tokens x
samples-per-token`` float32 samples at the pipeline's rate; encode a reference's style. The fp32 engines also give
upstream's greedy tokens exactly (the golden README: greedy tokens exact), through :func:`~engines.gpt_sovits.generate.generate` and through
their own ``open_batch`` path; the int8 engines' tokens are judged in test_int8_proof.py. Every engine is built as
``auto`` builds it, so the onnx int8 engine runs the int8 vocoder (its proof holds on the golden SoVITS): its
waveforms are bound by that proof's SNR (engines/vocoder_int8.py); every other waveform is upstream's within the
README's 1e-4.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from engines.gpt_sovits.generate import generate
from engines.base import EOS_TOKEN, SAMPLE_RATE, SAMPLES_PER_TOKEN, EngineError, SamplingParams, SemanticRequest
from tests.golden import Golden

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.conformance, pytest.mark.timeout(600)]

CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
# (backend, precision, device); the CUDA engine in fp32 (with its CUDA graphs) holds the CPU engines' clauses
ENGINES = [*(pytest.param((b, p, "cpu"), id=f"{b}-{p}") for b, p in
             (("torch", "fp32"), ("torch", "int8"), ("onnx", "fp32"), ("onnx", "int8"))),
           pytest.param(("torch", "fp32", "cuda"), id="torch-fp32-cuda", marks=CUDA)]
MAX_BATCH = 4
WAV_ATOL = 1e-4  # golden README: SoVITS waveform / ge atol 1e-4 (fp32)
SEMANTIC_HZ = 25  # semantic tokens per second of audio (SoVITS v2, "25hz")


@pytest.fixture(scope="module", params=ENGINES)
def engine(request: pytest.FixtureRequest, golden: Golden, golden_onnx_dir: Path) -> Any:
    backend, precision, device = request.param
    models = SimpleNamespace(gpt=golden.gpt_path, sovits=golden.sovits_path, hubert=golden.dir / "no-hubert",
                             bert=golden.dir / "no-bert")
    if backend == "torch":
        from engines.torch_engine import TorchEngine

        return TorchEngine.from_files(models, device=device, precision=precision, max_batch=MAX_BATCH, threads=1)
    from engines.onnx_engine import OnnxEngine

    return OnnxEngine.from_files(models, golden_onnx_dir, device="cpu", precision=precision, threads=1,
                                 max_batch=MAX_BATCH)


def _exact(engine: Any) -> bool:
    """fp32 engines must give upstream's greedy tokens exactly."""
    return engine.precision == "fp32"


def _assert_tokens(tokens: Any, label: str = "") -> None:
    assert isinstance(tokens, np.ndarray) and tokens.dtype == np.int64 and tokens.ndim == 1, (label, tokens)
    assert tokens.size >= 1 and tokens.min() >= 0 and tokens.max() < EOS_TOKEN, (label, tokens)


def _run(batch: Any, done: dict[int, np.ndarray], until: int | None = None, limit: int = 2000) -> None:
    """Step ``batch`` until request ``until`` finished (or nothing is active)."""
    for _ in range(limit):
        if (until is not None and until in done) or (until is None and not batch.active):
            return
        for rid, tokens in batch.step():
            assert rid not in done, f"request {rid} finished twice"
            done[rid] = tokens
    raise AssertionError(f"the batch did not finish in {limit} steps")


def test_identity(engine: Any, golden: Golden) -> None:
    assert engine.name in ("torch", "onnx") and engine.device in ("cpu", "cuda", "cuda:0")
    assert engine.precision in ("fp32", "int8")
    assert re.fullmatch(r"[0-9a-f]{16}", engine.model_id)
    # the rate: the file's, the pipeline's, and what the token rate and decode length imply
    declared = getattr(engine, "sample_rate", None)
    if declared is None:  # the torch engine has no attribute of its own: the rate of the SoVITS it loaded
        declared = engine.sovits.cfg.sampling_rate
    assert declared == golden.sampling_rate == SAMPLE_RATE == golden.samples_per_token * SEMANTIC_HZ
    assert golden.samples_per_token == SAMPLES_PER_TOKEN


def test_same_weights_same_model_id(golden: Golden, golden_onnx_dir: Path) -> None:
    """model_id keys the caches: one pair of files is one identity whatever the engine."""
    from engines.onnx_engine import OnnxEngine
    from engines.torch_engine import TorchEngine

    models = SimpleNamespace(gpt=golden.gpt_path, sovits=golden.sovits_path, hubert=golden.dir / "x",
                             bert=golden.dir / "y")
    a = TorchEngine.from_files(models, precision="fp32", threads=1).model_id
    b = OnnxEngine.from_files(models, golden_onnx_dir, precision="fp32", threads=1).model_id
    assert a == b


def test_generate_tokens_and_chunks(engine: Any, golden: Golden) -> None:
    cases = [*golden.greedy.values(), golden.reffree]
    chunks: dict[int, list[np.ndarray]] = {i: [] for i in range(len(cases))}
    out = generate(engine.new_gpt(), [golden.request(c) for c in cases], on_chunk=lambda i, t: chunks[i].append(t))
    assert len(out) == len(cases)
    for i, (case, tokens) in enumerate(zip(cases, out)):
        _assert_tokens(tokens, case.key)
        assert all(c.dtype == np.int64 and c.size for c in chunks[i])
        if case.stopped_by_eos or case.prompt.size == 0:  # nothing dropped: the chunks are the result
            np.testing.assert_array_equal(np.concatenate(chunks[i]), tokens, err_msg=case.key)
        if _exact(engine):
            np.testing.assert_array_equal(tokens, case.generated, err_msg=case.key)


def test_generate_should_stop(engine: Any, golden: Golden) -> None:
    case = next(iter(golden.greedy.values()))
    calls: dict[int, int] = {0: 0, 1: 0}

    def stop(i: int) -> bool:
        calls[i] += 1
        return i == 1 and calls[i] > 3

    out = generate(engine.new_gpt(), [golden.request(case), golden.request(case)], should_stop=stop)
    assert out[1].dtype == np.int64 and out[1].size == 0  # cancelled
    _assert_tokens(out[0])
    if _exact(engine):
        np.testing.assert_array_equal(out[0], case.generated)


def test_open_batch_gives_golden_tokens(engine: Any, golden: Golden) -> None:
    """The engine's own continuous batch (for torch: TorchEngine.open_batch -> SlotBatch) on every golden run,
    all at once, then the batched run's items joining while others decode."""
    chunks: dict[int, list[np.ndarray]] = {}
    batch = engine.open_batch(on_chunk=lambda i, t: chunks.setdefault(i, []).append(t))
    assert batch.capacity == MAX_BATCH and batch.active == 0
    cases = [*golden.greedy.values(), golden.reffree]
    assert len(cases) <= MAX_BATCH
    for i, case in enumerate(cases):
        batch.add(i, golden.request(case))
    assert batch.active == len(cases)
    done: dict[int, np.ndarray] = {}
    _run(batch, done)
    assert set(done) == set(range(len(cases))) and batch.active == 0
    for i, case in enumerate(cases):
        _assert_tokens(done[i], case.key)
        if case.stopped_by_eos or case.prompt.size == 0:
            np.testing.assert_array_equal(np.concatenate(chunks[i]), done[i], err_msg=case.key)
        if _exact(engine):
            np.testing.assert_array_equal(done[i], case.generated, err_msg=case.key)
    # the batched run's items, the second joining after the first has decoded a few steps
    n = golden.n_prompt_phones
    items = golden.batch_items
    for j, (ph, bert, expected) in enumerate(items):
        batch.add(100 + j, SemanticRequest(ph[n:], bert[:, n:], golden.voice(), golden.batch_params))
        for _ in range(3):
            for rid, tokens in batch.step():
                done[rid] = tokens
    _run(batch, done)
    for j, (_, _, expected) in enumerate(items):
        _assert_tokens(done[100 + j])
        if _exact(engine):
            np.testing.assert_array_equal(done[100 + j], expected)


def test_open_batch_capacity_and_cancel(engine: Any, golden: Golden) -> None:
    batch = engine.open_batch()
    case = next(iter(golden.greedy.values()))
    golden_req = golden.request(case)
    long = SemanticRequest(golden_req.phones, golden_req.bert, golden_req.voice,
                           SamplingParams(top_k=15, seed=7, early_stop_num=300))
    for rid in range(MAX_BATCH):
        batch.add(rid, long)
    assert batch.active == MAX_BATCH
    with pytest.raises(EngineError, match="busy"):
        batch.add(99, long)
    done: dict[int, np.ndarray] = {}
    for _ in range(3):
        done.update(batch.step())
    for rid in range(1, MAX_BATCH):
        batch.cancel(rid)
    assert not done and batch.active == 1  # EOS is not allowed before step 11: nothing finished in 3 steps
    batch.add(50, golden_req)  # reuses a cancelled row's slot
    _run(batch, done, until=50)
    assert not set(done) & set(range(1, MAX_BATCH))  # cancelled requests never finish
    _assert_tokens(done[50])
    if _exact(engine):
        np.testing.assert_array_equal(done[50], case.generated)
    batch.cancel(0)
    assert batch.active == 0
    batch.cancel(0)  # cancelling a finished or unknown request is harmless


def _assert_upstream_waveform(engine: Any, wav: np.ndarray, ref: np.ndarray, case: str) -> None:
    """Upstream's waveform within 1e-4; the int8 vocoder's within its proof's SNR bound."""
    if getattr(engine, "vocoder_precision", "fp32") == "fp32":
        np.testing.assert_allclose(wav, ref, rtol=0, atol=WAV_ATOL, err_msg=case)
        return
    from engines.vocoder_int8 import MIN_SNR_DB

    ref64 = ref.astype(np.float64)
    snr = 10 * np.log10(np.sum(ref64 ** 2) / np.sum((wav - ref64) ** 2))
    assert snr >= MIN_SNR_DB, f"{case}: int8 vocoder {snr:.1f} dB from upstream's waveform"


def test_decode_length_dtype_and_golden_waveform(engine: Any, golden: Golden) -> None:
    s = golden.sovits_io
    tokens, phones = s["codes"][0, 0], s["text"][0]
    voice = golden.voice(ge=s["ge"][0])
    wav = engine.decode(tokens, phones, voice, noise_scale=0.0)
    assert isinstance(wav, np.ndarray) and wav.dtype == np.float32 and wav.ndim == 1
    assert wav.size == tokens.size * golden.samples_per_token
    # what auto builds: the int8 vocoder exactly where the int8 GPT runs on the onnx engine (CPU)
    assert getattr(engine, "vocoder_precision", "fp32") == ("int8" if engine.name == "onnx" and
                                                            engine.precision == "int8" else "fp32")
    _assert_upstream_waveform(engine, wav, s["wav_ns0"][0, 0], "wav_ns0")
    for case, speed in golden.speed_cases.items():
        fast = engine.decode(tokens, phones, voice, speed=speed, noise_scale=0.0)
        assert fast.dtype == np.float32 and fast.size == s[case].shape[-1]
        _assert_upstream_waveform(engine, fast, s[case][0, 0], case)
    # seeded noise: reproducible, different per seed, audible and unclipped
    a, b, c = (engine.decode(tokens, phones, voice, noise_scale=0.5, seed=k) for k in (1, 1, 2))
    # bit for bit on a CPU; on a GPU cuDNN's convolutions may sum in another order from call to call (an H200 gave
    # 9 % of the samples 2.4e-7 apart): the same noise, so within rounding
    np.testing.assert_allclose(a, b, rtol=0, atol=0 if engine.device == "cpu" else 1e-5)
    assert np.abs(a - c).max() > 1e-3 and 0.01 < float(np.abs(a).max()) < 1.0
    # the GPT's output decodes: a golden run's tokens with its target phones
    gen = next(iter(golden.greedy.values())).generated
    out = engine.decode(gen, golden.target_phones, voice, noise_scale=0.5, seed=3)
    assert out.dtype == np.float32 and out.size == gen.size * golden.samples_per_token
    with pytest.raises(EngineError, match="at least one semantic token"):
        engine.decode(np.zeros(0, np.int64), phones, voice)


def test_encode_reference_style(engine: Any, golden: Golden) -> None:
    s = golden.sovits_io
    tokens, ge = engine.encode_reference(None, [s["refer_wav"][0]])
    assert tokens.dtype == np.int64 and tokens.size == 0  # no 16 kHz clip: reference-free, no prompt tokens
    assert ge.dtype == np.float32 and ge.shape == (golden.gin, 1)
    np.testing.assert_allclose(ge, s["ge"][0], rtol=0, atol=WAV_ATOL)
    _, ge2 = engine.encode_reference(None, [s["refer_wav"][0], s["refer2_wav"][0]])
    np.testing.assert_allclose(ge2, (s["ge"][0] + s["ge_refer2"][0]) / 2, rtol=0, atol=WAV_ATOL)
    with pytest.raises(EngineError, match="at least one"):
        engine.encode_reference(None, [])
