"""The ONNX export and the ONNX Runtime engine against the golden conformance data (fp32, CPU).

Tolerances are the golden README's: greedy tokens exact, logits atol 1e-4, SoVITS waveform / ge atol 1e-4, VQ codes
exact. The int8 step graph's structure is checked here; its precision proof (logit bound, decided greedy choices,
the stop) is test_int8_proof.py's, and the Engine contract over every engine is test_engine_contract.py's.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engines.base import EngineError, SamplingParams, SemanticRequest, VoicePrompt, prior_noise
from engines.export import FORBIDDEN_OPS, GRAPHS, TRT_SUPPORTED_OPS, check_graphs, ensure_onnx, graph_ops
from engines.gpt_sovits.generate import BatchDecoder, generate
from tests.golden import Golden, teacher_forced_logits

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(300)]

LOGITS_ATOL = 1e-4
WAV_ATOL = 1e-4


@pytest.fixture(scope="module")
def models(golden: Golden) -> SimpleNamespace:
    return SimpleNamespace(gpt=golden.gpt_path, sovits=golden.sovits_path, hubert=golden.dir / "no-hubert",
                           bert=golden.dir / "no-bert")


@pytest.fixture(scope="module")
def onnx_dir(golden_onnx_dir: Path) -> Path:
    return golden_onnx_dir


@pytest.fixture(scope="module")
def engine(models: SimpleNamespace, onnx_dir: Path):
    from engines.onnx_engine import OnnxEngine

    # the GPT graphs (what TensorRT builds from), verified through ONNX Runtime; the CPU default runs the fused step
    return OnnxEngine.from_files(models, onnx_dir, device="cpu", precision="fp32", threads=1, max_batch=4, gpt="graph")


@pytest.fixture(scope="module")
def sovits_io(golden: Golden) -> dict[str, np.ndarray]:
    return golden.sovits_io


def _decode_all(engine, items: list[tuple[np.ndarray, np.ndarray, np.ndarray, SamplingParams]]) -> list[np.ndarray]:
    """Run requests together through the engine's GPT with the shared BatchDecoder; results in input order."""
    decoder = BatchDecoder(engine.new_gpt(), max_slots=4, max_len=512)
    for i, (phones, bert, prompt, params) in enumerate(items):
        decoder.add(i, phones, bert, prompt, params)
    out: dict[int, np.ndarray] = {}
    while decoder.active:
        out.update(decoder.step())
    return [out[i] for i in range(len(items))]


# ------------------------------------------------------------------------------------------------------ graphs


def test_graphs_pass_onnx_checker_and_tensorrt_op_list(engine, models, onnx_dir: Path) -> None:
    folder = ensure_onnx(models, onnx_dir)
    ops = check_graphs(folder)
    assert set(ops) == set(GRAPHS)
    for name, used in ops.items():
        assert set(used) <= TRT_SUPPORTED_OPS, name
        assert not set(used) & FORBIDDEN_OPS, name
    assert "LayerNormalization" in ops["gpt_step"] and "If" not in ops["gpt_step"]
    assert "ConvTranspose" in ops["sovits_decode"] and "Resize" in ops["sovits_decode"]


def test_check_graphs_rejects_an_op_tensorrt_cannot_parse(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])
    graph = helper.make_graph([helper.make_node("Unique", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "ref_style.onnx"))
    with pytest.raises(EngineError, match="TensorRT 10 cannot parse: Unique"):
        check_graphs(tmp_path, ("ref_style",))
    with pytest.raises(EngineError, match="gpt_step.onnx is missing"):
        check_graphs(tmp_path, ("gpt_step",))


def test_export_is_reused_and_keyed_by_the_model_files(engine, models, onnx_dir: Path) -> None:
    folder = ensure_onnx(models, onnx_dir)
    stamp = (folder / "gpt_step.onnx").stat().st_mtime_ns
    assert ensure_onnx(models, onnx_dir) == folder
    assert (folder / "gpt_step.onnx").stat().st_mtime_ns == stamp  # not exported again
    assert len(folder.name) == 16 and folder.parent == onnx_dir


# ------------------------------------------------------------------------------------------------- GPT conformance


def test_greedy_tokens_exact(engine, golden: Golden) -> None:
    for key, case in golden.greedy.items():
        (tokens,) = generate(engine.new_gpt(), [golden.request(case)])
        np.testing.assert_array_equal(tokens, case.generated, err_msg=key)


def test_logits_along_the_greedy_path(engine, golden: Golden) -> None:
    for key, case in [*golden.greedy.items(), ("reffree", golden.reffree)]:
        got = teacher_forced_logits(engine.new_gpt(), case.phones, case.bert, case.prompt, case.fed)
        np.testing.assert_allclose(got, case.logits_raw, rtol=0, atol=LOGITS_ATOL, err_msg=key)


def test_reference_free_tokens_exact(engine, golden: Golden) -> None:
    case = golden.reffree
    (tokens,) = _decode_all(engine, [(case.phones, case.bert, case.prompt, case.params())])
    np.testing.assert_array_equal(tokens, case.generated)


def test_two_requests_decoded_together_match_golden(engine, golden: Golden) -> None:
    items = golden.batch_items
    got = _decode_all(engine, [(ph, bert, golden.prompt_tokens, golden.batch_params) for ph, bert, _ in items])
    for i, (_, _, expected) in enumerate(items):
        np.testing.assert_array_equal(got[i], expected)


def test_seeded_sampling_matches_the_torch_decoder(engine, golden: Golden, models) -> None:
    """Same seeds, same sampler: ONNX Runtime and torch draw the same tokens (top_k 15, three rows at once)."""
    from engines.gpt_sovits.checkpoint import load_gpt_checkpoint
    from engines.gpt_sovits.gpt import Text2SemanticModel

    torch_gpt = Text2SemanticModel.from_checkpoint(load_gpt_checkpoint(models.gpt))
    items = [(golden.phones, golden.bert, golden.prompt_tokens,
              SamplingParams(top_k=15, temperature=1.0, seed=100 + i, early_stop_num=30)) for i in range(3)]
    got = _decode_all(engine, items)
    decoder = BatchDecoder(torch_gpt, max_slots=4, max_len=512)
    for i, (ph, bert, prompt, params) in enumerate(items):
        decoder.add(i, ph, bert, prompt, params)
    ref: dict[int, np.ndarray] = {}
    while decoder.active:
        ref.update(decoder.step())
    for i in range(3):
        np.testing.assert_array_equal(got[i], ref[i])
    assert len({tuple(t) for t in got}) == 3  # different seeds really sample differently


def test_row_joining_mid_decode_gets_its_golden_tokens(engine, golden: Golden) -> None:
    """Continuous batching: a request added while another decodes still gets exactly its own greedy tokens."""
    batch = engine.open_batch()
    case = next(iter(golden.greedy.values()))
    req = golden.request(case)
    long = SemanticRequest(req.phones, req.bert, req.voice, SamplingParams(top_k=15, seed=7, early_stop_num=200))
    batch.add(1, long)
    done: dict[int, np.ndarray] = {}
    for _ in range(20):
        done.update(batch.step())
    batch.add(2, req)
    assert batch.active == 2 and batch.capacity == 4
    while 2 not in done:
        done.update(batch.step())
    np.testing.assert_array_equal(done[2], case.generated)
    batch.cancel(1)
    assert batch.active == 0


# ---------------------------------------------------------------------------------------------- SoVITS conformance


def test_reference_style_and_codes(engine, sovits_io) -> None:
    ge = engine.ref_style(torch.as_tensor(sovits_io["refer_spec"])).numpy()
    np.testing.assert_allclose(ge, sovits_io["ge"], rtol=0, atol=WAV_ATOL)
    codes = engine.extract_latent(torch.as_tensor(sovits_io["ssl_feature"])).numpy()
    np.testing.assert_array_equal(codes, sovits_io["ssl_codes"])
    tokens, ge2 = engine.encode_reference(None, [sovits_io["refer_wav"][0], sovits_io["refer2_wav"][0]])
    assert tokens.size == 0
    mean = (sovits_io["ge"][0] + sovits_io["ge_refer2"][0]) / 2
    np.testing.assert_allclose(ge2, mean, rtol=0, atol=WAV_ATOL)


def test_sovits_waveform(engine, golden: Golden) -> None:
    s = golden.sovits_io
    cases = {"wav_ns0": (1.0, 0.0), "wav_ns0_tworefs": (1.0, 0.0),
             **{k: (v, 0.0) for k, v in golden.speed_cases.items()},
             **{k: (1.0, v) for k, v in golden.noise_cases.items()}}
    assert len(cases) >= 4
    for case, (speed, noise) in cases.items():
        ge = s["ge"][0] if case != "wav_ns0_tworefs" else (s["ge"][0] + s["ge_refer2"][0]) / 2
        wav = engine.decode_with_noise(s["codes"], s["text"], ge, speed=speed, noise_scale=noise,
                                       eps=torch.as_tensor(s["eps"])).numpy()
        assert wav.shape == s[case].shape, case
        np.testing.assert_allclose(wav, s[case], rtol=0, atol=WAV_ATOL, err_msg=case)


def test_seeded_decode_matches_the_torch_sovits(engine, sovits_io, models) -> None:
    """With a seed, the prior noise is the torch engine's draw, so the waveforms agree."""
    from engines.gpt_sovits.checkpoint import load_sovits_checkpoint
    from engines.gpt_sovits.sovits import SoVITSDecoder

    sovits = SoVITSDecoder.from_checkpoint(load_sovits_checkpoint(models.sovits))
    s = sovits_io
    voice = VoicePrompt(np.zeros(0, np.int64), s["ge"][0], np.zeros(0, np.int64), np.zeros((1024, 0), np.float32))
    frames = 2 * s["codes"].shape[-1]
    for offset in (0, 6):  # a piece of a sentence from its frame 6 on: the seed's noise from there
        wav = engine.decode(s["codes"][0, 0], s["text"][0], voice, noise_scale=0.5, seed=1234, noise_offset=offset)
        eps = torch.from_numpy(prior_noise(1234, sovits.cfg.inter_channels, frames, offset))
        with torch.inference_mode():
            ref = sovits.decode(torch.as_tensor(s["codes"]), torch.as_tensor(s["text"]), torch.as_tensor(s["ge"]),
                                noise_scale=0.5, eps=eps)[0, 0].numpy()
        np.testing.assert_allclose(wav, ref, rtol=0, atol=WAV_ATOL)
    other = engine.decode(s["codes"][0, 0], s["text"][0], voice, noise_scale=0.5, seed=1235)
    assert np.abs(other - wav).max() > 1e-3


def test_unsupported_precision_names_the_fix(models, onnx_dir: Path) -> None:
    from engines.onnx_engine import OnnxEngine

    with pytest.raises(EngineError, match="tensorrt"):
        OnnxEngine.from_files(models, onnx_dir, precision="fp16")


# ----------------------------------------------------------------------------------------------------------- int8


def test_int8_step_graph_is_quantised_with_7_bit_weights(models, onnx_dir: Path) -> None:
    """Opt-in int8: the step graph's transformer linears become dynamic int8 with 7-bit weights (``reduce_range``,
    so AVX2 kernels cannot saturate and every CPU computes the same integers); the output head stays fp32.
    Its precision against upstream is proven in test_int8_proof.py."""
    import onnx
    from onnx import numpy_helper

    from engines.onnx_engine import OnnxEngine

    int8 = OnnxEngine.from_files(models, onnx_dir, precision="int8", threads=1, max_batch=4, gpt="graph")
    assert int8.precision == "int8" and int8.step_graph != "gpt_step"
    path = ensure_onnx(models, onnx_dir) / "gpt_step.int8.onnx"
    ops = graph_ops(path)
    assert "DynamicQuantizeLinear" in ops and ("MatMulInteger" in ops or "com.microsoft::DynamicQuantizeMatMul" in ops)
    weights = [numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer
               if t.data_type == onnx.TensorProto.INT8 and len(t.dims) == 2]  # matrices, not zero points
    # symmetric 7-bit: |w| <= 64, so a u8 x s8 pair sum stays <= 2 * 255 * 64 = 32640 < 2^15
    assert weights and all(int(np.abs(w.astype(np.int32)).max()) == 64 for w in weights)
    assert "MatMul" in ops  # the fp32 head (and the attention products) stay float


# ---------------------------------------------------------------------------------------------------- engines build


def test_build_engines_exports_checks_and_explains_missing_tensorrt(engine, models, onnx_dir: Path,
                                                                    tmp_path: Path) -> None:
    from bot.config import EngineConfig
    from engines.build import build_engines

    cfg = EngineConfig(backend="onnx", device="cpu", precision="fp32", max_batch=4, onnx_dir=onnx_dir,
                       tensorrt_dir=tmp_path / "trt", tensorrt_workspace_mb=1024)
    produced = build_engines(cfg, models, backend="onnx")
    assert set(produced) == set(GRAPHS) and all(p.is_file() for p in produced.values())
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        with pytest.raises(EngineError, match="pip install tensorrt"):
            build_engines(cfg, models, backend="tensorrt")
        assert set(build_engines(cfg, models)) == set(GRAPHS)  # no backend asked: graphs only, with a warning
        assert not (tmp_path / "trt").exists()  # a TensorRT build that cannot run leaves no folder behind
