"""The random v2Pro/v2ProPlus model sets the benchmarks build (engines.gpt_sovits.tiny): at the real size they have
the tensor names and shapes of upstream's released files, as listed in the golden set's ``real_size_shapes.json``;
the tiny set carries its version tag and runs on the torch engine."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from engines.base import VoicePrompt
from engines.gpt_sovits.checkpoint import load_sovits_checkpoint
from engines.gpt_sovits.tiny import sovits_state_dict, sv_state_dict, write_model_set

FILES = {"v2Pro": "sovits_v2Pro_finetuned_file", "v2ProPlus": "sovits_v2ProPlus_finetuned_file"}


@pytest.fixture(scope="module")
def real_shapes(golden_v2pro_dir: Path) -> dict:
    return json.loads((golden_v2pro_dir / "real_size_shapes.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("family", ["v2Pro", "v2ProPlus"])
def test_real_size_sovits_has_the_released_tensors(real_shapes: dict, family: str) -> None:
    ours = {k: list(v.shape) for k, v in sovits_state_dict("real", 0, family).items()}
    assert ours == real_shapes[FILES[family]]["keys"]


@pytest.mark.slow
def test_real_size_sv_model_has_the_released_tensors(real_shapes: dict) -> None:
    ours = {k: list(v.shape) for k, v in sv_state_dict("real", 0).items()}
    assert ours == {k: shape for k, (shape, _) in real_shapes["sv_pretrained_eres2netv2w24s4ep4"]["keys"].items()}


@pytest.mark.parametrize("family", ["v2Pro", "v2ProPlus"])
def test_tiny_set_is_tagged_and_speaks(tmp_path: Path, family: str) -> None:
    from engines.torch_engine import TorchEngine

    paths = write_model_set(tmp_path, "tiny", 0, family=family)
    assert paths["sovits"].read_bytes()[:2] == {"v2Pro": b"05", "v2ProPlus": b"06"}[family]
    assert load_sovits_checkpoint(paths["sovits"]).version == family
    engine = TorchEngine.from_files(SimpleNamespace(**paths), threads=1)
    clip = 0.1 * np.random.default_rng(0).standard_normal(3 * 32000).astype(np.float32)  # [N] @ 32 kHz
    sv = engine.encode_speaker([clip])
    assert sv is not None and sv.shape == (1, engine.sovits.cfg.sv_dim)
    _, ge = engine.encode_reference(None, [clip], sv_emb=sv)
    voice = VoicePrompt(np.zeros(0, np.int64), ge, np.zeros(0, np.int64), np.zeros((1024, 0), np.float32), sv)
    wav = engine.decode(np.arange(50) % 1024, np.arange(1, 20), voice, noise_scale=0.5, seed=0)
    assert wav.shape == (50 * 2 * engine.sovits.cfg.hop,) and np.all(np.isfinite(wav)) and np.abs(wav).max() > 1e-3
