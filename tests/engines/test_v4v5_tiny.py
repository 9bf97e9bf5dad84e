"""The random model sets of the diffusion families (``write_model_set(family=...)``'s SoVITS and vocoder): written
in upstream's layout and formats, loaded by the real loaders, decoded end to end into audible, unclipped audio at
the family's rate; and the bad requests a voice can make, refused with one line."""

from __future__ import annotations

import math
import numpy as np
import pytest
import torch

from engines.gpt_sovits.diffusion import DiffusionDecoder, DiffusionPrompt
from engines.gpt_sovits.tiny import _atomic  # pyright: ignore[reportPrivateUsage]
from engines.gpt_sovits.tiny_dit import DIT_LAYOUT, write_dit_family

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REF_RATE = 44100  # Hz, a reference clip as a user uploads it
REF_SECONDS = 3.0
N_TOKENS = 40  # target semantic tokens (1.6 s)
N_PHONES = 12


@pytest.fixture(scope="module", params=("v4", "v5turbo", "v5dev", "v3"))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def decoder(family: str, tmp_path_factory: pytest.TempPathFactory) -> DiffusionDecoder:
    root = tmp_path_factory.mktemp(f"tiny-{family}")
    paths = write_dit_family(root, family, "tiny", seed=3, atomic=_atomic)
    sovits_rel, vocoder_rel, tag = DIT_LAYOUT[family]
    assert paths["sovits"] == root / sovits_rel and paths["vocoder"] == root / vocoder_rel
    assert paths["sovits"].read_bytes()[:2] == (tag or b"PK")
    return DiffusionDecoder.load(paths["sovits"], paths["vocoder"])


def _clip(seconds: float = REF_SECONDS, rate: int = REF_RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(0)
    return (0.3 * np.sin(2 * math.pi * 180 * t * (1 + 0.3 * t)) + 0.02 * rng.standard_normal(t.size)).astype(np.float32)


def _tokens(seed: int, n: int, high: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, high, n)).long()


@pytest.fixture(scope="module")
def voice(decoder: DiffusionDecoder) -> DiffusionPrompt:
    ref_codes = _tokens(1, int(REF_SECONDS * 25), 1024).view(1, 1, -1)
    with torch.inference_mode():
        return decoder.prompt(_clip(), REF_RATE, ref_codes, _tokens(2, N_PHONES, 732).view(1, -1) + 1)


@torch.inference_mode()
def test_family_set_decodes_to_audible_audio(family: str, decoder: DiffusionDecoder, voice: DiffusionPrompt) -> None:
    spec = decoder.family
    assert decoder.family.name == family
    codes, phones = _tokens(3, N_TOKENS, 1024).view(1, 1, -1), _tokens(4, N_PHONES, 732).view(1, -1) + 1
    wav = decoder.decode(codes, phones, voice, generator=torch.Generator().manual_seed(7))
    frames = math.floor(2 * N_TOKENS * spec.feature_scale)  # 50 Hz encoder frames up-sampled to the mel rate
    assert wav.shape == (frames * spec.vocoder_hop,)
    assert decoder.sample_rate == spec.vocoder_rate
    rms = float(wav.pow(2).mean().sqrt())
    assert bool(torch.isfinite(wav).all()) and 0.02 < rms < 0.6, rms
    assert float((wav.abs() > 0.99).float().mean()) < 0.05  # not clipped
    again = decoder.decode(codes, phones, voice, generator=torch.Generator().manual_seed(7))
    assert torch.equal(wav, again)
    other = decoder.decode(codes, phones, voice, generator=torch.Generator().manual_seed(8))
    assert float((wav - other).abs().max()) > 1e-3


@torch.inference_mode()
def test_prompt_is_cut_to_the_family_length(decoder: DiffusionDecoder, voice: DiffusionPrompt) -> None:
    spec = decoder.family
    mel_frames = int(REF_SECONDS * spec.mel_rate) // spec.mel_hop
    assert voice.prompt.frames == min(mel_frames, spec.prompt_frames)
    assert voice.prompt.mel.shape[-1] == voice.prompt.features.shape[-1] == voice.prompt.frames


@torch.inference_mode()
def test_bad_requests_are_refused_in_one_line(family: str, decoder: DiffusionDecoder, voice: DiffusionPrompt) -> None:
    codes = _tokens(1, 10, 1024).view(1, 1, -1)
    phones = _tokens(2, 4, 732).view(1, -1) + 1
    with pytest.raises(ValueError, match="needs the reference's transcript"):
        decoder.prompt(_clip(), REF_RATE, codes, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="too short"):
        decoder.prompt(_clip(0.01), REF_RATE, codes, phones)
    if decoder.family.is_v5:
        with pytest.raises(ValueError, match=r"samples in 4, 8, 16, 32 steps, not 5"):
            decoder.decode(codes, phones, voice, steps=5)
        with pytest.raises(ValueError, match="between 0 and 2"):
            decoder.decode(codes, phones, voice, cfg=float("nan"))
    else:
        with pytest.raises(ValueError, match="at least 1"):
            decoder.decode(codes, phones, voice, steps=0)

