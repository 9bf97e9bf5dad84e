"""Shared fixtures. Markers are registered in pyproject.toml (conformance, e2e, gpu, slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.golden import Golden
from tests.golden import golden_dir as _golden_dir

TESTS_DIR = Path(__file__).resolve().parent
DATA_DIR = TESTS_DIR / "data"
# tests/tools/ holds scripts (the golden-variant writer), not tests
collect_ignore = ["tools"]


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    """The conformance data folder: $VOICEBOT_GOLDEN_DIR when set, else tests/data/golden."""
    return _golden_dir()


@pytest.fixture(scope="session")
def golden(golden_dir: Path) -> Golden:
    """The golden data set, read once (arrays, meta.json, the checkpoints' configs): see tests/golden.py."""
    return Golden(golden_dir)


@pytest.fixture(scope="session")
def golden_onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ONNX export folder per session for the golden models (engines.export keys it by the model files)."""
    return tmp_path_factory.mktemp("golden-onnx")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model set + config.yaml written by `python -m bot models make-tiny` (once per test session)."""
    from bot.__main__ import main

    out = tmp_path_factory.mktemp("tiny-models")
    assert main(["models", "make-tiny", str(out)]) == 0
    return out


@pytest.fixture
def tiny_config(tiny_models: Path, tmp_path: Path):
    """The tiny models' config with this test's own data folders (voices, caches, database)."""
    import dataclasses

    from bot.config import load_config

    cfg = load_config(tiny_models / "config.yaml")
    return dataclasses.replace(
        cfg,
        voices=dataclasses.replace(cfg.voices, dir=tmp_path / "data" / "voices"),
        cache=dataclasses.replace(cfg.cache, dir=tmp_path / "data" / "cache"),
        discord=dataclasses.replace(cfg.discord, database=tmp_path / "data" / "voicebot.sqlite3"),
    )


@pytest.fixture(scope="session")
def tiny_engine(tiny_models: Path):
    """One torch engine on the tiny models, shared by the tests that only run it."""
    from bot.config import load_config
    from engines import load_engine

    cfg = load_config(tiny_models / "config.yaml")
    return load_engine(cfg.engine, cfg.models)


@pytest.fixture(scope="session")
def golden_v2pro_dir() -> Path:
    """The v2Pro/v2ProPlus conformance data: $VOICEBOT_GOLDEN_V2PRO_DIR when set, else tests/data/golden-v2pro."""
    import os

    return Path(os.environ.get("VOICEBOT_GOLDEN_V2PRO_DIR") or DATA_DIR / "golden-v2pro")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A failure's report is made again when making it raised SystemError: Python 3.11's ``ast.parse`` (which pytest
    runs on the failing source) is not thread-safe, and a thread formatting a traceback at the same moment makes it
    fail with "AST constructor recursion depth mismatch". Uncaught here that ends the whole session (INTERNALERROR)
    and hides the test's own failure."""
    try:
        return (yield)
    except SystemError as e:
        error = e
    for _ in range(3):  # the race is a moment long: another try makes the report
        try:
            return pytest.TestReport.from_item_and_call(item, call)
        except SystemError as e:
            error = e
    assert call.excinfo is not None  # only a failure's traceback is parsed
    where = call.excinfo.traceback[-1] if call.excinfo.traceback else None
    place = f"{where.path}:{where.lineno + 1}: " if where is not None else ""
    return pytest.TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, "failed",
                             f"{place}{call.excinfo.exconly()} (its traceback could not be shown: {error})",
                             call.when, [], call.duration, call.start, call.stop,
                             user_properties=item.user_properties)
