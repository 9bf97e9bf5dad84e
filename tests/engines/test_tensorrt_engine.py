"""The TensorRT engine (FP16) against the golden conformance data; skipped without TensorRT and a CUDA GPU.

FP16 tolerances (stated; fp32 elsewhere is 1e-4): GPT logits along the golden path atol 5e-2 (|logit| <= 5, fp16
matmuls with fp32 norms, softmax and head), greedy tokens identical on >= 90 % of positions (exact where the golden
top-2 margin is large; the smallest margin, 0.0045, is below fp16 noise); SoVITS ge atol 1e-2, waveform atol 2e-2
with correlation > 0.999, VQ codes >= 95 % identical (fp16 moves near-ties). Everything TensorRT consumes is also
verified through ONNX Runtime in test_onnx_engine.py, which runs everywhere.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("tensorrt", reason="TensorRT is not installed (pip install tensorrt, NVIDIA GPUs only)")
if not torch.cuda.is_available():
    pytest.skip("the TensorRT engine needs a CUDA GPU", allow_module_level=True)

from engines.gpt_sovits.generate import BatchDecoder  # noqa: E402
from tests.golden import teacher_forced_logits  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.conformance, pytest.mark.timeout(1800)]

LOGITS_ATOL = 5e-2
GE_ATOL = 1e-2
WAV_ATOL = 2e-2


@pytest.fixture(scope="module")
def engine(golden, tmp_path_factory: pytest.TempPathFactory):
    from engines.tensorrt_engine import TensorRTEngine

    models = SimpleNamespace(gpt=golden.gpt_path, sovits=golden.sovits_path, hubert=golden.dir / "no-hubert",
                             bert=golden.dir / "no-bert")
    tmp = tmp_path_factory.mktemp("trt")
    return TensorRTEngine.from_files(models, tmp / "onnx", tmp / "plans", device="cuda:0", workspace_mb=2048,
                                     max_batch=4)


@pytest.fixture(scope="module")
def gpt_io(golden):
    return golden.gpt_io


@pytest.fixture(scope="module")
def sovits_io(golden):
    return golden.sovits_io


def _cuda(x: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(x, device="cuda:0")


def test_logits_along_the_greedy_path(engine, golden) -> None:
    for key, case in golden.greedy.items():
        got = teacher_forced_logits(engine.new_gpt(), case.phones, case.bert, case.prompt, case.fed)
        np.testing.assert_allclose(got, case.logits_raw, rtol=0, atol=LOGITS_ATOL, err_msg=key)


def test_greedy_tokens(engine, golden) -> None:
    for key, case in golden.greedy.items():
        decoder = BatchDecoder(engine.new_gpt(), max_slots=2, max_len=512)
        decoder.add(0, case.phones, case.bert, case.prompt, case.params())
        out: dict[int, np.ndarray] = {}
        while decoder.active:
            out.update(decoder.step())
        ref = case.generated
        n = min(len(ref), len(out[0]))
        assert (out[0][:n] == ref[:n]).mean() >= 0.9 and abs(len(out[0]) - len(ref)) <= 2, key


def test_sovits(engine, golden, sovits_io) -> None:
    s = sovits_io
    ge = engine.ref_style(_cuda(s["refer_spec"])).cpu().numpy()
    np.testing.assert_allclose(ge, s["ge"], rtol=0, atol=GE_ATOL)
    codes = engine.extract_latent(_cuda(s["ssl_feature"])).cpu().numpy()
    assert (codes == s["ssl_codes"]).mean() >= 0.95
    cases = [("wav_ns0", 1.0, 0.0), *((k, 1.0, v) for k, v in golden.noise_cases.items()),
             *((k, v, 0.0) for k, v in golden.speed_cases.items())]
    for case, speed, ns in cases:
        wav = engine.decode_with_noise(s["codes"], s["text"], s["ge"][0], speed=speed, noise_scale=ns,
                                       eps=torch.as_tensor(s["eps"])).cpu().numpy()
        assert wav.shape == s[case].shape
        np.testing.assert_allclose(wav, s[case], rtol=0, atol=WAV_ATOL)
        assert np.corrcoef(wav.ravel(), s[case].ravel())[0, 1] > 0.999


def test_contract(engine, golden) -> None:
    assert (engine.name, engine.precision) == ("tensorrt", "fp16") and engine.sample_rate == golden.sampling_rate
    tokens = next(iter(golden.greedy.values())).generated
    wav = engine.decode(tokens, golden.target_phones, golden.free_voice(), noise_scale=0.5, seed=1)
    assert wav.dtype == np.float32 and wav.ndim == 1 and wav.size == tokens.size * golden.samples_per_token
