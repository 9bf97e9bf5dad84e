"""The DiT's steps replayed from CUDA graphs (``engines.gpt_sovits.dit_graphs``) against the eager DiT on the same
GPU, on the golden tiny models (skipped without CUDA; what a graph records is checked on the CPU too).

The sentence's whole chunked mel with the family's default steps and guidance, upstream's noise per chunk: in fp32
the replayed steps give the eager steps' mel within :data:`ATOL_FP32`, in fp16 within :data:`ATOL_FP16`; every
shape is recorded once and replayed after, and past ``max_graphs`` the least recently used graph is dropped.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from engines.gpt_sovits.cfm import MelPrompt, synthesize_mel
from engines.gpt_sovits.dit_checkpoint import load_dit_sovits_checkpoint
from engines.gpt_sovits.dit_graphs import CudaGraphDit
from engines.gpt_sovits.mel import norm_spec
from engines.gpt_sovits.mel_sovits import MelSoVITS
from tests.golden_v4v5 import GoldenV4V5

cuda = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# The same kernels on the same inputs, launched from a graph instead of one by one: only a different choice of
# cuBLAS algorithm could change a sum's order, so fp32 holds to the DiT paths' fp32 bound on the CPU
ATOL_FP32 = 2e-5
# fp16: one different rounding in a product grows through 32 Euler steps; the mel's range is about 10
ATOL_FP16 = 2e-2


def _mel(golden_v4v5: GoldenV4V5, family: str, dtype: torch.dtype, estimator_of) -> tuple[Tensor, object]:
    sovits = MelSoVITS.from_checkpoint(load_dit_sovits_checkpoint(golden_v4v5.sovits_file(family)), "cuda", dtype)
    spec = sovits.family
    io, run = golden_v4v5.io(family), golden_v4v5.run(family, "default")
    ref = norm_spec(golden_v4v5.ref_log_mel(spec.mel_rate))
    prompt = MelPrompt.from_reference(io["fea_ref"].cuda().to(dtype), ref.cuda().to(dtype), spec)

    def noise(k: int, frames: int) -> Tensor:
        return io[f"chunk{k}_noise"].cuda().to(dtype)

    estimator = estimator_of(sovits.dit)
    with torch.inference_mode():
        mel = synthesize_mel(estimator, prompt, io["fea_todo"].cuda().to(dtype), spec, run["steps"], run["cfg"], noise)
    return mel.float().cpu(), estimator


@cuda[0]
@cuda[1]
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_replayed_cuda_steps_give_the_eager_mel(golden_v4v5: GoldenV4V5, family: str, dtype: torch.dtype) -> None:
    eager, _ = _mel(golden_v4v5, family, dtype, lambda dit: dit)
    graphed, est = _mel(golden_v4v5, family, dtype, CudaGraphDit)
    assert isinstance(est, CudaGraphDit)
    io, calls = golden_v4v5.io(family), golden_v4v5.run(family, "default")["cfm_call_args"]
    lengths = {int(io[f"chunk{k}_mu"].shape[1]) for k in range(len(calls))}  # one graph per length (rows fixed)
    assert est.captures == len(lengths) and est.captures + est.replays == sum(c["n_timesteps"] for c in calls)
    assert float(eager.abs().max()) > 0.1  # a real mel, not zeros on both sides
    bound = ATOL_FP32 if dtype == torch.float32 else ATOL_FP16
    assert float((graphed - eager).abs().max()) < bound


@cuda[0]
@cuda[1]
def test_cuda_graphs_past_the_limit_drop_the_least_recent(golden_v4v5: GoldenV4V5, family: str) -> None:
    sovits = MelSoVITS.from_checkpoint(load_dit_sovits_checkpoint(golden_v4v5.sovits_file(family)), "cuda")
    dit = sovits.dit
    est = CudaGraphDit(dit, max_graphs=1)
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for frames in (40, 56, 40):  # a second length evicts the first; the first again is recorded again
            cond = torch.randn(1, frames, 100, generator=gen).cuda()
            text = torch.randn(1, frames, dit.cfg.text_dim, generator=gen).cuda()
            times = torch.tensor([0.0, 0.5]).cuda()
            prep = est.prepare(cond, text, times, times if dit.cfg.step_embedding else None)
            x = torch.randn(1, frames, 100, generator=gen).cuda()
            for k in range(2):
                assert torch.allclose(est.step(x, prep, k), dit.step(x, prep, k), atol=ATOL_FP32)
    assert (est.captures, est.replays, len(est.graphs)) == (3, 3, 1)


@torch.inference_mode()
def test_what_a_cuda_graph_records_is_the_steps_velocity(golden_v4v5: GoldenV4V5, family: str) -> None:
    """The recorded body, fed one step's buffers (its own modulations among them), is ``DiT.step`` at that step: on
    the CPU, so every machine checks what the GPU replays."""
    dit = MelSoVITS.from_checkpoint(load_dit_sovits_checkpoint(golden_v4v5.sovits_file(family))).dit
    est = CudaGraphDit(dit)
    gen = torch.Generator().manual_seed(0)
    frames = 48
    times = torch.tensor([0.0, 0.25, 0.5])
    prep = est.prepare(torch.randn(1, frames, 100, generator=gen), torch.randn(1, frames, dit.cfg.text_dim,
                                                                             generator=gen),
                       times, times if dit.cfg.step_embedding else None, negative="audio")
    x = torch.randn(1, frames, 100, generator=gen)
    for k in range(len(times)):
        body = est._run(x, prep.static, *prep.rope, prep.block_mods[k], prep.final_mods[k])
        assert torch.equal(body, dit.step(x, prep, k))
        assert torch.equal(est.step(x, prep, k), body)  # off the GPU: the eager step
    assert est.captures == 0
