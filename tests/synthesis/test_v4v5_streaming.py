"""A diffusion family's sentence speaks its sampler's chunks as they are made: a long sentence on a tiny v4/v5turbo
model comes as one chunk per sampler piece, and the chunks joined are the engine's own decode for the sentence's
seed, faded, with its pause."""

from __future__ import annotations

import numpy as np
import pytest

from bot.services import build_synthesizer
from synthesis import SynthesisParams
from synthesis.audio import FADE_S, fade_edges
from synthesis.stages import sentence_seed
from synthesis.text import text_to_phonemes
from tests.synthesis.test_v4v5_product import RATE, _create, _family_config

LONG = "This sentence goes on for a good while so that its audio needs more than one chunk of the sampler."
TOKENS = 400  # semantic tokens: 16 s of audio, 1600 mel frames, at least two sampler chunks of at most 1000 frames
PAUSE_S = 0.25  # fragment_interval of these requests


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("dit-sets")


@pytest.fixture(params=("v4", "v5turbo"))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _long_tokens(synth, voice, params) -> tuple[np.ndarray, np.ndarray, int]:
    """Put a long token sequence into the prosody cache for ``LONG`` (the tiny GPT's own length is up to chance):
    (tokens, phones, the sentence's seed)."""
    ph = text_to_phonemes(LONG, "en")
    tokens = (np.arange(TOKENS, dtype=np.int64) * 7) % 64
    synth.cache.store.put_tokens(synth.stages.prosody_key(voice, ph, params), tokens, voice.id)  # (before any lookup)
    return tokens, ph.ids, sentence_seed(params.seed, ph.norm_text)


async def test_a_long_sentence_speaks_each_sampler_chunk_as_it_comes(sets, tmp_path, family):
    synth = build_synthesizer(_family_config(sets / family, tmp_path / "data", family))
    try:
        voice = await _create(synth)
        params = SynthesisParams(language="en", seed=77, fragment_interval=PAUSE_S)
        tokens, phones, seed = _long_tokens(synth, voice, params)
        engine = synth.engine
        pieces = await synth.worker.call(lambda: list(engine.decode_stream(tokens, phones, voice.prompt, seed=seed)))
        direct = await synth.worker.call(lambda: engine.decode(tokens, phones, voice.prompt, seed=seed))
        assert len(pieces) >= 2 and sum(p.size for p in pieces) == direct.size == TOKENS * 4 * 480

        chunks = [c async for c in synth.stream(LONG, voice, params)]
        assert synth.counters["prosody_hit"] == 1  # the tokens above were spoken, not the GPT's
        assert {c.sample_rate for c in chunks} == {RATE} and {c.index for c in chunks} == {0}
        # one chunk per sampler piece, each out once decoded (the sentence's last 5 ms wait for its fade-out), then
        # that fade-out with the pause
        fade, pause = round(FADE_S * RATE), round(PAUSE_S * RATE)
        sizes = [p.size for p in pieces]
        assert [c.audio.size for c in chunks] == [sizes[0] - fade, *sizes[1:], fade + pause]
        assert [c.timings.get("partial", 0.0) for c in chunks] == [1.0] * len(pieces) + [0.0]
        joined = np.concatenate([c.audio for c in chunks])
        expected = np.concatenate([fade_edges(direct, sample_rate=RATE), np.zeros(pause, np.float32)])
        np.testing.assert_allclose(joined, expected, atol=1e-5)
        assert float(np.sqrt(np.mean(chunks[0].audio.astype(np.float64) ** 2))) > 0.01  # the first piece is heard

        # the whole sentence was cached: the same request again is one chunk of the same samples
        again = [c async for c in synth.stream(LONG, voice, params)]
        assert len(again) == 1 and synth.counters["audio_hit"] == 1
        np.testing.assert_allclose(again[0].audio, joined, atol=1e-6)
    finally:
        await synth.close()


async def test_closing_a_stream_between_pieces_stops_the_sentence(sets, tmp_path):
    synth = build_synthesizer(_family_config(sets / "v5turbo", tmp_path / "data", "v5turbo"))
    try:
        voice = await _create(synth)
        params = SynthesisParams(language="en", seed=5, fragment_interval=0.0)
        _long_tokens(synth, voice, params)
        stream = synth.stream(LONG, voice, params)
        first = await anext(stream)
        assert first.timings["partial"] == 1.0
        await stream.aclose()
        assert synth.admission.in_flight == 0 and synth.counters["completed"] == 0
        # the worker goes on: the next request is spoken whole (a short one, one piece)
        chunks = [c async for c in synth.stream("Hello there.", voice, params)]
        assert chunks and all(c.sample_rate == RATE for c in chunks) and synth.counters["completed"] == 1
    finally:
        await synth.close()
