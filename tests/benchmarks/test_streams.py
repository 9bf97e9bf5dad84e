"""``python -m bot bench-streams``: the playback model that decides an underrun, and the command at the tiny size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.__main__ import main
from benchmarks.streams import SENTENCES_PER_STREAM, paragraph, parse_counts, playback
from engines.base import SpeechError


def test_playback_starts_with_the_first_chunk_and_counts_gaps() -> None:
    # 1 s chunks: the second is early (0.1 s to spare), the third 0.1 s late, the fourth exactly on time again
    # once playback resumed at the third's arrival (2.6 + 1.0), the fifth half a frame late (not heard)
    arrivals = [(0.5, 1.0), (1.4, 1.0), (2.6, 1.0), (3.6, 1.0), (4.61, 1.0)]
    start, gaps, worst = playback(arrivals)
    assert start == 0.5 and gaps == 1 and worst == pytest.approx(0.1)
    assert playback([(0.2, 3.0), (0.3, 1.0), (3.1, 1.0)]) == (0.2, 0, 0.0)


def test_every_stream_speaks_its_own_paragraph() -> None:
    texts = [paragraph(i) for i in range(12)]
    assert len(set(texts)) == 12
    assert all(t.count(".") == SENTENCES_PER_STREAM for t in texts)


@pytest.mark.parametrize("text", ["", "0", "1,x", "-2"])
def test_stream_counts_are_checked(text: str) -> None:
    with pytest.raises(SpeechError, match="--streams"):
        parse_counts(text)


@pytest.mark.slow
def test_bench_streams_command_at_tiny_size(tiny_models: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "streams.json"
    assert main(["bench-streams", "--config", str(tiny_models / "config.yaml"), "--streams", "1,3",
                 "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["engine"] == "torch" and doc["meta"]["device"] == "cpu"
    rows = doc["rows"]
    assert [r["streams"] for r in rows] == [1, 3]
    for r in rows:
        assert 0 < r["ttfa_median_s"] <= r["ttfa_max_s"] < r["wall_s"]
        assert len(r["ttfa_s"]) == len(r["late_s"]) == r["streams"]  # each stream's own figures
        assert max(r["ttfa_s"]) == r["ttfa_max_s"] and max(r["late_s"]) == r["worst_late_s"]
        assert r["audio_s"] > 1.0 * r["streams"]  # every stream spoke its paragraph
        assert r["realtime_x"] == pytest.approx(r["audio_s"] / r["wall_s"])
    table = capsys.readouterr().out
    assert "x real time" in table and "held in real time:" in table
