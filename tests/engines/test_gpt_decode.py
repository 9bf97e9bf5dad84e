"""The continuous-batching decoder: batching, joining, cancelling and syncing never change a request's tokens."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

from engines.base import EngineError, ModelFormatError, SamplingParams, SemanticRequest, VoicePrompt
from engines.gpt_sovits.checkpoint import load_gpt_checkpoint
from engines.gpt_sovits.generate import BatchDecoder, CudaGraphStep, generate
from engines.gpt_sovits.gpt import KV_BUCKET, Text2SemanticModel, build_random_gpt
from engines.gpt_sovits.naive import naive_generate
from engines.gpt_sovits.tiny import GPT_SIZES, gpt_state_dict
from tests.golden import Golden

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SAMPLED = dict(top_k=15, top_p=1.0, temperature=1.0, repetition_penalty=1.35)


@pytest.fixture(scope="module")
def model(golden: Golden) -> Text2SemanticModel:
    return Text2SemanticModel.from_checkpoint(load_gpt_checkpoint(golden.gpt_path))


@pytest.fixture(scope="module")
def inputs(golden: Golden) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Four requests of different lengths: (all phones, BERT, prompt tokens); the last is reference-free.

    Cut from the golden inputs by fractions, so any golden set gives four distinct requests."""
    ph, bert, prompt = golden.phones, golden.bert, golden.prompt_tokens
    n, a, b = golden.n_prompt_phones, 3 * len(ph) // 4, len(ph) // 8 or 1
    p, q = 5 * len(prompt) // 8, len(prompt) // 8 or 1
    return [
        (ph, bert, prompt),
        (ph[:a], bert[:, :a], prompt[:p]),
        (ph[b:], bert[:, b:], prompt[q:]),
        (ph[n:], bert[:, n:], np.zeros(0, np.int64)),
    ]


def _kv_len(positions: int) -> int:
    """The decoder's bucketed attention length covering ``positions`` cache entries."""
    return -(-positions // KV_BUCKET) * KV_BUCKET


def _solo(model: Text2SemanticModel, inp, params: SamplingParams) -> np.ndarray:
    dec = BatchDecoder(model, 1, 512)
    dec.add("x", *inp, params)
    while True:
        done = dec.step()
        if done:
            return done[0][1]


def _run(dec: BatchDecoder, results: dict) -> None:
    while dec.active:
        results.update(dec.step())


def test_seeded_batch_equals_solo(model, inputs) -> None:
    params = [SamplingParams(**SAMPLED, seed=100 + i, early_stop_num=60) for i in range(len(inputs))]
    solo = [_solo(model, inp, p) for inp, p in zip(inputs, params)]
    assert len({tuple(s) for s in solo}) == len(solo)
    assert any(len(s) < 60 for s in solo) and all(len(s) >= 11 for s in solo)  # some stop by EOS
    dec = BatchDecoder(model, 4, 512)
    for i, (inp, p) in enumerate(zip(inputs, params)):
        dec.add(i, *inp, p)
    results: dict = {}
    _run(dec, results)
    for i in range(len(inputs)):
        np.testing.assert_array_equal(results[i], solo[i])
    # the same seed again gives the same tokens; another seed gives others
    np.testing.assert_array_equal(_solo(model, inputs[0], params[0]), solo[0])
    other = _solo(model, inputs[0], SamplingParams(**SAMPLED, seed=7, early_stop_num=60))
    assert not np.array_equal(other, solo[0])


def test_continuous_join_and_slot_reuse_equal_solo(model, inputs) -> None:
    params = [SamplingParams(**SAMPLED, seed=i, early_stop_num=50) for i in range(len(inputs))]
    solo = [_solo(model, inp, p) for inp, p in zip(inputs, params)]
    dec = BatchDecoder(model, 2, 512, sync_every=3)
    results: dict = {}
    dec.add(0, *inputs[0], params[0])
    for _ in range(5):
        results.update(dec.step())
    dec.add(1, *inputs[1], params[1])  # joins 5 steps later, at a different position
    queue = [2, 3]
    while dec.active or queue:
        while queue and dec.free_slots:
            i = queue.pop(0)
            dec.add(i, *inputs[i], params[i])  # reuses a freed slot
        results.update(dec.step())
    for i in range(len(inputs)):
        np.testing.assert_array_equal(results[i], solo[i])


def test_greedy_batched_generate_equals_solo_and_naive(model, inputs, golden: Golden) -> None:
    params = SamplingParams(top_k=1, early_stop_num=45)
    ge = golden.ge  # the GPT never reads the style; any voice's will do
    def voice(n: int, inp) -> VoicePrompt:
        return VoicePrompt(inp[2], ge, inp[0][:n], inp[1][:, :n])

    reqs = [SemanticRequest(inp[0][5:], inp[1][:, 5:], voice(5, inp), params) for inp in inputs[:3]]
    reqs.append(SemanticRequest(inputs[3][0], inputs[3][1], golden.free_voice(), params))
    batched = generate(model, reqs)
    one_by_one = [generate(model, [r])[0] for r in reqs]
    naive = [naive_generate(model, *inp, params) for inp in inputs]
    for b, s, n in zip(batched, one_by_one, naive):
        np.testing.assert_array_equal(b, s)
        np.testing.assert_array_equal(b, n)


@pytest.mark.parametrize("sync_every", [1, 5, 64])
def test_sync_interval_does_not_change_tokens(model, inputs, sync_every: int) -> None:
    params = SamplingParams(**SAMPLED, seed=3, early_stop_num=80)
    expected = _solo(model, inputs[1], params)
    dec = BatchDecoder(model, 1, 512, sync_every=sync_every)
    dec.add("r", *inputs[1], params)
    results: dict = {}
    _run(dec, results)
    np.testing.assert_array_equal(results["r"], expected)


def test_early_stop_quirk_matches_naive(model, inputs, golden: Golden) -> None:
    """Stopped by early_stop_num (no EOS): upstream keeps the last sample and drops the first generated token."""
    greedy = golden.greedy.get("rp135") or next(iter(golden.greedy.values()))
    # limits below the golden greedy run's EOS step (inputs[0] with default rp 1.35 is that run)
    limits = sorted({0, 4, min(12, len(greedy.generated) - 1)}) if greedy.repetition_penalty == 1.35 else [0, 4]
    for esn in limits:
        params = SamplingParams(top_k=1, early_stop_num=esn)
        out = _solo(model, inputs[0], params)
        np.testing.assert_array_equal(out, naive_generate(model, *inputs[0], params))
        assert len(out) == max(esn, 1)
    # reference-free keeps every token
    out = _solo(model, inputs[3], SamplingParams(top_k=1, early_stop_num=4))
    assert len(out) == 5


def test_cancel_frees_slot_and_leaves_others_exact(model, inputs) -> None:
    params = [SamplingParams(**SAMPLED, seed=20 + i, early_stop_num=40) for i in range(3)]
    solo2 = _solo(model, inputs[2], params[2])
    dec = BatchDecoder(model, 2, 512)
    dec.add("a", *inputs[0], params[0])
    dec.add("b", *inputs[1], params[1])
    assert dec.free_slots == 0
    with pytest.raises(EngineError, match="slots are busy"):
        dec.add("c", *inputs[2], params[2])
    dec.step()
    assert dec.cancel("a") and not dec.cancel("a")
    assert dec.active == ("b",) and dec.free_slots == 1
    dec.add("c", *inputs[2], params[2])
    results: dict = {}
    _run(dec, results)
    assert set(results) == {"b", "c"}
    np.testing.assert_array_equal(results["c"], solo2)


def test_generate_should_stop_and_chunks(model, inputs, golden: Golden) -> None:
    n = golden.n_prompt_phones
    voice = golden.voice()
    reqs = [SemanticRequest(inputs[0][0][n:], inputs[0][1][:, n:], voice, SamplingParams(**SAMPLED, seed=s))
            for s in (1, 2)]
    chunks: dict[int, list[np.ndarray]] = {0: [], 1: []}
    calls = {"n": 0}

    def should_stop(i: int) -> bool:
        calls["n"] += 1
        return i == 1 and calls["n"] > 6

    out = generate(model, reqs, on_chunk=lambda i, t: chunks[i].append(t), should_stop=should_stop)
    assert out[1].size == 0  # cancelled
    assert len(out[0]) >= 11
    np.testing.assert_array_equal(np.concatenate(chunks[0]), out[0])  # stopped by EOS: chunks == result
    assert all(c.dtype == np.int64 and c.size for c in chunks[0])


def test_decode_step_slot_gather_equals_view(model, inputs) -> None:
    ph, bert, prompt = inputs[0]
    cut = len(prompt) - 2  # two rows of different lengths
    kv = _kv_len(len(ph) + len(prompt) + 1)
    with torch.inference_mode():
        model.setup_caches(3, kv)
        for slot in (0, 2):
            model.prefill(slot, torch.as_tensor(ph), torch.as_tensor(bert), torch.as_tensor(prompt[: cut + slot]))
        m2 = copy.deepcopy(model)
        pos = torch.tensor([len(ph) + cut, 0, len(ph) + cut + 2])
        toks = torch.tensor([5, 0, 9])
        by_view = model.decode_step(toks, pos, None, kv)
        by_gather = m2.decode_step(toks[[0, 2]], pos[[0, 2]], torch.tensor([0, 2]), kv)
    torch.testing.assert_close(by_gather, by_view[[0, 2]], atol=1e-5, rtol=0)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_fused_step_equals_scripted_and_python_loops(model, inputs, precision: str, monkeypatch) -> None:
    """CPU runs the decode layers as one fused C call (TorchScript where it cannot be built), CUDA as Python
    (graph-captured): all three compute the same (int8: the fused step rounds its activations to 15 bits inside the
    products, the loops use the dequantised weights as they are)."""
    from engines.gpt_sovits import cpu_step
    from engines.gpt_sovits import gpt as gpt_module

    if cpu_step.load_library() is None:
        pytest.skip(f"the fused CPU step cannot be built here: {cpu_step.unavailable_reason()}")
    base = copy.deepcopy(model)
    if precision == "int8":
        base.quantize_int8()
        assert base.int8_weights
    ph, bert, prompt = inputs[1]
    start = len(ph) + len(prompt)
    kv = _kv_len(start + 7)

    def run(m: Text2SemanticModel, fused: bool) -> torch.Tensor:
        lib = cpu_step.load_library()
        m.use_fused_step(lib)  # the same prefill for all three (int8: its last row by the library's product)
        with torch.inference_mode():
            m.setup_caches(2, kv)
            m.prefill(1, torch.as_tensor(ph), torch.as_tensor(bert), torch.as_tensor(prompt))
            m.use_fused_step(lib if fused else None)
            assert (m._fused is not None) == fused
            steps = [m.decode_step(torch.tensor([0, 7 + i]), torch.tensor([0, start + i]), None, kv)
                     for i in range(6)]
            steps.append(m.decode_step(torch.tensor([3]), torch.tensor([start + 6]), torch.tensor([1]), kv))
        return torch.cat([s[-1:] for s in steps])

    fused = run(copy.deepcopy(base), True)
    scripted = run(copy.deepcopy(base), False)
    assert gpt_module._layers_runner(torch.device("cpu")) is not gpt_module._decode_layers
    monkeypatch.setattr(gpt_module, "_layers_runner", lambda device: gpt_module._decode_layers)
    python = run(copy.deepcopy(base), False)
    torch.testing.assert_close(python, scripted, atol=1e-5, rtol=0)
    torch.testing.assert_close(fused, scripted, atol=1e-5 if precision == "fp32" else 0.02, rtol=0)
    assert not torch.equal(fused, scripted) or precision == "fp32"  # int8: really two computations
    if precision == "int8":  # and the int8 step stays close to the fp32 one
        fp32 = run(copy.deepcopy(model), True)
        assert (fused - fp32).abs().max().item() < 0.05 * fp32.abs().max().item()


def test_without_torchscript_the_python_loop_decodes(model, inputs, monkeypatch, caplog) -> None:
    """TorchScript is deprecated: where it cannot compile, the CPU decodes with the Python layer loop, same logits."""
    from engines.gpt_sovits import gpt as gpt_module

    ph, bert, prompt = inputs[0]

    start = len(ph) + len(prompt)
    kv = _kv_len(start + 3)

    def first_steps(m: Text2SemanticModel) -> torch.Tensor:
        with torch.inference_mode():
            m.setup_caches(1, kv)
            m.prefill(0, torch.as_tensor(ph), torch.as_tensor(bert), torch.as_tensor(prompt))
            return torch.stack([m.decode_step(torch.tensor([5 + i]), torch.tensor([start + i]), None, kv)[0]
                                for i in range(3)])

    scripted = first_steps(copy.deepcopy(model))

    def no_torchscript(fn):  # type: ignore[no-untyped-def]
        raise RuntimeError("TorchScript is not available in this build")

    monkeypatch.setattr(torch.jit, "script", no_torchscript)
    gpt_module._scripted_layers.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="engines.gpt_sovits.gpt"):
            fallback = first_steps(copy.deepcopy(model))
        assert gpt_module._layers_runner(torch.device("cpu")) is gpt_module._decode_layers
    finally:
        gpt_module._scripted_layers.cache_clear()  # the next test compiles again, with TorchScript
    assert "TorchScript could not compile the GPT layer loop (RuntimeError: TorchScript is not available" in caplog.text
    torch.testing.assert_close(fallback, scripted, atol=1e-5, rtol=0)


def test_request_too_long_for_cache(model, inputs) -> None:
    prefix = len(inputs[0][0]) + len(inputs[0][2])
    dec = BatchDecoder(model, 1, prefix + 31)
    with pytest.raises(EngineError, match="raise max_len"):
        dec.add("x", *inputs[0], SamplingParams(early_stop_num=-1))
    with pytest.raises(EngineError, match="raise max_len"):
        dec.add("x", *inputs[0], SamplingParams(early_stop_num=31))
    dec.add("y", *inputs[0], SamplingParams(top_k=1, early_stop_num=30))  # phones + prompt + 31 steps fit exactly


def test_int8_logits_close_to_fp32(model, inputs) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = copy.deepcopy(model).quantize_int8()
    ph, bert, prompt = inputs[0]
    with torch.inference_mode():
        out = []
        for m in (model, q):
            m.setup_caches(1, 256)
            out.append(m.prefill(0, torch.as_tensor(ph), torch.as_tensor(bert), torch.as_tensor(prompt)))
    err = (out[0] - out[1]).abs().max().item()
    assert err < 0.05 * out[0].abs().max().item()
    assert err > 0  # it really is a different (quantised) computation


def test_from_checkpoint_is_strict(golden: Golden) -> None:
    ckpt = load_gpt_checkpoint(golden.gpt_path)
    broken = dict(ckpt.state_dict)
    last = f"h.layers.{golden.gpt_config['n_layer'] - 1}.norm2.bias"
    del broken[last]
    head = broken["ar_predict_layer.weight"]
    broken["ar_predict_layer.weight"] = head[:, : head.shape[1] // 2]
    with pytest.raises(ModelFormatError, match=f"missing.*{last}.*ar_predict_layer.weight"):
        Text2SemanticModel.from_checkpoint(type(ckpt)(broken, ckpt.config, ckpt.info))
    with pytest.raises(ValueError, match="fp32, fp16 or bf16, got torch.float64"):
        Text2SemanticModel.from_checkpoint(ckpt, "cpu", torch.float64)


def test_build_random_gpt_sizes() -> None:
    """build_random_gpt("tiny") is the model set's tiny GPT (``models make-tiny``): same sizes, same tensors."""
    tiny = build_random_gpt("tiny", seed=1)
    cfg = tiny.config
    assert (cfg.dim, cfg.heads, cfg.layers) == GPT_SIZES["tiny"]
    assert (cfg.phoneme_vocab, cfg.vocab) == (732, 1025)  # the real v2 vocabularies
    assert sum(p.numel() for p in tiny.parameters()) == sum(t.numel() for t in gpt_state_dict("tiny", 1).values())
    with pytest.raises(ValueError):
        build_random_gpt("huge")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_fp32_greedy_matches_cpu(golden: Golden, inputs) -> None:
    ckpt = golden.gpt_checkpoint
    cpu = Text2SemanticModel.from_checkpoint(ckpt)
    gpu = Text2SemanticModel.from_checkpoint(ckpt, "cuda", torch.float32)
    params = SamplingParams(top_k=1, early_stop_num=40)
    for inp in inputs:
        np.testing.assert_array_equal(_solo(gpu, inp, params), _solo(cpu, inp, params))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_graph_replay_equals_eager(golden: Golden, inputs, dtype: torch.dtype) -> None:
    ckpt = golden.gpt_checkpoint
    results = []
    for use_graphs in (False, True):
        gpu = Text2SemanticModel.from_checkpoint(ckpt, "cuda", dtype)
        dec = BatchDecoder(gpu, 4, 512, bucket_rows=True)
        runner = CudaGraphStep(dec)
        if use_graphs:
            dec.run_step = runner
        for i, inp in enumerate(inputs):
            dec.add(i, *inp, SamplingParams(**SAMPLED, seed=i, early_stop_num=60))
        out: dict = {}
        _run(dec, out)
        results.append(out)
        if use_graphs:
            assert runner.replays > 20
    for i in range(len(inputs)):
        np.testing.assert_array_equal(results[1][i], results[0][i])


def test_a_cpu_prefill_drops_to_one_thread_when_its_layers_slow_down(model, inputs, monkeypatch) -> None:
    """Another process took a core: torch's threads then wait for each other at every op, so once the last
    PREFILL_SLOW_LAYERS layers ran PREFILL_SLOW times slower per position than the fastest seen, the rest of the prefill and the next PREFILL_SOLO
    prefills run on one thread; the same logits either way, and the caller's thread count comes back."""
    from engines.gpt_sovits import gpt as gpt_module

    ph, bert, prompt = (torch.as_tensor(a) for a in inputs[0])
    m = copy.deepcopy(model)
    seen: list[int] = []  # torch's thread count at each layer
    layer = m._prefill_layer
    slow = {"from": 10**9}  # layers from this one on take 10 s (a fake clock)
    clock = {"now": 0.0}

    def timed_layer(i, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(torch.get_num_threads())
        clock["now"] += 10.0 if len(seen) > slow["from"] else 0.001
        return layer(i, *args, **kwargs)

    monkeypatch.setattr(m, "_prefill_layer", timed_layer)
    monkeypatch.setattr(gpt_module.time, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(gpt_module, "PREFILL_SLOW_LAYERS", 1)  # (the tiny GPT has 3 layers, 2 of them timed)
    torch.set_num_threads(2)
    n = len(m.h.layers)
    with torch.inference_mode():
        m.setup_caches(1, 256)
        quiet = m.prefill(0, ph, bert, prompt)
        assert seen == [2] * n
        seen.clear()
        slow["from"] = 1  # the second layer on is slow (the last layer, one position's, is not timed): the third on
        shared = m.prefill(0, ph, bert, prompt)  # runs on one thread
        assert n >= 3 and seen == [2, 2] + [1] * (n - 2) and torch.get_num_threads() == 2
        for _ in range(gpt_module.PREFILL_SOLO):
            seen.clear()
            m.prefill(0, ph, bert, prompt)
            assert seen == [1] * n and torch.get_num_threads() == 2
        seen.clear()
        slow["from"] = 10**9
        m.prefill(0, ph, bert, prompt)
        assert seen == [2] * n  # then all threads again
    torch.testing.assert_close(shared, quiet, atol=1e-5, rtol=0)


@pytest.mark.parametrize("tx,tp", [(7, 0), (7, 12), (1, 20), (30, 3)])
def test_prefill_attention_text_and_audio_rows_apart_equal_the_masked_whole(tx: int, tp: int) -> None:
    """On a CPU the prefill attends text rows and audio rows apart: the same as one masked attention over all rows
    (text sees all text and no audio; audio sees all text and the audio up to itself), also for the last row alone
    (the last layer) and without audio rows (reference-free)."""
    from engines.gpt_sovits.gpt import _prefill_attention, _prefill_split  # pyright: ignore[reportPrivateUsage]

    torch.manual_seed(tx * 100 + tp)
    s = tx + tp
    q, k, v = (torch.randn(4, s, 8) for _ in range(3))
    allowed = torch.ones(s, s, dtype=torch.bool).tril_()
    allowed[:, :tx] = True
    split = _prefill_split(allowed, tx, torch.float32)  # the model's own split of this mask
    whole = _prefill_attention(q, k, v, allowed)  # (no split: one masked attention)
    assert torch.allclose(_prefill_attention(q, k, v, allowed, split), whole, atol=1e-6)
    last = _prefill_attention(q[:, -1:], k, v, allowed[-1:], split)
    assert torch.allclose(last, whole[:, -1:], atol=1e-6)
