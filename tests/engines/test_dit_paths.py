"""The diffusion decoder's paths (``DiffusionDecoder.load(path=...)``) against each other on the golden tiny models,
and the int8 proofs' logic.

* ``fp32`` (the fast path without int8: precomputed conditioning, fused q/k/v, batched CFG, the 48 kHz vocoder under
  ONNX Runtime) equals ``naive`` (upstream's eager forward every step, the vocoder in eager torch) within
  :data:`ATOL_MEL` per sampler call and :data:`ATOL_WAV` on the waveform, with upstream's noise, every family;
* ``fast`` (the default) runs int8 only with a proof on the loaded model, and its mel is then within the proof's bound
  of fp32's, with either GEMM library and attention in fp32 or bf16; a proof that fails keeps fp32 and says so in the
  log; a kept proof is reused without proving (each recipe its own); one about another file (changed since) is
  proven again.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from engines.gpt_sovits import dit_int8, vocoder_ort
from engines.gpt_sovits.cfm import MelPrompt, check_sampling, sample, synthesize_mel
from engines.gpt_sovits.diffusion import DiffusionDecoder
from engines.gpt_sovits.dit import DiT
from engines.gpt_sovits.dit_naive import NaiveDiT
from engines.gpt_sovits.family import family_spec
from engines.gpt_sovits.mel import norm_spec
from engines.gpt_sovits.tiny import _atomic  # pyright: ignore[reportPrivateUsage]
from engines.gpt_sovits.tiny_dit import write_dit_family
from tests.golden_v4v5 import GoldenV4V5

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ATOL_MEL = 2e-5  # fp32 vs naive per sampler call (measured <= 2e-6 at the released size, random weights)
ATOL_WAV = 1e-4  # fp32 (ONNX Runtime vocoder) vs naive (torch) waveform


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("proofs")  # shared: the v5 families' one vocoder file is quantised once


@pytest.fixture(scope="module")
def decoders(golden_v4v5: GoldenV4V5, family: str, cache: Path) -> dict[str, DiffusionDecoder]:
    g = golden_v4v5
    return {p: DiffusionDecoder.load(g.sovits_file(family), g.vocoder_path(family), path=p, cache_dir=cache)
            for p in ("naive", "fp32", "fast")}


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max())


def test_paths_run_what_they_say(decoders: dict[str, DiffusionDecoder]) -> None:
    assert isinstance(decoders["naive"].estimator, NaiveDiT)
    assert isinstance(decoders["naive"].vocoder, torch.nn.Module)
    assert isinstance(decoders["fp32"].estimator, DiT) and decoders["fp32"].precisions["dit"] == "fp32"
    fast = decoders["fast"]
    assert fast.precisions["dit"] in ("int8", "fp32")
    if fast.family.name != "v3":  # BigVGAN stays in torch
        assert isinstance(decoders["fp32"].vocoder, vocoder_ort.OrtVocoder)


@torch.inference_mode()
def test_fp32_path_equals_naive_per_sampler_call(golden_v4v5: GoldenV4V5, family: str,
                                                 decoders: dict[str, DiffusionDecoder]) -> None:
    """Every sampler call of the default run, upstream's inputs and noise (v5dev: with its guidance)."""
    io = golden_v4v5.io(family)
    for k, call in enumerate(golden_v4v5.run(family, "default")["cfm_call_args"]):
        args = (io[f"chunk{k}_mu"], io[f"chunk{k}_prompt"], call["n_timesteps"], decoders["fp32"].family,
                call["inference_cfg_rate"], io[f"chunk{k}_noise"])
        naive = sample(decoders["naive"].estimator, *args)
        fast = sample(decoders["fp32"].estimator, *args)
        assert float(naive.abs().max()) > 0.1  # a real mel, not zeros on both sides
        assert _max_err(fast, naive) < ATOL_MEL


@torch.inference_mode()
def test_fp32_path_equals_naive_end_to_end(golden_v4v5: GoldenV4V5, family: str,
                                           decoders: dict[str, DiffusionDecoder]) -> None:
    """Reference clip -> voice -> chunked mel -> waveform, with upstream's noise per chunk."""
    ref, io = golden_v4v5.ref, golden_v4v5.io(family)

    def noise(k: int, frames: int) -> torch.Tensor:
        return io[f"chunk{k}_noise"]

    wavs = {}
    for p in ("naive", "fp32"):
        d = decoders[p]
        voice = d.prompt(ref["raw_wav"], int(ref["raw_sr"]), ref["ref_codes"], ref["ref_phones"])
        wavs[p] = d.decode(ref["tgt_codes"], ref["tgt_phones"], voice, noise=noise)
    assert _max_err(wavs["fp32"], wavs["naive"]) < ATOL_WAV


@torch.inference_mode()
def test_fast_path_is_within_its_proof(golden_v4v5: GoldenV4V5, family: str,
                                       decoders: dict[str, DiffusionDecoder]) -> None:
    """The default path's sampled mel against fp32's: the proof's bound where int8 runs, identical where it does not."""
    io = golden_v4v5.io(family)
    spec = family_spec(family)
    mel = golden_v4v5.ref_log_mel(spec.mel_rate)
    prompt = MelPrompt.from_reference(io["fea_ref"], norm_spec(mel), spec)
    steps, cfg = check_sampling(spec, None, None)
    gen = [torch.Generator().manual_seed(5) for _ in range(2)]
    fp32 = synthesize_mel(decoders["fp32"].estimator, prompt, io["fea_todo"], spec, steps, cfg, generator=gen[0])
    fast = synthesize_mel(decoders["fast"].estimator, prompt, io["fea_todo"], spec, steps, cfg, generator=gen[1])
    if decoders["fast"].precisions["dit"] == "int8":
        assert dit_int8.mel_snr_db(fp32, fast) >= dit_int8.MIN_SNR_DB - 6  # other inputs than the proof's own
        assert _max_err(fast, fp32) > 0  # int8 really ran
    else:
        assert _max_err(fast, fp32) == 0


@torch.inference_mode()
def test_onednn_products_and_bf16_attention_are_within_the_proof(golden_v4v5: GoldenV4V5, family: str,
                                                                 decoders: dict[str, DiffusionDecoder]) -> None:
    """The recipe the engine plan picks on a CPU with AMX (oneDNN's int8 products, attention in bf16), on any CPU:
    another kernel really runs (its velocity is not fbgemm's), and its mel is within the proof's bound of fp32's."""
    if "onednn" not in torch.backends.quantized.supported_engines:
        pytest.skip("this torch has no oneDNN quantized engine")
    fp32 = decoders["fp32"].sovits.dit
    amx = dit_int8.int8_dit(fp32, "onednn", "bf16")
    assert amx.block(0).attn.compute_dtype == torch.bfloat16 and fp32.block(0).attn.compute_dtype is None
    io = golden_v4v5.io(family)
    spec = family_spec(family)
    prompt = MelPrompt.from_reference(io["fea_ref"], norm_spec(golden_v4v5.ref_log_mel(spec.mel_rate)), spec)
    steps, cfg = check_sampling(spec, None, None)
    mels = {name: synthesize_mel(est, prompt, io["fea_todo"], spec, steps, cfg,
                                 generator=torch.Generator().manual_seed(5))
            for name, est in (("fp32", fp32), ("fbgemm", dit_int8.int8_dit(fp32)), ("amx", amx))}
    assert _max_err(mels["amx"], mels["fbgemm"]) > 0
    assert dit_int8.mel_snr_db(mels["fp32"], mels["amx"]) >= dit_int8.MIN_SNR_DB - 6


def test_unknown_path_is_one_line(golden_v4v5: GoldenV4V5) -> None:
    with pytest.raises(ValueError, match="unknown decoder path 'quick'; use one of fast, fp32, naive"):
        DiffusionDecoder.load(golden_v4v5.sovits_file("v4"), golden_v4v5.vocoder_path("v4"), path="quick")


# ---------------------------------------------------------------------------------------- the proofs' logic
@pytest.fixture()
def model_files(tmp_path: Path) -> dict[str, Path]:
    return write_dit_family(tmp_path / "models", "v5turbo", "tiny", seed=11, atomic=_atomic)


def _counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """Count the calls of ``module.name`` (still calling it)."""
    calls: list[int] = []
    real = getattr(module, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_dit_proof_kept_reused_and_redone_when_stale(model_files: dict[str, Path], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch, dit_int8, "prove_int8_dit")
    cache = tmp_path / "cache"
    load = lambda: DiffusionDecoder.load(model_files["sovits"], model_files["vocoder"], cache_dir=cache)  # noqa: E731
    first = load()
    assert first.precisions["dit"] == "int8" and len(calls) == 1
    (record,) = cache.glob("dit-int8-*.json")
    assert load().precisions["dit"] == "int8" and len(calls) == 1  # kept: not proven again
    st = model_files["sovits"].stat()
    os.utime(model_files["sovits"], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the file changed since
    assert load().precisions["dit"] == "int8" and len(calls) == 2
    assert len(list(cache.glob("dit-int8-*.json"))) == 2 and record.is_file()


def test_each_int8_gemm_and_attention_has_its_own_kept_verdict(model_files: dict[str, Path], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch, dit_int8, "prove_int8_dit")
    cache = tmp_path / "cache"
    recipes = [("fbgemm", "fp32"), ("onednn", "fp32"), ("onednn", "bf16")]
    for _ in range(2):
        for gemm, attention in recipes:
            d = DiffusionDecoder.load(model_files["sovits"], model_files["vocoder"], cache_dir=cache, int8_gemm=gemm,
                                      attention=attention)
            assert d.precisions["dit"] == "int8"
        assert len(calls) == len(recipes)  # the second round reuses each recipe's own verdict
    assert len(list(cache.glob("dit-int8-*.json"))) == len(recipes)


def test_dit_proof_that_fails_keeps_fp32_and_logs(model_files: dict[str, Path], tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    d = DiffusionDecoder.load(model_files["sovits"], model_files["vocoder"], path="fp32")
    with caplog.at_level(logging.WARNING, logger="engines.gpt_sovits.dit_int8"):
        est, precision = dit_int8.choose_estimator(d.sovits, [model_files["sovits"]], tmp_path, min_snr_db=200.0)
    assert precision == "fp32" and est is d.sovits.dit
    assert "the fp32 DiT runs" in caplog.text and "needs 200 dB" in caplog.text
    # the kept measurement says the same the next time, without proving
    est, precision = dit_int8.choose_estimator(d.sovits, [model_files["sovits"]], tmp_path)
    assert precision == "int8"


def test_vocoder_proof_kept_reused_failing_and_stale(model_files: dict[str, Path], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    calls = _counting(monkeypatch, vocoder_ort, "_make_int8")
    torch_vocoder = DiffusionDecoder.load(model_files["sovits"], model_files["vocoder"], path="naive").vocoder
    assert isinstance(torch_vocoder, torch.nn.Module)
    cache = tmp_path / "cache"
    make = lambda bound: vocoder_ort.OrtVocoder.from_module(  # noqa: E731
        torch_vocoder, int8=True, cache_dir=cache, source=model_files["vocoder"], min_snr_db=bound)
    assert make(vocoder_ort.MIN_SNR_DB).precision == "int8" and len(calls) == 1
    assert make(vocoder_ort.MIN_SNR_DB).precision == "int8" and len(calls) == 1  # kept graph and verdict reused
    with caplog.at_level(logging.WARNING, logger="engines.gpt_sovits.vocoder_ort"):
        assert make(200.0).precision == "fp32" and len(calls) == 1
    assert "the fp32 vocoder runs" in caplog.text
    st = model_files["vocoder"].stat()
    os.utime(model_files["vocoder"], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert make(vocoder_ort.MIN_SNR_DB).precision == "int8" and len(calls) == 2
    mel = torch.randn(1, 100, 20) - 4
    with torch.inference_mode():
        ref = torch_vocoder(mel)
    got = make(vocoder_ort.MIN_SNR_DB)(mel)
    assert got.shape == ref.shape and vocoder_ort.audio_snr_db(ref.numpy(), got.numpy()) >= vocoder_ort.MIN_SNR_DB - 6


def test_no_cache_folder_proves_the_dit_and_keeps_the_fp32_vocoder(model_files: dict[str, Path],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch, dit_int8, "prove_int8_dit")
    d = DiffusionDecoder.load(model_files["sovits"], model_files["vocoder"])
    assert d.precisions == {"dit": "int8", "vocoder": "fp32"} and len(calls) == 1


def test_v3_bigvgan_runs_under_onnx_runtime_in_fp32_its_graph_kept(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """v3's BigVGAN is exported (its anti-aliasing filters grouped per channel as constants), runs the same samples as
    torch's to float rounding, stays fp32 (no int8 attempt), and its graph is kept so a restart does not trace it."""
    files = write_dit_family(tmp_path / "models", "v3", "tiny", seed=3, atomic=_atomic)
    traced = _counting(monkeypatch, vocoder_ort, "export_graph")
    quantised = _counting(monkeypatch, vocoder_ort, "_make_int8")
    cache = tmp_path / "cache"
    fast = DiffusionDecoder.load(files["sovits"], files["vocoder"], path="fast", cache_dir=cache)
    assert isinstance(fast.vocoder, vocoder_ort.OrtVocoder) and fast.precisions["vocoder"] == "fp32"
    assert len(traced) == 1 and not quantised and len(list(cache.glob("vocoder-fp32-*.onnx"))) == 1
    DiffusionDecoder.load(files["sovits"], files["vocoder"], path="fast", cache_dir=cache)
    assert len(traced) == 1  # the kept graph
    naive = DiffusionDecoder.load(files["sovits"], files["vocoder"], path="naive")
    mel = torch.randn(1, 100, 40) - 4
    with torch.inference_mode():
        ref, got = naive.vocoder(mel), fast.vocoder(mel)
    assert got.shape == ref.shape and float((got - ref).abs().max()) <= ATOL_WAV
