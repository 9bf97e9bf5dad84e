"""The engine plan as a table: settings x machine -> what runs, and the settings a machine cannot run, one line each.

Every probe here is written by hand: the plan is a pure function, so nothing in these tables touches the machine.
"""

from __future__ import annotations

import logging
from dataclasses import asdict

import pytest

from engines.base import EngineError
from engines.plan import EnginePlan, MachineProbe, Settings, plan_engine

NO_CC = "no C compiler found (install gcc: apt-get install gcc)"
CPU = MachineProbe(cpu="Test CPU", cores=2, isa=("avx2", "fma"), compiler="/usr/bin/cc", fused_step=True)
CPU_AMX = MachineProbe(cpu="Test CPU", cores=2, isa=("avx2", "fma", "avx512f", "amx_tile"), compiler="/usr/bin/cc",
                       fused_step=True, amx=True)
CPU_NO_CC = MachineProbe(cpu="Test CPU", cores=2, isa=("avx2", "fma"), fused_step=False, fused_step_reason=NO_CC)
CPU_NO_ORT = MachineProbe(cpu="Test CPU", cores=4, fused_step=True, onnxruntime=False)
GPU_TRT = MachineProbe(cpu="Host CPU", cores=16, fused_step=True, gpus=("NVIDIA H100",), tensorrt=True)
GPU = MachineProbe(cpu="Host CPU", cores=16, fused_step=True, gpus=("NVIDIA H100", "NVIDIA A10"))
GPU_ORT = MachineProbe(cpu="Host CPU", cores=16, gpus=("NVIDIA H100",), onnxruntime_cuda=True)

# fields: backend, device, precision, gpt_runner, gpt_weights, kv_dtype, vocoder, bert, diffusion_path, threads,
# int8_gemm, dit_attention
PLANS = [
    ("cpu auto: onnx, fused int8 weight-only, int8 vocoder if proven", {}, CPU, False,
     ("onnx", "cpu", "int8", "fused", "int8-weight-only", "bf16", "ort-int8-if-proven", "int8-if-proven", "", 2,
      "fbgemm", "")),
    ("cpu auto with AMX: the int8 prefill on oneDNN", {}, CPU_AMX, False,
     ("onnx", "cpu", "int8", "fused", "int8-weight-only", "bf16", "ort-int8-if-proven", "int8-if-proven", "", 2,
      "onednn", "")),
    ("cpu fp32 with AMX: no int8 prefill", {"precision": "fp32"}, CPU_AMX, False,
     ("onnx", "cpu", "fp32", "fused", "fp32", "fp32", "ort-fp32", "fp32", "", 2, "", "")),
    ("cpu auto, no compiler: the int8 step graph", {}, CPU_NO_CC, False,
     ("onnx", "cpu", "int8", "graphs", "int8-dynamic", "fp32", "ort-int8-if-proven", "int8-if-proven", "", 2, "", "")),
    ("cpu auto fp32: upstream's exact decode, fp32 vocoder", {"precision": "fp32", "threads": 1}, CPU, False,
     ("onnx", "cpu", "fp32", "fused", "fp32", "fp32", "ort-fp32", "fp32", "", 1, "", "")),
    ("cpu auto without ONNX Runtime: torch", {}, CPU_NO_ORT, False,
     ("torch", "cpu", "int8", "fused", "int8-weight-only", "bf16", "torch", "int8-if-proven", "", 4, "fbgemm", "")),
    ("cpu onnx, graphs asked", {"backend": "onnx", "gpt_runner": "graphs"}, CPU, False,
     ("onnx", "cpu", "int8", "graphs", "int8-dynamic", "fp32", "ort-int8-if-proven", "int8-if-proven", "", 2, "", "")),
    ("cpu onnx, int8 vocoder asked", {"backend": "onnx", "vocoder_precision": "int8"}, CPU, False,
     ("onnx", "cpu", "int8", "fused", "int8-weight-only", "bf16", "ort-int8", "int8-if-proven", "", 2,
      "fbgemm", "")),
    ("cpu onnx, fp32 vocoder asked", {"backend": "onnx", "vocoder_precision": "fp32"}, CPU, False,
     ("onnx", "cpu", "int8", "fused", "int8-weight-only", "bf16", "ort-fp32", "int8-if-proven", "", 2,
      "fbgemm", "")),
    ("cpu torch int8 fused", {"backend": "torch"}, CPU, False,
     ("torch", "cpu", "int8", "fused", "int8-weight-only", "bf16", "torch", "int8-if-proven", "", 2,
      "fbgemm", "")),
    ("cpu torch int8 without compiler: dynamic int8 TorchScript", {"backend": "torch"}, CPU_NO_CC, False,
     ("torch", "cpu", "int8", "torch", "int8-dynamic", "bf16", "torch", "int8-if-proven", "", 2, "", "")),
    ("cpu torch, torch loop asked", {"backend": "torch", "gpt_runner": "torch", "precision": "fp32"}, CPU, False,
     ("torch", "cpu", "fp32", "torch", "fp32", "fp32", "torch", "fp32", "", 2, "", "")),
    ("gpu auto with TensorRT", {}, GPU_TRT, False,
     ("tensorrt", "cuda:0", "fp16", "graphs", "fp16", "fp16", "tensorrt", "fp16", "", 16, "", "")),
    ("gpu auto without TensorRT: torch, CUDA graphs", {}, GPU, False,
     ("torch", "cuda:0", "fp16", "cuda-graphs", "fp16", "fp16", "torch", "fp16", "", 16, "", "")),
    ("gpu bf16 keeps torch", {"precision": "bf16", "device": "cuda"}, GPU_TRT, False,
     ("torch", "cuda:0", "bf16", "cuda-graphs", "bf16", "bf16", "torch", "bf16", "", 16, "", "")),
    ("second gpu, eager torch", {"device": "cuda:1", "cuda_graphs": False, "precision": "fp32"}, GPU, False,
     ("torch", "cuda:1", "fp32", "torch", "fp32", "fp32", "torch", "fp32", "", 16, "", "")),
    ("gpu onnx with onnxruntime-gpu", {"backend": "onnx", "precision": "fp32"}, GPU_ORT, False,
     ("onnx", "cuda:0", "fp32", "graphs", "fp32", "fp32", "ort-fp32", "fp32", "", 16, "", "")),
    ("cpu device on a gpu machine", {"device": "cpu"}, GPU, False,
     ("onnx", "cpu", "int8", "fused", "int8-weight-only", "bf16", "ort-int8-if-proven", "int8-if-proven", "", 16,
      "fbgemm", "")),
    ("v4/v5 cpu auto: fused int8 GPT, the fast decoder", {}, CPU, True,
     ("onnx", "cpu", "int8", "fused", "int8-weight-only", "bf16", "ort-int8-if-proven", "fp32", "fast", 2, "fbgemm",
      "fp32")),
    ("v4/v5 cpu auto with AMX: the DiT's products on oneDNN, its attention in bf16", {}, CPU_AMX, True,
     ("onnx", "cpu", "int8", "fused", "int8-weight-only", "bf16", "ort-int8-if-proven", "fp32", "fast", 2, "onednn",
      "bf16")),
    ("v4/v5 cpu fp32: the exact decoder", {"precision": "fp32", "backend": "torch"}, CPU, True,
     ("torch", "cpu", "fp32", "fused", "fp32", "fp32", "ort-fp32", "fp32", "fp32", 2, "", "fp32")),
    ("v4/v5 cpu onnx without compiler: the torch loop (the DiT's products on fbgemm)", {"backend": "onnx"},
     CPU_NO_CC, True,
     ("onnx", "cpu", "int8", "torch", "int8-dynamic", "bf16", "ort-int8-if-proven", "fp32", "fast", 2, "fbgemm",
      "fp32")),
    ("v4/v5 gpu auto with TensorRT: torch", {}, GPU_TRT, True,
     ("torch", "cuda:0", "fp16", "cuda-graphs", "fp16", "fp16", "torch", "fp16", "fp32", 16, "", "fp16")),
]
FIELDS = ("backend", "device", "precision", "gpt_runner", "gpt_weights", "kv_dtype", "vocoder", "bert",
          "diffusion_path", "threads", "int8_gemm", "dit_attention")


@pytest.mark.parametrize(("settings", "probe", "diffusion", "expected"), [row[1:] for row in PLANS],
                         ids=[row[0] for row in PLANS])
def test_plan_table(settings: dict[str, object], probe: MachineProbe, diffusion: bool,
                    expected: tuple[object, ...]) -> None:
    plan = plan_engine(Settings(**settings), probe, diffusion=diffusion)  # type: ignore[arg-type]
    assert tuple(asdict(plan)[f] for f in FIELDS) == expected


REFUSALS = [
    ({"precision": "int8", "device": "cuda"}, GPU, False, "int8 is a CPU speed path; on a GPU use fp16"),
    ({"precision": "fp16", "device": "cpu"}, GPU, False, "fp16 is for GPUs; on the CPU use fp32 \\(or int8\\)"),
    ({"device": "cuda"}, CPU, False, "no CUDA GPU is usable here; set engine.device: cpu"),
    ({"device": "cuda:2"}, GPU, False, "this machine has 2 CUDA GPU\\(s\\); set engine.device: cuda:0"),
    ({"backend": "tensorrt"}, CPU, False, "tensorrt needs an NVIDIA GPU .*on the CPU use torch or onnx"),
    ({"backend": "tensorrt", "precision": "bf16"}, GPU_TRT, False, "builds fp16 engines; .*torch for bf16"),
    ({"backend": "tensorrt"}, GPU, False, "needs TensorRT \\(pip install 'voicebot\\[gpu\\]'\\)"),
    ({"backend": "tensorrt"}, GPU_TRT, True, "tensorrt does not run the v3/v4/v5 models yet"),
    ({"backend": "onnx", "precision": "fp16"}, GPU_ORT, False, "the onnx backend runs fp32 or int8, not fp16"),
    ({"backend": "onnx", "precision": "fp32"}, GPU, False, "onnx on a GPU needs onnxruntime-gpu"),
    ({"backend": "onnx"}, CPU_NO_ORT, False, "engine.backend onnx needs ONNX Runtime"),
    ({"gpt_runner": "fused"}, CPU_NO_CC, False, f"gpt_runner fused cannot run: .*{NO_CC[:20]}"),
    ({"gpt_runner": "fused", "precision": "fp32"}, GPU, False, "fused cannot run: the fused step runs on CPUs"),
    ({"gpt_runner": "graphs", "backend": "torch"}, CPU, False, "graphs runs on the onnx and tensorrt backends"),
    ({"gpt_runner": "graphs"}, CPU, True, "graphs runs on the onnx and tensorrt backends with a v2 model"),
    ({"gpt_runner": "torch", "backend": "onnx"}, CPU, False, "onnx backend runs its GPT as step graphs or the fused"),
    ({"gpt_runner": "torch"}, GPU_TRT, False, "tensorrt backend runs its GPT as step graphs"),
    ({"vocoder_precision": "int8", "backend": "torch"}, CPU, False, "int8 runs on the onnx engine on a CPU"),
    ({"vocoder_precision": "int8", "precision": "fp32"}, GPU_ORT, False, "int8 runs on the onnx engine on a CPU"),
    ({"vocoder_precision": "int8"}, CPU, True, "int8 is the v2 vocoder's"),
    ({"backend": "jax"}, CPU, False, "unknown engine.backend 'jax': expected auto, torch, onnx, tensorrt"),
    ({"gpt_runner": "graph"}, CPU, False, "unknown engine.gpt_runner 'graph': expected auto, fused, graphs, torch"),
    ({"vocoder_precision": "int4"}, CPU, False, "unknown engine.vocoder_precision 'int4'"),
    ({"device": "cuda:x"}, GPU, False, "engine.device must be auto, cpu, cuda or cuda:N, got 'cuda:x'"),
]


@pytest.mark.parametrize(("settings", "probe", "diffusion", "message"), REFUSALS,
                         ids=[r[3].split(":")[0][:40] for r in REFUSALS])
def test_refusals_are_one_line_with_the_fix(settings: dict[str, object], probe: MachineProbe, diffusion: bool,
                                            message: str) -> None:
    with pytest.raises(EngineError, match=message) as info:
        plan_engine(Settings(**settings), probe, diffusion=diffusion)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_auto_falls_back_to_torch_and_explicit_choices_do_not() -> None:
    auto = plan_engine(Settings(), CPU)
    assert auto.fallback is not None and auto.fallback.backend == "torch" and auto.fallback.fallback is None
    assert (auto.fallback.gpt_runner, auto.fallback.gpt_weights, auto.fallback.vocoder) == (
        "fused", "int8-weight-only", "torch")
    assert plan_engine(Settings(backend="onnx"), CPU).fallback is None
    assert plan_engine(Settings(), GPU_TRT).fallback == plan_engine(Settings(backend="torch"), GPU_TRT)
    # a setting only the chosen backend runs leaves no fallback rather than refusing the plan
    assert plan_engine(Settings(vocoder_precision="int8"), CPU).fallback is None


def test_notes_say_why_auto_chose_a_slower_path() -> None:
    assert plan_engine(Settings(), CPU).notes == ()
    (note,) = plan_engine(Settings(), CPU_NO_CC).notes
    assert NO_CC in note and "step graphs" in note
    (note,) = plan_engine(Settings(), CPU_NO_ORT).notes
    assert "ONNX Runtime is not installed" in note


def test_the_plan_as_one_line_and_as_labels() -> None:
    plan = plan_engine(Settings(), CPU_NO_CC)
    line = plan.describe()
    assert "\n" not in line
    assert line.startswith("onnx on cpu (Test CPU), int8: GPT graphs int8-dynamic (KV fp32), vocoder "
                           "ort-int8-if-proven, BERT int8-if-proven, 2 threads, batch 8 [")
    labels = plan.labels()
    assert labels["gpt_runner"] == "graphs" and labels["threads"] == "2" and labels["device_name"] == "Test CPU"
    assert all(isinstance(v, str) for v in labels.values())


def test_the_plan_is_frozen() -> None:
    plan = plan_engine(Settings(), CPU)
    with pytest.raises(AttributeError):
        plan.gpt_runner = "torch"  # type: ignore[misc]
    assert isinstance(plan, EnginePlan) and hash(plan) == hash(plan_engine(Settings(), CPU))


def test_metrics_show_the_plan(caplog) -> None:
    """``/metrics``' engine info carries the plan's labels."""
    from bot.http.metrics import HttpMetrics
    from synthesis.metrics import PipelineStats

    plan = plan_engine(Settings(), CPU)
    snapshot = PipelineStats().snapshot(queue_depth=0, inflight=0, engine="onnx", device="cpu", precision="int8",
                                        plan=plan.labels())
    body, _ = HttpMetrics(lambda: snapshot).render()
    info = next(line for line in body.decode().splitlines() if line.startswith("voicebot_engine_info{"))
    for label in ('backend="onnx"', 'gpt_runner="fused"', 'gpt_weights="int8-weight-only"', 'kv_dtype="bf16"',
                  'vocoder="ort-int8-if-proven"', 'threads="2"', 'device_name="Test CPU"'):
        assert label in info


def test_load_engine_builds_the_plan_and_logs_it_once(tmp_path, caplog) -> None:
    """The engine is built as the plan says, on a hand-written machine, and the plan is logged in one line."""
    from bot.config import EngineConfig
    from engines.gpt_sovits.tiny import write_model_set
    from engines.loader import load_engine

    paths = write_model_set(tmp_path / "models", size="tiny", seed=0)
    models = type("Models", (), dict(paths))()
    cfg = EngineConfig(backend="torch", device="cpu", precision="int8", threads=1, onnx_dir=tmp_path / "onnx")
    with caplog.at_level(logging.INFO, logger="engines.loader"):
        engine = load_engine(cfg, models, probe=CPU_NO_CC)
    assert engine.plan == plan_engine(cfg, CPU_NO_CC)
    assert (engine.plan.gpt_runner, engine.plan.gpt_weights) == ("torch", "int8-dynamic")
    gpt = engine.gpt  # type: ignore[attr-defined]
    assert gpt.fused_lib is None and gpt.quantized and not gpt.int8_weights  # torch's dynamic int8, no fused step
    plan_lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("engine plan: ")]
    assert plan_lines == [f"engine plan: {engine.plan.describe()}"]
