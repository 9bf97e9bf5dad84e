"""The int8 Chinese BERT: made from the loaded BERT, proven against the loaded GPT, swapped in only where it holds."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import engines.bert_int8 as B
from bot.config import load_config
from engines.encoders import LazyEncoders
from engines.gpt_sovits.bert import BertFeaturizer

TEXT = "今天天气很好，我们去公园散步吧。"


@pytest.fixture(scope="module")
def models(tiny_models: Path):
    return load_config(tiny_models / "config.yaml").models


@pytest.fixture(scope="module")
def bert_dir(models, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny set's BERT with 4 layers (2 run, each with its linears): the tiny set's own has 2, none of which run."""
    from transformers import BertConfig, BertForMaskedLM

    out = tmp_path_factory.mktemp("bert4")
    config = BertConfig.from_pretrained(models.bert)
    config.num_hidden_layers = 4
    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        (out / name).write_bytes((Path(models.bert) / name).read_bytes())
    return out


@pytest.fixture(scope="module")
def bert(bert_dir: Path) -> BertFeaturizer:
    return BertFeaturizer.from_folder(bert_dir)


def test_the_int8_bert_has_int8_linears_and_features_close_to_fp32(bert: BertFeaturizer) -> None:
    weights = {n: p.detach().clone() for n, p in bert.model.named_parameters()}
    int8 = B.int8_bert(bert)
    # made without copying the fp32 linears first (they are read where they are), and the fp32 BERT keeps every
    # weight as it was
    assert {n: p for n, p in bert.model.named_parameters()}.keys() == weights.keys()
    assert all(torch.equal(p, weights[n]) for n, p in bert.model.named_parameters())
    linears = [m for m in int8.model.modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)]
    assert linears and not any(isinstance(m, torch.nn.Linear) and not isinstance(
        m, torch.ao.nn.quantized.dynamic.Linear) for m in int8.model.modules())
    assert any(isinstance(m, torch.nn.Linear) for m in bert.model.modules())  # the fp32 one is left as it was
    word2ph = [2] * len(TEXT)
    f32, f8 = bert.features(TEXT, word2ph), int8.features(TEXT, word2ph)
    assert f8.shape == f32.shape == (1024, sum(word2ph)) and f8.dtype == np.float32
    cos = (f32 * f8).sum(0) / np.sqrt((f32 ** 2).sum(0) * (f8 ** 2).sum(0))
    assert cos.min() > 0.99 and not np.array_equal(f8, f32)


def _dynamic(featurizer: BertFeaturizer) -> list[str]:
    return [n for n, m in featurizer.model.named_modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)]


def test_the_proof_measures_the_gpt_and_decides(bert: BertFeaturizer, models, monkeypatch, caplog) -> None:
    gpt = Path(models.gpt)
    (_, every), (_, keep) = B.CANDIDATES
    full, partial = B.int8_bert(bert, every), B.int8_bert(bert, keep)
    assert set(_dynamic(partial)) < set(_dynamic(full))  # the second keeps the feed-forward down projections fp32
    assert not any(n.endswith(".output.dense") and ".attention." not in n for n in _dynamic(partial))
    errors = [B.bert_int8_logit_error(bert, q, gpt) for q in (full, partial)]
    assert all(0 < e < 1 for e in errors)  # the features differ, a little; the same features again move nothing:
    assert B.bert_int8_logit_error(bert, bert, gpt) == 0.0
    monkeypatch.setattr(B, "MAX_LOGIT_ERROR", max(errors) * 1.01)  # the first candidate holds: every linear in int8
    proven, measured = B.prove_int8_bert(bert, gpt)
    assert _dynamic(proven) == _dynamic(full) and measured == pytest.approx(errors[0])
    if errors[1] < errors[0]:  # the first misses, the second holds
        monkeypatch.setattr(B, "MAX_LOGIT_ERROR", (errors[0] + errors[1]) / 2)
        proven, measured = B.prove_int8_bert(bert, gpt)
        assert _dynamic(proven) == _dynamic(partial) and measured == pytest.approx(errors[1])
    monkeypatch.setattr(B, "MAX_LOGIT_ERROR", min(errors) * 0.99)  # a model that misses both keeps fp32, logged
    with caplog.at_level(logging.WARNING, logger="engines.bert_int8"):
        kept, _ = B.prove_int8_bert(bert, gpt)
    assert kept is bert and "the fp32 BERT runs" in caplog.text


def test_encoders_serve_fp32_then_the_proven_int8_bert(models, bert_dir: Path, monkeypatch) -> None:
    monkeypatch.setattr(B, "MAX_LOGIT_ERROR", 10.0)
    encoders = LazyEncoders(None, bert_dir, "cpu", torch.float32)
    encoders.int8_bert_for = Path(models.gpt)
    first = encoders.bert()
    assert encoders.bert_proof is not None and any(isinstance(m, torch.nn.Linear) for m in first.model.modules())
    encoders.bert_proof.join(120)
    later = encoders.bert()
    assert later is not first and encoders.bert_precision == "int8" and encoders.bert_int8_error is not None
    plain = LazyEncoders(None, bert_dir, "cpu", torch.float32)  # fp32 engines never start a proof
    assert plain.bert() is not None and plain.bert_proof is None and plain.bert_precision == "fp32"


def test_a_proof_asked_to_stop_ends_and_the_fp32_bert_stays(bert: BertFeaturizer, bert_dir: Path, models,
                                                             monkeypatch, caplog) -> None:
    asked: list[int] = []

    def stop_at_third() -> bool:  # the proof asks between its parts: stop at the third question
        asked.append(1)
        return len(asked) >= 3

    with pytest.raises(B.ProofStopped):
        B.prove_int8_bert(bert, Path(models.gpt), stop_at_third)
    assert len(asked) == 3
    monkeypatch.setattr(B, "MAX_LOGIT_ERROR", 10.0)  # it would hold: only the stop keeps the fp32 BERT
    encoders = LazyEncoders(None, bert_dir, "cpu", torch.float32)
    encoders.int8_bert_for = Path(models.gpt)
    encoders._stop_proof.set()  # (as the process exit does, here before the proof's first question)
    with caplog.at_level(logging.INFO, logger="engines.encoders"):
        first = encoders.bert()
        assert encoders.bert_proof is not None
        encoders.bert_proof.join(120)
    assert not encoders.bert_proof.is_alive() and "proof stopped before it ended" in caplog.text
    assert encoders.bert() is first and encoders.bert_precision == "fp32" and encoders.bert_int8_error is None
    encoders.stop_background()  # (also when nothing runs)


def test_the_int8_engines_ask_for_the_int8_bert(models, tmp_path: Path) -> None:
    from engines.onnx_engine import OnnxEngine

    int8 = OnnxEngine.from_files(models, tmp_path / "onnx", precision="int8")
    fp32 = OnnxEngine.from_files(models, tmp_path / "onnx", precision="fp32")
    assert int8.encoders.int8_bert_for == Path(models.gpt) and fp32.encoders.int8_bert_for is None


def _encoders(models, bert_dir: Path, store: Path) -> LazyEncoders:
    encoders = LazyEncoders(None, bert_dir, "cpu", torch.float32)
    encoders.int8_bert_for, encoders.int8_bert_store = Path(models.gpt), store
    return encoders


def test_a_kept_proof_loads_the_int8_bert_at_the_next_start_without_the_fp32_one(models, bert_dir: Path,
                                                                                 tmp_path: Path, monkeypatch,
                                                                                 caplog) -> None:
    monkeypatch.setattr(B, "MAX_LOGIT_ERROR", 10.0)
    store = tmp_path / "export" / "bert_int8"
    first = _encoders(models, bert_dir, store)
    first.bert()
    assert first.bert_proof is not None
    first.bert_proof.join(120)
    proven = first.bert()
    assert first.bert_precision == "int8"
    assert store.with_suffix(".pt").is_file() and store.with_suffix(".json").is_file()

    def load_fp32(*_a, **_k):
        raise AssertionError("the fp32 BERT was read")

    with monkeypatch.context() as m:  # the next start: the kept int8 BERT at once, no fp32 BERT, no proof
        m.setattr(BertFeaturizer, "from_folder", load_fp32)
        again = _encoders(models, bert_dir, store)
        bert = again.bert()
    assert again.bert_proof is None and again.bert_precision == "int8"
    assert again.bert_int8_error == first.bert_int8_error
    assert _dynamic(bert) == _dynamic(proven)
    word2ph = [2] * len(TEXT)
    assert np.array_equal(bert.features(TEXT, word2ph), proven.features(TEXT, word2ph))  # the same weights, exactly

    damaged_file = tmp_path / "damaged.pt"  # a damaged file (put in place whole: the kept one is mapped above)
    damaged_file.write_bytes(store.with_suffix(".pt").read_bytes()[:1000])
    os.replace(damaged_file, store.with_suffix(".pt"))
    with caplog.at_level(logging.WARNING, logger="engines.bert_int8"):
        damaged = _encoders(models, bert_dir, store)
        damaged.bert()
    assert "cannot be used" in caplog.text and damaged.bert_proof is not None
    damaged.bert_proof.join(120)
    assert damaged.bert_precision == "int8"
    fresh = _encoders(models, bert_dir, store)
    fresh.bert()
    assert fresh.bert_proof is None and fresh.bert_precision == "int8"  # the damaged one was kept anew

    config = bert_dir / "config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))  # the BERT changed
    changed = _encoders(models, bert_dir, store)
    changed.bert()
    assert changed.bert_proof is not None  # proven again
    changed.bert_proof.join(120)


def test_a_kept_miss_keeps_the_fp32_bert_without_proving_again(models, bert_dir: Path, tmp_path: Path,
                                                                monkeypatch) -> None:
    monkeypatch.setattr(B, "MAX_LOGIT_ERROR", 1e-9)  # nothing holds
    store = tmp_path / "bert_int8"
    first = _encoders(models, bert_dir, store)
    fp32 = first.bert()
    assert first.bert_proof is not None
    first.bert_proof.join(120)
    assert first.bert() is fp32 and first.bert_precision == "fp32" and not store.with_suffix(".pt").exists()
    again = _encoders(models, bert_dir, store)
    assert again.bert() is not None and again.bert_proof is None and again.bert_precision == "fp32"
    assert again.bert_int8_error == first.bert_int8_error and again.bert_int8_error > 1e-9


def test_keeping_a_proof_on_a_full_disk_leaves_no_half_file(bert: BertFeaturizer, tmp_path: Path,
                                                            monkeypatch) -> None:
    def full_disk(obj, path) -> None:
        Path(path).write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(B.torch, "save", full_disk)
    store = tmp_path / "bert_int8"
    with pytest.raises(OSError):
        B.keep_proof(store, "key", B.int8_bert(bert), 0.1)
    assert list(tmp_path.iterdir()) == []  # nothing kept, nothing half-written: the next start proves again
