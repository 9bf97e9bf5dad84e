"""The int8 GPT proven on the loaded model (engines/gpt_int8_proof.py): the built-in sentences are our front-end's,
the verdict's rules hold on hand-made logits, the golden checkpoint passes and keeps its verdict, a changed file proves
again, and a checkpoint whose weights int8 cannot round well runs in fp32 and the engine says so."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from engines.base import EOS_TOKEN
from engines.gpt_int8_proof import BOUNDS, SENTENCES, GptProof, judge, kept_proof, load_sentences
from engines.gpt_runner import load_gpt, proof_kernels
from engines.gpt_sovits import cpu_step
from engines.gpt_sovits.sampling import MIN_STEPS_BEFORE_EOS
from engines.plan import EnginePlan, Settings, plan_engine, probe_machine
from tests.golden import Golden

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.conformance, pytest.mark.timeout(600)]

PROVING = "proving the int8 GPT on this model (once)..."
OUTLIER = 50.0  # a weight in every row of each layer's first FFN linear, on a channel that is always zero there
RUNNERS = {"weight-only": "fused", "dynamic": "torch"}  # the torch GPT's int8 methods and the runner of each


def _plan(method: str) -> EnginePlan:
    if method == "weight-only" and cpu_step.load_library() is None:
        pytest.skip(f"the fused CPU step cannot be built here: {cpu_step.unavailable_reason()}")
    return plan_engine(Settings(backend="torch", device="cpu", precision="int8", gpt_runner=RUNNERS[method]),
                       probe_machine())


def _proofs_run(caplog: pytest.LogCaptureFixture) -> int:
    return sum(r.getMessage() == PROVING for r in caplog.records)


def _kept(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("gpt-int8-*.json"))]


@pytest.fixture(scope="module")
def outlier_gpt(golden: Golden, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The golden GPT with one channel of each layer's first layer norm silenced (gain and bias 0) and an outlier
    weight on that channel in every row of the linear after it: fp32 reads the outliers times zero, while int8's
    per-row scale becomes the outlier's, and the row's real weights round to 0."""
    ckpt = torch.load(golden.gpt_path, map_location="cpu", weights_only=True)
    weights = ckpt["weight"]
    layers = sorted({int(k.split(".")[3]) for k in weights if k.startswith("model.h.layers.")})
    for i in layers:
        p = f"model.h.layers.{i}."
        weights[p + "norm1.weight"][0] = weights[p + "norm1.bias"][0] = 0.0
        weights[p + "linear1.weight"][:, 0] = OUTLIER
    path = tmp_path_factory.mktemp("outlier") / "gpt_outlier.ckpt"
    torch.save(ckpt, path)
    return path


# ---- the sentences ------------------------------------------------------------------------------------------------


def test_the_sentences_are_the_front_ends_phones() -> None:
    """Each built-in sentence's phones are what synthesis's front-end makes of its text today (a language whose
    packages this build lacks is skipped here, never dropped from the file); every language has one."""
    from synthesis.text.packages import NEEDS, missing
    from tests.tools.proof_sentences import SENTENCES as WRITTEN, build_one

    data = json.loads(SENTENCES.read_text(encoding="utf-8"))
    assert [(s["lang"], s["text"]) for s in data["sentences"]] == list(WRITTEN)
    assert sorted(s["lang"] for s in data["sentences"]) == sorted(NEEDS)
    checked = 0
    for entry in data["sentences"]:
        if missing(entry["lang"]):
            continue
        assert build_one(entry["lang"], entry["text"]) == entry, f"{entry['lang']}: run tests/tools/proof_sentences.py"
        checked += 1
    assert checked > 0
    assert [len(p) for _, p in load_sentences()] == [len(s["phones"]) for s in data["sentences"]]


# ---- the verdict's rules ------------------------------------------------------------------------------------------

VOCAB = EOS_TOKEN + 1
STEPS = MIN_STEPS_BEFORE_EOS + 4  # rows of the hand-made sentences: the stop rule applies from step 11


def _sentence(stop: bool) -> tuple[np.ndarray, list[int]]:
    """fp32 logits of a sentence whose greedy choice at step j is token j + 1 by a margin of 1.0 over EOS (the EOS
    row at the last step when ``stop``), and that path."""
    logits = np.zeros((STEPS, VOCAB), np.float32)
    path = list(range(1, STEPS + 1))
    for j in range(STEPS):
        logits[j, path[j]] = 2.0
        logits[j, EOS_TOKEN] = 1.0
    if stop:
        logits[-1, EOS_TOKEN] = 3.0
        path = path[:-1]
    return logits, path


def test_judge_passes_within_the_bound_with_the_stop() -> None:
    fp32, path = _sentence(stop=True)
    int8 = fp32 + np.float32(0.1)
    int8[-1, EOS_TOKEN] -= 0.2  # EOS still wins at the stop
    error, reason = judge(fp32, int8, path, True, 0.15)
    assert reason == "" and error == pytest.approx(0.1, abs=1e-6)


def test_judge_fails_a_logit_beyond_the_bound() -> None:
    fp32, path = _sentence(stop=False)
    int8 = fp32.copy()
    int8[5, 7] += 0.2
    error, reason = judge(fp32, int8, path, False, 0.15)
    assert error == pytest.approx(0.2, abs=1e-6) and reason == "logit error 0.200 > 0.15 at step 5"


def test_judge_fails_an_early_eos_where_fp32_led_by_more_than_the_bound() -> None:
    """EOS may not win before fp32's stop where fp32's choice led it by more than the bound; it may where it did not."""
    fp32, path = _sentence(stop=False)
    j = MIN_STEPS_BEFORE_EOS + 1
    fp32[j, EOS_TOKEN] = 2.0 - 0.2  # fp32's choice leads EOS by 0.2 > 0.15 ...
    int8 = fp32.copy()
    int8[j, EOS_TOKEN] += 0.12  # ... and int8 (within the bound of every logit) ...
    int8[j, path[j]] -= 0.12  # ... lets EOS win: the decode would stop early
    assert judge(fp32, int8, path, False, 0.15)[1] == (
        f"EOS wins at step {j}, before fp32's stop, where fp32's choice led it by 0.200")
    fp32[j, EOS_TOKEN] = 2.0 - 0.1  # a lead within the bound: EOS winning is int8's rounding, allowed
    int8 = fp32.copy()
    int8[j, EOS_TOKEN] += 0.06
    int8[j, path[j]] -= 0.06
    assert judge(fp32, int8, path, False, 0.15)[1] == ""


def test_judge_fails_a_stop_that_int8_loses() -> None:
    """At fp32's stop int8's EOS must be within the bound of its best logit."""
    fp32, path = _sentence(stop=True)
    fp32[-1, EOS_TOKEN] = 2.1  # fp32 stops by 0.1 over its next choice
    int8 = fp32.copy()
    int8[-1, EOS_TOKEN] -= 0.12  # within the bound per logit ...
    int8[-1, path[-1] + 1] += 0.12  # ... but EOS now trails by 0.14: within 0.15, kept
    assert judge(fp32, int8, path, True, 0.15)[1] == ""
    assert judge(fp32, int8, path, True, 0.13)[1] == "at fp32's stop (step 14) EOS trails int8's best by 0.140 > 0.13"


# ---- on the golden checkpoint -------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", list(RUNNERS))
def test_golden_gpt_passes_and_keeps_its_verdict(golden: Golden, tmp_path: Path, method: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    plan = _plan(method)
    with caplog.at_level(logging.INFO, logger="engines.gpt_int8_proof"):
        gpt, runs = load_gpt(golden.gpt_path, plan, tmp_path)
        assert runs == plan and gpt.quantized and gpt.int8_weights == (method == "weight-only")
        [kept] = _kept(tmp_path)
        assert kept["passed"] and kept["method"] == method and kept["bound"] == BOUNDS[method]
        assert 0 < kept["max_error"] <= BOUNDS[method]
        assert kept["sentences"] == len(load_sentences()) and kept["stops"] > 0  # the stop rule ran
        again, runs_again = load_gpt(golden.gpt_path, plan, tmp_path)
    assert runs_again == plan and again.quantized
    assert _proofs_run(caplog) == 1  # the second load read the kept verdict
    assert kept_proof(tmp_path, golden.gpt_path, method, proof_kernels(plan)) == GptProof(
        **{k: kept[k] for k in GptProof.__dataclass_fields__})


def test_each_int8_gemm_has_its_own_verdict(golden: Golden, tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """oneDNN's and fbgemm's prefill products round the activations each its own way: a verdict kept for one is not
    read for the other."""
    plan = _plan("weight-only")
    if "onednn" not in torch.backends.quantized.supported_engines:
        pytest.skip("this torch has no oneDNN int8 GEMM")
    with caplog.at_level(logging.INFO, logger="engines.gpt_int8_proof"):
        for gemm in ("fbgemm", "onednn", "fbgemm", "onednn"):
            gpt, runs = load_gpt(golden.gpt_path, dataclasses.replace(plan, int8_gemm=gemm), tmp_path)
            assert runs.int8_gemm == gemm and gpt.int8_weights
    assert _proofs_run(caplog) == 2  # once each, then kept
    assert sorted(k["passed"] for k in _kept(tmp_path)) == [True, True]


def test_a_changed_gpt_file_proves_again(golden: Golden, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plan = _plan("dynamic")
    path = tmp_path / "gpt.ckpt"
    shutil.copyfile(golden.gpt_path, path)
    proofs = tmp_path / "proofs"
    with caplog.at_level(logging.INFO, logger="engines.gpt_int8_proof"):
        load_gpt(path, plan, proofs)
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
        ckpt["weight"]["model.ar_predict_layer.weight"][0, 0] += 0.5  # fine-tuned, say
        torch.save(ckpt, path)
        load_gpt(path, plan, proofs)
        load_gpt(path, plan, proofs)
    assert _proofs_run(caplog) == 2  # once per file content, not per load
    assert len(_kept(proofs)) == 2


# ---- a model int8 cannot round well -------------------------------------------------------------------------------


def _misses(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "engines.gpt_int8_proof" and r.levelno == logging.WARNING]


@pytest.mark.parametrize("method", list(RUNNERS))
def test_an_int8_gpt_that_misses_runs_in_fp32(outlier_gpt: Path, tmp_path: Path, method: str,
                                              caplog: pytest.LogCaptureFixture) -> None:
    plan = _plan(method)
    with caplog.at_level(logging.INFO, logger="engines.gpt_int8_proof"):
        gpt, runs = load_gpt(outlier_gpt, plan, tmp_path)
    [kept] = _kept(tmp_path)
    assert not kept["passed"] and kept["max_error"] > 1.0  # the wiped rows move the logits by whole units
    [line] = _misses(caplog)
    how = ", ".join(filter(None, (method, proof_kernels(plan))))  # (the prefill's GEMM where it has its own verdict)
    assert f"({how}) misses its proof on this model" in line and "the GPT runs in fp32" in line
    assert f"logits up to {kept['max_error']:.3f} from fp32's, bound {BOUNDS[method]:.2f}" in line
    assert not gpt.quantized and gpt.compute_dtype == torch.float32
    assert gpt.fused_lib is (cpu_step.load_library() if method == "weight-only" else None)  # the plan's runner, fp32
    assert (runs.gpt_runner, runs.gpt_weights, runs.kv_dtype) == (plan.gpt_runner, "fp32", "fp32")
    assert runs.labels()["gpt_weights"] == "fp32" and f"GPT {plan.gpt_runner} fp32 (KV fp32)" in runs.describe()
    assert "the int8 GPT missed its proof on this model" in runs.describe()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="engines.gpt_int8_proof"):
        _, runs_again = load_gpt(outlier_gpt, plan, tmp_path)  # a restart: the kept miss, no proof, fp32 again
    assert _proofs_run(caplog) == 0 and len(_misses(caplog)) == 1 and runs_again == runs


def test_engines_report_the_fp32_gpt_that_runs(golden: Golden, outlier_gpt: Path, tmp_path: Path) -> None:
    """Every backend that runs an int8 GPT goes through the proof: the torch engine, the onnx engine with the fused
    step, and the onnx engine's int8 step graph (which then runs the fp32 step graph)."""
    from engines.export import INT8_STEP, ensure_onnx
    from engines.onnx_engine import OnnxEngine
    from engines.torch_engine import TorchEngine

    models = SimpleNamespace(gpt=outlier_gpt, sovits=golden.sovits_path, hubert=golden.dir / "no-hubert",
                             bert=golden.dir / "no-bert")
    engine = TorchEngine.from_files(models, precision="int8", threads=1, proofs=tmp_path / "torch")
    assert engine.plan.gpt_weights == "fp32" and not engine.gpt.quantized
    graphs = OnnxEngine.from_files(models, tmp_path / "onnx", precision="int8", threads=1, max_batch=2, gpt="graph")
    assert graphs.step_graph == "gpt_step" and graphs.plan.gpt_weights == "fp32"
    assert INT8_STEP not in graphs.runner.sessions  # type: ignore[attr-defined]
    if cpu_step.load_library() is not None:
        fused = OnnxEngine.from_files(models, tmp_path / "onnx", precision="int8", threads=1, max_batch=2)
        assert fused.plan.gpt_runner == "fused" and fused.plan.gpt_weights == "fp32"
        assert fused.gpt is not None and not fused.gpt.quantized
    methods = {k["method"]: k["passed"] for k in _kept(ensure_onnx(models, tmp_path / "onnx"))}
    assert methods.get("onnx-dynamic") is False


def test_the_onnx_int8_step_graph_passes_on_the_golden_gpt(golden: Golden, golden_onnx_dir: Path) -> None:
    from engines.export import INT8_STEP, ensure_onnx
    from engines.onnx_engine import OnnxEngine

    models = SimpleNamespace(gpt=golden.gpt_path, sovits=golden.sovits_path, hubert=golden.dir / "no-hubert",
                             bert=golden.dir / "no-bert")
    engine = OnnxEngine.from_files(models, golden_onnx_dir, precision="int8", threads=1, max_batch=2, gpt="graph")
    assert engine.step_graph == INT8_STEP and engine.plan.gpt_weights == "int8-dynamic"
    assert "gpt_step" not in engine.runner.sessions  # type: ignore[attr-defined]
    kept = kept_proof(ensure_onnx(models, golden_onnx_dir), golden.gpt_path, "onnx-dynamic")
    assert kept is not None and kept.passed and 0 < kept.max_error <= BOUNDS["onnx-dynamic"] and kept.stops > 0
