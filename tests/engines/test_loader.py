"""Which backend, device and precision a config gets, and the messages for the combinations that cannot run."""

from __future__ import annotations

import pytest
import torch

from engines.base import EngineError
from engines.loader import choose_backend, resolve_device, resolve_precision


@pytest.mark.parametrize(("precision", "device", "expected"), [
    ("auto", "cpu", "fp32"), ("auto", "cuda:0", "fp16"), ("int8", "cpu", "int8"), ("fp32", "cpu", "fp32"),
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
    ("auto", "cpu", "fp32", True, "torch"),
    ("auto", "cpu", "int8", False, "torch"),
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
