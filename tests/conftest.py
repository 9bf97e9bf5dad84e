"""Shared fixtures. Markers are registered in pyproject.toml (conformance, e2e, gpu, slow)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
DATA_DIR = TESTS_DIR / "data"


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    """The conformance data folder: $VOICEBOT_GOLDEN_DIR when set, else tests/data/golden."""
    return Path(os.environ.get("VOICEBOT_GOLDEN_DIR") or DATA_DIR / "golden")
