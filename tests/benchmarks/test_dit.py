"""``python -m bot bench --engines dit`` at the tiny size: beside the DiT and vocoder rows, a family's whole pipeline
on upstream's naive way and on the product's, in the table and the JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bot.__main__ import main

RATE = 48000  # Hz, v5turbo's output


def _measured(x: float | None) -> bool:
    """A figure the benchmark took: a positive, finite number."""
    return x is not None and math.isfinite(x) and x > 0


@pytest.mark.slow
@pytest.mark.timeout(900)  # a hang guard: two fresh processes, each writing and loading a tiny v5turbo set
def test_bench_dit_pipeline_rows_naive_beside_fast(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    rc = main(["bench", "--sizes", "tiny", "--engines", "dit", "--dit-families", "v5turbo", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["rows"] == [] and doc["families"] == []  # dit alone times the diffusion families only
    dit = {d["path"]: d for d in doc["dit"] if d["family"] == "v5turbo"}
    assert set(dit) == {"naive", "fp32", "fast"}
    assert all(_measured(d["ref_gflops"]) for d in dit.values())  # each row says how fast the machine ran then
    rows = {(w["family"], w["path"]): w for w in doc["dit_pipeline"]}
    assert set(rows) == {("v5turbo", "naive"), ("v5turbo", "fast")}
    naive, fast = rows[("v5turbo", "naive")], rows[("v5turbo", "fast")]
    for path, w in (("naive", naive), ("fast", fast)):
        assert w["size"] == "tiny" and w["contend"] == 0 and w["rounds"] >= 1, path
        assert w["sentences"] == 2 and w["steps"] == dit["naive"]["steps"], path  # the family's default steps
        assert _measured(w["first_audio_s"]) and _measured(w["total_s"]) and _measured(w["audio_s"]), path
        # the first audio comes before the last (two sentences), and the RTF is the total over the audio
        assert w["first_audio_s"] <= w["total_s"], path
        assert w["rtf"] == pytest.approx(w["total_s"] / w["audio_s"]), path
    # the same phones and tokens per sentence give the same mel frames, so the same samples: only the float sums of
    # the seconds may differ, by far less than one sample
    assert fast["audio_s"] == pytest.approx(naive["audio_s"], abs=0.5 / RATE)
    # upstream's way runs fp32 everywhere, the torch vocoder; the product says what its proofs let run
    assert (naive["gpt"], naive["dit"], naive["vocoder"]) == ("fp32", "fp32", "torch-fp32")
    assert fast["gpt"] in ("fp32", "int8-weight-only", "int8-dynamic")
    assert fast["dit"] in ("fp32", "int8") and fast["vocoder"] in ("ort-fp32", "ort-int8")
    # each ratio is the naive row's figure over the row's own
    assert naive["x_first"] == 1.0 and naive["x_rtf"] == 1.0
    assert fast["x_first"] == pytest.approx(naive["first_audio_s"] / fast["first_audio_s"])
    assert fast["x_rtf"] == pytest.approx(naive["rtf"] / fast["rtf"])
    table = capsys.readouterr().out
    head = next(i for i, ln in enumerate(table.splitlines()) if ln.startswith("Whole pipeline"))
    assert "naive: upstream's way" in table.splitlines()[head]
    lines = table.splitlines()[head + 3:head + 5]
    assert [ln.split()[:2] for ln in lines] == [["v5turbo", "naive"], ["v5turbo", "fast"]]
