"""Voices on a v2Pro/v2ProPlus model set (the tiny set with the golden v2Pro SoVITS and SV model): a voice keeps its
speaker-verification features in its prompt file and speaks through ``Synthesizer.stream``; a voice made under
another model set is re-encoded from its stored clip when it is next used, never mixed; ``backend: auto`` runs v2Pro
on the onnx engine on a CPU, which speaks a voice the torch engine made (same files, same voice)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from bot.services import build_synthesizer
from synthesis.types import SynthesisParams
from synthesis.voices import PROMPT_FILE, VoiceError
from tests.audio_samples import speech_like_wav

SEEDED = SynthesisParams(language="en", seed=1234, noise_scale=0.5)
CONSENT = {"user_id": 1, "text": "this is my own voice"}
SENTENCE = "The weather is nice today."


@pytest.fixture(scope="module")
def v2pro_meta(golden_v2pro_dir: Path) -> dict:
    return json.loads((golden_v2pro_dir / "meta.json").read_text())


@pytest.fixture(params=("v2Pro", "v2ProPlus"))
def version(request: pytest.FixtureRequest, v2pro_meta: dict) -> str:
    if request.param not in v2pro_meta["versions"]:
        pytest.skip(f"this golden set has no {request.param} data")
    return str(request.param)


@pytest.fixture
def pro_config(tiny_config, golden_v2pro_dir: Path, v2pro_meta: dict, version: str):
    """The tiny model set with its SoVITS replaced by the golden v2Pro/v2ProPlus one (and the golden SV model);
    the same data folders as ``tiny_config``, so voices made under one set are seen by the other."""
    models = dataclasses.replace(tiny_config.models, sovits=golden_v2pro_dir / v2pro_meta["sovits"][version]["file"],
                                 sv=golden_v2pro_dir / v2pro_meta["sv"]["file"])
    return dataclasses.replace(tiny_config, models=models)


def _sv_dim(v2pro_meta: dict, version: str) -> int:
    return int(v2pro_meta["sovits"][version]["v2pro_key_shapes"]["sv_emb.weight"][1])


async def _create(synth, name: str = "alice"):
    voice, _ = await synth.voicing.create(name, speech_like_wav(), f"{name}.wav", transcript="Hello, this is my voice.",
                                        language="en", consent=CONSENT)
    return voice


async def _speak(synth, voice) -> np.ndarray:
    chunks = [c async for c in synth.stream(SENTENCE, voice, SEEDED)]
    audio = np.concatenate([c.audio for c in chunks])  # [N] float32 @ 32 kHz
    assert audio.dtype == np.float32 and chunks[0].sample_rate == 32000
    assert np.all(np.isfinite(audio))
    speech = audio[: -int(0.3 * 32000)]  # without the fragment interval after the sentence
    assert speech.size >= 1280 and float(np.sqrt(np.mean(speech.astype(np.float64) ** 2))) > 1e-3  # not silent
    return audio


def _stored_arrays(synth, voice_id: str) -> dict[str, np.ndarray]:
    with np.load(synth.voices.root / voice_id / PROMPT_FILE) as z:
        return {k: z[k] for k in z.files}


async def test_a_v2pro_voice_keeps_its_sv_features_and_speaks(pro_config, v2pro_meta, version):
    synth = build_synthesizer(pro_config)
    try:
        assert synth.engine.name == "torch"
        voice = await _create(synth)
        stored = _stored_arrays(synth, voice.id)
        assert stored["sv_emb"].shape == (1, _sv_dim(v2pro_meta, version)) and stored["sv_emb"].dtype == np.float32
        assert np.all(np.isfinite(stored["sv_emb"])) and np.abs(stored["sv_emb"]).max() > 0
        loaded = synth.voices.get(voice.id)
        assert loaded.model_id == synth.engine.model_id
        np.testing.assert_array_equal(loaded.prompt.sv_emb, stored["sv_emb"])
        # the style in the file is the one fused with those features (as the engine computes it from the clip)
        clip = synth.voices.load_clip(voice.id)
        _, ge = synth.engine.encode_reference(None, [clip], sv_emb=stored["sv_emb"])
        np.testing.assert_allclose(stored["ge"], ge, atol=1e-4)
        await _speak(synth, voice)
    finally:
        await synth.close()


async def test_a_v2_voice_is_reencoded_for_v2pro_and_back(tiny_config, pro_config, v2pro_meta, version):
    v2 = build_synthesizer(tiny_config)
    try:
        voice = await _create(v2)
        assert "sv_emb" not in _stored_arrays(v2, voice.id) and voice.prompt.sv_emb is None
        v2_id, v2_ge = v2.engine.model_id, voice.prompt.ge
    finally:
        await v2.close()

    pro = build_synthesizer(pro_config)
    try:
        assert pro.engine.model_id != v2_id
        await _speak(pro, voice.name)  # by name: loaded from the store, made by the v2 model
        assert pro.counters["voice_reencoded"] == 1
        now = pro.voices.get(voice.id)
        assert (now.version, now.model_id) == (2, pro.engine.model_id)
        assert now.prompt.sv_emb is not None and now.prompt.sv_emb.shape == (1, _sv_dim(v2pro_meta, version))
        assert _stored_arrays(pro, voice.id)["sv_emb"].shape == now.prompt.sv_emb.shape
        np.testing.assert_array_equal(now.prompt.prompt_phones, voice.prompt.prompt_phones)  # same transcript
        await _speak(pro, voice)  # the stale v2 Voice object: the stored v2Pro version is used, no second encode
        assert pro.counters["voice_reencoded"] == 1
        pro_voice = now
    finally:
        await pro.close()

    back = build_synthesizer(tiny_config)
    try:
        await _speak(back, pro_voice)
        assert back.counters["voice_reencoded"] == 1
        again = back.voices.get(voice.id)
        assert (again.version, again.model_id, again.prompt.sv_emb) == (3, v2_id, None)
        assert "sv_emb" not in _stored_arrays(back, voice.id)
        np.testing.assert_allclose(again.prompt.ge, v2_ge, atol=1e-4)  # the same clip, the same v2 style
    finally:
        await back.close()


async def test_a_voice_without_its_clip_is_refused_with_the_fix(tiny_config, pro_config):
    v2 = build_synthesizer(tiny_config)
    try:
        voice = await _create(v2, "bob")
    finally:
        await v2.close()
    (Path(tiny_config.voices.dir) / voice.id / "clip.flac").unlink()
    pro = build_synthesizer(pro_config)
    try:
        with pytest.raises(VoiceError, match="create the voice again"):
            [c async for c in pro.stream(SENTENCE, voice.id, SEEDED)]
        assert pro.voices.get(voice.id).version == 1  # nothing was stored
    finally:
        await pro.close()


async def test_auto_runs_v2pro_on_onnx_and_speaks_a_voice_the_torch_engine_made(pro_config, v2pro_meta, version):
    pytest.importorskip("onnxruntime")
    made = build_synthesizer(pro_config)  # the tiny set's torch engine
    try:
        assert made.engine.name == "torch"
        voice = await _create(made)
        clip = made.voices.load_clip(voice.id)  # [N] float32 @ 32 kHz, as stored
        sv_torch = made.engine.encode_speaker([clip])
        _, ge_torch = made.engine.encode_reference(None, [clip], sv_emb=sv_torch)
    finally:
        await made.close()
    auto = dataclasses.replace(pro_config.engine, backend="auto", device="cpu", precision="auto")
    synth = build_synthesizer(dataclasses.replace(pro_config, engine=auto))
    try:
        assert synth.engine.name == "onnx" and synth.engine.model_id == voice.model_id  # same files, same voice
        await _speak(synth, voice.name)
        assert synth.counters["voice_reencoded"] == 0
        # the onnx engine encodes the stored clip as the torch engine does (torch SV model, ref_style graph)
        sv = synth.engine.encode_speaker([clip])
        assert sv is not None and sv.shape == (1, _sv_dim(v2pro_meta, version))
        np.testing.assert_allclose(sv, sv_torch, atol=1e-3)  # golden-v2pro README: sv_emb
        _, ge = synth.engine.encode_reference(None, [clip], sv_emb=sv)
        np.testing.assert_allclose(ge, ge_torch, atol=1e-4)  # golden-v2pro README: ge
    finally:
        await synth.close()
