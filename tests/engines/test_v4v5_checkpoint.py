"""Loading the diffusion families' files in upstream's formats (the golden set's tiny files, and every key and shape
of the released-size models), and refusing bad ones with one line: a v5 file with a v4 header, a truncated file,
a DiT with weights missing, a LoRA file, a v2 file, a SoVITS file where the vocoder belongs."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from engines.base import ModelFormatError
from engines.gpt_sovits.bigvgan import BigVGAN
from engines.gpt_sovits.checkpoint import SovitsCheckpoint, load_sovits_checkpoint
from engines.gpt_sovits.dit_checkpoint import (
    BigVGANCheckpoint,
    load_bigvgan_checkpoint,
    load_dit_sovits_checkpoint,
    load_vocoder48k_checkpoint,
)
from engines.gpt_sovits.family import family_spec
from engines.gpt_sovits.mel_sovits import MelSoVITS
from engines.gpt_sovits.vocoder48k import Vocoder48k
from tests.golden_v4v5 import GoldenV4V5

# configs/s2.json's model block, which the released v3/v4/v5 SoVITS are built from (reference section 2); the
# golden set's real_size_shapes.json was made with it
S2_MODEL = {"inter_channels": 192, "hidden_channels": 192, "filter_channels": 768, "n_heads": 2, "n_layers": 6,
            "kernel_size": 3, "p_dropout": 0.1, "resblock": "1", "resblock_kernel_sizes": [3, 7, 11],
            "resblock_dilation_sizes": [[1, 3, 5]] * 3, "upsample_rates": [10, 8, 2, 2, 2],
            "upsample_initial_channel": 512, "upsample_kernel_sizes": [16, 16, 8, 2, 2], "gin_channels": 512,
            "semantic_frame_rate": "25hz", "freeze_quantizer": True}


def _one_line(e: pytest.ExceptionInfo[ModelFormatError]) -> str:
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 400, msg
    return msg


def _retag(src: Path, dst: Path, tag: bytes) -> Path:
    dst.write_bytes(tag + src.read_bytes()[2:])
    return dst


def _save(path: Path, obj: Any, tag: bytes = b"PK") -> Path:
    buf = io.BytesIO()
    torch.save(obj, buf)
    path.write_bytes(tag + buf.getvalue()[2:])
    return path


@pytest.mark.parametrize("family", ["v4", "v5turbo", "v5dev", "v3"])
def test_each_family_file_loads_as_upstream_detects_it(golden_v4v5: GoldenV4V5, family: str) -> None:
    if family not in golden_v4v5.families:
        pytest.skip(f"this golden set has no {family} data")
    meta = golden_v4v5.sovits_meta(family)
    path = golden_v4v5.sovits_file(family)
    assert path.read_bytes()[:2].decode() == meta["first_2_bytes_ascii"]
    ckpt = load_dit_sovits_checkpoint(path)
    assert ckpt.version == meta["detected"][1] == family
    assert len(ckpt.state_dict) == meta["n_tensors_saved"]
    assert sum(t.numel() for t in ckpt.state_dict.values()) == meta["n_params_saved"]
    model = MelSoVITS.from_checkpoint(ckpt)
    assert model.family.step_embedding == meta["has_d_embed"] == (model.dit.d_embed is not None)
    # the v2 loader still refuses it, naming the family
    with pytest.raises(ModelFormatError):
        load_sovits_checkpoint(path)


def test_untagged_file_is_told_by_its_name_config_or_the_configured_family(golden_v4v5: GoldenV4V5,
                                                                          tmp_path: Path) -> None:
    src = golden_v4v5.sovits_file("v5turbo")
    assert load_dit_sovits_checkpoint(_retag(src, tmp_path / "s2Gv5turbo.pth", b"PK")).version == "v5turbo"
    assert load_dit_sovits_checkpoint(_retag(src, tmp_path / "mine.pth", b"PK")).version == "v5turbo"  # its config
    for family in ("v5turbo", "v4"):
        ckpt = load_dit_sovits_checkpoint(golden_v4v5.sovits_file(family))
        config = {**ckpt.config, "model": {k: v for k, v in ckpt.config["model"].items() if k != "version"}}
        silent = _save(tmp_path / f"silent_{family}.pth", {"weight": ckpt.state_dict, "config": config, "info": ""})
        assert load_dit_sovits_checkpoint(silent, expected=family).version == family
        if family == "v5turbo":
            assert load_dit_sovits_checkpoint(silent).version == "v5dev"  # upstream's rule for an unnamed v5 file
        else:
            with pytest.raises(ModelFormatError) as e:
                load_dit_sovits_checkpoint(silent)
            assert "set models.family to v3 or v4" in _one_line(e)


def test_v5_file_with_a_v4_header_is_refused(golden_v4v5: GoldenV4V5, tmp_path: Path) -> None:
    bad = _retag(golden_v4v5.sovits_file("v5turbo"), tmp_path / "bad.pth", b"04")
    with pytest.raises(ModelFormatError) as e:
        load_dit_sovits_checkpoint(bad)
    msg = _one_line(e)
    assert "04 header says v4" in msg and "v5 weights" in msg
    bad = _retag(golden_v4v5.sovits_file("v4"), tmp_path / "bad2.pth", b"08")
    with pytest.raises(ModelFormatError) as e:
        load_dit_sovits_checkpoint(bad)
    assert "says v5turbo" in _one_line(e)


def test_truncated_file_is_refused(golden_v4v5: GoldenV4V5, tmp_path: Path) -> None:
    data = golden_v4v5.sovits_file("v5turbo").read_bytes()
    cut = tmp_path / "cut.pth"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError) as e:
        load_dit_sovits_checkpoint(cut)
    assert "truncated or corrupt" in _one_line(e)


def test_dit_with_weights_missing_is_refused(golden_v4v5: GoldenV4V5, tmp_path: Path) -> None:
    ckpt = load_dit_sovits_checkpoint(golden_v4v5.sovits_file("v4"))
    sd = dict(ckpt.state_dict)
    last = MelSoVITS.from_checkpoint(ckpt).cfg.dit.depth - 1
    del sd[f"cfm.estimator.transformer_blocks.{last}.ff.ff.2.weight"]
    with pytest.raises(ModelFormatError) as e:
        MelSoVITS.from_checkpoint(SovitsCheckpoint(sd, ckpt.config, ckpt.version, ckpt.info))
    assert f"transformer_blocks.{last}.ff.ff.2.weight" in _one_line(e)
    no_dit = {k: v for k, v in ckpt.state_dict.items() if ".transformer_blocks." not in k}
    with pytest.raises(ModelFormatError) as e:
        MelSoVITS.from_checkpoint(SovitsCheckpoint(no_dit, ckpt.config, ckpt.version, ckpt.info))
    assert "no DiT blocks" in _one_line(e)


def test_lora_and_v2_files_are_refused(golden_v4v5: GoldenV4V5, tmp_path: Path) -> None:
    ckpt = load_dit_sovits_checkpoint(golden_v4v5.sovits_file("v4"))
    lora = _save(tmp_path / "lora.pth", {"weight": ckpt.state_dict, "config": {"model": {}}, "info": "x",
                                          "lora_rank": 32}, b"04")
    with pytest.raises(ModelFormatError) as e:
        load_dit_sovits_checkpoint(lora)
    assert "LoRA" in _one_line(e)
    v2 = _save(tmp_path / "v2.pth", {"weight": {k: v for k, v in ckpt.state_dict.items() if not k.startswith("cfm.")},
                                     "config": {"model": {}}, "info": "x"})
    with pytest.raises(ModelFormatError) as e:
        load_dit_sovits_checkpoint(v2)
    assert "v2-family" in _one_line(e)


def test_vocoders_load_and_wrong_files_are_refused(golden_v4v5: GoldenV4V5, tmp_path: Path) -> None:
    sd = load_vocoder48k_checkpoint(golden_v4v5.vocoder_path("v4"))
    assert len(sd) == len(golden_v4v5.meta["vocoders"]["v4"]["keys"])
    assert Vocoder48k.from_state_dict(sd).hop == golden_v4v5.meta["vocoders"]["v4"]["vocoder_configs"]["upsample_rate"]
    with pytest.raises(ModelFormatError) as e:
        load_vocoder48k_checkpoint(golden_v4v5.sovits_file("v4"))
    assert "not the vocoder" in _one_line(e)
    with pytest.raises(ModelFormatError) as e:
        load_bigvgan_checkpoint(tmp_path)
    assert "does not exist" in _one_line(e)
    if "v3" in golden_v4v5.families:
        big = BigVGAN.from_folder(golden_v4v5.vocoder_path("v3"))
        assert big.hop == golden_v4v5.meta["vocoders"]["v3"]["vocoder_configs"]["upsample_rate"]


def _meta_tensors(shapes: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    return {k: torch.empty(s, device="meta", dtype=torch.float16) for k, s in shapes.items()}


@pytest.mark.parametrize("family", ["v3", "v4", "v5dev", "v5turbo"])
def test_released_size_shapes_build(golden_v4v5: GoldenV4V5, family: str) -> None:
    """Every key and shape of a released-size SoVITS fits the model built from them (on the meta device)."""
    table = json.loads((golden_v4v5.root / "real_size_shapes.json").read_text())
    shapes = table["sovits"][family]["keys"]
    ckpt = SovitsCheckpoint(_meta_tensors(shapes), {"model": dict(S2_MODEL, version=family)}, family, "")
    with torch.device("meta"):
        model = MelSoVITS.from_checkpoint(ckpt, device="meta")
    dit = model.cfg.dit
    assert (dit.dim, dit.depth, dit.heads, dit.dim_head, dit.text_dim) == (1024, 22, 16, 64, 512)
    assert model.cfg.family == family_spec(family)


def test_released_size_vocoders_build(golden_v4v5: GoldenV4V5) -> None:
    table = json.loads((golden_v4v5.root / "real_size_shapes.json").read_text())
    hifigan = _meta_tensors(table["vocoder"]["v4_v5_hifigan_after_remove_weight_norm"]["keys"])
    with torch.device("meta"):
        assert Vocoder48k.from_state_dict(hifigan, device="meta").conv_pre.out_channels == 512
    if "v3" in golden_v4v5.meta["vocoders"]:
        config = json.loads((golden_v4v5.vocoder_path("v3") / "config.json").read_text())
        for key, (released, _tiny) in golden_v4v5.meta["vocoders"]["v3"]["config_changes"].items():
            config[key] = released
        big = _meta_tensors(table["vocoder"]["v3_bigvgan_file_layout"]["keys"])
        with torch.device("meta"):
            model = BigVGAN.from_checkpoint(BigVGANCheckpoint(config, big), device="meta")
        assert model.hop == 256
