"""The GPT in half precision (fp16, bf16) keeps upstream's greedy decisions on the golden data, and does not stop
early: on the CPU here (with the TorchScript layer loop and with the plain Python one that CUDA runs) and on CUDA
where there is one (fp32 norms, logits and sampling in all).

Half precision is known to make GPT-SoVITS stop early. The proof, per precision, along upstream's own greedy path
(teacher-forced):
- every step's raw logits are within ``LOGIT_ATOL`` of upstream's (stated tolerances: fp16 0.02, bf16 0.08; fp32
  elsewhere is 1e-4);
- at every step whose upstream top-2 margin (after the EOS cut and the repetition penalty) exceeds what that logit
  error can flip, the penalised greedy choice is upstream's: the token, or EOS at upstream's stop and not before;
- decoding freely, the tokens equal upstream's up to the first step with a margin that small (the tiny golden model
  has near-ties of 0.0045, below bf16 noise) and the decode does not end before it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engines.base import SamplingParams
from engines.gpt_sovits.checkpoint import load_gpt_checkpoint
from engines.gpt_sovits.generate import BatchDecoder
from engines.gpt_sovits.gpt import Text2SemanticModel
from engines.gpt_sovits.sampling import EOS_TOKEN, MIN_STEPS_BEFORE_EOS

pytestmark = pytest.mark.conformance

HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
LOGIT_ATOL = {"fp16": 0.02, "bf16": 0.08}  # measured on CPU: fp16 0.005, bf16 0.033 at most
CASES = [("rp135", 1.35), ("rp100", 1.0)]
# On the CPU the layer loop runs as TorchScript; the plain Python loop is what CUDA runs: both are checked here.
DEVICES = ["cpu", "cpu-python", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


@pytest.fixture(scope="module")
def io(golden_dir: Path) -> dict[str, np.ndarray]:
    with np.load(golden_dir / "gpt_io.npz") as f:
        return {k: f[k] for k in f.files}


@pytest.fixture
def device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test's device; ``cpu-python`` is the CPU with the layer loop CUDA runs (plain Python)."""
    if request.param == "cpu-python":
        from engines.gpt_sovits import gpt as gpt_module

        monkeypatch.setattr(gpt_module, "_layers_runner", lambda device: gpt_module._decode_layers)
        return "cpu"
    return request.param


def _model(golden_dir: Path, device: str, precision: str) -> Text2SemanticModel:
    return Text2SemanticModel.from_checkpoint(load_gpt_checkpoint(golden_dir / "gpt_tiny_v2.ckpt"), device,
                                              HALF[precision])


def _teacher_forced(model: Text2SemanticModel, io: dict[str, np.ndarray], generated: np.ndarray) -> np.ndarray:
    """Raw logits at every step, feeding upstream's tokens: ``[len(generated)+1, 1025]`` fp32."""
    dev = model.pe.device
    phones, bert, prompt = (torch.as_tensor(io[k][0], device=dev)
                            for k in ("phone_ids", "bert_feature", "prompt_semantic"))
    with torch.inference_mode():
        model.setup_caches(1, 256)
        rows = [model.prefill(0, phones, bert, prompt)]
        pos = len(phones) + len(prompt)
        for i, tok in enumerate(generated):
            rows.append(model.decode_step(torch.tensor([int(tok)], device=dev), torch.tensor([pos + i], device=dev),
                                          None, 128)[0])
        out = torch.stack(rows)
    assert out.dtype == torch.float32  # logits stay fp32 whatever the weights
    return out.cpu().numpy()


def _penalised(raw: np.ndarray, history: np.ndarray, rp: float, step: int) -> np.ndarray:
    """Upstream's greedy view of one step: the EOS column cut before step 11, the repetition penalty applied."""
    x = (raw[:EOS_TOKEN] if step < MIN_STEPS_BEFORE_EOS else raw).copy()
    if rp != 1.0:
        prev = np.unique(history)
        x[prev] = np.where(x[prev] < 0, x[prev] * rp, x[prev] / rp)
    return x


def _choices(logits: np.ndarray, io: dict[str, np.ndarray], generated: np.ndarray, rp: float):
    """Per step: the penalised greedy choice and its top-2 margin."""
    out = []
    for step, raw in enumerate(logits):
        x = _penalised(raw, np.concatenate([io["prompt_semantic"][0], generated[:step]]), rp, step)
        top2 = np.sort(x)[-2:]
        out.append((int(np.argmax(x)), float(top2[1] - top2[0])))
    return out


@pytest.mark.parametrize(("key", "rp"), CASES)
def test_penalised_view_reproduces_upstream_margins(io: dict[str, np.ndarray], key: str, rp: float) -> None:
    """The test's own reading of a step (cut + penalty) is upstream's: on the golden raw logits it gives the golden
    tokens, EOS at the end, and the golden margins."""
    gen = io[f"greedy_{key}_generated"]
    choices = _choices(io[f"greedy_{key}_logits_raw"], io, gen, rp)
    assert [c for c, _ in choices] == [*gen.tolist(), EOS_TOKEN]
    np.testing.assert_allclose([m for _, m in choices], io[f"greedy_{key}_top2_margin"], atol=1e-3)


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize(("key", "rp"), CASES)
def test_half_keeps_greedy_choices_and_stop(golden_dir: Path, io: dict[str, np.ndarray], device: str,
                                            precision: str, key: str, rp: float) -> None:
    gen, margins = io[f"greedy_{key}_generated"], io[f"greedy_{key}_top2_margin"]
    logits = _teacher_forced(_model(golden_dir, device, precision), io, gen)
    raw = io[f"greedy_{key}_logits_raw"]
    np.testing.assert_allclose(logits, raw, atol=LOGIT_ATOL[precision], rtol=0)
    flip = 2 * max(rp, 1.0) * LOGIT_ATOL[precision]  # the smallest margin the logit error could flip
    decided = margins > flip
    assert decided.sum() >= len(margins) // 3 and decided[-1]  # the stop step (EOS) is always among them
    expected = [*gen.tolist(), EOS_TOKEN]
    for step, (choice, _) in enumerate(_choices(logits, io, gen, rp)):
        if decided[step]:
            assert choice == expected[step], f"step {step}: {choice} != upstream's {expected[step]}"


@pytest.mark.parametrize("device", DEVICES, indirect=True)
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize(("key", "rp"), CASES)
def test_half_free_decode_follows_upstream_until_a_near_tie(golden_dir: Path, io: dict[str, np.ndarray],
                                                              device: str, precision: str, key: str,
                                                              rp: float) -> None:
    gen, margins = io[f"greedy_{key}_generated"], io[f"greedy_{key}_top2_margin"]
    flip = 2 * max(rp, 1.0) * LOGIT_ATOL[precision]
    tie = int(np.argmax(margins <= flip)) if (margins <= flip).any() else len(margins)
    dec = BatchDecoder(_model(golden_dir, device, precision), 1, 256)
    dec.add("r", io["phone_ids"][0], io["bert_feature"][0], io["prompt_semantic"][0],
            SamplingParams(top_k=1, repetition_penalty=rp, early_stop_num=int(io["early_stop_num"]), seed=0))
    while not (out := dec.step()):
        pass
    tokens = out[0][1]
    assert len(tokens) >= min(tie, len(gen)), f"stopped after {len(tokens)} tokens, upstream went on"
    assert tokens[:tie].tolist() == gen[:tie].tolist()
    if tie >= len(margins):  # no near-tie on the way: the whole sequence and its stop are upstream's
        assert tokens.tolist() == gen.tolist()
