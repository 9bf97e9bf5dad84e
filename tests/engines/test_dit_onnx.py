"""The DiT step as an ONNX graph (``engines.gpt_sovits.dit_onnx``) against the torch DiT on the golden tiny models.

* every step of every sampler call of the family's default run, with upstream's noise: the velocity of the graph
  under ONNX Runtime equals ``DiT.step``'s within :data:`ATOL_STEP`, at each chunk's frame count from one export,
  with the CFG negative as a second row where the run guides;
* the whole chunked mel sampled with :class:`OrtDit` against the torch DiT's within :data:`ATOL_MEL`;
* the graph passes ``onnx.checker`` and uses only operators TensorRT 10 parses, none forbidden;
* exporting leaves the torch path as it was, and a masked call (which the graph does not carry) runs in torch;
* ``engines build`` on a diffusion family exports and checks its graphs and says TensorRT engines are not built.

Families, steps, guidance and lengths come from the set's ``meta.json`` and arrays; each bound is checked to cover
twice the set's own fp32-vs-fp64 error.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import Tensor

import engines.gpt_sovits.dit as dit_module
from engines.base import EngineError
from engines.export import FORBIDDEN_OPS, TRT_SUPPORTED_OPS, check_graphs
from engines.gpt_sovits.cfm import CFG_EPS, MelPrompt, sample, synthesize_mel
from engines.gpt_sovits.dit import DiT
from engines.gpt_sovits.dit_checkpoint import load_dit_sovits_checkpoint
from engines.gpt_sovits.dit_onnx import GRAPH, OrtDit, export_dit_step
from engines.gpt_sovits.family import FamilySpec
from engines.gpt_sovits.mel import norm_spec
from engines.gpt_sovits.mel_sovits import MelSoVITS
from tests.golden import Golden
from tests.golden_v4v5 import GoldenV4V5

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Both sides are fp32 and differ only in their kernels' summation order (ONNX Runtime's fused LayerNorm and MLAS
# products against torch's): measured <= 2.7e-6 on velocities of magnitude <= 5, so 2e-5 leaves a margin of seven.
ATOL_STEP = 2e-5
# The whole chunked mel, after every Euler step and chunk: the DiT paths' fp32-vs-naive bound (measured <= 2e-6),
# fifty times below the conformance tests' 1e-3 against upstream.
ATOL_MEL = 2e-5
# Two fp32 evaluations of the same maths, each about the set's fp32-vs-fp64 error off the exact value, differ by up
# to twice it: each bound must cover that, so a set made the same way at other sizes gets a bound that can hold.
MARGIN = 2


@pytest.fixture(scope="module")
def spec_dit(golden_v4v5: GoldenV4V5, family: str) -> tuple[FamilySpec, DiT]:
    sovits = MelSoVITS.from_checkpoint(load_dit_sovits_checkpoint(golden_v4v5.sovits_file(family)))
    return sovits.family, sovits.dit


@pytest.fixture(scope="module")
def graph(spec_dit: tuple[FamilySpec, DiT]) -> bytes:
    return export_dit_step(spec_dit[1])


@pytest.fixture(scope="module")
def ort_dit(spec_dit: tuple[FamilySpec, DiT]) -> OrtDit:
    return OrtDit.from_dit(spec_dit[1], threads=1)


def _max_err(a: Tensor, b: Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max())


class _Both:
    """An estimator that runs both steps on the sampler's own ``x`` at every step, records their difference and the
    batch rows, and hands the sampler the torch velocity (so both see the same trajectory)."""

    def __init__(self, reference: DiT, other: OrtDit) -> None:
        self.reference, self.other = reference, other
        self.errors: list[float] = []
        self.rows: set[int] = set()
        self.frames: set[int] = set()

    def prepare(self, *args: Any, **kwargs: Any) -> Any:
        return self.reference.prepare(*args, **kwargs)

    def step(self, x: Tensor, prep: Any, k: int) -> Tensor:
        want = self.reference.step(x, prep, k)
        self.errors.append(_max_err(self.other.step(x, prep, k), want))
        self.rows.add(int(want.shape[0]))
        self.frames.add(int(want.shape[1]))
        return want


def test_tolerances_cover_the_sets_precision(golden_v4v5: GoldenV4V5, family: str) -> None:
    f64 = golden_v4v5.fp64(family)
    assert MARGIN * f64["dit_v_max_abs_diff"] < ATOL_STEP
    assert MARGIN * f64["cfm_chunk0_max_abs_diff"] < ATOL_MEL


@torch.inference_mode()
def test_each_step_equals_the_torch_step(golden_v4v5: GoldenV4V5, family: str, spec_dit: tuple[FamilySpec, DiT],
                                         ort_dit: OrtDit) -> None:
    """Every step of every sampler call of the default run (upstream's inputs and noise), one export."""
    spec, dit = spec_dit
    io = golden_v4v5.io(family)
    calls = golden_v4v5.run(family, "default")["cfm_call_args"]
    frames: set[int] = set()
    for k, call in enumerate(calls):
        both = _Both(dit, ort_dit)
        sample(both, io[f"chunk{k}_mu"], io[f"chunk{k}_prompt"], call["n_timesteps"], spec,
               call["inference_cfg_rate"], io[f"chunk{k}_noise"])
        assert len(both.errors) == call["n_timesteps"]
        assert both.rows == {2 if call["inference_cfg_rate"] > CFG_EPS else 1}  # the negative rides as row 1
        assert max(both.errors) < ATOL_STEP, f"chunk {k}: max abs error {max(both.errors):.3g}"
        frames |= both.frames
    assert len(frames) >= 2, "the run's calls all have one length: the frame axis is not exercised"


@torch.inference_mode()
def test_the_batch_axis_holds_the_negative(golden_v4v5: GoldenV4V5, family: str, spec_dit: tuple[FamilySpec, DiT],
                                           ort_dit: OrtDit) -> None:
    """Both negatives (v5's audio-only, v3/v4's audio and text) as a second row, on the golden single DiT call's
    inputs (another frame count than the sampler's chunks): each row equals the torch step's."""
    spec, dit = spec_dit
    io = golden_v4v5.io(family)
    x, cond, mu = (io[n].transpose(1, 2) for n in ("dit_x", "dit_cond", "dit_mu"))
    d = io.get("dit_d")  # v3/v4's step size; None for v5
    prep = dit.prepare(cond, mu, io["dit_t"], d, negative="audio" if spec.is_v5 else "audio+text")
    got, want = ort_dit.step(x, prep, 0), dit.step(x, prep, 0)
    assert got.shape[0] == 2 and _max_err(got, want) < ATOL_STEP


@torch.inference_mode()
def test_sampled_mel_equals_the_torch_dits(golden_v4v5: GoldenV4V5, family: str, spec_dit: tuple[FamilySpec, DiT],
                                           ort_dit: OrtDit) -> None:
    """The sentence's whole chunked mel, the family's default steps and guidance, upstream's noise per chunk."""
    spec, dit = spec_dit
    io, run = golden_v4v5.io(family), golden_v4v5.run(family, "default")
    prompt = MelPrompt.from_reference(io["fea_ref"], norm_spec(golden_v4v5.ref_log_mel(spec.mel_rate)), spec)

    def noise(k: int, frames: int) -> Tensor:
        return io[f"chunk{k}_noise"]

    mels = [synthesize_mel(est, prompt, io["fea_todo"], spec, run["steps"], run["cfg"], noise)
            for est in (dit, ort_dit)]
    assert float(mels[0].abs().max()) > 0.1  # a real mel, not zeros on both sides
    assert _max_err(mels[1], mels[0]) < ATOL_MEL


def test_graph_is_tensorrt_parsable(graph: bytes, tmp_path: Path) -> None:
    (tmp_path / f"{GRAPH}.onnx").write_bytes(graph)
    ops = set(check_graphs(tmp_path, (GRAPH,))[GRAPH])  # raises on a failed check; the sets again: what it holds
    assert ops <= TRT_SUPPORTED_OPS and not ops & FORBIDDEN_OPS, sorted(ops - TRT_SUPPORTED_OPS | ops & FORBIDDEN_OPS)


@torch.inference_mode()
def test_export_leaves_the_torch_path_alone(golden_v4v5: GoldenV4V5, family: str,
                                            spec_dit: tuple[FamilySpec, DiT]) -> None:
    """The export's traceable stand-ins are undone: the same functions, the same velocity to the bit."""
    spec, dit = spec_dit
    io = golden_v4v5.io(family)
    x, cond, mu = (io[n].transpose(1, 2) for n in ("dit_x", "dit_cond", "dit_mu"))
    prep = dit.prepare(cond, mu, io["dit_t"], io.get("dit_d"))
    rotate, functional = dit_module._rotate_first_head, dit_module.F  # pyright: ignore[reportPrivateUsage]
    before = dit.step(x, prep, 0)
    export_dit_step(dit)
    assert dit_module._rotate_first_head is rotate and dit_module.F is functional  # pyright: ignore[reportPrivateUsage]
    assert torch.equal(dit.step(x, prep, 0), before)


@torch.inference_mode()
def test_a_masked_call_runs_in_torch(golden_v4v5: GoldenV4V5, family: str, spec_dit: tuple[FamilySpec, DiT],
                                     ort_dit: OrtDit) -> None:
    spec, dit = spec_dit
    io = golden_v4v5.io(family)
    x, cond, mu = (io[n].transpose(1, 2) for n in ("dit_x", "dit_cond", "dit_mu"))
    lens = torch.tensor([x.shape[1] - 7])
    prep = ort_dit.prepare(cond, mu, io["dit_t"], io.get("dit_d"), x_lens=lens)
    assert prep.mask is not None
    assert torch.equal(ort_dit.step(x, prep, 0), dit.step(x, prep, 0))


# ---------------------------------------------------------------------------------------------------- engines build


def test_build_exports_and_checks_the_diffusion_graphs(golden_v4v5: GoldenV4V5, golden: Golden, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A v3/v4/v5 SoVITS: the DiT step and vocoder graphs, checked, and one line that TensorRT engines are not built."""
    from bot.config import EngineConfig
    from engines.build import build_engines

    family = golden_v4v5.families[0]
    models: Any = SimpleNamespace(gpt=golden.gpt_path, sovits=golden_v4v5.sovits_file(family),
                                  vocoder=golden_v4v5.vocoder_path(family), hubert=tmp_path / "no-hubert",
                                  bert=tmp_path / "no-bert")
    cfg = EngineConfig(backend="onnx", device="cpu", precision="fp32", onnx_dir=tmp_path / "onnx",
                       tensorrt_dir=tmp_path / "trt")
    produced = build_engines(cfg, models, backend="onnx")
    assert set(produced) == {"dit_step", "vocoder"} and all(p.is_file() for p in produced.values())
    with pytest.raises(EngineError, match="not built yet"):
        build_engines(cfg, models, backend="tensorrt")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="engines.build"):
        assert build_engines(cfg, models) == produced
    assert [r.getMessage().count("\n") for r in caplog.records] == [0]  # one warning, one line
    assert not (tmp_path / "trt").exists()
