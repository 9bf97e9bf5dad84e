"""On a CPU the torch engine belongs to the thread it is bound to: a call from any other thread is warned about once
(torch work in a second thread makes every later GPT step about 2x slower, see engines.loader)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np
import pytest

from engines.torch_engine import TorchEngine


def test_calls_off_the_bound_thread_are_warned_once(tiny_models: Path, caplog: pytest.LogCaptureFixture) -> None:
    from bot.config import load_config

    engine = TorchEngine.from_files(load_config(tiny_models / "config.yaml").models, threads=1)
    voice = _voice(engine)

    def speak() -> np.ndarray:
        return engine.decode(np.arange(20) % 7, np.arange(1, 9), voice)

    speak()  # not bound yet: any thread may call
    out: dict[str, np.ndarray] = {}

    def worker() -> None:
        engine.bind_thread()
        out["wav"] = speak()

    caplog.set_level(logging.WARNING, logger="engines.torch_engine")
    t = threading.Thread(target=worker, name="bound")
    t.start()
    t.join()
    assert out["wav"].size > 0 and not caplog.records
    for _ in range(2):
        speak()
    assert [r.getMessage() for r in caplog.records] == [
        "the torch engine was called from thread 'MainThread', not from the thread it is bound to: on a CPU two "
        "threads running torch work slow every later GPT step about 2x; call the engine only from the synthesis "
        "worker"]


def _voice(engine: TorchEngine):  # type: ignore[no-untyped-def]
    from engines.base import VoicePrompt

    gin = engine.sovits.cfg.gin_channels
    return VoicePrompt(np.zeros(0, np.int64), np.full((gin, 1), 0.1, np.float32), np.zeros(0, np.int64),
                       np.zeros((1024, 0), np.float32))
