"""Fixtures of the engine tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch


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
