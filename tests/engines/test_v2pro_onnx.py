"""The ONNX export of a v2Pro/v2ProPlus SoVITS, run in ONNX Runtime against upstream's outputs: ``ref_style`` takes the
SV features as a second input, ``sovits_decode`` feeds the MRTE ``ge_to512(ge)``; both stay within TensorRT's op list.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from engines.export import FORBIDDEN_OPS, TRT_SUPPORTED_OPS, check_graphs, ensure_onnx, load_manifest
from tests.golden import Golden

ort = pytest.importorskip("onnxruntime")

ATOL = 1e-4  # golden-v2pro README: ge and waveform (fp32)

pytestmark = [pytest.mark.conformance, pytest.mark.slow]


@pytest.fixture(scope="module")
def folder(golden: Golden, golden_v2pro_dir: Path, meta: dict, version: str, golden_onnx_dir: Path) -> Path:
    """The export of golden GPT + golden v2Pro SoVITS (the session's, shared with the engine tests)."""
    models = SimpleNamespace(gpt=golden.gpt_path, sovits=golden_v2pro_dir / meta["sovits"][version]["file"])
    return ensure_onnx(models, golden_onnx_dir)


def _npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _session(folder: Path, name: str):  # type: ignore[no-untyped-def]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(folder / f"{name}.onnx"), opts, providers=["CPUExecutionProvider"])


def _close(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape, (a.shape, b.shape)
    err = float(np.abs(a.astype(np.float64) - b).max())
    assert err < ATOL, f"max abs error {err:.3g}"


def test_manifest_and_ops(folder: Path, meta: dict, version: str, golden_v2pro_dir: Path) -> None:
    manifest = load_manifest(folder)["sovits"]
    ref = _npz(golden_v2pro_dir / "ref_io.npz")
    assert manifest["version"] == version and manifest["sv_dim"] == ref["refer_sv_emb"].shape[1]
    for name, used in check_graphs(folder).items():
        assert set(used) <= TRT_SUPPORTED_OPS, name
        assert not set(used) & FORBIDDEN_OPS, name
    assert [i.name for i in _session(folder, "ref_style").get_inputs()] == ["spec", "sv"]


def test_ref_style_graph(folder: Path, golden_v2pro_dir: Path, version: str) -> None:
    ref = _npz(golden_v2pro_dir / "ref_io.npz")
    io = _npz(golden_v2pro_dir / f"sovits_{version}_io.npz")
    sess = _session(folder, "ref_style")
    (ge,) = sess.run(None, {"spec": ref["refer_spec"], "sv": ref["refer_sv_emb"]})
    _close(ge, io["ge"])
    (ge2,) = sess.run(None, {"spec": ref["refer2_spec"], "sv": ref["refer2_sv_emb"]})
    _close(ge2, io["ge_refer2"])


def test_decode_graph(folder: Path, golden_v2pro_dir: Path, version: str) -> None:
    io = _npz(golden_v2pro_dir / f"sovits_{version}_io.npz")
    sess = _session(folder, "sovits_decode")
    feeds = {"codes": io["codes"].astype(np.int64), "text": io["text"].astype(np.int64)}
    zeros = np.zeros_like(io["eps"], dtype=np.float32)
    cases = {"wav_ns0": (io["ge"], zeros), "wav_ns05_eps": (io["ge"], (0.5 * io["eps"]).astype(np.float32)),
             "wav_ns0_tworefs": (io["ge_tworefs"], zeros),
             "wav_ns0_speed125": (io["ge"], np.zeros(io["m_p_speed125"].shape, np.float32))}
    for case, (ge, noise) in cases.items():
        (wav,) = sess.run(None, {**feeds, "ge": ge.astype(np.float32), "noise": noise})
        assert wav.shape == io[case].shape, case
        _close(wav, io[case])


def test_tensorrt_profiles_cover_every_dynamic_input(folder: Path) -> None:
    """TensorRT builds from these graphs: every input with a dynamic axis (the SV features included) has a profile
    whose shapes agree with the graph's fixed axes (checked here without TensorRT)."""
    from engines.tensorrt_engine import MAX_REF_BATCH, profiles

    table = profiles(load_manifest(folder), max_batch=4)
    for graph, profile in table.items():
        inputs = {i.name: i.shape for i in _session(folder, graph).get_inputs()}
        dynamic = {n for n, shape in inputs.items() if any(not isinstance(d, int) for d in shape)}
        assert dynamic <= set(profile) <= set(inputs), graph
        for name, shapes in profile.items():
            for shape in shapes:
                assert len(shape) == len(inputs[name]), (graph, name)
                assert all(d == s for d, s in zip(inputs[name], shape) if isinstance(d, int)), (graph, name, shape)
    sv_dim = load_manifest(folder)["sovits"]["sv_dim"]
    assert table["ref_style"]["sv"] == ((1, sv_dim), (1, sv_dim), (MAX_REF_BATCH, sv_dim))
