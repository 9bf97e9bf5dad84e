"""SoVITS v2 decoder vs upstream's own outputs on the golden tiny model (fp32, CPU), plus loading rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.utils import parametrize

from engines.base import SAMPLES_PER_TOKEN, ModelFormatError, decoded_frames, prior_noise, token_sample
from engines.gpt_sovits.checkpoint import SovitsCheckpoint, load_sovits_checkpoint
from engines.gpt_sovits.sovits import SoVITSDecoder, mean_style
from tests.golden import Golden

ATOL = 1e-4  # README: upstream fp32 vs fp64 differ by 1.8e-6


@pytest.fixture(scope="module")
def ckpt(golden: Golden) -> SovitsCheckpoint:
    return load_sovits_checkpoint(golden.sovits_path)


@pytest.fixture(scope="module")
def model(ckpt) -> SoVITSDecoder:
    return SoVITSDecoder.from_checkpoint(ckpt)


@pytest.fixture(scope="module")
def io(golden: Golden) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in golden.sovits_io.items()}


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
    assert wav.shape == (1, 1, codes.shape[-1] * 2 * model.cfg.hop)  # 2 latent frames of hop samples per token
    _close(wav, io["wav_ns0"])


@torch.inference_mode()
def test_wav_with_stored_noise(model, io, golden: Golden):
    codes, text = _inputs(io)
    assert golden.noise_cases
    for case, noise in golden.noise_cases.items():
        _close(model.decode(codes, text, io["ge"], noise_scale=noise, eps=io["eps"]), io[case])


@torch.inference_mode()
def test_speed(model, io, golden: Golden):
    codes, text = _inputs(io)
    assert golden.speed_cases
    for case, speed in golden.speed_cases.items():
        _, m_p, _ = model.encode_prior(codes, text, io["ge"], speed=speed)
        assert m_p.shape[-1] == int(golden.frames / speed) + 1  # upstream's interpolation length
        _close(m_p, io[f"m_p_speed{case.rsplit('speed', 1)[1]}"])
        _close(model.decode(codes, text, io["ge"], speed=speed, noise_scale=0.0), io[case])


def test_token_sample_follows_the_speed_interpolation():
    """``token_sample`` puts token k where the speed interpolation (linear, ``align_corners=False``, to
    ``decoded_frames`` frames, as upstream and :mod:`sovits_modules`) moved its first frame: on a ramp of source frame
    indices, the output frame that begins there reads 2k within one output frame (2n / frames source frames); the
    speed-1 map does not."""
    for speed in (0.8, 1.1, 1.25, 1.5, 2.0):
        for n in (7, 16, 30):
            frames = decoded_frames(n, speed)
            ramp = torch.arange(2 * n, dtype=torch.float32).view(1, 1, -1)  # source frame i holds i
            out = torch.nn.functional.interpolate(ramp, size=frames, mode="linear")[0, 0]
            assert frames == int(2 * n / speed) + 1 and token_sample(n, n, speed) == frames * SAMPLES_PER_TOKEN // 2
            for k in range(n):
                j = round(token_sample(k, n, speed) / (SAMPLES_PER_TOKEN // 2))
                assert abs(float(out[min(j, frames - 1)]) - 2 * k) <= 2 * n / frames, (speed, n, k)
            k = n - 2
            assert abs(float(out[min(2 * k, frames - 1)]) - 2 * k) > 2 * n / frames or n * abs(1 - 1 / speed) < 3


def test_prior_noise_is_one_stream_per_seed_frame_after_frame():
    """A piece of a sentence from frame ``offset`` on gets the frames the whole sentence's draw has there."""
    whole = prior_noise(7, 12, 50)
    assert whole.shape == (1, 12, 50) and whole.dtype == np.float32 and whole.flags.c_contiguous
    for offset, frames in ((0, 20), (6, 30), (44, 6)):
        assert np.array_equal(prior_noise(7, 12, frames, offset), whole[..., offset:offset + frames])
    assert not np.allclose(prior_noise(8, 12, 50), whole)
    assert 0.9 < float(whole.std()) < 1.1 and abs(float(whole.mean())) < 0.1


@torch.inference_mode()
def test_two_references(model, io):
    codes, text = _inputs(io)
    ge = mean_style([model.ref_style(io["refer_spec"]), model.ref_style(io["refer2_spec"])])
    _close(model.decode(codes, text, ge, noise_scale=0.0), io["wav_ns0_tworefs"])


@torch.inference_mode()
def test_codes(model, io):
    _close(model.dequantize(io["codes"].long()), io["codes_dequantized"])
    codes = model.extract_latent(io["ssl_feature"])
    assert codes.dtype == torch.int64 and codes.shape == (1, 1, io["ssl_feature"].shape[-1] // 2)  # ssl_proj stride 2
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


def test_built_from_weight_shapes(model, ckpt, golden: Golden):
    """The dims the config does not state come from the weight shapes: MRTE width, phone table, ref_enc bins."""
    sd = ckpt.state_dict
    assert model.cfg.mrte_hidden == golden.sovits_config["gin_channels"] == sd["enc_p.mrte.c_pre.weight"].shape[0]
    assert model.cfg.n_symbols == golden.n_symbols == sd["enc_p.text_embedding.weight"].shape[0]
    assert model.cfg.style_bins == sd["ref_enc.spectral.0.fc.weight"].shape[1]
    assert model.cfg.style_bins < golden.sovits_io["refer_spec"].shape[1]  # v2 reads the first bins only
    assert model.cfg.hop == golden.sovits_data_config["hop_length"] == golden.samples_per_token // 2


def test_bad_weights_are_refused(ckpt, golden: Golden):
    extra = dict(ckpt.state_dict, **{"dec.bogus.weight": torch.zeros(3)})
    with pytest.raises(ModelFormatError, match="unexpected dec.bogus.weight"):
        SoVITSDecoder.from_checkpoint(SovitsCheckpoint(extra, ckpt.config, "v2", ""))
    post = golden.last_flow_post()  # the last flow step's output conv
    missing = {k: v for k, v in ckpt.state_dict.items() if not k.startswith(post)}
    with pytest.raises(ModelFormatError, match=f"missing {post}.bias"):
        SoVITSDecoder.from_checkpoint(SovitsCheckpoint(missing, ckpt.config, "v2", ""))
    enc_q = dict(ckpt.state_dict, **{"enc_q.pre.weight": torch.zeros(2)})  # training-only: ignored
    SoVITSDecoder.from_checkpoint(SovitsCheckpoint(enc_q, ckpt.config, "v2", ""))
    wrong = ckpt.config["model"]["hidden_channels"] + 32  # a width the weights do not have
    cfg = {**ckpt.config, "model": {**ckpt.config["model"], "hidden_channels": wrong}}
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
