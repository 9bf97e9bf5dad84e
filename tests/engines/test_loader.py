"""Which backend, device and precision a config gets, and the messages for the combinations that cannot run."""

from __future__ import annotations

import pytest
import torch

from engines.base import EngineError
from engines.loader import choose_backend, resolve_device, resolve_precision


@pytest.mark.parametrize(("precision", "device", "expected"), [
    ("auto", "cpu", "int8"), ("auto", "cuda:0", "fp16"), ("int8", "cpu", "int8"), ("fp32", "cpu", "fp32"),
    ("bf16", "cuda:0", "bf16"), ("fp32", "cuda:1", "fp32"),
])
def test_precision_resolves(precision: str, device: str, expected: str) -> None:
    assert resolve_precision(precision, device) == expected


@pytest.mark.parametrize(("precision", "device", "message"), [
    ("fp16", "cpu", "fp16 is for GPUs; on the CPU use fp32 \\(or int8\\)"),
    ("bf16", "cpu", "bf16 is for GPUs"),
    ("int8", "cuda:0", "int8 is a CPU speed path; on a GPU use fp16"),
])
def test_precision_the_device_cannot_run(precision: str, device: str, message: str) -> None:
    with pytest.raises(EngineError, match=message):
        resolve_precision(precision, device)


@pytest.mark.parametrize(("backend", "device", "precision", "trt", "expected"), [
    ("auto", "cpu", "fp32", True, "onnx"),  # measured fastest on CPUs (engines.plan.CPU_AUTO_BACKEND)
    ("auto", "cpu", "int8", False, "onnx"),
    ("auto", "cuda:0", "fp16", True, "tensorrt"),
    ("auto", "cuda:0", "fp16", False, "torch"),
    ("auto", "cuda:0", "bf16", True, "torch"),  # TensorRT engines are fp16: another precision keeps torch
    ("onnx", "cpu", "int8", False, "onnx"),
    ("torch", "cuda:0", "fp32", True, "torch"),
    ("tensorrt", "cuda:0", "fp16", True, "tensorrt"),  # not installed is the engine's own message, with the fix
])
def test_backend_choice(backend: str, device: str, precision: str, trt: bool, expected: str) -> None:
    assert choose_backend(backend, device, precision, trt) == expected


@pytest.mark.parametrize(("backend", "device", "precision", "message"), [
    ("tensorrt", "cpu", "fp32", "tensorrt needs an NVIDIA GPU .*on the CPU use torch or onnx"),
    ("tensorrt", "cuda:0", "bf16", "builds fp16 engines; set engine.precision: fp16 .*torch for bf16"),
    ("jax", "cpu", "fp32", "unknown engine.backend 'jax': expected auto, torch, onnx, tensorrt"),
])
def test_backend_the_setup_cannot_serve(backend: str, device: str, precision: str, message: str) -> None:
    with pytest.raises(EngineError, match=message):
        choose_backend(backend, device, precision, True)


def test_device_resolves_here() -> None:
    assert resolve_device("cpu") == "cpu"
    if torch.cuda.is_available():
        assert resolve_device("auto") == "cuda:0" and resolve_device("cuda") == "cuda:0"
    else:
        assert resolve_device("auto") == "cpu"
        with pytest.raises(EngineError, match="no CUDA GPU is usable here; set engine.device: cpu"):
            resolve_device("cuda")


def test_auto_on_a_cpu_falls_back_to_torch_when_the_onnx_engine_cannot_load(tmp_path, monkeypatch,
                                                                              caplog) -> None:
    """auto picks onnx on a CPU for speed; an export that fails leaves the bot speaking through torch."""
    import dataclasses

    import engines.onnx_engine
    from bot.config import EngineConfig
    from engines.gpt_sovits.tiny import write_model_set
    from engines.loader import load_engine

    paths = write_model_set(tmp_path / "models", size="tiny", seed=0)

    def refuse(*args, **kwargs):
        raise EngineError("export failed (simulated)")

    monkeypatch.setattr(engines.onnx_engine.OnnxEngine, "from_files", refuse)
    models = type("Models", (), dict(paths))()
    auto = EngineConfig(backend="auto", device="cpu", precision="fp32", threads=1, onnx_dir=tmp_path / "onnx")
    with caplog.at_level("WARNING", logger="engines.loader"):
        engine = load_engine(auto, models)
    assert engine.name == "torch" and engine.precision == "fp32"
    assert "ONNX engine unavailable (export failed (simulated)); using the torch engine" in caplog.text
    with pytest.raises(EngineError, match="export failed"):  # an explicit onnx choice reports the failure
        load_engine(dataclasses.replace(auto, backend="onnx"), models)

    def crash(*args, **kwargs):  # not an EngineError: a runtime's own error, as from another version of its API
        raise AttributeError("'Builder' object has no attribute 'build_serialized_network' (simulated)")

    monkeypatch.setattr(engines.onnx_engine.OnnxEngine, "from_files", crash)
    caplog.clear()
    with caplog.at_level("WARNING", logger="engines.loader"):
        assert load_engine(auto, models).name == "torch"
    assert "ONNX engine unavailable ('Builder' object has no attribute" in caplog.text
    assert "Traceback" in caplog.text  # an unexpected error brings its traceback to the log
    with pytest.raises(AttributeError):
        load_engine(dataclasses.replace(auto, backend="onnx"), models)
