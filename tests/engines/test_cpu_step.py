"""The fused CPU decode step (engines/gpt_sovits/cpu_step.c): built once per CPU and cached, the same numbers with
one thread or two and on CPUs without AVX2 (its portable path), and the TorchScript step where no compiler exists.

Its conformance against upstream is the GPT's (test_gpt_decode.py and the golden tests run it, as the CPU default),
and its int8 is proven in test_int8_proof.py.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from engines.gpt_sovits import cpu_step
from engines.gpt_sovits.gpt import Text2SemanticModel, build_random_gpt

pytestmark = pytest.mark.usefixtures("one_torch_thread")

if cpu_step.load_library() is None:
    pytest.skip(f"the fused CPU step cannot be built here: {cpu_step.unavailable_reason()}", allow_module_level=True)


@pytest.fixture(scope="module")
def gpt() -> Text2SemanticModel:
    return build_random_gpt("tiny", seed=3).use_fused_step(cpu_step.load_library())


def _decode(model: Text2SemanticModel, lib=None, steps: int = 5, fused: bool = True) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Prefill two rows, then decode them together (by slot index): ``[steps, 2, vocab]`` logits."""
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        model.setup_caches(3, 128)
        if lib is not None:
            model._fused = model._fused_step(lib)
        assert (model._fused is not None) == fused
        starts = []
        for slot, n in ((0, 17), (2, 29)):
            phones = torch.randint(1, 700, (n,), generator=g)
            prompt = torch.randint(0, 1024, (n // 2,), generator=g)
            model.prefill(slot, phones, torch.randn(1024, n, generator=g) * 0.1, prompt)
            starts.append(n + n // 2)
        out = []
        for i in range(steps):
            pos = torch.tensor([starts[0] + i, starts[1] + i])
            out.append(model.decode_step(torch.tensor([4 + i, 900 - i]), pos, torch.tensor([0, 2]), 64))
    return torch.stack(out)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_two_threads_compute_the_same_numbers(gpt: Text2SemanticModel, precision: str) -> None:
    """Threads split output rows and attention heads, never a sum: the result is bit-identical."""
    model = copy.deepcopy(gpt)
    if precision == "int8":
        model.quantize_int8()
    try:
        assert cpu_step.set_threads(1) == 1
        one = _decode(copy.deepcopy(model))
        assert cpu_step.set_threads(2) == 2
        two = _decode(copy.deepcopy(model))
    finally:
        cpu_step.set_threads(1)
    assert torch.equal(one, two)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_portable_path_equals_the_avx2_path(gpt: Text2SemanticModel, precision: str, tmp_path) -> None:
    """A CPU without AVX2/FMA runs the C fallback loops: the same maths, fp32 summation order apart (int8 also
    writes its cache in bf16, where a last-bit difference can round a value to the neighbouring bf16: measured
    3.8e-4 at most on logits of about 3)."""
    cc = cpu_step.find_compiler()
    assert cc is not None
    portable = cpu_step.build_library(cc, (*cpu_step.CFLAGS, "-mno-avx2", "-mno-fma", "-mno-avx"), tmp_path)
    model = copy.deepcopy(gpt)
    if precision == "int8":
        model.quantize_int8()
    fast = _decode(copy.deepcopy(model))
    slow = _decode(copy.deepcopy(model), portable)
    torch.testing.assert_close(slow, fast, atol=2e-5 if precision == "fp32" else 2e-3, rtol=0)


def test_built_once_per_cpu_and_compiler(tmp_path) -> None:
    """The build is cached under a name that covers source, compiler, flags and CPU; a second load reuses it."""
    cc = cpu_step.find_compiler()
    assert cc is not None
    cpu_step.build_library(cc, directory=tmp_path)
    (built,) = tmp_path.glob("cpu_step-*.so")
    stamp = built.stat().st_mtime_ns
    cpu_step.build_library(cc, directory=tmp_path)
    assert list(tmp_path.glob("cpu_step-*.so")) == [built] and built.stat().st_mtime_ns == stamp
    cpu_step.build_library(cc, (*cpu_step.CFLAGS, "-DVB_STALL_NS=1000000"), tmp_path)  # other flags: another file
    assert len(list(tmp_path.glob("cpu_step-*.so"))) == 2
    assert not list(tmp_path.glob("*.tmp*"))


def test_a_failing_compiler_is_an_os_error_with_its_message(tmp_path) -> None:
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo fake 1.0; exit 0; fi\necho 'no room' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(OSError, match="no room"):
        cpu_step.build_library(str(fake), directory=tmp_path / "k")
    assert not list((tmp_path / "k").glob("*"))  # no half-written library left


def test_without_a_compiler_the_model_decodes_with_torchscript(gpt: Text2SemanticModel, monkeypatch) -> None:
    """No compiler: the plan says why and how to fix it, and the model without the fused step decodes the same
    logits with TorchScript."""
    from engines.plan import Settings, plan_engine, probe_machine

    fused = _decode(copy.deepcopy(gpt))
    monkeypatch.setattr(cpu_step, "load_library", lambda: None)
    monkeypatch.setattr(cpu_step, "_reason", "no C compiler found (install gcc: apt-get install gcc)")
    plan = plan_engine(Settings(backend="torch", device="cpu"), probe_machine())
    assert plan.gpt_runner == "torch" and "no C compiler found (install gcc" in plan.describe()
    plain = _decode(copy.deepcopy(gpt).use_fused_step(None), fused=False)
    torch.testing.assert_close(plain, fused, atol=1e-5, rtol=0)


def test_kernel_dir_follows_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("VOICEBOT_KERNEL_DIR", str(tmp_path / "k"))
    assert cpu_step.kernel_dir() == tmp_path / "k"
    monkeypatch.delenv("VOICEBOT_KERNEL_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c"))
    assert cpu_step.kernel_dir() == tmp_path / "c" / "voicebot" / "kernels"
    assert os.environ.get("VOICEBOT_KERNEL_DIR") is None


def test_an_idle_team_sleeps(gpt: Text2SemanticModel) -> None:
    """Between utterances the worker thread blocks: an idle bot must not keep a core busy (a spinning worker would
    use about 0.5 s of CPU in the half second measured)."""
    import time

    try:
        cpu_step.set_threads(2)
        _decode(copy.deepcopy(gpt))
        time.sleep(0.3)  # past the worker's spin, yield and nap phases
        cpu0 = time.process_time()
        time.sleep(0.5)
        assert time.process_time() - cpu0 < 0.1
        again = _decode(copy.deepcopy(gpt))  # and it wakes for the next step
    finally:
        cpu_step.set_threads(1)
    torch.testing.assert_close(again, _decode(copy.deepcopy(gpt)), atol=0, rtol=0)


def test_the_c_sampler_draws_what_the_torch_sampler_draws() -> None:
    """BatchDecoder's CPU sampling (one C call) against sampling.sample_step on random logits: the same tokens and
    stops for greedy, top-k 5/15/100/all, temperatures and penalties, early-EOS steps and dead rows; the bookkeeping
    (token written at its step, marked seen, EOS step, steps advanced by live) as _sample_rows does it."""
    from engines.base import SamplingParams
    from engines.gpt_sovits.sampling import MIN_STEPS_BEFORE_EOS, SamplerState, sample_step

    vocab, rows, eos = 1025, 5, 1024
    sampler = cpu_step.Sampler(cpu_step.load_library(), vocab, eos, MIN_STEPS_BEFORE_EOS)
    state = SamplerState.allocate(rows, "cpu")
    for r, (k, t, rp) in enumerate([(1, 1.0, 1.35), (5, 0.7, 1.0), (15, 1.3, 2.0), (100, 1.0, 1.35), (1025, 0.5, 1.1)]):
        state.set_row(r, SamplingParams(top_k=k, temperature=t, repetition_penalty=rp, seed=r), vocab)
    g = torch.Generator().manual_seed(0)
    stops = 0
    for _ in range(400):
        logits = torch.randn(rows, vocab, generator=g) * 3
        logits[:, eos] += torch.rand(rows, generator=g) * 6  # EOS often near the top
        seen = torch.rand(rows, vocab, generator=g) < 0.1
        steps = torch.randint(0, 30, (rows,), generator=g)
        live = (torch.rand(rows, generator=g) < 0.8).long()
        want, stop = sample_step(logits, seen, steps, state, vocab, False, eos)
        tokens = torch.zeros(rows, 1501, dtype=torch.long)
        eos_at, nxt, steps_after, seen_after = torch.full((rows,), -1), torch.zeros(rows, dtype=torch.long), \
            steps.clone(), seen.clone()
        sampler(logits, seen_after, tokens, steps_after, eos_at, nxt, live, state.top_k, state.temperature,
                state.repetition_penalty, state.key)
        assert torch.equal(nxt, want)
        assert torch.equal(tokens.gather(1, steps[:, None])[:, 0], want)
        assert torch.equal(eos_at, torch.where(stop & (live > 0), steps, torch.full_like(steps, -1)))
        assert torch.equal(steps_after, steps + live)
        assert torch.equal(seen_after, seen.scatter(1, want[:, None], True))
        stops += int(stop.sum())
    assert stops > 20  # the EOS paths ran (32 with this seed)


def test_decoder_tokens_are_the_same_with_the_torch_sampler(gpt: Text2SemanticModel) -> None:
    """A seeded batch through BatchDecoder: C sampling and torch sampling give the same tokens."""
    import numpy as np

    from engines.base import SamplingParams
    from engines.gpt_sovits import generate as gen

    rng = np.random.default_rng(0)
    args = [(rng.integers(1, 700, n), rng.normal(0, 0.1, (1024, n)).astype(np.float32), rng.integers(0, 1024, n // 2))
            for n in (17, 29)]

    def run(c_sampler: bool) -> list[np.ndarray]:
        dec = gen.BatchDecoder(copy.deepcopy(gpt), 2, 256)
        assert dec._c_sampler is not None
        if not c_sampler:
            dec._c_sampler = None
        for i, a in enumerate(args):
            dec.add(i, *a, SamplingParams(top_k=15, seed=7 + i, early_stop_num=60))
        out: dict[int, np.ndarray] = {}
        while dec.active:
            out.update(dec.step())
        return [out[0], out[1]]

    with_c, with_torch = run(True), run(False)
    assert all(len(a) > 10 for a in with_c)
    for a, b in zip(with_c, with_torch):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rows", [1, 3])
def test_one_linear_through_the_step_products(rows: int) -> None:
    """cpu_step.linear (the int8 prefill's last row): the product of the dequantised weights, within the rounding of
    the activations to 15 bits (int8), exactly fp32's sums (fp32); bad arguments are refused."""
    lib = cpu_step.load_library()
    if lib is None:
        pytest.skip(f"fused step unavailable: {cpu_step.unavailable_reason()}")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=g)
    bias, x = torch.randn(96, generator=g), torch.randn(rows, 64, generator=g)
    torch.testing.assert_close(cpu_step.linear(lib, w, None, bias, x), x @ w.T + bias, rtol=1e-5, atol=1e-5)
    scale = w.abs().amax(1) / 127
    q = torch.round(w / scale[:, None]).to(torch.int8)
    ref = x @ (q.float() * scale[:, None]).T + bias
    got = cpu_step.linear(lib, q, scale, bias, x)
    assert got.shape == (rows, 96) and float((got - ref).abs().max()) < 1e-3 * float(ref.abs().max())
    assert float((cpu_step.linear(lib, q, scale, None, x) - (ref - bias)).abs().max()) < 1e-3 * float(ref.abs().max())
    with pytest.raises(ValueError, match="int8 \\(with a scale\\)"):
        cpu_step.linear(lib, q, None, bias, x)
    with pytest.raises(ValueError, match="refused"):
        cpu_step.linear(lib, w, None, bias, torch.randn(cpu_step.MAX_ROWS + 1, 64))


def test_rows_together_equal_each_row_alone() -> None:
    """The int8 products widen each weight once for a group of up to 4 rows (4, 3 or 2, then one at a time): every
    row of a batch equals the same row decoded alone, bit for bit (integer sums), for every way a batch splits."""
    lib = cpu_step.load_library()
    if lib is None:
        pytest.skip(f"fused step unavailable: {cpu_step.unavailable_reason()}")
    g = torch.Generator().manual_seed(1)
    q = torch.randint(-127, 128, (40, 2048), generator=g, dtype=torch.int8)
    scale, bias = torch.rand(40, generator=g) * 1e-2, torch.randn(40, generator=g)
    x = torch.randn(cpu_step.MAX_ROWS, 2048, generator=g)
    alone = torch.cat([cpu_step.linear(lib, q, scale, bias, x[i:i + 1]) for i in range(x.shape[0])])
    for rows in range(1, cpu_step.MAX_ROWS + 1):
        assert torch.equal(cpu_step.linear(lib, q, scale, bias, x[:rows]), alone[:rows]), rows
