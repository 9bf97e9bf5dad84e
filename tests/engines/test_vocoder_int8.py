"""The int8 vocoder (engines/vocoder_int8.py, ``engine.vocoder_precision: int8``): which convolutions it quantises,
made once, and how far its audio is from fp32 on the golden SoVITS (its speed is the bench's: ``voc RTF`` of the
``onnx int8-voc`` row)."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engines.base import EngineError
from engines.export import ensure_onnx
from tests.golden import Golden

pytestmark = pytest.mark.timeout(300)

from engines.vocoder_int8 import MIN_SNR_DB  # int8 against fp32 (golden decodes 24.5-24.8 dB; real size 32 dB)


@pytest.fixture(scope="module")
def models(golden: Golden) -> SimpleNamespace:
    return SimpleNamespace(gpt=golden.gpt_path, sovits=golden.sovits_path, hubert=golden.dir / "no-hubert",
                           bert=golden.dir / "no-bert")


@pytest.fixture(scope="module")
def export_dir(models: SimpleNamespace, golden_onnx_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the golden export (the int8 graph is written next to the fp32 one)."""
    root = tmp_path_factory.mktemp("int8-vocoder")
    folder = ensure_onnx(models, golden_onnx_dir)
    shutil.copytree(folder, root / folder.name)
    return root


def _snr_db(ref: np.ndarray, x: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((x - ref).astype(np.float64) ** 2)))


def test_int8_vocoder_quantises_the_resblock_convolutions_once(models, export_dir: Path) -> None:
    import onnx

    from engines.vocoder_int8 import QUANTISED_BLOCKS, quantize_vocoder_int8

    folder = ensure_onnx(models, export_dir)
    former = [folder / "sovits_decode.int8.onnx", folder / "sovits_decode.int8.json"]  # an earlier format's files
    for path in former:
        path.write_bytes(b"old")
    path = quantize_vocoder_int8(folder)
    made = path.stat().st_mtime_ns
    assert quantize_vocoder_int8(folder) == path and path.stat().st_mtime_ns == made  # cached
    assert not list(folder.glob("*.tmp.onnx")) and not list(folder.glob("*augmented*"))
    assert not any(p.exists() for p in former)
    fp32 = onnx.load(str(folder / "sovits_decode.onnx"))
    int8 = onnx.load(str(path))
    blocks = [n.name for n in fp32.graph.node if n.op_type == "Conv" and QUANTISED_BLOCKS in n.name]
    assert blocks, "the decoder has residual-block convolutions"
    # every resblock conv is an int8 convolution, channels-last; its weight int8
    weights = {i.name: i for i in int8.graph.initializer}
    int8_convs = {n.name: n for n in int8.graph.node if n.op_type == "QLinearConv"}
    for name in blocks:
        conv = int8_convs[f"{name}/channels_last"]
        assert conv.domain == "com.microsoft" and onnx.helper.get_attribute_value(conv.attribute[
            [a.name for a in conv.attribute].index("channels_last")]) == 1
        assert weights[conv.input[3]].data_type == onnx.TensorProto.INT8, name
    assert not [n for n in int8.graph.node if n.op_type == "Conv" and QUANTISED_BLOCKS in n.name]
    others = [n for n in int8.graph.node if n.op_type in ("Conv", "ConvTranspose")]
    assert others and all(weights[n.input[1]].data_type == onnx.TensorProto.FLOAT for n in others)  # the rest: fp32
    read = {name for n in int8.graph.node for name in n.input}
    assert [i.name for i in int8.graph.initializer if i.name not in read] == []  # (ONNX Runtime warns of each)


def test_channels_last_blocks_give_the_same_samples(models, export_dir: Path, tmp_path: Path) -> None:
    """The layout rewrite changes no sample: the QDQ graph ONNX Runtime lays out itself decodes the same audio, bit
    for bit; a graph not in the expected form is left as it was."""
    import onnx

    from engines.vocoder_int8 import channels_last_blocks, quantize_qdq, quantize_vocoder_int8

    folder = ensure_onnx(models, export_dir)
    qdq = tmp_path / "qdq.onnx"
    quantize_qdq(folder, qdq)
    _assert_same_samples(folder, qdq, quantize_vocoder_int8(folder), decodes=2)
    fp32 = onnx.load(str(folder / "sovits_decode.onnx"))  # convolutions without QDQ pairs
    before = fp32.SerializeToString()
    assert channels_last_blocks(fp32) == 0 and fp32.SerializeToString() == before


def test_channels_last_blocks_of_v2pro_decoders(golden: Golden, golden_v2pro_dir: Path, meta: dict, version: str,
                                                golden_onnx_dir: Path, tmp_path: Path) -> None:
    """A v2Pro/v2ProPlus decoder (v2ProPlus's is the wider) is rewritten whole, to the same samples."""
    import onnx

    from engines.vocoder_int8 import QUANTISED_BLOCKS, channels_last_blocks, quantize_qdq

    models = SimpleNamespace(gpt=golden.gpt_path, sovits=golden_v2pro_dir / meta["sovits"][version]["file"])
    folder = ensure_onnx(models, golden_onnx_dir)  # (the session's export, shared with the v2Pro engine tests)
    qdq, rewritten = tmp_path / "qdq.onnx", tmp_path / "channels_last.onnx"
    quantize_qdq(folder, qdq)
    model = onnx.load(str(qdq))
    blocks = [n for n in model.graph.node if n.op_type == "Conv" and QUANTISED_BLOCKS in n.name]
    assert channels_last_blocks(model) == len(blocks) > 0
    onnx.save(model, str(rewritten))
    _assert_same_samples(folder, qdq, rewritten, decodes=1)


def _assert_same_samples(folder: Path, a: Path, b: Path, decodes: int) -> None:
    """Graphs ``a`` and ``b`` (sovits_decode variants of ``folder``'s export) decode held-out synthetic inputs to the
    same samples, bit for bit."""
    import onnxruntime as ort

    from engines.vocoder_int8 import _synthetic_feeds

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sessions = [ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"]) for p in (a, b)]
    for feed in _synthetic_feeds(folder, {i.name for i in sessions[0].get_inputs()}, decodes, seed=3):
        ref, out = (s.run(None, feed)[0] for s in sessions)
        assert ref.size > 0 and np.array_equal(ref, out)


def test_int8_vocoder_audio_is_close_to_fp32(models, export_dir: Path, golden: Golden) -> None:
    from engines.onnx_engine import OnnxEngine

    s = golden.sovits_io
    eng = {v: OnnxEngine.from_files(models, export_dir, device="cpu", precision="fp32", threads=1, max_batch=1,
                                    vocoder=v) for v in ("fp32", "int8")}
    cases = [("wav_ns0", 0.0), *[(k, v) for k, v in golden.noise_cases.items()]]
    for case, noise in cases:
        wav = {v: e.decode_with_noise(s["codes"], s["text"], s["ge"][0], noise_scale=noise,
                                      eps=torch.as_tensor(s["eps"])).numpy() for v, e in eng.items()}
        np.testing.assert_allclose(wav["fp32"], s[case], rtol=0, atol=1e-4)  # the fp32 graph is upstream's
        assert wav["int8"].shape == wav["fp32"].shape
        snr = _snr_db(wav["fp32"], wav["int8"])
        assert snr >= MIN_SNR_DB, f"{case}: int8 vocoder {snr:.1f} dB from fp32"


def test_int8_vocoder_is_a_cpu_onnx_option(models, export_dir: Path, tmp_path: Path) -> None:
    from bot.config import EngineConfig
    from engines.loader import load_engine
    from engines.onnx_engine import OnnxEngine

    with pytest.raises(EngineError, match="vocoder_precision"):
        OnnxEngine.from_files(models, export_dir, device="cpu", vocoder="int4")
    cfg = EngineConfig(backend="torch", device="cpu", precision="fp32", vocoder_precision="int8", threads=1)
    with pytest.raises(EngineError, match="runs on the onnx engine on a CPU.*auto or fp32"):
        load_engine(cfg, models)
    with pytest.raises(ValueError, match="vocoder_precision"):
        EngineConfig(vocoder_precision="fp16")


def test_auto_picks_the_int8_vocoder_only_where_its_proof_holds(models, export_dir: Path, monkeypatch) -> None:
    import json

    from engines import vocoder_int8
    from engines.onnx_engine import OnnxEngine

    folder = ensure_onnx(models, export_dir)
    snr = vocoder_int8.vocoder_int8_snr_db(folder)  # held-out decodes, measured once and kept beside the graph
    assert snr >= vocoder_int8.MIN_SNR_DB  # the golden SoVITS passes (24.5-24.8 dB on its own decodes)
    proof = folder / vocoder_int8.PROOF_FILE
    assert json.loads(proof.read_text())["snr_db"] == pytest.approx(snr)
    assert vocoder_int8.choose_vocoder(folder, "auto") == (folder / "sovits_decode.int8.v2.onnx", "int8")
    assert vocoder_int8.choose_vocoder(folder, "fp32") == (folder / "sovits_decode.onnx", "fp32")
    int8 = OnnxEngine.from_files(models, export_dir, device="cpu", precision="int8", threads=1, max_batch=1)
    assert int8.vocoder_precision == "int8"  # auto with the int8 GPT on a CPU
    fp32 = OnnxEngine.from_files(models, export_dir, device="cpu", precision="fp32", threads=1, max_batch=1)
    assert fp32.vocoder_precision == "fp32"  # fp32 asks for upstream's exact decode: the vocoder too

    # a model whose int8 audio misses the bound keeps the fp32 vocoder under auto; int8 asked outright still runs
    monkeypatch.setattr(vocoder_int8, "MIN_SNR_DB", snr + 1.0)
    assert vocoder_int8.choose_vocoder(folder, "auto") == (folder / "sovits_decode.onnx", "fp32")
    assert vocoder_int8.choose_vocoder(folder, "int8")[1] == "int8"
    # a graph made anew is measured anew: the kept figure names the graph it was measured on
    record = json.loads(proof.read_text())
    proof.write_text(json.dumps({**record, "graph_mtime_ns": record["graph_mtime_ns"] - 1, "snr_db": 99.0}))
    assert vocoder_int8.vocoder_int8_snr_db(folder) == pytest.approx(snr)
