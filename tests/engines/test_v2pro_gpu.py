"""v2Pro/v2ProPlus on CUDA: the SV front-end in fp32 and the SoVITS in fp32, fp16 and bf16 against upstream's
waveform, and the TensorRT engine built from the same ONNX graphs (skipped without CUDA; TensorRT also without
tensorrt). Tolerances as the CPU tests, and 5e-2 for the waveform in half precision (as v2); TensorRT FP16: the
stated tolerances of test_tensorrt_engine.py (ge 1e-2, waveform 2e-2 with correlation > 0.999)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engines.gpt_sovits.checkpoint import load_sovits_checkpoint, load_sv_checkpoint
from engines.gpt_sovits.sovits import SoVITSDecoder
from engines.gpt_sovits.sv import ERes2NetV2, SpeakerEncoder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.conformance,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
ATOL_SV = 1e-3
WAVE_ATOL_HALF = 5e-2
TRT_GE_ATOL = 1e-2
TRT_WAV_ATOL = 2e-2


def _npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def test_sv_embedding_on_cuda(golden_v2pro_dir: Path, meta: dict) -> None:
    ref = _npz(golden_v2pro_dir / "ref_io.npz")
    model = ERes2NetV2.from_checkpoint(load_sv_checkpoint(golden_v2pro_dir / meta["sv"]["file"]), "cuda")
    emb = SpeakerEncoder(model).embed(ref["refer_wav"][0]).cpu().numpy()
    np.testing.assert_allclose(emb, ref["refer_sv_emb"], rtol=0, atol=ATOL_SV)


@pytest.mark.parametrize("version", ["v2Pro", "v2ProPlus"])
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_v2pro_waveform_on_cuda(golden_v2pro_dir: Path, meta: dict, version: str, precision: str) -> None:
    ref = _npz(golden_v2pro_dir / "ref_io.npz")
    io = _npz(golden_v2pro_dir / f"sovits_{version}_io.npz")
    dtype = HALF.get(precision, torch.float32)
    path = golden_v2pro_dir / meta["sovits"][version]["file"]
    model = SoVITSDecoder.from_checkpoint(load_sovits_checkpoint(path), "cuda", dtype)
    with torch.inference_mode():
        ge = model.ref_style(torch.as_tensor(ref["refer_spec"], device="cuda").to(dtype),
                             torch.as_tensor(ref["refer_sv_emb"], device="cuda"))
        wav = model.decode(torch.as_tensor(io["codes"], device="cuda").long(),
                           torch.as_tensor(io["text"], device="cuda").long(), ge, noise_scale=0.0)
    atol = 1e-4 if precision == "fp32" else WAVE_ATOL_HALF
    np.testing.assert_allclose(wav.float().cpu().numpy(), io["wav_ns0"], rtol=0, atol=atol)


@pytest.mark.timeout(1800)
def test_v2pro_on_tensorrt(golden, golden_v2pro_dir: Path, meta: dict, version: str,
                           tmp_path_factory: pytest.TempPathFactory) -> None:
    pytest.importorskip("tensorrt", reason="TensorRT is not installed (pip install tensorrt, NVIDIA GPUs only)")
    from engines.tensorrt_engine import TensorRTEngine

    ref = _npz(golden_v2pro_dir / "ref_io.npz")
    io = _npz(golden_v2pro_dir / f"sovits_{version}_io.npz")
    models = SimpleNamespace(gpt=golden.gpt_path, sovits=golden_v2pro_dir / meta["sovits"][version]["file"],
                             hubert=golden.dir / "no-hubert", bert=golden.dir / "no-bert",
                             sv=golden_v2pro_dir / meta["sv"]["file"])
    tmp = tmp_path_factory.mktemp(f"trt-{version}")
    engine = TensorRTEngine.from_files(models, tmp / "onnx", tmp / "plans", device="cuda:0", workspace_mb=2048,
                                       max_batch=1)
    refs = [ref["refer_wav"][0], ref["refer2_wav"][0]]
    sv = engine.encode_speaker(refs)  # the torch SV model, fp32 on the GPU
    assert sv is not None
    np.testing.assert_allclose(sv, np.concatenate([ref["refer_sv_emb"], ref["refer2_sv_emb"]]), rtol=0, atol=ATOL_SV)
    _, ge = engine.encode_reference(None, refs[:1], sv_emb=sv[:1])
    np.testing.assert_allclose(ge, io["ge"][0], rtol=0, atol=TRT_GE_ATOL)
    _, ge2 = engine.encode_reference(None, refs, sv_emb=sv)
    np.testing.assert_allclose(ge2, io["ge_tworefs"][0], rtol=0, atol=TRT_GE_ATOL)
    for case, ge_in, noise_scale in (("wav_ns0", io["ge"], 0.0), ("wav_ns05_eps", io["ge"], 0.5),
                                     ("wav_ns0_tworefs", io["ge_tworefs"], 0.0)):
        wav = engine.decode_with_noise(io["codes"], io["text"], ge_in[0], noise_scale=noise_scale,
                                       eps=torch.as_tensor(io["eps"])).cpu().numpy()
        assert wav.shape == io[case].shape, case
        np.testing.assert_allclose(wav, io[case], rtol=0, atol=TRT_WAV_ATOL, err_msg=case)
        assert np.corrcoef(wav.ravel(), io[case].ravel())[0, 1] > 0.999, case
