"""Fixtures of the engine tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.golden_v4v5 import GoldenV4V5, golden_v4v5_dir


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module: the tiny models are fastest so, and it is robust on a busy shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def meta(golden_v2pro_dir: Path) -> dict[str, Any]:
    """The v2Pro golden set's ``meta.json`` (file names, sizes, versions present)."""
    return json.loads((golden_v2pro_dir / "meta.json").read_text())


@pytest.fixture(scope="module", params=("v2Pro", "v2ProPlus"))
def version(request: pytest.FixtureRequest, meta: dict[str, Any]) -> str:
    """Each SoVITS family the v2Pro golden set holds data for."""
    if request.param not in meta["versions"]:
        pytest.skip(f"this golden set has no {request.param} data")
    return str(request.param)


@pytest.fixture(scope="module")
def golden_v4v5() -> GoldenV4V5:
    """The v4/v5 golden set (``VOICEBOT_GOLDEN_V4V5_DIR`` overrides where it is)."""
    root = golden_v4v5_dir()
    if not (root / "meta.json").is_file():
        pytest.skip(f"no v4/v5 golden set at {root}")
    return GoldenV4V5(root)


@pytest.fixture(scope="module", params=("v4", "v5turbo", "v5dev", "v3"))
def family(request: pytest.FixtureRequest, golden_v4v5: GoldenV4V5) -> str:
    """Each diffusion family the v4/v5 golden set holds data for."""
    if request.param not in golden_v4v5.families:
        pytest.skip(f"this golden set has no {request.param} data")
    return str(request.param)
