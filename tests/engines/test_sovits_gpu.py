"""SoVITS on CUDA in fp32, fp16 and bf16 against the golden waveform (skipped without CUDA).

Waveform tolerance in half precision: 5e-2 absolute (fp32: 1e-4). The GPT's half-precision proof (greedy choices
and the stop kept on the golden data) is in test_gpt_half.py, which runs on the CPU and on CUDA.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engines.gpt_sovits.checkpoint import load_sovits_checkpoint
from engines.gpt_sovits.sovits import SoVITSDecoder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.conformance,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
WAVE_ATOL_HALF = 5e-2


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_sovits_waveform_on_cuda(golden, precision):
    io = golden.sovits_io
    dtype = HALF.get(precision, torch.float32)
    model = SoVITSDecoder.from_checkpoint(load_sovits_checkpoint(golden.sovits_path), "cuda", dtype)
    with torch.inference_mode():
        ge = model.ref_style(torch.as_tensor(io["refer_spec"], device="cuda").to(dtype))
        wav = model.decode(torch.as_tensor(io["codes"], device="cuda"), torch.as_tensor(io["text"], device="cuda"),
                           ge, noise_scale=0.0)
    got = wav.float().cpu().numpy()
    atol = 1e-4 if precision == "fp32" else WAVE_ATOL_HALF
    np.testing.assert_allclose(got, io["wav_ns0"], atol=atol)
