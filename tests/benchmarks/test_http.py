"""``python -m bot bench-http``: the synthetic reference it speaks with, and the command over the tiny models."""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest

from benchmarks.http import REFERENCE_S, run_http_bench, synthetic_speech
from bot.config import load_config

RATE = 32000  # Hz, the synthesizer's output rate


async def test_bench_reference_clip_is_accepted_as_speech() -> None:
    from synthesis.audio import Decoded, prepare_reference

    x = synthetic_speech()
    assert x.dtype == np.float32 and x.size == int(REFERENCE_S * RATE) and np.abs(x).max() == pytest.approx(0.5)
    ref = prepare_reference(Decoded(x, RATE, x.size / RATE), min_s=3.0, max_s=10.0)
    assert ref.duration_s >= 3.0 and not ref.warnings


async def test_bench_http_measures_every_protocol_cold_and_warm(tiny_models: Path, tmp_path: Path, capsys) -> None:
    temps_before = set(Path(tempfile.gettempdir()).glob("voicebot-bench-http-*"))
    out = tmp_path / "bench.json"
    config = load_config(tiny_models / "config.yaml")
    # asyncio.run inside: the command runs on its own loop, as `python -m bot bench-http` does
    assert await asyncio.to_thread(run_http_bench, config, argparse.Namespace(json=out, repeat=1)) == 0
    rows = json.loads(out.read_text())["rows"]
    protocols = ["api_v2 GET wav stream", "api_v2 POST wav whole", "SillyTavern ogg stream", "OpenAI mp3",
                 "OpenAI pcm", "WebSocket pcm"]
    assert [(r["protocol"], r["run"]) for r in rows] == [(p, run) for p in protocols for run in ("cold", "warm")]
    for cold, warm in zip(rows[::2], rows[1::2]):
        assert (cold["gpt_sentences"], cold["prosody_hits"], cold["audio_hits"]) == (2, 0, 0)  # cold: the GPT ran
        assert (warm["gpt_sentences"], warm["prosody_hits"], warm["audio_hits"]) == (0, 2, 0)  # warm: SoVITS only
        assert cold["bytes"] == warm["bytes"] > 0  # seeded: the same audio both times
        for r in (cold, warm):
            assert 0 < r["ttfb_s"] <= r["total_s"]
    by_name = {r["protocol"]: r for r in rows}
    # one audio, three encodings: 32 kHz wav = 44-byte header + 16-bit pcm; OpenAI pcm is at 24 kHz
    wav, ws, pcm = (by_name[p]["bytes"] for p in ("api_v2 GET wav stream", "WebSocket pcm", "OpenAI pcm"))
    assert wav == ws + 44 and abs(pcm - ws * 3 // 4) <= 4
    printed = capsys.readouterr().out
    assert "first byte ms" in printed and all(p in printed for p in protocols)
    assert set(Path(tempfile.gettempdir()).glob("voicebot-bench-http-*")) == temps_before  # nothing left behind
