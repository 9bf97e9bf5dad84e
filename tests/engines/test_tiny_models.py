"""The random model-set writer: upstream file formats, loadable by our loaders/models, and models that behave."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engines.base import EngineError, SamplingParams, SemanticRequest, VoicePrompt
from engines.gpt_sovits.bert import BertFeaturizer
from engines.gpt_sovits.checkpoint import load_gpt_checkpoint, load_sovits_checkpoint
from engines.gpt_sovits.generate import generate
from engines.gpt_sovits.gpt import Text2SemanticModel
from engines.gpt_sovits.sovits import SoVITSDecoder
from engines.gpt_sovits.spectrogram import reference_spec_input
from engines.gpt_sovits.ssl import HubertEncoder
from engines.gpt_sovits.tiny import MODEL_SET_LAYOUT, write_model_set


@pytest.fixture(scope="module")
def model_set(tmp_path_factory) -> dict[str, Path]:
    return write_model_set(tmp_path_factory.mktemp("tiny-set"), size="tiny", seed=0)


def test_layout_and_size(model_set):
    root = model_set["gpt"].parents[1]
    for name, rel in MODEL_SET_LAYOUT.items():
        assert model_set[name] == root / rel and model_set[name].exists()
    assert (model_set["hubert"] / "preprocessor_config.json").is_file()
    assert (model_set["bert"] / "vocab.txt").is_file() and (model_set["bert"] / "tokenizer.json").is_file()
    total = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    # GPT 1.4 MB + SoVITS 10.7 MB + HuBERT 6 MB + BERT 64 MB (its 21k x 1024 word table alone is 43 MB in fp16)
    assert total < 90e6, total
    assert not list(root.rglob("*.tmp")) and not list(root.rglob(".staging-*"))


def test_gpt_file_format(model_set):
    raw = torch.load(model_set["gpt"], map_location="cpu", weights_only=True)
    assert list(raw) == ["weight", "config", "info"] and raw["info"] == "GPT-e1"
    assert len(raw["weight"]) == 7 + 12 * 3  # 295 for 24 layers
    assert all(k.startswith("model.") and v.dtype == torch.float16 for k, v in raw["weight"].items())
    assert raw["config"]["data"]["max_sec"] == 54
    assert raw["config"]["model"]["embedding_dim"] == 96 and raw["config"]["model"]["n_layer"] == 3
    ckpt = load_gpt_checkpoint(model_set["gpt"])
    assert "ar_predict_layer.weight" in ckpt.state_dict


def test_sovits_file_format(model_set):
    raw = torch.load(model_set["sovits"], map_location="cpu", weights_only=True)  # plain dicts, like s2G2333k
    weights = raw["weight"]
    assert not any(k.startswith("enc_q") for k in weights)
    assert all(v.dtype == torch.float16 for v in weights.values())
    assert "dec.ups.0.weight_g" in weights and "dec.ups.0.weight_v" in weights and "dec.conv_pre.weight" in weights
    assert weights["quantizer.vq.layers.0._codebook.inited"].item() == 1
    ckpt = load_sovits_checkpoint(model_set["sovits"])
    assert ckpt.version == "v2" and ckpt.config["model"]["gin_channels"] == 128


def test_same_seed_same_weights(tmp_path):
    from engines.gpt_sovits.tiny import gpt_state_dict, sovits_state_dict

    a, b, c = gpt_state_dict("tiny", 3), gpt_state_dict("tiny", 3), gpt_state_dict("tiny", 4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.bert_proj.weight"], c["model.bert_proj.weight"])
    s1, s2 = sovits_state_dict("tiny", 3), sovits_state_dict("tiny", 3)
    assert all(torch.equal(s1[k], s2[k]) for k in s1)


def _request(rng: np.random.Generator, prompt: int) -> SemanticRequest:
    tx = 16
    voice = VoicePrompt(
        prompt_tokens=rng.integers(0, 1024, prompt).astype(np.int64),
        ge=np.zeros((128, 1), np.float32),
        prompt_phones=rng.integers(1, 732, 8 if prompt else 0).astype(np.int64),
        prompt_bert=np.zeros((1024, 8 if prompt else 0), np.float32),
    )
    return SemanticRequest(
        phones=rng.integers(1, 732, tx).astype(np.int64),
        bert=rng.normal(0, 0.25, (1024, tx)).astype(np.float32),
        voice=voice,
        params=SamplingParams(top_k=1, seed=0),
    )


def test_gpt_stops_by_itself(model_set):
    """The scaled EOS makes random weights stop after a few dozen tokens, greedy and sampled."""
    model = Text2SemanticModel.from_checkpoint(load_gpt_checkpoint(model_set["gpt"]))
    rng = np.random.default_rng(5)
    reqs = [_request(rng, prompt) for prompt in (0, 40, 100)]
    sampled = [SemanticRequest(r.phones, r.bert, r.voice, SamplingParams(top_k=15, seed=1)) for r in reqs]
    lengths = [len(t) for t in generate(model, reqs + sampled)]
    assert all(11 <= n <= 120 for n in lengths), lengths
    assert float(np.median(lengths)) <= 60, lengths


@torch.inference_mode()
def test_sovits_output_is_audible(model_set):
    model = SoVITSDecoder.from_checkpoint(load_sovits_checkpoint(model_set["sovits"]))
    rng = np.random.default_rng(0)
    t = np.arange(3 * 32000) / 32000
    ref = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.02 * rng.standard_normal(t.size)).astype(np.float32)
    ge = model.ref_style(reference_spec_input(ref))
    codes = torch.from_numpy(rng.integers(0, 1024, (1, 1, 50)))
    text = torch.from_numpy(rng.integers(1, 732, (1, 20)))
    wav = model.decode(codes, text, ge, noise_scale=0.5, generator=torch.Generator().manual_seed(0))[0, 0].numpy()
    assert wav.shape == (50 * 1280,)
    rms, peak = float(np.sqrt(np.mean(wav**2))), float(np.abs(wav).max())
    assert 0.03 < rms < 0.5, rms
    assert peak < 0.99, peak
    # not a constant or a DC offset: the 20 ms frame energies vary
    frames = wav[: wav.size // 640 * 640].reshape(-1, 640)
    assert float(frames.std(axis=1).std()) > 1e-3


@torch.inference_mode()
def test_hubert_folder(model_set):
    hubert = HubertEncoder.from_folder(model_set["hubert"])
    wav = np.random.default_rng(0).uniform(-0.3, 0.3, 3 * 16000).astype(np.float32)
    feats = hubert.encode(wav)
    # the 0.6 s pad is appended inside: (48000 + 9600 - 400) // 320 + 1 = 179 frames
    assert feats.shape == (1, 768, 179) == (1, 768, HubertEncoder.frames(wav.size))
    assert torch.isfinite(feats).all()
    sovits = SoVITSDecoder.from_checkpoint(load_sovits_checkpoint(model_set["sovits"]))
    codes = sovits.extract_latent(feats)
    assert codes.shape == (1, 1, 89) and int(codes.min()) >= 0 and int(codes.max()) < 1024


@torch.inference_mode()
def test_bert_folder(model_set):
    bert = BertFeaturizer.from_folder(model_set["bert"])
    feats = bert.features("你好。", [2, 2, 1])
    assert feats.shape == (1024, 5) and feats.dtype == np.float32
    assert np.array_equal(feats[:, 0], feats[:, 1]) and np.array_equal(feats[:, 2], feats[:, 3])
    assert not np.allclose(feats[:, 1], feats[:, 2])
    # the truncated encoder gives exactly upstream's hidden_states[-3] of the full masked-LM model
    from transformers import AutoModelForMaskedLM

    full = AutoModelForMaskedLM.from_pretrained(str(model_set["bert"]), local_files_only=True, dtype=torch.float32)
    out = full(**bert.tokenizer("你好。", return_tensors="pt"), output_hidden_states=True)
    want = out.hidden_states[-3][0, 1:-1].repeat_interleave(torch.tensor([2, 2, 1]), dim=0).t().numpy()
    assert np.abs(feats - want).max() < 1e-5
    # every hanzi is one token (no [UNK]), so any normalised Chinese text lines up with word2ph
    text = "今天天气很好，我们去公园散步吧。"
    assert bert.features(text, [2] * 7 + [1] + [2] * 7 + [1]).shape == (1024, 30)
    assert bert.tokenizer.unk_token_id not in bert.tokenizer(text)["input_ids"]
    with pytest.raises(EngineError, match="word2ph"):
        bert.features("你好。", [2, 2])


def test_missing_folders_say_how_to_fix(tmp_path):
    with pytest.raises(EngineError, match="python -m bot models download"):
        HubertEncoder.from_folder(tmp_path / "nope")
    with pytest.raises(EngineError, match="python -m bot models download"):
        BertFeaturizer.from_folder(tmp_path / "nope")


@pytest.mark.slow
def test_real_size_set(tmp_path):
    paths = write_model_set(tmp_path, size="real", seed=0)
    gpt = load_gpt_checkpoint(paths["gpt"])
    assert len(gpt.state_dict) == 295
    assert gpt.state_dict["h.layers.23.linear1.weight"].shape == (2048, 512)
    sovits = SoVITSDecoder.from_checkpoint(load_sovits_checkpoint(paths["sovits"]))
    n = sum(p.numel() for p in sovits.parameters()) + sovits.codebook.numel()
    assert 41e6 < n < 44e6, n  # 52.9 M upstream minus enc_q's 10.5 M
    assert sovits.cfg.mrte_hidden == 512 and sovits.cfg.upsample_initial_channel == 512
