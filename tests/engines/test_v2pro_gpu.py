"""v2Pro/v2ProPlus on CUDA: the SV front-end in fp32 and the SoVITS in fp32, fp16 and bf16 against upstream's
waveform (skipped without CUDA). Tolerances as the CPU tests, and 5e-2 for the waveform in half precision (as v2)."""

from __future__ import annotations

from pathlib import Path

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
