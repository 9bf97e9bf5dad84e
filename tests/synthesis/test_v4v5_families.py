"""v5dev (classifier-free guidance) and v3 (24 kHz, BigVGAN) through the product on tiny sets from ``models make-tiny
--family``: a voice made for them speaks audio at the family's rate equal to the engine's own decode for the
sentence's seed; v5dev's guidance changes the sample, and each guidance its own cache entry."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bot.services import build_synthesizer
from synthesis import SynthesisParams
from synthesis.audio import fade_edges
from synthesis.stages import sentence_seed
from synthesis.text import text_to_phonemes
from tests.synthesis.test_v4v5_product import SENTENCE, _create, _family_config

RATES = {"v5dev": 48000, "v3": 24000}  # Hz, each family's output


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("dit-sets")


async def _say(synth, voice, params: SynthesisParams) -> np.ndarray:
    chunks = [c async for c in synth.stream(SENTENCE, voice, params)]
    assert {c.sample_rate for c in chunks} == {synth.sample_rate} and {c.index for c in chunks} == {0}
    return np.concatenate([c.audio for c in chunks])


@pytest.mark.parametrize("family", list(RATES))
async def test_say_speaks_the_familys_rate_equal_to_the_engines_decode(sets, tmp_path, family):
    synth = build_synthesizer(_family_config(sets / family, tmp_path / "data", family))
    try:
        engine, rate = synth.engine, RATES[family]
        assert (engine.family, engine.sample_rate, synth.sample_rate) == (family, rate, rate)
        voice = await _create(synth)
        assert voice.prompt.family == family and voice.prompt.ref_mel is not None
        assert voice.prompt.ref_mel.shape[0] == 100
        params = SynthesisParams(language="en", seed=42, fragment_interval=0.0)
        audio = await _say(synth, voice, params)
        rms = float(np.sqrt(np.mean(audio.astype(np.float64) ** 2)))
        assert audio.size >= rate // 4 and np.all(np.isfinite(audio)) and rms > 0.01  # heard, not silence
        ph = text_to_phonemes(SENTENCE, "en")
        tokens = await synth.stages.cache.get_tokens(synth.stages.prosody_key(voice, ph, params))
        assert tokens is not None
        seed = sentence_seed(params.seed, ph.norm_text)
        direct = await synth.worker.call(lambda: engine.decode(tokens, ph.ids, voice.prompt, seed=seed))
        np.testing.assert_allclose(audio, fade_edges(direct, sample_rate=rate), atol=1e-5)
        # the audio is the tokens' length at the family's rate: 40 ms a token (v3's mel frames do not divide it:
        # within one vocoder hop)
        assert abs(audio.size - tokens.size * rate // 25) <= (256 if family == "v3" else 0)
    finally:
        await synth.close()


async def test_v5dev_guidance_changes_the_sample(sets, tmp_path):
    synth = build_synthesizer(_family_config(sets / "v5dev", tmp_path / "data", "v5dev"))
    try:
        voice = await _create(synth)
        base = SynthesisParams(language="en", seed=9, fragment_interval=0.0, steps=8)
        guided = await _say(synth, voice, base)  # the family's guidance, 1.3
        unguided = await _say(synth, voice, dataclasses.replace(base, cfg=0.0))
        assert guided.size == unguided.size and float(np.abs(guided - unguided).max()) > 1e-3
        assert synth.counters["audio_hit"] == 0  # the second request did not take the first one's audio
        again = await _say(synth, voice, dataclasses.replace(base, cfg=0.0))
        assert synth.counters["audio_hit"] == 1
        np.testing.assert_array_equal(again, unguided)
    finally:
        await synth.close()
