"""v2Pro/v2ProPlus checkpoint loading: golden upstream files (05/06 tags), the SV model file, mis-tagged, incomplete
and unsafe files, and the released sizes from ``real_size_shapes.json``. Every fact is read from the data folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from engines.base import ModelFormatError
from engines.gpt_sovits.checkpoint import load_sovits_checkpoint, load_sv_checkpoint
from engines.gpt_sovits.sovits import SoVITSDecoder
from engines.gpt_sovits.sv import ERes2NetV2
from tests.golden import Golden

VERSIONS = ("v2Pro", "v2ProPlus")


@pytest.fixture(scope="module")
def real_sizes(golden_v2pro_dir: Path) -> dict:
    return json.loads((golden_v2pro_dir / "real_size_shapes.json").read_text())


class _Payload:
    """Pickles to a call of ``os.system`` that creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[override]
        return (os.system, (f"touch {self.marker}",))


def _retag(data: bytes, tag: bytes) -> bytes:
    return tag + data[2:]


@pytest.mark.conformance
@pytest.mark.parametrize("version", VERSIONS)
def test_golden_v2pro_loads_from_its_tag(golden_v2pro_dir: Path, meta: dict, version: str) -> None:
    m = meta["sovits"][version]
    path = golden_v2pro_dir / m["file"]
    before = path.read_bytes()
    assert before[:2] == m["first_2_bytes_ascii"].encode()  # the 05/06 tag, not "PK"
    ckpt = load_sovits_checkpoint(path)
    assert path.read_bytes() == before  # the tag is restored in memory only
    assert ckpt.version == m["hps_model_version_after_load"] == version
    assert ckpt.info == m["info"]
    assert type(ckpt.config) is dict and type(ckpt.config["model"]) is dict  # the pickled utils.HParams
    assert ckpt.config["model"] == m["config_model"]
    assert sum(t.numel() for t in ckpt.state_dict.values()) == m["n_params_saved"]
    for key, shape in m["v2pro_key_shapes"].items():
        assert list(ckpt.state_dict[key].shape) == shape
    assert not any(k.startswith("enc_q.") for k in ckpt.state_dict)


@pytest.mark.parametrize("version", VERSIONS)
def test_untagged_v2pro_file_is_recognised(golden_v2pro_dir: Path, meta: dict, tmp_path: Path, version: str) -> None:
    """A "PK" file with the v2Pro weights (a pretrained s2Gv2Pro*.pth) is v2Pro/v2ProPlus by config, else by kernel."""
    m = meta["sovits"][version]
    ckpt = load_sovits_checkpoint(golden_v2pro_dir / m["file"])
    with_version = tmp_path / "with_version.pth"
    torch.save({"weight": ckpt.state_dict, "config": ckpt.config, "info": ckpt.info}, with_version)
    assert with_version.read_bytes()[:2] == b"PK"
    assert load_sovits_checkpoint(with_version).version == version
    model_cfg = {k: v for k, v in ckpt.config["model"].items() if k != "version"}
    no_version = tmp_path / "no_version.pth"
    torch.save({"weight": ckpt.state_dict, "config": {**ckpt.config, "model": model_cfg}, "info": ""}, no_version)
    assert load_sovits_checkpoint(no_version).version == version


def test_v2_file_tagged_v2pro_is_refused(golden: Golden, tmp_path: Path) -> None:
    for tag, name in ((b"05", "v2Pro"), (b"06", "v2ProPlus")):
        path = tmp_path / f"mistagged_{name}.pth"
        path.write_bytes(_retag((golden.sovits_path).read_bytes(), tag))
        with pytest.raises(ModelFormatError, match=f"tagged as a {name} file but it lacks .*sv_emb.weight"):
            load_sovits_checkpoint(path)


def test_v2pro_file_tagged_v2_is_refused(golden_v2pro_dir: Path, meta: dict, tmp_path: Path) -> None:
    path = tmp_path / "mistagged.pth"
    path.write_bytes(_retag((golden_v2pro_dir / meta["sovits"]["v2Pro"]["file"]).read_bytes(), b"01"))
    with pytest.raises(ModelFormatError, match="tagged as a v2 file but it holds v2Pro weights"):
        load_sovits_checkpoint(path)


def test_incomplete_v2pro_file_is_refused(golden_v2pro_dir: Path, meta: dict, tmp_path: Path) -> None:
    ckpt = load_sovits_checkpoint(golden_v2pro_dir / meta["sovits"]["v2ProPlus"]["file"])
    weights = {k: v for k, v in ckpt.state_dict.items() if not k.startswith("ge_to512.")}
    path = tmp_path / "incomplete.pth"
    torch.save({"weight": weights, "config": ckpt.config, "info": ""}, path)
    with pytest.raises(ModelFormatError, match="lacks ge_to512.weight, ge_to512.bias"):
        load_sovits_checkpoint(path)
    tagged = tmp_path / "incomplete_tagged.pth"
    tagged.write_bytes(_retag(path.read_bytes(), b"06"))
    with pytest.raises(ModelFormatError, match="tagged as a v2ProPlus file but it lacks .*ge_to512.weight"):
        load_sovits_checkpoint(tagged)


def test_booby_trapped_v2pro_file_is_refused(golden_v2pro_dir: Path, meta: dict, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    ckpt = load_sovits_checkpoint(golden_v2pro_dir / meta["sovits"]["v2Pro"]["file"])
    path = tmp_path / "evil.pth"
    torch.save({"weight": ckpt.state_dict, "config": _Payload(marker), "info": ""}, path)
    path.write_bytes(_retag(path.read_bytes(), b"05"))
    with pytest.raises(ModelFormatError, match="contains code"):
        load_sovits_checkpoint(path)
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------------- SV model
@pytest.mark.conformance
def test_golden_sv_model_loads(golden_v2pro_dir: Path, meta: dict) -> None:
    sv = meta["sv"]
    path = golden_v2pro_dir / sv["file"]
    ckpt = load_sv_checkpoint(path)
    assert ckpt.m_channels == sv["arch"]["m_channels"]
    assert len(ckpt.state_dict) == sv["n_tensors"]
    floats = [t for t in ckpt.state_dict.values() if t.is_floating_point()]
    assert sum(t.numel() for t in floats) == sv["n_params"]
    assert {t.dtype for t in floats} == {torch.float16}  # as stored; the builder casts
    model = ERes2NetV2.from_checkpoint(ckpt)
    assert model.out_dim == sv["forward3_dim"]
    assert next(model.parameters()).dtype == torch.float32


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_booby_trapped_sv_file_is_refused(golden_v2pro_dir: Path, meta: dict, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    sd = dict(load_sv_checkpoint(golden_v2pro_dir / meta["sv"]["file"]).state_dict)
    path = tmp_path / "evil.ckpt"
    torch.save({**sd, "seg_1.bias": _Payload(marker)}, path, pickle_protocol=2)
    with pytest.raises(ModelFormatError, match="contains code.*was not loaded"):
        load_sv_checkpoint(path)
    assert not marker.exists()


def test_wrong_files_as_sv_model_are_refused(golden_v2pro_dir: Path, meta: dict, tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match="not the speaker-verification model"):
        load_sv_checkpoint(golden_v2pro_dir / meta["sovits"]["v2Pro"]["file"])
    other = tmp_path / "other.ckpt"
    torch.save({"encoder.weight": torch.zeros(3, 3)}, other)
    with pytest.raises(ModelFormatError, match="not an ERes2NetV2"):
        load_sv_checkpoint(other)
    with pytest.raises(ModelFormatError, match="does not exist"):
        load_sv_checkpoint(tmp_path / "missing.ckpt")
    sd = dict(load_sv_checkpoint(golden_v2pro_dir / meta["sv"]["file"]).state_dict)
    sd.pop("layer3_ds.weight")
    sd["layer1.0.conv1.weight"] = torch.zeros(1, 1, 1, 1)
    broken = tmp_path / "broken.ckpt"
    torch.save(sd, broken)
    with pytest.raises(ModelFormatError, match="missing layer3_ds.weight.*mis-shaped layer1.0.conv1.weight"):
        ERes2NetV2.from_checkpoint(load_sv_checkpoint(broken))


# ----------------------------------------------------------------------------------------------- released sizes
def _empty(shape: list[int], dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


@pytest.mark.slow
def test_released_size_sv_file_would_be_accepted(real_sizes: dict, meta: dict, tmp_path: Path) -> None:
    """The released ERes2NetV2's every key/shape (as upstream's class builds it), written as a file and loaded."""
    table = real_sizes["sv_pretrained_eres2netv2w24s4ep4"]
    sd = {k: _empty(shape, torch.int64 if dtype == "int64" else torch.float16) for k, (shape, dtype)
          in table["keys"].items()}
    path = tmp_path / "pretrained_eres2netv2w24s4ep4.ckpt"
    torch.save(sd, path)
    ckpt = load_sv_checkpoint(path)
    assert ckpt.m_channels == meta["sv"]["released_m_channels"] == table["keys"]["conv1.weight"][0][0]
    assert ERes2NetV2.validate(ckpt) == meta["sv"]["released_forward3_dim"]  # the start-up check, on meta
    model = ERes2NetV2.from_checkpoint(ckpt)
    assert model.out_dim == meta["sv"]["released_forward3_dim"]
    used = sum(t.numel() for k, t in sd.items() if t.is_floating_point() and not k.startswith("seg_1."))
    assert sum(t.numel() for t in model.state_dict().values() if t.is_floating_point()) == used
    assert sum(t.numel() for t in sd.values() if t.is_floating_point()) == table["n_params_float"]


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_released_size_sovits_file_would_be_accepted(real_sizes: dict, meta: dict, tmp_path: Path,
                                                     version: str) -> None:
    """A fine-tuned released-size v2Pro/v2ProPlus file (keys/shapes from the table, upstream's released config)."""
    table = real_sizes[f"sovits_{version}_finetuned_file"]
    m = meta["sovits"][version]
    sd = {k: _empty(shape) for k, shape in table["keys"].items()}
    assert sum(t.numel() for t in sd.values()) == table["n_params_without_enc_q"]
    path = tmp_path / f"{version}.pth"
    torch.save({"weight": sd, "config": {"model": m["released_config_model"], "data": m["config_data"]},
                "info": "1epoch_1iteration"}, path)
    path.write_bytes(_retag(path.read_bytes(), m["first_2_bytes_ascii"].encode()))
    ckpt = load_sovits_checkpoint(path)
    assert ckpt.version == version
    model = SoVITSDecoder.from_checkpoint(ckpt)
    cfg = m["released_config_model"]
    assert model.cfg.gin_channels == cfg["gin_channels"] and model.cfg.upsample_kernel_sizes[0] == \
        cfg["upsample_kernel_sizes"][0]
    assert model.cfg.sv_dim == meta["sv"]["released_forward3_dim"]  # the released SV model's output width
    assert model.cfg.mrte_hidden == table["keys"]["ge_to512.weight"][0]
