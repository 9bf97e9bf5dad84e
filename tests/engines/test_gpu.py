"""GPU conformance of the torch engine in half precision (skipped without CUDA).

Half precision is known to make GPT-SoVITS stop early; these tests prove ours keeps upstream's greedy tokens on the
golden data with fp16 and bf16 weights (fp32 norms, logits and sampling). Waveform tolerance in half precision:
5e-2 absolute (fp32 on CPU: 1e-4).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engines.base import SamplingParams
from engines.gpt_sovits.checkpoint import load_gpt_checkpoint, load_sovits_checkpoint
from engines.gpt_sovits.generate import BatchDecoder
from engines.gpt_sovits.gpt import Text2SemanticModel
from engines.gpt_sovits.sovits import SoVITSDecoder

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.conformance,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
WAVE_ATOL_HALF = 5e-2


def _greedy(model, phones, bert, prompt, rp, esn):
    dec = BatchDecoder(model, 2, 512)
    dec.add("r", phones, bert, prompt, SamplingParams(top_k=1, repetition_penalty=rp, early_stop_num=esn, seed=0))
    while not (out := dec.step()):
        pass
    return out[0][1]


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("rp,key", [(1.35, "greedy_rp135"), (1.0, "greedy_rp100")])
def test_gpt_greedy_tokens_on_cuda(golden_dir, precision, rp, key):
    io = np.load(golden_dir / "gpt_io.npz")
    dtype = HALF.get(precision, torch.float32)
    model = Text2SemanticModel.from_checkpoint(load_gpt_checkpoint(golden_dir / "gpt_tiny_v2.ckpt"), "cuda", dtype)
    tokens = _greedy(model, io["phone_ids"][0], io["bert_feature"][0], io["prompt_semantic"][0], rp,
                     int(io["early_stop_num"]))
    assert tokens.tolist() == io[f"{key}_generated"].tolist()


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_sovits_waveform_on_cuda(golden_dir, precision):
    io = np.load(golden_dir / "sovits_io.npz")
    dtype = HALF.get(precision, torch.float32)
    model = SoVITSDecoder.from_checkpoint(load_sovits_checkpoint(golden_dir / "sovits_tiny_v2.pth"), "cuda", dtype)
    with torch.inference_mode():
        ge = model.ref_style(torch.as_tensor(io["refer_spec"], device="cuda").to(dtype))
        wav = model.decode(torch.as_tensor(io["codes"], device="cuda"), torch.as_tensor(io["text"], device="cuda"),
                           ge, noise_scale=0.0)
    got = wav.float().cpu().numpy()
    atol = 1e-4 if precision == "fp32" else WAVE_ATOL_HALF
    np.testing.assert_allclose(got, io["wav_ns0"], atol=atol)
