"""The TensorRT engine (FP16) against the golden conformance data; skipped without TensorRT and a CUDA GPU.

FP16 tolerances (stated; fp32 elsewhere is 1e-4): GPT logits along the golden path atol 5e-2 (|logit| <= 5, fp16
matmuls with fp32 norms, softmax and head), greedy tokens identical on >= 90 % of positions (exact where the golden
top-2 margin is large; the smallest margin, 0.0045, is below fp16 noise); SoVITS ge atol 1e-2, waveform atol 2e-2
with correlation > 0.999, VQ codes >= 95 % identical (fp16 moves near-ties). Everything TensorRT consumes is also
verified through ONNX Runtime in test_onnx_engine.py, which runs everywhere.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("tensorrt", reason="TensorRT is not installed (pip install tensorrt, NVIDIA GPUs only)")
if not torch.cuda.is_available():
    pytest.skip("the TensorRT engine needs a CUDA GPU", allow_module_level=True)

from engines.base import SAMPLE_RATE, SAMPLES_PER_TOKEN, SamplingParams, VoicePrompt  # noqa: E402
from engines.gpt_sovits.generate import BatchDecoder  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.conformance, pytest.mark.timeout(1800)]

LOGITS_ATOL = 5e-2
GE_ATOL = 1e-2
WAV_ATOL = 2e-2


@pytest.fixture(scope="module")
def engine(golden_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    from engines.tensorrt_engine import TensorRTEngine

    models = SimpleNamespace(gpt=golden_dir / "gpt_tiny_v2.ckpt", sovits=golden_dir / "sovits_tiny_v2.pth",
                             hubert=golden_dir / "no-hubert", bert=golden_dir / "no-bert")
    tmp = tmp_path_factory.mktemp("trt")
    return TensorRTEngine.from_files(models, tmp / "onnx", tmp / "plans", device="cuda:0", workspace_mb=2048,
                                     max_batch=4)


@pytest.fixture(scope="module")
def gpt_io(golden_dir: Path):
    return np.load(golden_dir / "gpt_io.npz")


@pytest.fixture(scope="module")
def sovits_io(golden_dir: Path):
    return np.load(golden_dir / "sovits_io.npz")


def _cuda(x: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(x, device="cuda:0")


@pytest.mark.parametrize("tag", ["rp135", "rp100"])
def test_logits_along_the_greedy_path(engine, gpt_io, tag: str) -> None:
    gpt = engine.new_gpt()
    gpt.setup_caches(1, 256)
    phones, bert, prompt = (_cuda(gpt_io[k][0]) for k in ("phone_ids", "bert_feature", "prompt_semantic"))
    rows = [gpt.prefill(0, phones, bert, prompt)[None]]
    start = phones.shape[0] + prompt.shape[0]
    for j, tok in enumerate(gpt_io[f"greedy_{tag}_generated"]):
        rows.append(gpt.decode_step(_cuda(np.array([tok])), _cuda(np.array([start + j])), None, 128))
    ref = gpt_io[f"greedy_{tag}_logits_raw"]
    got = torch.cat(rows).float().cpu().numpy()[: len(ref)]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=0, atol=LOGITS_ATOL)


@pytest.mark.parametrize("tag,rp", [("rp135", 1.35), ("rp100", 1.0)])
def test_greedy_tokens(engine, gpt_io, tag: str, rp: float) -> None:
    decoder = BatchDecoder(engine.new_gpt(), max_slots=2, max_len=512)
    decoder.add(0, gpt_io["phone_ids"][0], gpt_io["bert_feature"][0], gpt_io["prompt_semantic"][0],
                SamplingParams(top_k=1, repetition_penalty=rp, early_stop_num=40, seed=0))
    out: dict[int, np.ndarray] = {}
    while decoder.active:
        out.update(decoder.step())
    ref = gpt_io[f"greedy_{tag}_generated"]
    n = min(len(ref), len(out[0]))
    assert (out[0][:n] == ref[:n]).mean() >= 0.9 and abs(len(out[0]) - len(ref)) <= 2


def test_sovits(engine, sovits_io) -> None:
    s = sovits_io
    ge = engine.ref_style(_cuda(s["refer_spec"])).cpu().numpy()
    np.testing.assert_allclose(ge, s["ge"], rtol=0, atol=GE_ATOL)
    codes = engine.extract_latent(_cuda(s["ssl_feature"])).cpu().numpy()
    assert (codes == s["ssl_codes"]).mean() >= 0.95
    for case, speed, ns in (("wav_ns0", 1.0, 0.0), ("wav_ns05_eps", 1.0, 0.5), ("wav_ns0_speed125", 1.25, 0.0)):
        wav = engine.decode_with_noise(s["codes"], s["text"], s["ge"][0], speed=speed, noise_scale=ns,
                                       eps=torch.as_tensor(s["eps"])).cpu().numpy()
        assert wav.shape == s[case].shape
        np.testing.assert_allclose(wav, s[case], rtol=0, atol=WAV_ATOL)
        assert np.corrcoef(wav.ravel(), s[case].ravel())[0, 1] > 0.999


def test_contract(engine, gpt_io, sovits_io) -> None:
    assert (engine.name, engine.precision) == ("tensorrt", "fp16") and engine.sample_rate == SAMPLE_RATE
    tokens = gpt_io["greedy_rp100_generated"]
    voice = VoicePrompt(np.zeros(0, np.int64), sovits_io["ge"][0], np.zeros(0, np.int64),
                        np.zeros((1024, 0), np.float32))
    wav = engine.decode(tokens, gpt_io["phone_ids"][0, 9:], voice, noise_scale=0.5, seed=1)
    assert wav.dtype == np.float32 and wav.ndim == 1 and wav.size == tokens.size * SAMPLES_PER_TOKEN
