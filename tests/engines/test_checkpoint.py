"""Checkpoint loading: golden upstream files, refusal of unsafe / unsupported / damaged files."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import torch

from engines.base import ModelFormatError
from engines.gpt_sovits.checkpoint import (
    file_fingerprint,
    load_gpt_checkpoint,
    load_sovits_checkpoint,
)
from tests.golden import Golden


class _Payload:
    """Pickles to a call of ``os.system`` that creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[override]
        return (os.system, (f"touch {self.marker}",))


def _gpt_like(model: dict | None = None) -> dict:
    """A minimal GPT file body with the given model config."""
    cfg = {"vocab_size": 1025, "phoneme_vocab_size": 732, "embedding_dim": 8, "head": 2, "n_layer": 1, "EOS": 1024}
    cfg.update(model or {})
    return {"weight": {"model.ar_predict_layer.weight": torch.zeros(1025, 8, dtype=torch.float16)},
            "config": {"model": cfg, "data": {"max_sec": 54}}, "info": "GPT-e1"}


def _sovits_like(extra: dict | None = None, symbols: int = 732) -> dict:
    """A minimal SoVITS file body."""
    weight = {"enc_p.text_embedding.weight": torch.zeros(symbols, 4, dtype=torch.float16)}
    weight.update(extra or {})
    return {"weight": weight, "config": {"model": {"version": "v2"}, "data": {}}, "info": "1epoch_1iteration"}


@pytest.mark.conformance
def test_golden_gpt_loads(golden: Golden) -> None:
    """The loader's view of the GPT file agrees with meta.json (written by the generator from the file itself)."""
    ckpt = load_gpt_checkpoint(golden.gpt_path)
    meta, model = golden.meta["gpt"], golden.meta["gpt"]["config_model"]
    assert ckpt.config["model"] == model
    assert ckpt.info.startswith("GPT-e")
    assert len(ckpt.state_dict) == golden.gpt_n_tensors
    assert not any(k.startswith("model.") for k in ckpt.state_dict)
    assert {k.removeprefix("model.") for k in meta["state_dict_keys_sample"]} <= set(ckpt.state_dict)
    dim, last = model["embedding_dim"], model["n_layer"] - 1
    assert ckpt.state_dict["ar_text_embedding.word_embeddings.weight"].shape == (model["phoneme_vocab_size"], dim)
    assert ckpt.state_dict["ar_predict_layer.weight"].shape == (model["vocab_size"], dim)
    assert ckpt.state_dict[f"h.layers.{last}.self_attn.in_proj_weight"].dtype == torch.float16
    assert ckpt.config["data"]["max_sec"] == meta["max_sec"]
    assert sum(t.numel() for t in ckpt.state_dict.values()) == golden.gpt_n_params


@pytest.mark.conformance
def test_golden_sovits_loads_pickled_hparams(golden: Golden) -> None:
    path = golden.sovits_path
    before = path.read_bytes()
    ckpt = load_sovits_checkpoint(path)
    assert path.read_bytes() == before
    meta = golden.meta["sovits"]
    assert meta["config_type"] == "utils.HParams"  # the file's config is a pickled HParams, as fine-tuned files
    assert ckpt.version == "v2" and ckpt.info == meta["info"]
    assert type(ckpt.config) is dict and type(ckpt.config["model"]) is dict and type(ckpt.config["data"]) is dict
    assert ckpt.config["model"] == meta["config_model"] and ckpt.config["data"] == meta["config_data"]
    assert not any("enc_q" in k for k in ckpt.state_dict)
    assert sum(t.numel() for t in ckpt.state_dict.values()) == golden.sovits_n_params
    assert ckpt.state_dict["enc_p.text_embedding.weight"].shape == (golden.n_symbols,
                                                                    meta["config_model"]["hidden_channels"])


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("protocol", [2, 4])  # 2: GLOBAL opcode, 4: STACK_GLOBAL opcode
@pytest.mark.parametrize("loader", [load_gpt_checkpoint, load_sovits_checkpoint])
def test_booby_trapped_file_is_refused_and_never_runs(tmp_path: Path, loader, protocol: int) -> None:
    marker = tmp_path / "pwned"
    body = _gpt_like() if loader is load_gpt_checkpoint else _sovits_like()
    body["config"] = _Payload(marker)
    path = tmp_path / "evil.ckpt"
    torch.save(body, path, pickle_protocol=protocol)
    with pytest.raises(ModelFormatError, match="contains code.*was not loaded"):
        loader(path)
    assert not marker.exists()


def test_booby_trapped_tagged_file_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    body = _sovits_like()
    body["info"] = _Payload(marker)
    path = tmp_path / "evil.pth"
    torch.save(body, path)
    data = bytearray(path.read_bytes())
    data[:2] = b"01"  # a v2 tag: the loader restores "PK" in memory and must still refuse the code
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match="contains code"):
        load_sovits_checkpoint(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    ("magic", "match"),
    [(b"05", "tagged as a v2Pro file but it lacks the v2Pro weights"),  # v2Pro is supported; a v2 file is not one
     (b"06", "tagged as a v2ProPlus file but it lacks the v2ProPlus weights"),
     (b"03", "v3 LoRA files are not supported yet; use a v2, v2Pro or v2ProPlus model"),
     (b"04", "v4 LoRA files are not supported yet; use a v2, v2Pro or v2ProPlus model")],
)
def test_version_magic_refused_and_file_unchanged(golden: Golden, tmp_path: Path, magic: bytes, match: str) -> None:
    path = tmp_path / "tagged.pth"
    data = bytearray(golden.sovits_path.read_bytes())
    data[:2] = magic
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match=match):
        load_sovits_checkpoint(path)
    assert path.read_bytes() == bytes(data)


def test_v2_tag_loads_in_memory_only(golden: Golden, tmp_path: Path) -> None:
    path = tmp_path / "tagged_v2.pth"
    data = bytearray(golden.sovits_path.read_bytes())
    data[:2] = b"01"
    path.write_bytes(bytes(data))
    ckpt = load_sovits_checkpoint(path)
    untagged = golden.sovits_checkpoint
    assert ckpt.version == "v2" and ckpt.state_dict.keys() == untagged.state_dict.keys()
    assert all(torch.equal(ckpt.state_dict[k], v) for k, v in untagged.state_dict.items())
    assert path.read_bytes()[:2] == b"01"


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (_sovits_like(symbols=322), "v1 SoVITS model"),
        (_sovits_like({"cfm.proj.weight": torch.zeros(2)}),
         "v3/v4 SoVITS models are not supported yet; use a v2, v2Pro or v2ProPlus model"),
        (_sovits_like({"sv_emb.weight": torch.zeros(2)}), r"has some v2Pro weights \(sv_emb.weight\) but lacks"),
        ({**_sovits_like(), "lora_rank": 32},
         "v3/v4 LoRA files are not supported yet; use a v2, v2Pro or v2ProPlus model"),
        (_gpt_like(), "GPT model .*not a SoVITS"),
    ],
)
def test_unsupported_sovits_refused(tmp_path: Path, body: dict, match: str) -> None:
    path = tmp_path / "model.pth"
    torch.save(body, path)
    with pytest.raises(ModelFormatError, match=match):
        load_sovits_checkpoint(path)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (_gpt_like({"phoneme_vocab_size": 512}), "v1 GPT"),
        (_gpt_like({"vocab_size": 2049}), "not a v2 model"),
        (_sovits_like(), "SoVITS model"),
    ],
)
def test_unsupported_gpt_refused(tmp_path: Path, body: dict, match: str) -> None:
    path = tmp_path / "model.ckpt"
    torch.save(body, path)
    with pytest.raises(ModelFormatError, match=match):
        load_gpt_checkpoint(path)


def test_damaged_files_refused(golden: Golden, tmp_path: Path) -> None:
    good = golden.gpt_path.read_bytes()
    cases = {
        "empty.ckpt": (b"", "is empty"),
        "junk.ckpt": (b"<html>404 Not Found</html>", "not a PyTorch checkpoint"),
        "truncated.ckpt": (good[: len(good) // 2], "truncated or corrupt"),
    }
    for name, (data, match) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(ModelFormatError, match=match) as info:
            load_gpt_checkpoint(path)
        assert name in str(info.value)
        assert path.read_bytes() == data
    with pytest.raises(ModelFormatError, match="does not exist"):
        load_gpt_checkpoint(tmp_path / "missing.ckpt")


def test_file_fingerprint(golden: Golden, tmp_path: Path) -> None:
    path = tmp_path / "g.ckpt"
    shutil.copy(golden.gpt_path, path)
    expected = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    assert file_fingerprint(path) == expected
    assert file_fingerprint(str(path)) == expected
    path.write_bytes(b"changed")
    os.utime(path, ns=(1, 1))  # a different mtime invalidates the cached value
    assert file_fingerprint(path) == hashlib.sha256(b"changed").hexdigest()[:16]
