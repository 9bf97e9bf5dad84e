"""The GPT and its sampler against upstream GPT-SoVITS outputs on the golden tiny checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from engines.base import SamplingParams, SemanticRequest, VoicePrompt
from engines.gpt_sovits.checkpoint import load_gpt_checkpoint
from engines.gpt_sovits.generate import generate
from engines.gpt_sovits.gpt import Text2SemanticModel
from engines.gpt_sovits.naive import naive_generate
from engines.gpt_sovits.sampling import SamplerState, logits_to_probs, sample_step

pytestmark = pytest.mark.conformance

N_PROMPT_PHONES = 9  # gpt_io.npz: the first 9 phones are the prompt's


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The tiny model is fastest on one thread, and one thread is robust on a busy shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def io(golden_dir: Path) -> dict[str, np.ndarray]:
    with np.load(golden_dir / "gpt_io.npz") as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="module")
def model(golden_dir: Path) -> Text2SemanticModel:
    return Text2SemanticModel.from_checkpoint(load_gpt_checkpoint(golden_dir / "gpt_tiny_v2.ckpt"))


def _voice(io: dict[str, np.ndarray]) -> VoicePrompt:
    ph, bert = io["phone_ids"][0], io["bert_feature"][0]
    return VoicePrompt(io["prompt_semantic"][0], np.zeros((128, 1), np.float32), ph[:N_PROMPT_PHONES],
                       bert[:, :N_PROMPT_PHONES])


def _free_voice() -> VoicePrompt:
    return VoicePrompt(np.zeros(0, np.int64), np.zeros((128, 1), np.float32), np.zeros(0, np.int64),
                       np.zeros((1024, 0), np.float32))


def _teacher_forced_logits(model: Text2SemanticModel, phones, bert, prompt, generated) -> np.ndarray:
    """Raw logits at every step, feeding upstream's tokens: ``[len(generated)+1, 1025]``."""
    with torch.inference_mode():
        model.setup_caches(2, 256)
        slot = 1  # not row 0, to exercise slot addressing
        rows = [model.prefill(slot, torch.as_tensor(phones), torch.as_tensor(bert), torch.as_tensor(prompt))]
        pos = len(phones) + len(prompt)
        for i, tok in enumerate(generated):
            lg = model.decode_step(torch.tensor([int(tok)]), torch.tensor([pos + i]), torch.tensor([slot]), 128)
            rows.append(lg[0])
        return torch.stack(rows).numpy()


def test_embeddings(model: Text2SemanticModel, io: dict[str, np.ndarray]) -> None:
    with torch.inference_mode():
        x = model.embed_text(torch.as_tensor(io["phone_ids"]), torch.as_tensor(io["bert_feature"]))
        y = model.embed_prompt(torch.as_tensor(io["prompt_semantic"]))
    np.testing.assert_allclose(x.numpy(), io["x_emb"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(y.numpy(), io["prompt_y_pos"], atol=1e-5, rtol=0)


@pytest.mark.parametrize(("key", "rp"), [("rp135", 1.35), ("rp100", 1.0)])
def test_greedy_logits_per_step(model: Text2SemanticModel, io: dict[str, np.ndarray], key: str, rp: float) -> None:
    gen = io[f"greedy_{key}_generated"]
    logits = _teacher_forced_logits(model, io["phone_ids"][0], io["bert_feature"][0], io["prompt_semantic"][0], gen)
    raw = io[f"greedy_{key}_logits_raw"]
    assert logits.shape == raw.shape
    np.testing.assert_allclose(logits, raw, atol=1e-4, rtol=0)


@pytest.mark.parametrize(("key", "rp"), [("rp135", 1.35), ("rp100", 1.0)])
def test_greedy_tokens_exact(model: Text2SemanticModel, io: dict[str, np.ndarray], key: str, rp: float) -> None:
    params = SamplingParams(top_k=1, repetition_penalty=rp, early_stop_num=int(io["early_stop_num"]))
    n = N_PROMPT_PHONES
    req = SemanticRequest(io["phone_ids"][0, n:], io["bert_feature"][0, :, n:], _voice(io), params)
    expected = io[f"greedy_{key}_y"][0, -int(io[f"greedy_{key}_idx"]):]
    assert len(expected) == {"rp135": 25, "rp100": 11}[key]
    np.testing.assert_array_equal(generate(model, [req])[0], expected)
    naive = naive_generate(model, io["phone_ids"][0], io["bert_feature"][0], io["prompt_semantic"][0], params)
    np.testing.assert_array_equal(naive, expected)


def test_reference_free(model: Text2SemanticModel, io: dict[str, np.ndarray]) -> None:
    phones, bert, expected = io["reffree_phone_ids"][0], io["reffree_bert_feature"][0], io["reffree_y"][0]
    logits = _teacher_forced_logits(model, phones, bert, np.zeros(0, np.int64), expected[:-1])
    np.testing.assert_allclose(logits, io["reffree_logits_raw"], atol=1e-4, rtol=0)
    params = SamplingParams(top_k=1, repetition_penalty=1.35, early_stop_num=20)
    out = generate(model, [SemanticRequest(phones, bert, _free_voice(), params)])[0]
    assert len(out) == 21  # early stop keeps every token when there is no prompt (upstream returns idx 0)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(naive_generate(model, phones, bert, np.zeros(0, np.int64), params), expected)


def test_batched_matches_upstream_batch(model: Text2SemanticModel, io: dict[str, np.ndarray]) -> None:
    n = N_PROMPT_PHONES
    params = SamplingParams(top_k=1, repetition_penalty=1.35, early_stop_num=40)
    reqs = [SemanticRequest(io[f"batch{i}_phone_ids"][n:], io[f"batch{i}_bert_feature"][:, n:], _voice(io), params)
            for i in range(2)]
    outs = generate(model, reqs)
    for i in range(2):
        expected = io[f"batch{i}_y"][-int(io[f"batch{i}_idx"]):]
        np.testing.assert_array_equal(outs[i], expected)
        np.testing.assert_array_equal(io[f"batch{i}_naive_y"][0, -int(io[f"batch{i}_naive_idx"]):], expected)
    assert [len(o) for o in outs] == [25, 27]


@pytest.mark.parametrize("case", range(5))
def test_sampler_probabilities(golden_dir: Path, case: int) -> None:
    with np.load(golden_dir / "sampling_io.npz") as f:
        logits, prev, probs = f[f"case{case}_logits"], f[f"case{case}_previous_tokens"], f[f"case{case}_probs"]
        params = json.loads(str(f[f"case{case}_params"]))
    x = torch.as_tensor(logits)
    out = logits_to_probs(x, torch.as_tensor(prev), **params)
    np.testing.assert_allclose(out.numpy(), probs, atol=1e-6, rtol=0)
    np.testing.assert_array_equal(x.numpy(), logits)  # input untouched


@pytest.mark.parametrize("case", [1, 3])  # V=1024: upstream's first 11 steps, EOS column cut
def test_batched_sampler_eos_cut_matches(golden_dir: Path, case: int) -> None:
    """sample_step masks EOS for steps < 11 instead of cutting the column; the samples' support must be the same."""
    with np.load(golden_dir / "sampling_io.npz") as f:
        logits, prev, probs = f[f"case{case}_logits"], f[f"case{case}_previous_tokens"], f[f"case{case}_probs"]
        params = json.loads(str(f[f"case{case}_params"]))
    full = torch.cat([torch.as_tensor(logits), torch.full((2, 1), 50.0)], dim=1)  # a huge EOS logit, masked
    seen = torch.zeros(2, 1025, dtype=torch.bool).scatter_(1, torch.as_tensor(prev), True)
    state = SamplerState.allocate(2, "cpu")
    for row in range(2):
        state.set_row(row, SamplingParams(**params, seed=row), 1025)
    support = probs > 0
    for step in range(10):
        toks, stop = sample_step(full, seen, torch.full((2,), step), state, params["top_k"], params["top_p"] < 1)
        assert not stop.any()
        assert all(support[r, int(toks[r])] for r in range(2))


def test_sampler_draws_follow_probabilities() -> None:
    """The exponential race with hashed noise samples from softmax: frequencies over 4000 seeds match probs."""
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0] + [-30.0] * 1020])
    n = 4000
    state = SamplerState.allocate(n, "cpu")
    for row in range(n):
        state.set_row(row, SamplingParams(top_k=5, repetition_penalty=1.0, seed=row), 1025)
    toks, _ = sample_step(logits.expand(n, -1), torch.zeros(n, 1025, dtype=torch.bool), torch.full((n,), 20), state,
                          5, False)
    freq = np.bincount(toks.numpy(), minlength=5)[:5] / n
    expected = torch.softmax(logits[0, :5], 0).numpy()
    np.testing.assert_allclose(freq, expected, atol=0.025)  # ~3 standard errors at n=4000
