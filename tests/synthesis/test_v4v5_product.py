"""The diffusion families (v4, v5turbo) through the product, on tiny model sets written by ``models make-tiny
--family``: a voice made for them keeps its mel prompt, speaks 48 kHz audio equal to the engine's own decode for the
same seed, is re-encoded when the family changes; the caches tell families and sampler options apart; bad input is
refused in one line before any speech."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from bot.services import build_synthesizer
from engines import SpeechError
from engines.base import ModelFormatError
from synthesis import SynthesisParams
from synthesis.audio import fade_edges
from synthesis.cache import SynthesisCache
from synthesis.stages import sentence_seed
from synthesis.text import text_to_phonemes
from synthesis.voices import PROMPT_FILE, VoiceError
from tests.audio_samples import speech_like_wav

CONSENT = {"user_id": 1, "text": "this is my own voice"}
SENTENCE = "How are you today?"
RATE = 48000  # Hz, v4 and v5 output


def _family_config(root: Path, data: Path, family: str):
    from bot.__main__ import main
    from bot.config import load_config

    if not (root / "config.yaml").exists():
        assert main(["models", "make-tiny", str(root), "--family", family]) == 0
    cfg = load_config(root / "config.yaml")
    return dataclasses.replace(
        cfg,
        voices=dataclasses.replace(cfg.voices, dir=data / "voices"),
        cache=dataclasses.replace(cfg.cache, dir=data / "cache"),
        discord=dataclasses.replace(cfg.discord, database=data / "voicebot.sqlite3"),
    )


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dit-sets")


@pytest.fixture(params=("v4", "v5turbo"))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _config(sets: Path, tmp_path: Path, family: str):
    return _family_config(sets / family, tmp_path / "data", family)


async def _create(synth, transcript: str | None = "Hello, this is my voice.", seconds: float = 4.0):
    voice, _ = await synth.voicing.create("alice", speech_like_wav(seconds), "alice.wav", transcript=transcript,
                                          language="en", consent=CONSENT)
    return voice


async def test_say_speaks_48k_audio_equal_to_the_engines_decode(sets, tmp_path, family):
    synth = build_synthesizer(_config(sets, tmp_path, family))
    try:
        engine = synth.engine
        assert (engine.family, engine.sample_rate, synth.sample_rate) == (family, RATE, RATE)
        voice = await _create(synth)
        assert voice.prompt.family == family and voice.prompt.ref_mel is not None
        assert voice.prompt.ref_mel.shape[0] == 100 and voice.prompt.ref_mel.shape[1] > 300  # 4 s at 100 fps
        with np.load(synth.voices.root / voice.id / PROMPT_FILE) as z:  # stored with the prompt
            assert str(z["family"]) == family
            np.testing.assert_array_equal(z["ref_mel"], voice.prompt.ref_mel)
        params = SynthesisParams(language="en", seed=1234, fragment_interval=0.0)
        chunks = [c async for c in synth.stream(SENTENCE, voice, params)]
        assert {c.sample_rate for c in chunks} == {RATE} and {c.index for c in chunks} == {0}
        audio = np.concatenate([c.audio for c in chunks])  # (the sampler's pieces, then the fade-out)
        rms = float(np.sqrt(np.mean(audio.astype(np.float64) ** 2)))
        assert audio.size >= RATE // 4 and np.all(np.isfinite(audio)) and rms > 0.01  # heard, not silence
        # the same sentence through the engine directly: the tokens the pipeline cached, the sentence's seed
        ph = text_to_phonemes(SENTENCE, "en")
        key = synth.stages.prosody_key(voice, ph, params)
        tokens = await synth.stages.cache.get_tokens(key)
        assert tokens is not None and audio.size == tokens.size * 4 * 480  # 4 mel frames a token, 480 samples each
        seed = sentence_seed(params.seed, ph.norm_text)
        direct = await synth.worker.call(lambda: engine.decode(tokens, ph.ids, voice.prompt, 1.0, 0.5, seed))
        np.testing.assert_allclose(audio, fade_edges(direct, sample_rate=RATE), atol=1e-5)
        pieces = await synth.worker.call(lambda: list(engine.decode_stream(tokens, ph.ids, voice.prompt, seed=seed)))
        np.testing.assert_allclose(np.concatenate(pieces), direct, atol=1e-5)
    finally:
        await synth.close()


async def test_bad_voice_input_is_refused_in_one_line(sets, tmp_path, family):
    synth = build_synthesizer(_config(sets, tmp_path, family))
    try:
        with pytest.raises(VoiceError, match=rf"the loaded {family} model needs the clip's transcript \(prompt_text\)"
                           ) as e:
            await _create(synth, transcript=None)
        assert "\n" not in str(e.value)
        with pytest.raises(SpeechError) as e:  # the upload's own checks come first
            await _create(synth, seconds=0.5)
        assert "\n" not in str(e.value)
        # shorter than one frame of the family's mel prompt (what a stored clip gives at re-encoding)
        with pytest.raises(SpeechError, match=rf"too short \(0.03 s\) for a {family} voice's mel prompt") as e:
            synth.engine.reference_mel(np.zeros(1000, np.float32), 32000)
        assert "\n" not in str(e.value)
        # an engine handed a v2 voice (or a reference-free one) says so, in one line
        voice = await _create(synth)
        ph = text_to_phonemes(SENTENCE, "en")
        v2_prompt = dataclasses.replace(voice.prompt, family="v2", ref_mel=None)
        with pytest.raises(SpeechError, match=f"encoded for a v2 SoVITS, the loaded one is {family}"):
            synth.engine.decode(np.arange(10), ph.ids, v2_prompt)
    finally:
        await synth.close()


async def test_v5_steps_are_checked_before_any_speech(sets, tmp_path):
    synth = build_synthesizer(_config(sets, tmp_path, "v5turbo"))
    try:
        voice = await _create(synth)
        with pytest.raises(SpeechError, match=r"v5turbo samples in 4, 8, 16, 32 steps, not 5"):
            async for _ in synth.stream(SENTENCE, voice, SynthesisParams(language="en", seed=1, steps=5)):
                pass
        # 8 steps and some guidance: another sample, and its own cache entry
        base = SynthesisParams(language="en", seed=1, fragment_interval=0.0)
        four = [c async for c in synth.stream(SENTENCE, voice, base)][0].audio
        eight = [c async for c in synth.stream(SENTENCE, voice, dataclasses.replace(base, steps=8, cfg=0.5))][0].audio
        assert four.size == eight.size and float(np.abs(four - eight).max()) > 1e-3
    finally:
        await synth.close()


async def test_a_voice_is_reencoded_when_the_family_changes(sets, tmp_path):
    v4 = build_synthesizer(_config(sets, tmp_path, "v4"))
    try:
        voice = await _create(v4)
        v4_id = v4.engine.model_id
    finally:
        await v4.close()
    v5 = build_synthesizer(_config(sets, tmp_path, "v5turbo"))
    try:
        assert v5.engine.model_id != v4_id
        chunks = [c async for c in v5.stream(SENTENCE, voice.name, SynthesisParams(language="en", seed=3))]
        assert chunks and chunks[0].sample_rate == RATE
        assert v5.counters["voice_reencoded"] == 1
        now = v5.voices.get(voice.id)
        assert (now.version, now.model_id, now.prompt.family) == (2, v5.engine.model_id, "v5turbo")
        np.testing.assert_array_equal(now.prompt.prompt_phones, voice.prompt.prompt_phones)  # same transcript
    finally:
        await v5.close()


async def test_a_v2_model_refuses_a_diffusion_voice_until_reencoded(sets, tmp_path, tiny_config):
    v4 = build_synthesizer(_config(sets, tmp_path, "v4"))
    try:
        voice = await _create(v4)
    finally:
        await v4.close()
    v2 = build_synthesizer(dataclasses.replace(tiny_config, voices=dataclasses.replace(
        tiny_config.voices, dir=tmp_path / "data" / "voices")))
    try:
        with pytest.raises(SpeechError, match="encoded for a v4 SoVITS, the loaded one is v2"):
            v2.engine.decode(np.arange(10), np.arange(1, 5), voice.prompt)
        chunks = [c async for c in v2.stream(SENTENCE, voice.name, SynthesisParams(language="en", seed=3))]
        assert chunks[0].sample_rate == 32000 and v2.counters["voice_reencoded"] == 1
        now = v2.voices.get(voice.id)
        assert now.prompt.family == "v2" and now.prompt.ref_mel is None
    finally:
        await v2.close()


def test_cache_keys_differ_per_family_and_sampler() -> None:
    sampling = {"top_k": 15, "seed": 1}
    prosody = {f: SynthesisCache.prosody_key("m", "v", 1, "hi", "en", sampling, family=f)
               for f in ("v2", "v4", "v5turbo")}
    assert prosody["v2"] == SynthesisCache.prosody_key("m", "v", 1, "hi", "en", sampling)  # v2 keys unchanged
    assert len(set(prosody.values())) == 3
    keys = {SynthesisCache.audio_key("p", 1.0, 0.5, 1, family=f, steps=s, cfg=c)
            for f, s, c in (("", None, None), ("v4", None, None), ("v5turbo", None, None), ("v5turbo", 8, None),
                            ("v5turbo", 8, 0.5))}
    assert len(keys) == 5
    assert SynthesisCache.audio_key("p", 1.0, 0.5, 1) == SynthesisCache.audio_key("p", 1.0, 0.5, 1, family="")


def test_a_family_mismatch_is_refused_at_load(sets, tmp_path) -> None:
    from engines import load_engine

    cfg = _config(sets, tmp_path, "v4")
    for family, words in (("v5turbo", "is a v4 SoVITS but models.family is v5turbo"),
                          ("v2", "is a v3/v4/v5 SoVITS but models.family is v2")):
        models = dataclasses.replace(cfg.models, family=family)
        with pytest.raises(ModelFormatError, match=words) as e:
            load_engine(cfg.engine, models)
        assert "\n" not in str(e.value)
    wrong_vocoder = dataclasses.replace(cfg.models, vocoder=cfg.models.sovits)  # the SoVITS file as the vocoder
    with pytest.raises(ModelFormatError, match="not the vocoder"):
        load_engine(cfg.engine, wrong_vocoder)
