"""The ONNX export and the ONNX Runtime engine against the golden conformance data (fp32, CPU).

Tolerances are the golden README's: greedy tokens exact, logits atol 1e-4, SoVITS waveform / ge atol 1e-4, VQ codes
exact. The int8 step graph is checked for what it is (quantised, token agreement measured), not for exactness.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engines.base import SAMPLE_RATE, SAMPLES_PER_TOKEN, EngineError, SamplingParams, SemanticRequest, VoicePrompt
from engines.export import FORBIDDEN_OPS, GRAPHS, TRT_SUPPORTED_OPS, check_graphs, ensure_onnx, graph_ops
from engines.gpt_sovits.generate import BatchDecoder

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(300)]

N_PROMPT_PHONES = 9  # gpt_io: the first 9 phone ids are the reference transcript's
LOGITS_ATOL = 1e-4
WAV_ATOL = 1e-4


@pytest.fixture(scope="module")
def models(golden_dir: Path) -> SimpleNamespace:
    return SimpleNamespace(gpt=golden_dir / "gpt_tiny_v2.ckpt", sovits=golden_dir / "sovits_tiny_v2.pth",
                           hubert=golden_dir / "no-hubert", bert=golden_dir / "no-bert")


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx")


@pytest.fixture(scope="module")
def engine(models: SimpleNamespace, onnx_dir: Path):
    from engines.onnx_engine import OnnxEngine

    return OnnxEngine.from_files(models, onnx_dir, device="cpu", precision="fp32", threads=1, max_batch=4)


@pytest.fixture(scope="module")
def gpt_io(golden_dir: Path):
    return np.load(golden_dir / "gpt_io.npz")


@pytest.fixture(scope="module")
def sovits_io(golden_dir: Path):
    return np.load(golden_dir / "sovits_io.npz")


def _decode_all(engine, items: list[tuple[np.ndarray, np.ndarray, np.ndarray, SamplingParams]]) -> list[np.ndarray]:
    """Run requests together through the engine's GPT with the shared BatchDecoder; results in input order."""
    decoder = BatchDecoder(engine.new_gpt(), max_slots=4, max_len=512)
    for i, (phones, bert, prompt, params) in enumerate(items):
        decoder.add(i, phones, bert, prompt, params)
    out: dict[int, np.ndarray] = {}
    while decoder.active:
        out.update(decoder.step())
    return [out[i] for i in range(len(items))]


def _golden_request(gpt_io, rp: float) -> SemanticRequest:
    ph, bert = gpt_io["phone_ids"][0], gpt_io["bert_feature"][0]
    voice = VoicePrompt(prompt_tokens=gpt_io["prompt_semantic"][0], ge=np.zeros((128, 1), np.float32),
                        prompt_phones=ph[:N_PROMPT_PHONES], prompt_bert=bert[:, :N_PROMPT_PHONES])
    return SemanticRequest(ph[N_PROMPT_PHONES:], bert[:, N_PROMPT_PHONES:], voice,
                           SamplingParams(top_k=1, repetition_penalty=rp, early_stop_num=40, seed=0))


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


@pytest.mark.parametrize("tag,rp", [("rp135", 1.35), ("rp100", 1.0)])
def test_greedy_tokens_exact(engine, gpt_io, tag: str, rp: float) -> None:
    (tokens,) = engine.generate_semantic([_golden_request(gpt_io, rp)])
    np.testing.assert_array_equal(tokens, gpt_io[f"greedy_{tag}_generated"])


@pytest.mark.parametrize("tag", ["rp135", "rp100"])
def test_logits_along_the_greedy_path(engine, gpt_io, tag: str) -> None:
    gpt = engine.new_gpt()
    gpt.setup_caches(1, 256)
    phones, bert, prompt = (torch.as_tensor(gpt_io[k][0]) for k in ("phone_ids", "bert_feature", "prompt_semantic"))
    rows = [gpt.prefill(0, phones, bert, prompt)[None]]
    start = phones.shape[0] + prompt.shape[0]
    for j, tok in enumerate(gpt_io[f"greedy_{tag}_generated"]):
        rows.append(gpt.decode_step(torch.tensor([int(tok)]), torch.tensor([start + j]), None, 128))
    ref = gpt_io[f"greedy_{tag}_logits_raw"]
    got = torch.cat(rows).numpy()[: len(ref)]
    np.testing.assert_allclose(got, ref, rtol=0, atol=LOGITS_ATOL)


def test_reference_free_tokens_exact(engine, gpt_io) -> None:
    (tokens,) = _decode_all(engine, [(gpt_io["reffree_phone_ids"][0], gpt_io["reffree_bert_feature"][0],
                                      np.zeros(0, np.int64), SamplingParams(top_k=1, early_stop_num=20, seed=0))])
    np.testing.assert_array_equal(tokens, gpt_io["reffree_y"][0])


def test_two_requests_decoded_together_match_golden(engine, gpt_io) -> None:
    params = SamplingParams(top_k=1, early_stop_num=40, seed=0)
    got = _decode_all(engine, [(gpt_io[f"batch{i}_phone_ids"], gpt_io[f"batch{i}_bert_feature"],
                                gpt_io["prompt_semantic"][0], params) for i in (0, 1)])
    for i in (0, 1):
        np.testing.assert_array_equal(got[i], gpt_io[f"batch{i}_y"][40:])


def test_seeded_sampling_matches_the_torch_decoder(engine, gpt_io, models) -> None:
    """Same seeds, same sampler: ONNX Runtime and torch draw the same tokens (top_k 15, three rows at once)."""
    from engines.gpt_sovits.checkpoint import load_gpt_checkpoint
    from engines.gpt_sovits.gpt import Text2SemanticModel

    torch_gpt = Text2SemanticModel.from_checkpoint(load_gpt_checkpoint(models.gpt))
    items = [(gpt_io["phone_ids"][0], gpt_io["bert_feature"][0], gpt_io["prompt_semantic"][0],
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


def test_row_joining_mid_decode_gets_its_golden_tokens(engine, gpt_io) -> None:
    """Continuous batching: a request added while another decodes still gets exactly its own greedy tokens."""
    batch = engine.open_batch()
    req = _golden_request(gpt_io, 1.35)
    long = SemanticRequest(req.phones, req.bert, req.voice, SamplingParams(top_k=15, seed=7, early_stop_num=200))
    batch.add(1, long)
    done: dict[int, np.ndarray] = {}
    for _ in range(20):
        done.update(batch.step())
    batch.add(2, req)
    assert batch.active == 2 and batch.capacity == 4
    while 2 not in done:
        done.update(batch.step())
    np.testing.assert_array_equal(done[2], gpt_io["greedy_rp135_generated"])
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


@pytest.mark.parametrize("case", ["wav_ns0", "wav_ns05_eps", "wav_ns0_speed125", "wav_ns0_tworefs"])
def test_sovits_waveform(engine, sovits_io, case: str) -> None:
    s = sovits_io
    ge = s["ge"][0] if case != "wav_ns0_tworefs" else (s["ge"][0] + s["ge_refer2"][0]) / 2
    wav = engine.decode_with_noise(
        s["codes"], s["text"], ge, speed=1.25 if case == "wav_ns0_speed125" else 1.0,
        noise_scale=0.5 if case == "wav_ns05_eps" else 0.0, eps=torch.as_tensor(s["eps"])).numpy()
    assert wav.shape == s[case].shape
    np.testing.assert_allclose(wav, s[case], rtol=0, atol=WAV_ATOL)


def test_seeded_decode_matches_the_torch_sovits(engine, sovits_io, models) -> None:
    """With a seed, the prior noise is the torch engine's draw, so the waveforms agree."""
    from engines.gpt_sovits.checkpoint import load_sovits_checkpoint
    from engines.gpt_sovits.sovits import SoVITSDecoder

    sovits = SoVITSDecoder.from_checkpoint(load_sovits_checkpoint(models.sovits))
    s = sovits_io
    voice = VoicePrompt(np.zeros(0, np.int64), s["ge"][0], np.zeros(0, np.int64), np.zeros((1024, 0), np.float32))
    wav = engine.decode(s["codes"][0, 0], s["text"][0], voice, noise_scale=0.5, seed=1234)
    with torch.inference_mode():
        ref = sovits.decode(torch.as_tensor(s["codes"]), torch.as_tensor(s["text"]), torch.as_tensor(s["ge"]),
                            noise_scale=0.5, generator=torch.Generator().manual_seed(1234))[0, 0].numpy()
    np.testing.assert_allclose(wav, ref, rtol=0, atol=WAV_ATOL)
    other = engine.decode(s["codes"][0, 0], s["text"][0], voice, noise_scale=0.5, seed=1235)
    assert np.abs(other - wav).max() > 1e-3


# ------------------------------------------------------------------------------------------------------- contract


def test_contract_dtype_rate_and_chunking(engine, gpt_io, sovits_io) -> None:
    assert (engine.name, engine.device, engine.precision) == ("onnx", "cpu", "fp32")
    assert engine.sample_rate == SAMPLE_RATE and len(engine.model_id) == 16
    chunks: list[tuple[int, np.ndarray]] = []
    (tokens,) = engine.generate_semantic([_golden_request(gpt_io, 1.35)], on_chunk=lambda i, t: chunks.append((i, t)))
    assert len(chunks) >= 2 and {i for i, _ in chunks} == {0}  # streamed in several pieces
    np.testing.assert_array_equal(np.concatenate([t for _, t in chunks]), tokens)  # EOS stop: nothing dropped
    voice = VoicePrompt(np.zeros(0, np.int64), sovits_io["ge"][0], np.zeros(0, np.int64),
                        np.zeros((1024, 0), np.float32))
    wav = engine.decode(tokens, gpt_io["phone_ids"][0, N_PROMPT_PHONES:], voice, noise_scale=0.5, seed=1)
    assert wav.dtype == np.float32 and wav.ndim == 1
    assert wav.size == tokens.size * SAMPLES_PER_TOKEN
    assert 0.01 < float(np.abs(wav).max()) < 1.0
    with pytest.raises(EngineError, match="at least one semantic token"):
        engine.decode(np.zeros(0, np.int64), gpt_io["phone_ids"][0], voice)


def test_unsupported_precision_names_the_fix(models, onnx_dir: Path) -> None:
    from engines.onnx_engine import OnnxEngine

    with pytest.raises(EngineError, match="tensorrt"):
        OnnxEngine.from_files(models, onnx_dir, precision="fp16")


# ----------------------------------------------------------------------------------------------------------- int8


def test_int8_step_graph_is_quantised_and_agrees_on_golden_tokens(engine, models, onnx_dir: Path, gpt_io) -> None:
    """Opt-in int8: the step graph's linears become int8. Greedy tokens vs golden (measured): 4 of 5 sequences
    exact, 97 of 109 tokens at equal positions (the reference-free run leaves the golden path at a near-tie and
    stays off it). Asserted: >= 4 exact, >= 85 %."""
    from engines.onnx_engine import OnnxEngine

    int8 = OnnxEngine.from_files(models, onnx_dir, precision="int8", threads=1, max_batch=4)
    ops = graph_ops(ensure_onnx(models, onnx_dir) / "gpt_step.int8.onnx")
    assert "DynamicQuantizeLinear" in ops and ("MatMulInteger" in ops or "com.microsoft::DynamicQuantizeMatMul" in ops)
    cases = [("greedy_rp135_generated", _golden_request(gpt_io, 1.35)),
             ("greedy_rp100_generated", _golden_request(gpt_io, 1.0))]
    got = int8.generate_semantic([r for _, r in cases])
    pairs = [(g, gpt_io[k]) for g, (k, _) in zip(got, cases)]
    rf = _decode_all(int8, [(gpt_io["reffree_phone_ids"][0], gpt_io["reffree_bert_feature"][0],
                             np.zeros(0, np.int64), SamplingParams(top_k=1, early_stop_num=20, seed=0))])
    pairs.append((rf[0], gpt_io["reffree_y"][0]))
    params = SamplingParams(top_k=1, early_stop_num=40, seed=0)
    both = _decode_all(int8, [(gpt_io[f"batch{i}_phone_ids"], gpt_io[f"batch{i}_bert_feature"],
                               gpt_io["prompt_semantic"][0], params) for i in (0, 1)])
    pairs += [(both[i], gpt_io[f"batch{i}_y"][40:]) for i in (0, 1)]
    exact = sum(np.array_equal(g, r) for g, r in pairs)
    agree = sum(int((g[: min(len(g), len(r))] == r[: min(len(g), len(r))]).sum()) for g, r in pairs)
    total = sum(len(r) for _, r in pairs)
    assert exact >= 4 and agree / total >= 0.85, (exact, agree, total)


# ---------------------------------------------------------------------------------------------------- engines build


def test_build_engines_exports_checks_and_explains_missing_tensorrt(engine, models, onnx_dir: Path,
                                                                    tmp_path: Path) -> None:
    from engines.export import build_engines

    cfg = SimpleNamespace(backend="onnx", device="cpu", precision="fp32", max_batch=4, onnx_dir=onnx_dir,
                          tensorrt_dir=tmp_path / "trt", tensorrt_workspace_mb=1024)
    produced = build_engines(cfg, models, backend="onnx")
    assert set(produced) == set(GRAPHS) and all(p.is_file() for p in produced.values())
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        with pytest.raises(EngineError, match="pip install tensorrt"):
            build_engines(cfg, models, backend="tensorrt")
        assert set(build_engines(cfg, models)) == set(GRAPHS)  # no backend asked: graphs only, with a warning
    assert not (tmp_path / "trt").exists() or torch.cuda.is_available()
