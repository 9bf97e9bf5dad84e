"""The reference linear spectrogram: upstream golden data, frame count, loudness rule, a tone's peak bin."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engines.gpt_sovits.spectrogram import (
    N_BINS,
    linear_spectrogram,
    reference_spec_input,
    spectrogram_frames,
)

SR = 32000  # Hz


def _rel_err(a: torch.Tensor, b: np.ndarray) -> float:
    ref = torch.from_numpy(b)
    return float((a - ref).abs().max() / ref.abs().max())


@pytest.mark.conformance
def test_matches_upstream_spectrogram_torch(golden):
    g = golden.spectrogram_io
    spec = linear_spectrogram(g["wav"])
    assert spec.shape == (1, N_BINS, spectrogram_frames(g["wav"].shape[-1])) == g["spec"].shape
    assert spec.dtype == torch.float32
    assert _rel_err(spec, g["spec"]) < 1e-5


@pytest.mark.conformance
def test_reference_specs_of_the_sovits_data(golden):
    g = golden.sovits_io
    for wav, spec in (("refer_wav", "refer_spec"), ("refer2_wav", "refer2_spec")):
        assert _rel_err(reference_spec_input(g[wav]), g[spec]) < 1e-5


@pytest.mark.parametrize("n", [705, 1344, 1984, 32000, 64123])
def test_frame_count(n):
    spec = linear_spectrogram(torch.zeros(n))
    assert spec.shape == (1, N_BINS, spectrogram_frames(n))
    assert spectrogram_frames(n) == 1 + (n + 1408 - 2048) // 640
    # silence gives exactly sqrt(1e-8) in every bin
    assert torch.allclose(spec, torch.full_like(spec, 1e-4))


def test_tone_peaks_in_its_bin():
    t = np.arange(SR) / SR
    wav = (0.5 * np.sin(2 * np.pi * 1000.0 * t)).astype(np.float32)
    spec = linear_spectrogram(wav[None])
    inner = spec[0, :, 1:-1]  # the edge frames overlap the reflect padding
    assert torch.all(inner.argmax(dim=0) == 64)  # 1000 Hz / (32000 Hz / 2048) = 64
    # Hann window, amplitude 0.5: |X| = 0.5 * sum(w) / 2 = 0.5 * 1024 / 2
    assert float(inner[64].mean()) == pytest.approx(256.0, rel=1e-3)


def test_batch_rows_are_independent():
    rng = np.random.default_rng(0)
    wav = rng.uniform(-0.5, 0.5, (2, 8000)).astype(np.float32)
    both = linear_spectrogram(wav)
    assert torch.allclose(both[1:], linear_spectrogram(wav[1:]), atol=1e-5)


def test_loud_reference_is_scaled_down():
    rng = np.random.default_rng(1)
    x = rng.uniform(-0.8, 0.8, 16000).astype(np.float32)
    quiet = linear_spectrogram(x)
    # peak <= 1: used as is
    assert torch.equal(reference_spec_input(x), quiet)
    # peak 1.5: divided by 1.5, i.e. back to x
    loud = x * (1.5 / np.abs(x).max())
    assert torch.allclose(reference_spec_input(loud), linear_spectrogram(loud / 1.5), rtol=1e-5, atol=1e-6)
    # peak 6: divided by min(2, 6) = 2 only
    very = x * (6.0 / np.abs(x).max())
    assert torch.allclose(reference_spec_input(very), linear_spectrogram(very / 2.0), rtol=1e-5, atol=1e-6)


def test_too_short_is_refused():
    with pytest.raises(ValueError, match="too short"):
        linear_spectrogram(torch.zeros(1, 704))
    with pytest.raises(ValueError, match=r"\[B, N\]"):
        linear_spectrogram(torch.zeros(1, 1, 4000))
