"""v2Pro/v2ProPlus vs upstream's own outputs on the golden tiny models (fp32, CPU): the SV front-end (16 kHz resample,
Kaldi filter banks, ERes2NetV2 ``forward3`` and its intermediates), then the SoVITS with the stored SV features, then
end to end from the 32 kHz reference. Tolerances are the README's; every size and length is read from the data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engines.gpt_sovits.checkpoint import load_sovits_checkpoint, load_sv_checkpoint
from engines.gpt_sovits.fbank import fbank, fbank_frames
from engines.gpt_sovits.sovits import SoVITSDecoder, mean_style
from engines.gpt_sovits.spectrogram import reference_spec_input
from engines.gpt_sovits.sv import ERes2NetV2, SpeakerEncoder, resample_32k_to_16k

pytestmark = pytest.mark.conformance

ATOL_RESAMPLE = 1e-5  # README: fp32 vs fp64 1.2e-7
ATOL_FBANK = 1e-3  # README: fp32 vs fp64 2.3e-4 at a bin of -12.4
ATOL_SV = 1e-3  # README: ~3e-5 of |sv_emb| <= 33.6
ATOL_SOVITS = 1e-4  # README: fp32 vs fp64 <= 3.2e-6 for the whole chain
REFS = ("refer", "refer2")


def _close(a: torch.Tensor, ref: torch.Tensor, atol: float) -> None:
    assert tuple(a.shape) == tuple(ref.shape), (tuple(a.shape), tuple(ref.shape))
    err = float((a.float() - ref.float()).abs().max())
    assert err < atol, f"max abs error {err:.3g} (atol {atol:g})"


def _npz(path: Path) -> dict[str, torch.Tensor]:
    with np.load(path) as z:
        return {k: torch.from_numpy(z[k]) for k in z.files}


@pytest.fixture(scope="module")
def ref(golden_v2pro_dir: Path) -> dict[str, torch.Tensor]:
    return _npz(golden_v2pro_dir / "ref_io.npz")


@pytest.fixture(scope="module")
def sv_model(golden_v2pro_dir: Path, meta: dict) -> ERes2NetV2:
    return ERes2NetV2.from_checkpoint(load_sv_checkpoint(golden_v2pro_dir / meta["sv"]["file"]))


@pytest.fixture(scope="module")
def model(golden_v2pro_dir: Path, meta: dict, version: str) -> SoVITSDecoder:
    return SoVITSDecoder.from_checkpoint(load_sovits_checkpoint(golden_v2pro_dir / meta["sovits"][version]["file"]))


@pytest.fixture(scope="module")
def io(golden_v2pro_dir: Path, version: str) -> dict[str, torch.Tensor]:
    return _npz(golden_v2pro_dir / f"sovits_{version}_io.npz")


def _inputs(io: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return io["codes"].long(), io["text"].long()


# ------------------------------------------------------------------------------------------------- SV front-end
@pytest.mark.parametrize("name", REFS)
def test_resample_32k_to_16k(ref, name: str) -> None:
    wav16k = resample_32k_to_16k(ref[f"{name}_wav"])
    assert wav16k.dtype == torch.float32
    _close(wav16k, ref[f"{name}_wav16k"], ATOL_RESAMPLE)


def test_resample_odd_length_and_1d(ref) -> None:
    """torchaudio keeps ceil(N / 2) samples; a 1-d clip is one row."""
    wav = ref["refer_wav"][0, :1001]
    out = resample_32k_to_16k(wav)
    assert out.shape == (1, 501)
    full = resample_32k_to_16k(ref["refer_wav"])
    # away from the cut, a prefix resamples like the whole clip (the kernel spans 13 input samples each side)
    _close(out[:, :480], full[:, :480], ATOL_RESAMPLE)


@pytest.mark.parametrize("name", REFS)
def test_fbank(ref, name: str) -> None:
    wav16k = ref[f"{name}_wav16k"]
    feats = fbank(wav16k)
    assert feats.shape[1] == fbank_frames(wav16k.shape[1])
    _close(feats, ref[f"{name}_fbank"], ATOL_FBANK)


def test_fbank_rows_are_independent(ref) -> None:
    wav = ref["refer_wav16k"]
    both = fbank(torch.cat([wav, wav.flip(-1)], 0))
    _close(both[:1], ref["refer_fbank"], ATOL_FBANK)
    _close(both[1:], fbank(wav.flip(-1)), 1e-6)
    with pytest.raises(ValueError, match="too short"):
        fbank(wav[:, :10])


@pytest.mark.parametrize("name", REFS)
@torch.inference_mode()
def test_sv_embedding_from_stored_fbank(sv_model, ref, name: str) -> None:
    emb = sv_model(ref[f"{name}_fbank"])
    assert emb.shape[1] == sv_model.out_dim
    _close(emb, ref[f"{name}_sv_emb"], ATOL_SV)
    _close(sv_model.feature_map(ref[f"{name}_fbank"]), ref[f"{name}_sv_fuse34"], ATOL_SV)


@torch.inference_mode()
def test_sv_intermediates(sv_model, ref) -> None:
    """The README's hooks on the second reference: bn1 (before the stem ReLU), layer1..4, layer3_ds, fuse34."""
    x = ref["refer2_fbank"].transpose(1, 2).unsqueeze(1)  # [1, 1, 80, T]
    bn1 = sv_model.bn1(sv_model.conv1(x))
    _close(bn1, ref["refer2_sv_bn1"], ATOL_SV)
    out1 = sv_model.layer1(torch.relu(bn1))
    out2 = sv_model.layer2(out1)
    out3 = sv_model.layer3(out2)
    out4 = sv_model.layer4(out3)
    ds = sv_model.layer3_ds(out3)
    for name, got in (("layer1", out1), ("layer2", out2), ("layer3", out3), ("layer4", out4), ("layer3_ds", ds)):
        _close(got, ref[f"refer2_sv_{name}"], ATOL_SV)
    _close(sv_model.fuse34(out4, ds), ref["refer2_sv_fuse34"], ATOL_SV)


@pytest.mark.parametrize("name", REFS)
def test_sv_embedding_end_to_end(sv_model, ref, name: str) -> None:
    """32 kHz reference -> resample -> filter banks -> ERes2NetV2, all ours."""
    emb = SpeakerEncoder(sv_model).embed(ref[f"{name}_wav"][0].numpy())
    _close(emb, ref[f"{name}_sv_emb"], ATOL_SV)


# ------------------------------------------------------------------------- SoVITS with the stored SV features
@torch.inference_mode()
def test_style_fusion(model, io, ref) -> None:
    spec = ref["refer_spec"]
    _close(model.ref_enc(spec[:, : model.cfg.style_bins]), io["ge_refenc"], ATOL_SOVITS)
    _close(model.sv_emb(ref["refer_sv_emb"]), io["sv_proj"], ATOL_SOVITS)
    ge = model.ref_style(spec, ref["refer_sv_emb"])
    _close(ge, io["ge"], ATOL_SOVITS)
    _close(model.text_style(io["ge"]).transpose(1, 2), io["ge512"], ATOL_SOVITS)
    assert model.cfg.sv_dim == ref["refer_sv_emb"].shape[1]
    with pytest.raises(ValueError, match="needs the reference's speaker-verification features"):
        model.ref_style(spec)
    with pytest.raises(ValueError, match="width"):
        model.ref_style(spec, ref["refer_sv_emb"][:, :-1])


@torch.inference_mode()
def test_text_encoder_outputs(model, io) -> None:
    codes, text = _inputs(io)
    seen: list[torch.Tensor] = []
    hook = model.enc_p.mrte.register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        x, m_p, logs_p = model.encode_prior(codes, text, io["ge"])
    finally:
        hook.remove()
    _close(seen[0], io["mrte_out"], ATOL_SOVITS)
    _close(x, io["enc_p_x"], ATOL_SOVITS)
    _close(m_p, io["m_p"], ATOL_SOVITS)
    _close(logs_p, io["logs_p"], ATOL_SOVITS)
    assert io["y_mask"].shape[-1] == m_p.shape[-1] and bool((io["y_mask"] == 1).all())


@torch.inference_mode()
def test_flow(model, io) -> None:
    _close(model.flow_reverse(io["m_p"], io["ge"]), io["z"], ATOL_SOVITS)


@torch.inference_mode()
def test_wav_noise_free(model, io, ref) -> None:
    codes, text = _inputs(io)
    ge = model.ref_style(ref["refer_spec"], ref["refer_sv_emb"])
    wav = model.decode(codes, text, ge, noise_scale=0.0)
    assert wav.shape[-1] == codes.shape[-1] * 2 * model.cfg.hop
    _close(wav, io["wav_ns0"], ATOL_SOVITS)


@torch.inference_mode()
def test_wav_with_stored_noise(model, io) -> None:
    codes, text = _inputs(io)
    _close(model.decode(codes, text, io["ge"], noise_scale=0.5, eps=io["eps"]), io["wav_ns05_eps"], ATOL_SOVITS)


@torch.inference_mode()
def test_speed(model, io) -> None:
    codes, text = _inputs(io)
    _, m_p, _ = model.encode_prior(codes, text, io["ge"], speed=1.25)
    assert m_p.shape[-1] == int(io["m_p"].shape[-1] / 1.25) + 1
    _close(m_p, io["m_p_speed125"], ATOL_SOVITS)
    _close(model.decode(codes, text, io["ge"], speed=1.25, noise_scale=0.0), io["wav_ns0_speed125"], ATOL_SOVITS)


@torch.inference_mode()
def test_two_references(model, io, ref) -> None:
    """Each reference is fused with its own SV features, then the fused styles are averaged."""
    codes, text = _inputs(io)
    ge2 = model.ref_style(ref["refer2_spec"], ref["refer2_sv_emb"])
    _close(ge2, io["ge_refer2"], ATOL_SOVITS)
    ge = mean_style([model.ref_style(ref["refer_spec"], ref["refer_sv_emb"]), ge2])
    _close(ge, io["ge_tworefs"], ATOL_SOVITS)
    _close(model.text_style(ge).transpose(1, 2), io["ge512_tworefs"], ATOL_SOVITS)
    _close(model.decode(codes, text, ge, noise_scale=0.0), io["wav_ns0_tworefs"], ATOL_SOVITS)


@torch.inference_mode()
def test_codes(model, io) -> None:
    _close(model.dequantize(io["codes"].long()), io["codes_dequantized"], ATOL_SOVITS)
    codes = model.extract_latent(io["ssl_feature"])
    assert codes.dtype == torch.int64
    assert torch.equal(codes, io["ssl_codes"].long())


# ---------------------------------------------------------------- end to end from the 32 kHz reference clips
@torch.inference_mode()
def test_end_to_end_from_reference_audio(model, sv_model, io, ref) -> None:
    """Spectrogram + SV features computed here from ``refer_wav`` (and ``refer2_wav``), then the SoVITS."""
    codes, text = _inputs(io)
    encoder = SpeakerEncoder(sv_model)
    ges = []
    for name in REFS:
        wav = ref[f"{name}_wav"][0].numpy()
        ges.append(model.ref_style(reference_spec_input(wav), encoder.embed(wav)))
    _close(ges[0], io["ge"], ATOL_SOVITS)
    _close(ges[1], io["ge_refer2"], ATOL_SOVITS)
    _close(model.decode(codes, text, ges[0], noise_scale=0.0), io["wav_ns0"], ATOL_SOVITS)
    _close(model.decode(codes, text, mean_style(ges), noise_scale=0.0), io["wav_ns0_tworefs"], ATOL_SOVITS)


@torch.inference_mode()
def test_sv_features_really_enter(model, io, ref) -> None:
    """Another speaker's SV features change the waveform well beyond the tolerance (the fusion is not a no-op)."""
    codes, text = _inputs(io)
    ge_other = model.ref_style(ref["refer_spec"], ref["refer2_sv_emb"])
    wav = model.decode(codes, text, ge_other, noise_scale=0.0)
    assert float((wav - io["wav_ns0"]).abs().max()) > 10 * ATOL_SOVITS


@torch.inference_mode()
def test_bf16_runs_and_stays_close(golden_v2pro_dir: Path, meta: dict, version: str, io, ref) -> None:
    """Half precision is for GPUs; bf16 also runs on CPU, which checks the dtype plumbing of the fusion here."""
    path = golden_v2pro_dir / meta["sovits"][version]["file"]
    model = SoVITSDecoder.from_checkpoint(load_sovits_checkpoint(path), dtype=torch.bfloat16)
    ge = model.ref_style(ref["refer_spec"], ref["refer_sv_emb"])  # fp32 SV features into a bf16 model
    assert ge.dtype == torch.bfloat16
    codes, text = _inputs(io)
    wav = model.decode(codes, text, ge, noise_scale=0.0).float()
    assert wav.shape == io["wav_ns0"].shape
    corr = float(torch.corrcoef(torch.stack([wav.flatten(), io["wav_ns0"].flatten()]))[0, 1])
    assert corr > 0.95, corr
