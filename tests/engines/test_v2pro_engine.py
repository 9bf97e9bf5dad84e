"""Every CPU engine (torch; onnx on the exported graphs through ONNX Runtime, what TensorRT builds from) on a
v2Pro/v2ProPlus model set (golden GPT + golden v2Pro SoVITS + golden SV model): the SV features come out of
``encode_speaker``, the fused style out of ``encode_reference``, and ``decode`` matches upstream; a voice made for the
other family is refused, never mixed; the SV model is required, checked and part of the model id on every engine."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from engines.base import Engine, EngineError, VoicePrompt
from engines.gpt_sovits.checkpoint import load_sv_checkpoint
from engines.torch_engine import TorchEngine
from tests.golden import Golden

BACKENDS = ("torch", "onnx")

ATOL_SV = 1e-3  # golden-v2pro README: sv_emb
ATOL_SOVITS = 1e-4  # golden-v2pro README: ge and waveform


@dataclass(frozen=True)
class _Paths:
    """A ModelPaths with the SV model (HuBERT/BERT are loaded only on use, and not used here)."""

    gpt: Path
    sovits: Path
    hubert: Path
    bert: Path
    sv: Path | None = None


@pytest.fixture(scope="module")
def ref(golden_v2pro_dir: Path) -> dict[str, np.ndarray]:
    with np.load(golden_v2pro_dir / "ref_io.npz") as z:
        return {k: z[k] for k in z.files}


def _paths(golden: Golden, golden_v2pro_dir: Path, meta: dict, version: str, sv: bool = True) -> _Paths:
    v2 = golden.sovits_path
    sovits = golden_v2pro_dir / meta["sovits"][version]["file"] if version != "v2" else v2
    return _Paths(golden.gpt_path, sovits, golden.dir / "no-hubert", golden.dir / "no-bert",
                  golden_v2pro_dir / meta["sv"]["file"] if sv else None)


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each CPU engine that runs a SoVITS; onnx needs onnxruntime."""
    if request.param == "onnx":
        pytest.importorskip("onnxruntime")
    return str(request.param)


def _build(backend: str, paths: _Paths, onnx_dir: Path) -> Engine:
    """The ``backend`` engine over ``paths`` in fp32 on the CPU (onnx: the graphs, GPT included, in ONNX Runtime)."""
    if backend == "torch":
        return TorchEngine.from_files(paths, threads=1)
    from engines.onnx_engine import OnnxEngine

    return OnnxEngine.from_files(paths, onnx_dir, device="cpu", precision="fp32", threads=1, max_batch=1, gpt="graph")


@pytest.fixture(scope="module")
def engine(golden: Golden, golden_v2pro_dir: Path, meta: dict, version: str, backend: str,
           golden_onnx_dir: Path) -> Engine:
    return _build(backend, _paths(golden, golden_v2pro_dir, meta, version), golden_onnx_dir)


@pytest.fixture(scope="module")
def io(golden_v2pro_dir: Path, version: str) -> dict[str, np.ndarray]:
    with np.load(golden_v2pro_dir / f"sovits_{version}_io.npz") as z:
        return {k: z[k] for k in z.files}


def _close(a: np.ndarray, b: np.ndarray, atol: float) -> None:
    assert a.shape == b.shape, (a.shape, b.shape)
    err = float(np.abs(a.astype(np.float64) - b).max())
    assert err < atol, f"max abs error {err:.3g} (atol {atol:g})"


def _voice(ge: np.ndarray, sv_emb: np.ndarray | None) -> VoicePrompt:
    return VoicePrompt(np.zeros(0, np.int64), ge, np.zeros(0, np.int64), np.zeros((1024, 0), np.float32), sv_emb)


@pytest.mark.conformance
def test_encode_and_decode_match_upstream(engine: Engine, io, ref) -> None:
    refs = [ref["refer_wav"][0], ref["refer2_wav"][0]]
    sv = engine.encode_speaker(refs)
    assert sv is not None and sv.dtype == np.float32
    _close(sv, np.concatenate([ref["refer_sv_emb"], ref["refer2_sv_emb"]]), ATOL_SV)
    tokens, ge = engine.encode_reference(None, refs[:1], sv_emb=sv[:1])
    assert tokens.size == 0
    _close(ge, io["ge"][0], ATOL_SOVITS)
    _, ge_own = engine.encode_reference(None, refs[:1])  # computes the SV features itself
    _close(ge_own, ge, 1e-6)
    _, ge2 = engine.encode_reference(None, refs, sv_emb=sv)
    _close(ge2, io["ge_tworefs"][0], ATOL_SOVITS)
    codes, text = io["codes"][0, 0], io["text"][0]
    _close(engine.decode(codes, text, _voice(ge, sv[:1]), noise_scale=0.0), io["wav_ns0"][0, 0], ATOL_SOVITS)
    _close(engine.decode(codes, text, _voice(ge2, sv), noise_scale=0.0), io["wav_ns0_tworefs"][0, 0],
           ATOL_SOVITS)


def test_a_v2_voice_is_refused_by_a_v2pro_model(engine: Engine, io, ref) -> None:
    ge = io["ge"][0]
    with pytest.raises(EngineError, match="no speaker-verification features .*plain v2 SoVITS.*re-encode the voice"):
        engine.decode(io["codes"][0, 0], io["text"][0], _voice(ge, None), noise_scale=0.0)
    with pytest.raises(EngineError, match="speaker-verification features are .*re-encode"):
        engine.decode(io["codes"][0, 0], io["text"][0], _voice(ge, np.zeros((1, 3), np.float32)))
    with pytest.raises(EngineError, match="rows for 1 reference clips"):
        engine.encode_reference(None, [np.zeros(32000, np.float32)], sv_emb=np.zeros((2, ref["refer_sv_emb"].shape[1])))


def test_a_v2pro_voice_is_refused_by_a_v2_model(golden: Golden, golden_v2pro_dir: Path, meta: dict, ref,
                                                backend: str, golden_onnx_dir: Path) -> None:
    v2 = _build(backend, _paths(golden, golden_v2pro_dir, meta, "v2"), golden_onnx_dir)
    assert v2.encode_speaker([ref["refer_wav"][0]]) is None and v2.speaker is None  # type: ignore[attr-defined]
    _, ge = v2.encode_reference(None, [ref["refer_wav"][0]])
    v2.decode(np.arange(8) % 5, np.arange(1, 6), _voice(ge, None), noise_scale=0.0)  # its own voice is fine
    sv = np.asarray(ref["refer_sv_emb"], np.float32)
    with pytest.raises(EngineError, match="encoded for a v2Pro/v2ProPlus SoVITS .*plain v2"):
        v2.decode(np.arange(8) % 5, np.arange(1, 6), _voice(ge, sv), noise_scale=0.0)


def test_a_v2pro_model_needs_the_sv_file(golden: Golden, golden_v2pro_dir: Path, meta: dict, backend: str,
                                         tmp_path: Path) -> None:
    onnx_dir = tmp_path / "onnx"
    with pytest.raises(EngineError, match="needs the speaker-verification model .*models.sv"):
        _build(backend, _paths(golden, golden_v2pro_dir, meta, "v2Pro", sv=False), onnx_dir)
    missing = _Paths(**{**_paths(golden, golden_v2pro_dir, meta, "v2Pro").__dict__, "sv": tmp_path / "no.ckpt"})
    with pytest.raises(EngineError, match="no.ckpt does not exist"):
        _build(backend, missing, onnx_dir)
    assert not onnx_dir.exists() or not any(onnx_dir.iterdir())  # refused before any export work


def test_the_sv_model_is_part_of_the_model_identity(golden: Golden, golden_v2pro_dir: Path, meta: dict,
                                                    backend: str, golden_onnx_dir: Path, tmp_path: Path) -> None:
    paths = _paths(golden, golden_v2pro_dir, meta, "v2Pro")
    a = _build(backend, paths, golden_onnx_dir)
    assert a.speaker is not None and not a.speaker.model.loaded  # loaded on first use
    same = tmp_path / "same.ckpt"
    shutil.copy(paths.sv, same)  # type: ignore[arg-type]
    b = _build(backend, _Paths(**{**paths.__dict__, "sv": same}), golden_onnx_dir)
    assert b.model_id == a.model_id  # identity is the bytes, not the path
    sd = dict(load_sv_checkpoint(paths.sv).state_dict)  # type: ignore[arg-type]
    sd["conv1.weight"] = sd["conv1.weight"] * 2
    other = tmp_path / "other.ckpt"
    torch.save(sd, other)
    c = _build(backend, _Paths(**{**paths.__dict__, "sv": other}), golden_onnx_dir)
    assert c.model_id != a.model_id
    if backend != "torch":  # the same files compute the same voices on every backend: one id
        assert a.model_id == TorchEngine.from_files(paths, threads=1).model_id


def test_a_mismatched_sv_model_is_refused_at_load(golden: Golden, golden_v2pro_dir: Path, meta: dict, backend: str,
                                                  golden_onnx_dir: Path, tmp_path: Path) -> None:
    """An SV model of another width (here a narrower stem) is caught when the engine loads, by weight shapes only."""
    from engines.gpt_sovits.sv import ERes2NetV2

    m = meta["sv"]["arch"]["m_channels"] - 2
    narrow = tmp_path / "narrow.ckpt"
    torch.save({k: v.half() if v.is_floating_point() else v for k, v in ERes2NetV2(m).state_dict().items()}, narrow)
    paths = _paths(golden, golden_v2pro_dir, meta, "v2Pro")
    with pytest.raises(EngineError, match=f"gives {ERes2NetV2(m).out_dim}-wide features but the SoVITS reads "
                                          f"{meta['sv']['forward3_dim']}"):
        _build(backend, _Paths(**{**paths.__dict__, "sv": narrow}), golden_onnx_dir)
    junk = tmp_path / "junk.ckpt"
    torch.save({"conv1.weight": torch.zeros(4, 1, 3, 3), "fuse34.local_att.0.weight": torch.zeros(1)}, junk)
    with pytest.raises(EngineError, match="speaker-verification weights lack layer blocks"):
        _build(backend, _Paths(**{**paths.__dict__, "sv": junk}), golden_onnx_dir)


@pytest.mark.parametrize(("magic", "match"), [(b"03", "v3 LoRA files are not supported"),
                                              (b"04", "v4 LoRA files are not supported")])
def test_v3_v4_files_stay_refused(golden: Golden, golden_v2pro_dir: Path, meta: dict, backend: str, tmp_path: Path,
                                  magic: bytes, match: str) -> None:
    """A v3/v4 SoVITS (a different decoder) is refused with the reason by every engine, before any export work."""
    tagged = tmp_path / "s2v3.pth"
    tagged.write_bytes(magic + golden.sovits_path.read_bytes()[2:])
    paths = _Paths(**{**_paths(golden, golden_v2pro_dir, meta, "v2Pro").__dict__, "sovits": tagged})
    onnx_dir = tmp_path / "onnx"
    with pytest.raises(EngineError, match=match):
        _build(backend, paths, onnx_dir)
    assert not onnx_dir.exists() or not any(onnx_dir.iterdir())
