"""``python -m bot bench`` at the tiny size: every engine and precision runs, the table and the JSON rows hold."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bot.__main__ import main


def _measured(x: float | None) -> bool:
    """A figure the benchmark took: a positive, finite number."""
    return x is not None and math.isfinite(x) and x > 0


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a hang guard, not a verdict: a dozen fresh processes each load torch and ONNX Runtime
def test_bench_tiny_every_engine_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    rc = main(["bench", "--sizes", "tiny", "--engines", "naive,torch,int8,onnx,voc32,pipeline,accuracy", "--batches",
               "1,2", "--steps", "12", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    meta = doc["meta"]  # every figure says which machine it came from
    assert meta["auto"]["backend"] in ("torch", "onnx")
    assert meta["cpu"] and meta["cores"] >= 1 and _measured(meta["read_gb_s"])
    assert set(meta["isa"]) >= {"avx2", "avx512f", "avx512_vnni", "amx_tile"}
    assert all(isinstance(v, bool) for v in meta["isa"].values())
    assert meta["torch"] and meta["torch_cpu_capability"] and "CPUExecutionProvider" in meta["onnxruntime_providers"]
    rows = doc["rows"]
    decode = {(r["engine"], r["precision"], r["batch"]): r for r in rows if r["engine"] != "pipeline"}
    assert set(decode) == {("naive", "fp32", 1)} | {
        (e, p, b) for e, p in (("torch", "fp32"), ("torch", "int8"), ("onnx", "fp32"), ("onnx", "int8"),
                               ("onnx-v32", "int8"))
        for b in (1, 2)}
    # how fast is the benchmark's to say, not this test's: a row holds a measurement (a positive, finite number)
    # where one was taken and None where none is, latency only at the smallest batch
    for key, r in decode.items():
        assert r["size"] == "tiny" and r["device"] == "cpu", key
        assert _measured(r["tokens_per_s"]) and _measured(r["peak_mem_mb"]), key
        latency = r["batch"] == 1
        assert (_measured(r["ttfa_s"]) and _measured(r["rtf"])) == latency, key
        assert (r["ttfa_s"] is None and r["rtf"] is None) == (not latency), key
        assert _measured(r["vocoder_rtf"]) == latency and (r["vocoder_rtf"] is None) == (not latency), key
        assert _measured(r["floor_ms"]) and _measured(r["x_floor"]) and r["contend"] == 0, key
        # x floor: the row's ms per step over the floor of reading its weights once
        assert r["x_floor"] == pytest.approx(1000 * r["batch"] / r["tokens_per_s"] / r["floor_ms"]), key
    assert decode[("torch", "int8", 1)]["floor_ms"] < decode[("torch", "fp32", 1)]["floor_ms"]  # fewer bytes
    auto = (meta["auto"]["backend"], meta["auto"]["precision"])
    assert {k for k, r in decode.items() if r["default"]} == {(*auto, b) for b in (1, 2)}
    # the vocoder that ran: fp32 with the fp32 GPT and on the voc32 row; with the int8 GPT on the onnx engine, what
    # the int8 vocoder's proof decides on this model (the same in every process of the run)
    assert decode[("onnx", "fp32", 1)]["vocoder"] == "fp32" and decode[("onnx-v32", "int8", 1)]["vocoder"] == "fp32"
    auto_vocoder = decode[("onnx", "int8", 1)]["vocoder"]
    assert auto_vocoder in ("fp32", "int8") and decode[("onnx", "int8", 2)]["vocoder"] == auto_vocoder
    cases = ("cold", "prosody-hit", "audio-hit", "cold-zh")  # (the last: the same text in Chinese, BERT included)
    piped = [r for r in rows if r["engine"] == "pipeline"]
    assert len(piped) == 3 * len(cases)  # fp32, int8 (vocoder auto), and voc32's int8 with the fp32 vocoder
    pipeline = {(r["precision"], r["case"]): r for r in piped[:2 * len(cases)]}
    assert set(pipeline) == {(p, c) for p in ("fp32", "int8") for c in cases}
    assert all(pipeline[("fp32", c)]["vocoder"] == "fp32" for c in cases)
    # the BERT that ran, on the Chinese rows only: fp32 with the fp32 GPT; with the int8 GPT, int8 where its proof
    # held (the tiny BERT runs none of its layers, so its int8 copy is exact)
    assert all((r["bert"] == "-") == (r["case"] != "cold-zh") for r in piped)
    assert pipeline[("fp32", "cold-zh")]["bert"] == "fp32" and pipeline[("int8", "cold-zh")]["bert"] == "int8"
    if auto[0] == "onnx":
        assert all(pipeline[("int8", c)]["vocoder"] == auto_vocoder for c in cases)
    voc32 = {r["case"]: r for r in piped[2 * len(cases):]}
    assert set(voc32) == set(cases) and not any(r["default"] for r in voc32.values())
    assert all(r["precision"] == "int8" and r["vocoder"] == "fp32" for r in voc32.values())
    assert voc32["cold"]["audio_s"] > 1.0 and all(_measured(r["ttfa_s"]) for r in voc32.values())
    assert {r["backend"] for r in pipeline.values()} == {auto[0]}  # the pipeline runs what auto picks
    assert {k for k, r in pipeline.items() if r["default"]} == {(auto[1], c) for c in cases}
    # int8 against fp32 along one teacher-forced path: shares and cosines, one row per backend
    accuracy = {(a["engine"], a["precision"]): a for a in doc["accuracy"]}
    assert set(accuracy) == {("torch", "int8"), ("onnx", "int8")}
    for a in accuracy.values():
        assert a["steps"] == 12 and 0 <= a["argmax_agree"] <= 1 and 0 <= a["top15_overlap"] <= 1
        assert -1 <= a["cosine_min"] <= a["cosine_mean"] <= 1 + 1e-6
    for p in ("fp32", "int8"):
        assert all(_measured(pipeline[(p, c)]["ttfa_s"]) for c in cases), p
        assert pipeline[(p, "cold")]["audio_s"] > 1.0 and pipeline[(p, "cold-zh")]["audio_s"] > 1.0  # three sentences
        # the two hits run the same (faster) parameters, so the audio hit replays exactly what the prosody hit made
        assert pipeline[(p, "audio-hit")]["audio_s"] == pipeline[(p, "prosody-hit")]["audio_s"]
        # the process's high-water mark: torch and the models alone are past 100 MiB; it never goes down
        peaks = [pipeline[(p, c)]["peak_mem_mb"] for c in cases]
        assert peaks[0] > 100 and peaks == sorted(peaks), peaks
    table = capsys.readouterr().out
    assert "x naive" in table and "1.00x" in table and "Synthesizer.stream" in table and "x floor" in table
    assert "CPU: " in table and "memory read" in table and "teacher-forced" in table


@pytest.mark.slow
@pytest.mark.timeout(900)  # a hang guard: two fresh processes (torch, onnx), each timing three vocoders
def test_bench_families_reports_the_v2pro_vocoders_beside_v2(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    rc = main(["bench", "--sizes", "tiny", "--engines", "families", "--batches", "1", "--steps", "4", "--json",
               str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["rows"] == [] and doc["accuracy"] == []  # families alone times the vocoders only
    vocoders = {(v["engine"], v["precision"], v["family"]): v for v in doc["families"]}
    assert set(vocoders) == {(e, p, f) for e, p in (("torch", "fp32"), ("onnx", "fp32"), ("onnx", "int8"))
                             for f in ("v2", "v2Pro", "v2ProPlus")}
    assert all(v["vocoder"] == "fp32" for (e, p, _), v in vocoders.items() if p == "fp32")
    assert {v["vocoder"] for (e, p, _), v in vocoders.items() if p == "int8"} <= {"fp32", "int8"}
    for key, v in vocoders.items():
        assert v["size"] == "tiny" and v["device"] == "cpu" and v["contend"] == 0, key
        assert _measured(v["vocoder_rtf"]), key
    table = capsys.readouterr().out
    assert "SoVITS vocoder RTF by family" in table
    line = next(ln for ln in table.splitlines() if ln.startswith("onnx ") and " tiny " in ln)
    assert len(line.split()) == 5 + 3 + 1 and "-" not in line.split()  # the three families measured side by side


def test_contention_processes_run_for_the_block_only() -> None:
    """--contend N: N busy processes exist inside the block, none after it."""
    from benchmarks.gpt import Contention, parse_contend

    with Contention(2) as c:
        assert len(c.procs) == 2 and all(p.is_alive() for p in c.procs)
        procs = list(c.procs)
    assert not c.procs and not any(p.is_alive() for p in procs)
    with Contention(0) as c:
        assert c.procs == []
    assert parse_contend("0,1") == [0, 1] and parse_contend("2") == [2]
    from engines import SpeechError

    for bad in ("", "x", "-1"):
        with pytest.raises(SpeechError, match="--contend takes counts of busy processes"):
            parse_contend(bad)


def test_natural_pace_ends_each_gpt_run_after_its_tokens_per_phone() -> None:
    """The pipeline rows' random GPT (EOS zeroed) stops each sentence at a natural pace: N tokens per target phone."""
    import numpy as np

    from benchmarks.gpt import natural_pace
    from engines.base import SamplingParams, SemanticRequest, VoicePrompt

    class Batch:
        def __init__(self) -> None:
            self.added: list[SemanticRequest] = []

        def add(self, request_id: int, request: SemanticRequest) -> None:
            self.added.append(request)

    class Engine:
        def __init__(self) -> None:
            self.batches: list[Batch] = []

        def open_batch(self, on_chunk: object = None) -> Batch:
            self.batches.append(Batch())
            return self.batches[-1]

    engine = Engine()
    natural_pace(engine, 2)
    voice = VoicePrompt(prompt_tokens=np.zeros(7, np.int64), ge=np.zeros((512, 1), np.float32),
                        prompt_phones=np.ones(5, np.int64), prompt_bert=np.zeros((1024, 5), np.float32))
    batch = engine.open_batch(on_chunk=None)
    for n in (3, 11):
        batch.add(n, SemanticRequest(np.ones(n, np.int64), np.zeros((1024, n), np.float32), voice,
                                     SamplingParams(top_k=5, seed=n)))
    assert [r.params.early_stop_num for r in engine.batches[0].added] == [6, 22]
    assert [r.params.top_k for r in engine.batches[0].added] == [5, 5]  # nothing else changes
