"""``python -m bot bench`` at the tiny size: every engine and precision runs, the table and the JSON rows hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.__main__ import main


@pytest.mark.slow
def test_bench_tiny_every_engine_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    rc = main(["bench", "--sizes", "tiny", "--engines", "naive,torch,int8,onnx,pipeline", "--batches", "1,2",
               "--steps", "12", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())
    decode = {(r["engine"], r["precision"], r["batch"]): r for r in rows if r["engine"] != "pipeline"}
    assert set(decode) == {("naive", "fp32", 1)} | {
        (e, p, b) for e, p in (("torch", "fp32"), ("torch", "int8"), ("onnx", "fp32"), ("onnx", "int8"))
        for b in (1, 2)}
    for key, r in decode.items():
        assert r["size"] == "tiny" and r["device"] == "cpu", key
        assert r["tokens_per_s"] > 10 and r["peak_mem_mb"] > 50, key
        assert (r["ttfa_s"] is not None and 0 < r["ttfa_s"] < 10 and 0 < r["rtf"] < 5) == (r["batch"] == 1), key
    pipeline = {(r["precision"], r["case"]): r for r in rows if r["engine"] == "pipeline"}
    assert set(pipeline) == {(p, c) for p in ("fp32", "int8") for c in ("cold", "prosody-hit", "audio-hit")}
    for p in ("fp32", "int8"):
        assert pipeline[(p, "audio-hit")]["ttfa_s"] < pipeline[(p, "cold")]["ttfa_s"]
        assert pipeline[(p, "cold")]["audio_s"] > 1.0  # three sentences of audio came out
    table = capsys.readouterr().out
    assert "x naive" in table and "1.00x" in table and "Synthesizer.stream" in table
