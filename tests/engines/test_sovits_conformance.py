"""SoVITS v2 decoder vs upstream's own outputs on the golden tiny model (fp32, CPU), plus loading rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.utils import parametrize

from engines.base import ModelFormatError
from engines.gpt_sovits.checkpoint import SovitsCheckpoint, load_sovits_checkpoint
from engines.gpt_sovits.sovits import SoVITSDecoder, mean_style

ATOL = 1e-4  # README: upstream fp32 vs fp64 differ by 1.8e-6


@pytest.fixture(scope="module")
def ckpt(golden_dir) -> SovitsCheckpoint:
    return load_sovits_checkpoint(golden_dir / "sovits_tiny_v2.pth")


@pytest.fixture(scope="module")
def model(ckpt) -> SoVITSDecoder:
    return SoVITSDecoder.from_checkpoint(ckpt)


@pytest.fixture(scope="module")
def io(golden_dir) -> dict[str, torch.Tensor]:
    g = np.load(golden_dir / "sovits_io.npz")
    return {k: torch.from_numpy(g[k]) for k in g.files}


def _close(a: torch.Tensor, ref: torch.Tensor) -> None:
    assert a.shape == ref.shape
    err = float((a.float() - ref.float()).abs().max())
    assert err < ATOL, f"max abs error {err:.3g}"


def _inputs(io):
    return io["codes"].long(), io["text"].long()


pytestmark = pytest.mark.conformance


@torch.inference_mode()
def test_ge(model, io):
    _close(model.ref_style(io["refer_spec"]), io["ge"])
    _close(model.ref_style(io["refer2_spec"]), io["ge_refer2"])


@torch.inference_mode()
def test_text_encoder_outputs(model, io):
    codes, text = _inputs(io)
    x, m_p, logs_p = model.encode_prior(codes, text, io["ge"])
    _close(x, io["enc_p_x"])
    _close(m_p, io["m_p"])
    _close(logs_p, io["logs_p"])
    assert io["y_mask"].shape[-1] == m_p.shape[-1] and bool((io["y_mask"] == 1).all())


@torch.inference_mode()
def test_flow(model, io):
    _close(model.flow_reverse(io["m_p"], io["ge"]), io["z"])


@torch.inference_mode()
def test_wav_noise_free(model, io):
    codes, text = _inputs(io)
    ge = model.ref_style(io["refer_spec"])
    wav = model.decode(codes, text, ge, noise_scale=0.0)
    assert wav.shape == (1, 1, 37 * 1280)
    _close(wav, io["wav_ns0"])


@torch.inference_mode()
def test_wav_with_stored_noise(model, io):
    codes, text = _inputs(io)
    wav = model.decode(codes, text, io["ge"], noise_scale=0.5, eps=io["eps"])
    _close(wav, io["wav_ns05_eps"])


@torch.inference_mode()
def test_speed(model, io):
    codes, text = _inputs(io)
    _, m_p, _ = model.encode_prior(codes, text, io["ge"], speed=1.25)
    assert m_p.shape[-1] == int(74 / 1.25) + 1
    _close(m_p, io["m_p_speed125"])
    _close(model.decode(codes, text, io["ge"], speed=1.25, noise_scale=0.0), io["wav_ns0_speed125"])


@torch.inference_mode()
def test_two_references(model, io):
    codes, text = _inputs(io)
    ge = mean_style([model.ref_style(io["refer_spec"]), model.ref_style(io["refer2_spec"])])
    _close(model.decode(codes, text, ge, noise_scale=0.0), io["wav_ns0_tworefs"])


@torch.inference_mode()
def test_codes(model, io):
    _close(model.dequantize(io["codes"].long()), io["codes_dequantized"])
    codes = model.extract_latent(io["ssl_feature"])
    assert codes.dtype == torch.int64 and codes.shape == (1, 1, 30)
    assert torch.equal(codes, io["ssl_codes"].long())


@torch.inference_mode()
def test_seeded_noise_is_reproducible(model, io):
    codes, text = _inputs(io)
    runs = [
        model.decode(codes, text, io["ge"], noise_scale=0.5, generator=torch.Generator().manual_seed(s))
        for s in (7, 7, 8)
    ]
    assert torch.equal(runs[0], runs[1])
    assert float((runs[0] - runs[2]).abs().max()) > 1e-3
    assert float((runs[0] - io["wav_ns0"]).abs().max()) > 1e-3  # the noise really enters


def test_weight_norm_is_folded(model, ckpt):
    names = dict(model.named_parameters())
    assert not any(n.endswith(("weight_g", "weight_v")) for n in names)
    assert not any(m._forward_pre_hooks or parametrize.is_parametrized(m) for m in model.modules())
    # ConvTranspose1d: the norm is over (out, k) per *input* channel
    g = ckpt.state_dict["dec.ups.0.weight_g"].float()
    v = ckpt.state_dict["dec.ups.0.weight_v"].float()
    want = g * v / v.flatten(1).norm(dim=1).view(-1, 1, 1)
    assert torch.allclose(names["dec.ups.0.weight"], want, atol=1e-6)


def test_built_from_weight_shapes(model):
    assert model.cfg.mrte_hidden == 128 and model.cfg.n_symbols == 732 and model.cfg.style_bins == 704
    assert model.cfg.hop == 640


def test_bad_weights_are_refused(ckpt):
    extra = dict(ckpt.state_dict, **{"dec.bogus.weight": torch.zeros(3)})
    with pytest.raises(ModelFormatError, match="unexpected dec.bogus.weight"):
        SoVITSDecoder.from_checkpoint(SovitsCheckpoint(extra, ckpt.config, "v2", ""))
    missing = {k: v for k, v in ckpt.state_dict.items() if not k.startswith("flow.flows.6.post")}
    with pytest.raises(ModelFormatError, match="missing flow.flows.6.post.bias"):
        SoVITSDecoder.from_checkpoint(SovitsCheckpoint(missing, ckpt.config, "v2", ""))
    enc_q = dict(ckpt.state_dict, **{"enc_q.pre.weight": torch.zeros(2)})  # training-only: ignored
    SoVITSDecoder.from_checkpoint(SovitsCheckpoint(enc_q, ckpt.config, "v2", ""))
    cfg = {**ckpt.config, "model": {**ckpt.config["model"], "hidden_channels": 96}}
    with pytest.raises(ModelFormatError, match="shape|missing|unexpected"):
        SoVITSDecoder.from_checkpoint(SovitsCheckpoint(ckpt.state_dict, cfg, "v2", ""))


@torch.inference_mode()
def test_bf16_runs_and_stays_close(ckpt, io):
    """Half precision is for GPUs; bf16 also runs on CPU, which checks the dtype plumbing here."""
    model = SoVITSDecoder.from_checkpoint(ckpt, dtype=torch.bfloat16)
    codes, text = _inputs(io)
    ge = model.ref_style(io["refer_spec"])
    assert ge.dtype == torch.bfloat16
    wav = model.decode(codes, text, ge, noise_scale=0.0).float()
    ref = io["wav_ns0"]
    assert wav.shape == ref.shape
    corr = float(torch.corrcoef(torch.stack([wav.flatten(), ref.flatten()]))[0, 1])
    assert corr > 0.95, corr
