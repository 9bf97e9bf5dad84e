"""v3/v4 LoRA SoVITS files (``03``/``04``): merged onto their base model exactly as upstream merges them.

The reference is the real ``peft`` package doing what upstream does: its LoRA trainer wraps a tiny SoVITS's ``cfm``
(``r = alpha = lora_rank``, targets ``to_q/to_k/to_v/to_out.0``), trains (here: random LoRA pairs and shifted weights
outside ``cfm``) and saves what it trained (``savee`` -> ``my_save2``); its loader builds the base model, wraps
``cfm`` again, loads the file with strict=False and calls ``merge_and_unload()``. Our loader, which imports no peft,
must give the same weights bit for bit, and the same DiT velocity.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

from engines.base import ModelFormatError
from engines.gpt_sovits.checkpoint import SovitsCheckpoint
from engines.gpt_sovits.dit_checkpoint import load_dit_sovits_checkpoint
from engines.gpt_sovits.mel_sovits import MelSoVITS
from engines.gpt_sovits.tiny_dit import sovits_config, sovits_state_dict, write_dit_family

peft = pytest.importorskip("peft")

TARGETS = ["to_k", "to_q", "to_v", "to_out.0"]  # upstream's LoraConfig (s2_train_v3_lora.py, TTS.init_vits_weights)
TAGS = {"v3": b"03", "v4": b"04"}  # upstream's model_version2byte for LoRA files
RANK = 8
SEED = 5


def _atomic(path: Path, write: Callable[[str], None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write(str(path))


def _upstream_tree(sd: dict[str, torch.Tensor]) -> nn.Module:
    """A module tree under upstream's names holding ``sd`` in fp32 (as upstream loads a fp16 file into its fp32
    model): the attention projections are ``nn.Linear`` (what peft wraps), the DiT's rotary table a buffer (saved
    under peft's names, as upstream's is), every other tensor a parameter."""
    root = nn.Module()

    def node(path: list[str]) -> nn.Module:
        module = root
        for part in path:
            if part not in module._modules:  # pyright: ignore[reportPrivateUsage]
                module.add_module(part, nn.Module())
            module = module._modules[part]  # pyright: ignore[reportPrivateUsage]
            assert module is not None
        return module

    linears = {k[: -len(".weight")] for k in sd
               if k.endswith(".weight") and k[: -len(".weight")].endswith(tuple("." + t for t in TARGETS))}
    for stem in sorted(linears):
        w = sd[stem + ".weight"]
        *parent, name = stem.split(".")
        node(parent).add_module(name, nn.Linear(w.shape[1], w.shape[0], bias=stem + ".bias" in sd))
    for key, t in sd.items():
        stem, leaf = key.rsplit(".", 1)
        if stem in linears:
            continue
        if leaf == "inv_freq":
            node(stem.split(".")).register_buffer(leaf, t.float().clone())
        else:
            node(stem.split(".")).register_parameter(leaf, nn.Parameter(t.float().clone()))
    root.load_state_dict({k: v.float() for k, v in sd.items()}, strict=True)
    return root


def _lora_config(rank: int) -> Any:
    return peft.LoraConfig(target_modules=TARGETS, r=rank, lora_alpha=rank, init_lora_weights=True)


def _train_and_save(family: str, base_sd: dict[str, torch.Tensor], path: Path, rank: int = RANK) -> None:
    """Upstream's LoRA trainer, one 'step': wrap ``cfm``, change every trainable tensor, save as ``savee`` does."""
    net = _upstream_tree(base_sd)
    net.cfm = peft.get_peft_model(net.cfm, _lora_config(rank))
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if ".lora_" in name:  # B starts at zero: give both sides values, so the merge changes the weights
                p.copy_(0.2 * torch.randn(p.shape, generator=gen) / rank ** 0.5)
            elif p.requires_grad:  # the trainer fine-tunes everything outside cfm too
                p.add_(0.01 * torch.randn(p.shape, generator=gen))
    no_grad_names = {name for name, p in net.named_parameters() if not p.requires_grad}
    sim_ckpt = {k: v.half().cpu() for k, v in net.state_dict().items() if k not in no_grad_names}
    opt = {"weight": {k: v for k, v in sim_ckpt.items() if "enc_q" not in k}, "config": sovits_config(family, "tiny"),
           "info": "8epoch_96iteration", "lora_rank": rank}
    _my_save2(opt, path, TAGS[family])


def _my_save2(obj: dict[str, Any], path: Path, tag: bytes) -> Path:
    buf = io.BytesIO()
    torch.save(obj, buf)
    path.write_bytes(tag + buf.getvalue()[2:])
    return path


def _upstream_load(base_sd: dict[str, torch.Tensor], lora_path: Path,
                   unexpected: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
    """Upstream's ``init_vits_weights`` for a LoRA file: base, peft wrap, load with strict=False, merge."""
    data = bytearray(lora_path.read_bytes())
    data[:2] = b"PK"
    dict_s2 = torch.load(io.BytesIO(bytes(data)), map_location="cpu", weights_only=True)
    model = _upstream_tree(base_sd)
    model.cfm = peft.get_peft_model(model.cfm, _lora_config(dict_s2["lora_rank"]))
    result = model.load_state_dict(dict_s2["weight"], strict=False)
    assert set(result.unexpected_keys) == unexpected  # every other tensor of the file landed somewhere
    model.cfm = model.cfm.merge_and_unload()
    return {k: v.detach() for k, v in model.state_dict().items()}


def _make_case(family: str, root: Path) -> dict[str, Any]:
    """The family's tiny pretrained set under ``root`` and a LoRA fine-tune of its SoVITS saved beside it."""
    files = write_dit_family(root, family, "tiny", SEED, _atomic)
    base_sd = sovits_state_dict(family, "tiny", SEED)
    lora = root / f"voice_e8_s96_l{RANK}.pth"
    _train_and_save(family, base_sd, lora)
    return {"family": family, "base": files["sovits"], "vocoder": files["vocoder"], "base_sd": base_sd, "lora": lora}


@pytest.fixture(scope="module", params=["v4", "v3"])
def lora_case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _make_case(str(request.param), tmp_path_factory.mktemp(f"lora-{request.param}"))


@pytest.fixture(scope="module")
def v4_lora(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _make_case("v4", tmp_path_factory.mktemp("lora-v4-only"))


def _one_line(e: pytest.ExceptionInfo[ModelFormatError]) -> str:
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 400, msg
    return msg


def test_the_file_is_laid_out_as_upstream_saves_it(lora_case: dict[str, Any]) -> None:
    raw = lora_case["lora"].read_bytes()
    assert raw[:2] == TAGS[lora_case["family"]]
    weight = _upstream_weight(lora_case["lora"])
    a = "cfm.base_model.model.estimator.transformer_blocks.0.attn.to_out.0.lora_A.default.weight"
    assert weight[a].shape == (RANK, 128) and weight[a].dtype == torch.float16  # [r, heads * dim_head]
    assert "cfm.base_model.model.estimator.rotary_embed.inv_freq" in weight  # cfm's buffer, under peft's name
    assert not any(".base_layer." in k for k in weight)  # frozen, so not saved
    assert "enc_p.text_embedding.weight" in weight  # trained outside cfm, plain name


def _upstream_weight(path: Path) -> dict[str, torch.Tensor]:
    data = bytearray(path.read_bytes())
    data[:2] = b"PK"
    return torch.load(io.BytesIO(bytes(data)), map_location="cpu", weights_only=True)["weight"]


def test_merged_weights_equal_peft_merge_and_unload(lora_case: dict[str, Any]) -> None:
    expected = _upstream_load(lora_case["base_sd"], lora_case["lora"])
    ckpt = load_dit_sovits_checkpoint(lora_case["lora"], base=lora_case["base"])
    assert ckpt.version == lora_case["family"] and ckpt.info == "8epoch_96iteration"
    assert set(ckpt.state_dict) == set(expected)
    unequal = [k for k, v in expected.items() if not torch.equal(ckpt.state_dict[k].float(), v)]
    assert unequal == []
    merged = [k for k in expected if k.endswith(tuple(f".{t}.weight" for t in TARGETS))]
    assert len(merged) == 4 * 2  # every attention projection of the tiny DiT's 2 blocks
    for k in merged:
        assert ckpt.state_dict[k].dtype == torch.float32
        assert float((ckpt.state_dict[k] - lora_case["base_sd"][k].float()).abs().max()) > 1e-3  # the LoRA counts
    # the weights trained outside cfm come from the file, the frozen DiT ones from the base
    assert torch.equal(ckpt.state_dict["enc_p.text_embedding.weight"],
                       _upstream_weight(lora_case["lora"])["enc_p.text_embedding.weight"])
    ff = "cfm.estimator.transformer_blocks.1.ff.ff.0.0.weight"
    assert ff in ckpt.state_dict and torch.equal(ckpt.state_dict[ff], lora_case["base_sd"][ff])


def test_dit_velocity_equals_peft_merged_model(lora_case: dict[str, Any]) -> None:
    expected = _upstream_load(lora_case["base_sd"], lora_case["lora"])
    ckpt = load_dit_sovits_checkpoint(lora_case["lora"], base=lora_case["base"])
    ours = MelSoVITS.from_checkpoint(ckpt)
    ref = MelSoVITS.from_checkpoint(SovitsCheckpoint(expected, ckpt.config, ckpt.version, ckpt.info))
    base = MelSoVITS.from_checkpoint(load_dit_sovits_checkpoint(lora_case["base"]))
    gen = torch.Generator().manual_seed(11)
    frames = 24
    x = torch.randn(1, 100, frames, generator=gen)
    cond = torch.randn(1, 100, frames, generator=gen)
    text = torch.randn(1, ours.cfg.dit.text_dim, frames, generator=gen)
    args = (x, cond, torch.tensor([frames]), torch.tensor([0.3]), torch.tensor([0.125]), text)
    with torch.inference_mode():
        v_ours, v_ref, v_base = ours.dit(*args), ref.dit(*args), base.dit(*args)
    assert float((v_ours - v_ref).abs().max()) <= 1e-6
    assert float((v_ours - v_base).abs().max()) > 1e-3  # the merged LoRA changes what the DiT computes


def test_the_decoder_loads_a_lora_through_its_base(lora_case: dict[str, Any]) -> None:
    from engines.gpt_sovits.diffusion import DiffusionDecoder

    decoder = DiffusionDecoder.load(lora_case["lora"], lora_case["vocoder"], lora_case["family"], path="fp32",
                                    sovits_base=lora_case["base"])
    q = "dit.transformer_blocks.0.attn.qkv.weight"
    expected = _upstream_load(lora_case["base_sd"], lora_case["lora"])
    stem = "cfm.estimator.transformer_blocks.0.attn."
    fused = torch.cat([expected[f"{stem}to_{p}.weight"] for p in "qkv"])
    assert torch.equal(decoder.sovits.state_dict()[q], fused)


def test_the_int8_dit_proof_of_a_lora_is_made_again_when_its_base_changes(v4_lora: dict[str, Any], tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A LoRA's weights are its base's too: the kept int8 verdict holds for the pair, not for the LoRA file alone."""
    import os

    from engines.gpt_sovits import dit_int8
    from engines.gpt_sovits.diffusion import DiffusionDecoder

    proofs: list[int] = []
    prove = dit_int8.prove_int8_dit
    monkeypatch.setattr(dit_int8, "prove_int8_dit", lambda *a, **k: proofs.append(1) or prove(*a, **k))
    base = tmp_path / "base.pth"
    base.write_bytes(v4_lora["base"].read_bytes())
    load = lambda: DiffusionDecoder.load(v4_lora["lora"], v4_lora["vocoder"], "v4", path="fast",  # noqa: E731
                                         sovits_base=base, cache_dir=tmp_path / "proofs")
    load()
    load()
    assert len(proofs) == 1  # kept for the pair
    st = base.stat()
    os.utime(base, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the base changed since
    load()
    assert len(proofs) == 2 and len(list((tmp_path / "proofs").glob("dit-int8-*.json"))) == 2


def test_a_lora_without_its_base_is_one_line(lora_case: dict[str, Any], tmp_path: Path) -> None:
    family = lora_case["family"]
    with pytest.raises(ModelFormatError) as e:
        load_dit_sovits_checkpoint(lora_case["lora"])
    msg = _one_line(e)
    assert "LoRA" in msg and "models.sovits_base" in msg and f"models download --family {family}" in msg
    with pytest.raises(ModelFormatError) as e:
        load_dit_sovits_checkpoint(lora_case["lora"], base=tmp_path / "gone.pth")
    msg = _one_line(e)
    assert "gone.pth" in msg and "is missing" in msg and f"models download --family {family}" in msg
    with pytest.raises(ModelFormatError) as e:  # a LoRA is no base
        load_dit_sovits_checkpoint(lora_case["lora"], base=lora_case["lora"])
    assert "itself a LoRA" in _one_line(e)


def test_a_base_of_another_family_is_refused(lora_case: dict[str, Any], tmp_path: Path) -> None:
    other = "v5turbo" if lora_case["family"] == "v4" else "v4"
    files = write_dit_family(tmp_path, other, "tiny", SEED, _atomic)
    with pytest.raises(ModelFormatError) as e:
        load_dit_sovits_checkpoint(lora_case["lora"], base=files["sovits"])
    assert f"its base {files['sovits']} is a {other} SoVITS" in _one_line(e)


def _damaged(case: dict[str, Any], tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> Path:
    data = bytearray(case["lora"].read_bytes())
    data[:2] = b"PK"
    obj = torch.load(io.BytesIO(bytes(data)), map_location="cpu", weights_only=True)
    change(obj)
    return _my_save2(obj, tmp_path / "damaged.pth", TAGS[case["family"]])


PAIR = "cfm.base_model.model.estimator.transformer_blocks.1.attn.to_v.lora_{}.default.weight"


@pytest.mark.parametrize(("change", "message"), [
    (lambda o: o["weight"].pop(PAIR.format("B")), "to_v has a lora_A but no lora_B"),
    (lambda o: o["weight"].pop(PAIR.format("A")), "to_v has a lora_B but no lora_A"),
    (lambda o: o.pop("lora_rank"), "without a valid lora_rank (found None)"),
    (lambda o: o.update(lora_rank="8"), "without a valid lora_rank (found '8')"),
    (lambda o: o.update(lora_rank=4), "LoRA pair is A (8, 64), B (128, 8), but rank 4"),
    (lambda o: o["weight"].update({PAIR.format("A"): torch.zeros(RANK, 63, dtype=torch.float16)}), "A (8, 63)"),
    (lambda o: o["weight"].update({"enc_p.text_embedding.weight": torch.zeros(3, 3)}), "trained on another base"),
    (lambda o: o["weight"].update({PAIR.replace("to_v", "ff.ff.0.0").format("A"): torch.zeros(RANK, 64)}),
     "unexpected LoRA tensor"),
    (lambda o: o["weight"].update({PAIR.replace("to_v", "to_w").format("A"): torch.zeros(RANK, 64)}),
     "unexpected LoRA tensor"),
])
def test_a_malformed_lora_is_one_line(v4_lora: dict[str, Any], tmp_path: Path,
                                      change: Callable[[dict[str, Any]], None], message: str) -> None:
    bad = _damaged(v4_lora, tmp_path, change)
    with pytest.raises(ModelFormatError) as e:
        load_dit_sovits_checkpoint(bad, base=v4_lora["base"])
    msg = _one_line(e)
    assert message in msg and str(bad) in msg


def test_the_config_points_at_the_family_base(tmp_path: Path) -> None:
    from bot.config import config_from_dict

    models = config_from_dict({"models": {"family": "v4", "dir": "m"}}, tmp_path).models
    assert models.sovits_base == tmp_path / "m" / "gsv-v4-pretrained" / "s2Gv4.pth"
    assert config_from_dict({"models": {"family": "v3"}}, tmp_path).models.sovits_base == tmp_path / "models/s2Gv3.pth"
    assert config_from_dict({"models": {"family": "v2"}}, tmp_path).models.sovits_base is None
    mine = config_from_dict({"models": {"family": "v4", "sovits_base": "b.pth"}}, tmp_path).models.sovits_base
    assert mine == tmp_path / "b.pth"


def test_tiny_dit_writes_a_lora_as_the_trainer_does(lora_case: dict[str, Any], tmp_path: Path) -> None:
    from engines.gpt_sovits.tiny_dit import write_dit_lora

    family = lora_case["family"]
    path = write_dit_lora(tmp_path / "tiny_lora.pth", family, "tiny", SEED, RANK, _atomic)
    assert path.read_bytes()[:2] == TAGS[family]
    mine, trainers = _upstream_weight(path), _upstream_weight(lora_case["lora"])
    assert {k: (tuple(v.shape), v.dtype) for k, v in mine.items()} == \
           {k: (tuple(v.shape), v.dtype) for k, v in trainers.items()}
    expected = _upstream_load(lora_case["base_sd"], path)  # peft takes it as its own
    ckpt = load_dit_sovits_checkpoint(path, base=lora_case["base"])
    assert all(torch.equal(ckpt.state_dict[k].float(), v) for k, v in expected.items())


def test_plain_dit_names_in_a_lora_are_ignored_as_upstream_does(v4_lora: dict[str, Any], tmp_path: Path) -> None:
    """Upstream loads a LoRA file into the peft-wrapped model, where ``cfm.estimator.*`` names match nothing."""
    ff = "cfm.estimator.transformer_blocks.1.ff.ff.0.0.weight"
    path = _damaged(v4_lora, tmp_path, lambda o: o["weight"].update({ff: torch.zeros_like(v4_lora["base_sd"][ff])}))
    expected = _upstream_load(v4_lora["base_sd"], path, frozenset({ff}))
    ckpt = load_dit_sovits_checkpoint(path, base=v4_lora["base"])
    assert torch.equal(ckpt.state_dict[ff], v4_lora["base_sd"][ff])
    assert torch.equal(expected[ff], ckpt.state_dict[ff].float())
