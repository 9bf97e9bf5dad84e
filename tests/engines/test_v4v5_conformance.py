"""v4/v5turbo/v5dev/v3 vs upstream's own outputs on the golden tiny models (fp32, CPU), stage by stage: the mel
front-end, the encoder (``decode_encp``), one DiT velocity, each sampler call with upstream's noise, the chunking,
the sampled mel with the default steps and with fewer, the vocoder, then end to end from the raw reference clip.

Tolerances are the golden README's suggestions (front-end, encoder and DiT 1e-4; sampled mels and waveforms 1e-3,
since each chunk's output feeds the next prompt); each is checked to sit well above the set's own fp32-vs-fp64
error, so a set made the same way at other sizes is held to the same standard. Every family, file, step count,
guidance rate and length comes from the set's ``meta.json`` and arrays."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engines.gpt_sovits import cfm
from engines.gpt_sovits.cfm import MelPrompt, check_sampling, sample, synthesize_mel
from engines.gpt_sovits.diffusion import DiffusionDecoder
from engines.gpt_sovits.family import family_spec
from engines.gpt_sovits.mel import denorm_spec, log_mel, norm_spec, resample
from tests.golden_v4v5 import GoldenV4V5

pytestmark = [pytest.mark.conformance, pytest.mark.usefixtures("one_torch_thread")]

ATOL_FRONT_END = 1e-4  # README: front-end atol 1e-4 (fp32 vs fp64: resample 8.9e-8, log-mel 7.2e-6)
ATOL_ENCODER = 1e-4  # README: decode_encp / DiT 1e-4 (fp64: fea_ref <= 1.8e-6, one DiT call <= 5.1e-6)
ATOL_MEL = 1e-3  # README: sampled mel 1e-3 (fp64: one CFM chunk <= 2.9e-6)
ATOL_WAV = 1e-3  # README: waveforms 1e-3 (fp64: vocoder <= 1.1e-5)
MARGIN = 10  # each tolerance is at least this many times the set's own fp32-vs-fp64 error


def _close(a: torch.Tensor, ref: torch.Tensor, atol: float) -> None:
    assert tuple(a.shape) == tuple(ref.shape), (tuple(a.shape), tuple(ref.shape))
    err = float((a.float() - ref.float()).abs().max())
    assert err < atol, f"max abs error {err:.3g} (atol {atol:g})"


@pytest.fixture(scope="module")
def decoder(golden_v4v5: GoldenV4V5, family: str) -> DiffusionDecoder:
    return DiffusionDecoder.load(golden_v4v5.sovits_file(family), golden_v4v5.vocoder_path(family), path="fp32")


@pytest.fixture(scope="module")
def io(golden_v4v5: GoldenV4V5, family: str) -> dict[str, torch.Tensor]:
    return golden_v4v5.io(family)


def _chunks(io: dict[str, torch.Tensor]) -> int:
    return sum(1 for k in io if k.startswith("chunk") and k.endswith("_noise"))


def _noise(io: dict[str, torch.Tensor]) -> cfm.NoiseSource:
    """Upstream's draws, chunk by chunk (a chunk of another length than recorded fails the test)."""

    def draw(k: int, frames: int) -> torch.Tensor:
        eps = io[f"chunk{k}_noise"]
        assert eps.shape[-1] == frames, f"chunk {k}: {frames} frames sampled, upstream sampled {eps.shape[-1]}"
        return eps

    return draw


def test_tolerances_cover_the_sets_precision(golden_v4v5: GoldenV4V5, family: str) -> None:
    f64 = golden_v4v5.fp64(family)
    assert MARGIN * f64["fea_ref_max_abs_diff"] < ATOL_ENCODER
    assert MARGIN * f64["dit_v_max_abs_diff"] < ATOL_ENCODER
    assert MARGIN * f64["cfm_chunk0_max_abs_diff"] < ATOL_MEL
    assert MARGIN * f64["vocoder_wav_max_abs_diff"] < ATOL_WAV
    assert MARGIN * golden_v4v5.ref_fp64["mel32k_log_max_abs_diff"] < ATOL_FRONT_END


def test_family_and_defaults_match_upstream(golden_v4v5: GoldenV4V5, family: str, decoder: DiffusionDecoder) -> None:
    meta = golden_v4v5.sovits_meta(family)
    assert decoder.family.name == family
    assert check_sampling(decoder.family, None, None) == tuple(meta["sampling_defaults"])
    assert decoder.family.step_embedding == meta["has_d_embed"]
    assert decoder.sample_rate == golden_v4v5.meta["vocoders"][golden_v4v5.vocoder_key(family)]["vocoder_configs"]["sr"]


@torch.inference_mode()
def test_reference_mel_front_end(golden_v4v5: GoldenV4V5, family: str) -> None:
    ref = golden_v4v5.ref
    spec = family_spec(family)
    key = f"wav{spec.mel_rate // 1000}k"
    wav = resample(ref["raw_wav"], int(ref["raw_sr"]), spec.mel_rate)
    _close(wav, ref[key], ATOL_FRONT_END)
    mel = log_mel(ref[key], spec.mel_rate, spec.mel_fft, spec.mel_hop)
    _close(mel, golden_v4v5.ref_log_mel(spec.mel_rate), ATOL_FRONT_END)


@torch.inference_mode()
def test_encoder_outputs(golden_v4v5: GoldenV4V5, decoder: DiffusionDecoder, io: dict[str, torch.Tensor]) -> None:
    ref, sovits = golden_v4v5.ref, decoder.sovits
    ge = sovits.ref_style(ref["refer_spec"])
    _close(ge, io["ge"], ATOL_ENCODER)
    enc_p_x, fea_ref = sovits.encode(ref["ref_codes"], ref["ref_phones"], io["ge"])
    _close(enc_p_x, io["ref_enc_p_x"], ATOL_ENCODER)
    _close(fea_ref, io["fea_ref"], ATOL_ENCODER)
    _close(sovits.features(ref["tgt_codes"], ref["tgt_phones"], io["ge"]), io["fea_todo"], ATOL_ENCODER)
    # speed 1.25: the encoder output is interpolated, and the frames past int(k N / speed) + 1 are masked
    _close(sovits.features(ref["tgt_codes"], ref["tgt_phones"], io["ge"], 1.25), io["fea_todo_speed125"], ATOL_ENCODER)


@torch.inference_mode()
def test_one_dit_velocity(decoder: DiffusionDecoder, io: dict[str, torch.Tensor], family: str) -> None:
    dit = decoder.sovits.dit
    d = io.get("dit_d")
    args = (io["dit_x"], io["dit_cond"], io["dit_x_lens"], io["dit_t"], d, io["dit_mu"])
    _close(dit(*args), io["dit_v"], ATOL_ENCODER)
    v5 = family_spec(family).is_v5
    _close(dit(*args, drop_audio_cond=True, drop_text=not v5), io["dit_v_neg"], ATOL_ENCODER)
    # the intermediates upstream's forward hooks recorded
    _close(dit.time_embed(io["dit_t"]), io["dit_hook_time_embed"], ATOL_ENCODER)
    if d is not None:
        assert dit.d_embed is not None
        _close(dit.d_embed(d), io["dit_hook_d_embed"], ATOL_ENCODER)
    _close(dit.text_embed(io["dit_mu"].transpose(1, 2)), io["dit_hook_text_embed"], ATOL_ENCODER)
    if "dit_v_static_cache" in io:  # v5: upstream's cached path, which is what the sampler here does
        _close(dit(*args), io["dit_v_static_cache"], ATOL_ENCODER)
        _close(dit(*args, drop_audio_cond=True), io["dit_v_neg_static_cache"], ATOL_ENCODER)


@torch.inference_mode()
def test_each_sampler_call(golden_v4v5: GoldenV4V5, family: str, decoder: DiffusionDecoder,
                           io: dict[str, torch.Tensor]) -> None:
    run = golden_v4v5.run(family, "default")
    for k, call in enumerate(run["cfm_call_args"]):
        out = sample(decoder.sovits.dit, io[f"chunk{k}_mu"], io[f"chunk{k}_prompt"], call["n_timesteps"],
                     decoder.family, call["inference_cfg_rate"], io[f"chunk{k}_noise"])
        _close(out, io[f"chunk{k}_cfm_out"], ATOL_MEL)
        assert float(out[..., : io[f"chunk{k}_prompt"].shape[-1]].abs().max()) == 0.0  # prompt frames held at 0


@torch.inference_mode()
def test_chunking_of_a_long_target(golden_v4v5: GoldenV4V5, family: str, decoder: DiffusionDecoder,
                                   io: dict[str, torch.Tensor], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every chunk's features and prompt, given upstream's outputs for the chunks before it."""
    run = golden_v4v5.run(family, "default")
    assert _chunks(io) == run["n_chunks"] >= 2
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def replay(dit: Any, mu: torch.Tensor, prompt: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append((mu, prompt))
        return io[f"chunk{len(seen) - 1}_cfm_out"]

    monkeypatch.setattr(cfm, "sample", replay)
    mel = _ref_mel(golden_v4v5, family)
    prompt = MelPrompt.from_reference(io["fea_ref"], mel, decoder.family)
    steps, rate = check_sampling(decoder.family, None, None)
    synthesize_mel(decoder.sovits.dit, prompt, io["fea_todo"], decoder.family, steps, rate)
    assert [int(mu.shape[1]) for mu, _ in seen] == run["chunk_mu_frames"]
    assert [int(p.shape[-1]) for _, p in seen] == run["chunk_prompt_frames"]
    for k, (mu, p) in enumerate(seen):
        _close(mu, io[f"chunk{k}_mu"], ATOL_ENCODER)
        _close(p, io[f"chunk{k}_prompt"], ATOL_ENCODER)


def _ref_mel(golden_v4v5: GoldenV4V5, family: str) -> torch.Tensor:
    """The stored reference log-mel of the family's rate, normalised."""
    return norm_spec(golden_v4v5.ref_log_mel(family_spec(family).mel_rate))


@torch.inference_mode()
def test_sampled_mel_with_fewer_steps(golden_v4v5: GoldenV4V5, family: str, decoder: DiffusionDecoder,
                                      io: dict[str, torch.Tensor]) -> None:
    run = golden_v4v5.run(family, "few")
    prompt = MelPrompt.from_reference(io["fea_ref"], _ref_mel(golden_v4v5, family), decoder.family)
    mel = synthesize_mel(decoder.sovits.dit, prompt, io["fea_todo"], decoder.family, run["steps"], run["cfg"],
                         _noise(io))
    _close(mel, io["few_mel"], ATOL_MEL)


@torch.inference_mode()
def test_vocoder(decoder: DiffusionDecoder, io: dict[str, torch.Tensor]) -> None:
    _close(decoder.vocoder(io["voc_mel_in"]), io["voc_wav"], ATOL_WAV)
    _close(decoder.vocode(io["default_mel"]), io["default_wav"], ATOL_WAV)


@torch.inference_mode()
def test_end_to_end_from_the_raw_reference(golden_v4v5: GoldenV4V5, family: str, decoder: DiffusionDecoder,
                                           io: dict[str, torch.Tensor]) -> None:
    """Raw 44.1 kHz clip + tokens + phones -> waveform, default steps and guidance, upstream's noise."""
    ref = golden_v4v5.ref
    run = golden_v4v5.run(family, "default")
    voice = decoder.prompt(ref["raw_wav"], int(ref["raw_sr"]), ref["ref_codes"], ref["ref_phones"])
    assert voice.prompt.frames == golden_v4v5.sovits_meta(family)["prompt_frames"]
    mel = decoder.mel(ref["tgt_codes"], ref["tgt_phones"], voice, noise=_noise(io))
    assert check_sampling(decoder.family, None, None) == (run["steps"], run["cfg"])
    _close(mel, io["default_mel"], ATOL_MEL)
    wav = decoder.vocode(mel)
    assert wav.shape[-1] == run["wav_samples"]
    _close(wav, io["default_wav"], ATOL_WAV)


@torch.inference_mode()
def test_streamed_pieces_join_to_the_whole_waveform(golden_v4v5: GoldenV4V5, family: str, decoder: DiffusionDecoder,
                                                    io: dict[str, torch.Tensor]) -> None:
    """One piece per sampler chunk, the first before the second chunk is sampled; joined, upstream's waveform."""
    ref = golden_v4v5.ref
    voice = decoder.prompt(ref["raw_wav"], int(ref["raw_sr"]), ref["ref_codes"], ref["ref_phones"])
    pieces = list(decoder.stream(ref["tgt_codes"], ref["tgt_phones"], voice, noise=_noise(io)))
    assert len(pieces) == golden_v4v5.run(family, "default")["n_chunks"]
    _close(torch.cat(pieces), io["default_wav"], ATOL_WAV)
