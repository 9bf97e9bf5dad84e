"""The GPT and its sampler against upstream GPT-SoVITS outputs on the golden tiny checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engines.base import SamplingParams, SemanticRequest
from engines.gpt_sovits.checkpoint import load_gpt_checkpoint
from engines.gpt_sovits.generate import generate
from engines.gpt_sovits.gpt import Text2SemanticModel
from engines.gpt_sovits.naive import naive_generate
from engines.gpt_sovits.sampling import SamplerState, logits_to_probs, sample_step
from tests.golden import Golden, teacher_forced_logits

pytestmark = [pytest.mark.conformance, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def io(golden: Golden) -> dict[str, np.ndarray]:
    return golden.gpt_io


@pytest.fixture(scope="module")
def model(golden: Golden) -> Text2SemanticModel:
    return Text2SemanticModel.from_checkpoint(load_gpt_checkpoint(golden.gpt_path))


def _teacher_forced_logits(model: Text2SemanticModel, phones, bert, prompt, fed) -> np.ndarray:
    """Raw logits at every step, feeding upstream's tokens, through cache slot 1 (exercises slot addressing)."""
    return teacher_forced_logits(model, phones, bert, prompt, fed, slot=1)


def test_embeddings(model: Text2SemanticModel, io: dict[str, np.ndarray]) -> None:
    with torch.inference_mode():
        x = model.embed_text(torch.as_tensor(io["phone_ids"]), torch.as_tensor(io["bert_feature"]))
        y = model.embed_prompt(torch.as_tensor(io["prompt_semantic"]))
    np.testing.assert_allclose(x.numpy(), io["x_emb"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(y.numpy(), io["prompt_y_pos"], atol=1e-5, rtol=0)


def test_greedy_logits_per_step(model: Text2SemanticModel, golden: Golden) -> None:
    for case in golden.greedy.values():
        logits = _teacher_forced_logits(model, case.phones, case.bert, case.prompt, case.fed)
        assert logits.shape == case.logits_raw.shape, case.key
        np.testing.assert_allclose(logits, case.logits_raw, atol=1e-4, rtol=0, err_msg=case.key)


def test_greedy_tokens_exact(model: Text2SemanticModel, golden: Golden, io: dict[str, np.ndarray]) -> None:
    for key, case in golden.greedy.items():
        req = golden.request(case, seed=None)
        expected = io[f"greedy_{key}_y"][0, -int(io[f"greedy_{key}_idx"]):]
        # upstream's stored lengths (meta.json) and tokens (y = prompt + new tokens) agree
        assert len(expected) == golden.meta["gpt"]["greedy"][key]["generated_len"] == len(case.generated)
        np.testing.assert_array_equal(io[f"greedy_{key}_y"][0, : len(golden.prompt_tokens)], golden.prompt_tokens)
        np.testing.assert_array_equal(generate(model, [req])[0], expected, err_msg=key)
        naive = naive_generate(model, case.phones, case.bert, case.prompt, case.params(seed=None))
        np.testing.assert_array_equal(naive, expected, err_msg=key)


def test_reference_free(model: Text2SemanticModel, golden: Golden) -> None:
    """The reference-free call's early_stop_num and penalty are in no array: tests/golden.py reads them from
    meta.json, or from the README bullet of the shared set (early_stop_num=20, R=1.35)."""
    case = golden.reffree
    logits = _teacher_forced_logits(model, case.phones, case.bert, case.prompt, case.fed)
    np.testing.assert_allclose(logits, case.logits_raw, atol=1e-4, rtol=0)
    assert len(case.generated) == golden.meta["gpt"]["reffree_generated_len"]
    out = generate(model, [golden.request(case, seed=None)])[0]
    if not case.stopped_by_eos:  # early stop keeps every token when there is no prompt (upstream returns idx 0)
        assert len(out) == case.early_stop_num + 1
    np.testing.assert_array_equal(out, case.generated)
    np.testing.assert_array_equal(naive_generate(model, case.phones, case.bert, case.prompt, case.params(None)),
                                  case.generated)


def test_batched_matches_upstream_batch(model: Text2SemanticModel, golden: Golden, io: dict[str, np.ndarray]) -> None:
    n, items = golden.n_prompt_phones, golden.batch_items
    assert len(items) >= 2 and len({len(ph) for ph, _, _ in items}) > 1  # different lengths: upstream pads
    for ph, _, _ in items:  # every item starts with the golden prompt's phones (the batch shares one prompt)
        np.testing.assert_array_equal(ph[:n], golden.phones[:n])
    reqs = [SemanticRequest(ph[n:], bert[:, n:], golden.voice(), golden.batch_params) for ph, bert, _ in items]
    outs = generate(model, reqs)
    for i, (_, _, expected) in enumerate(items):
        np.testing.assert_array_equal(outs[i], expected)
        np.testing.assert_array_equal(io[f"batch{i}_naive_y"][0, -int(io[f"batch{i}_naive_idx"]):], expected)
    assert [len(o) for o in outs] == [int(io[f"batch{i}_idx"]) for i in range(len(items))]


def _sampling_cases(golden: Golden) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, dict]]:
    """``{case: (logits [2, V], previous_tokens [2, T], probs [2, V], params)}`` of sampling_io.npz."""
    f = golden.sampling_io
    ids = sorted(int(k[len("case"):-len("_params")]) for k in f if k.startswith("case") and k.endswith("_params"))
    assert ids, "sampling_io.npz has no cases"
    return {c: (f[f"case{c}_logits"], f[f"case{c}_previous_tokens"], f[f"case{c}_probs"],
                json.loads(str(f[f"case{c}_params"]))) for c in ids}


def test_sampler_probabilities(golden: Golden) -> None:
    for case, (logits, prev, probs, params) in _sampling_cases(golden).items():
        x = torch.as_tensor(logits)
        out = logits_to_probs(x, torch.as_tensor(prev), **params)
        np.testing.assert_allclose(out.numpy(), probs, atol=1e-6, rtol=0, err_msg=f"case {case}")
        np.testing.assert_array_equal(x.numpy(), logits)  # input untouched


def test_batched_sampler_eos_cut_matches(golden: Golden) -> None:
    """sample_step masks EOS for steps < 11 instead of cutting the column; the samples' support must be the same.

    The cases with one column fewer than the vocabulary imitate upstream's first 11 steps (EOS column cut)."""
    vocab = int(golden.gpt_config["vocab_size"])
    cut = {c: v for c, v in _sampling_cases(golden).items() if v[0].shape[1] == vocab - 1}
    assert cut, "sampling_io.npz has no EOS-cut case"
    for case, (logits, prev, probs, params) in cut.items():
        rows = logits.shape[0]
        full = torch.cat([torch.as_tensor(logits), torch.full((rows, 1), 50.0)], dim=1)  # a huge EOS logit, masked
        seen = torch.zeros(rows, vocab, dtype=torch.bool).scatter_(1, torch.as_tensor(prev), True)
        state = SamplerState.allocate(rows, "cpu")
        for row in range(rows):
            state.set_row(row, SamplingParams(**params, seed=row), vocab)
        support = probs > 0
        for step in range(10):
            toks, stop = sample_step(full, seen, torch.full((rows,), step), state, params["top_k"],
                                     params["top_p"] < 1)
            assert not stop.any()
            assert all(support[r, int(toks[r])] for r in range(rows)), f"case {case}"


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
