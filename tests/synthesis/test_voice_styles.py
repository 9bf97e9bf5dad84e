"""Several references per voice: extra clips whose ``ge`` is averaged with the main clip's (upstream's
``aux_ref_audio_paths``), the same fusion across voices per request, and named styles (a reference of its own each),
on the tiny model set: each checked against the engine's own multi-reference encode, the stored files, the cache
keys, and a re-encode for another model (the golden v2Pro set: each clip fused with its own SV features)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from bot.services import build_synthesizer
from synthesis.types import AudioInputError, SynthesisParams, VoiceNotFound
from synthesis.voices import PROMPT_FILE, VoiceError, VoiceStore
from tests.audio_samples import speech_like_wav
from tests.synthesis.test_voices import create, db_bytes, make_prompt, make_reference

SEEDED = SynthesisParams(language="en", seed=1234, noise_scale=0.5)
CONSENT = {"user_id": 1, "text": "this is my own voice"}
SENTENCE = "The weather is nice today."
GE_ATOL = 1e-5  # the mean of clips encoded one by one vs the engine's one call over them (float32 sums)


async def _make(synth, name: str, f0: float = 140.0, seed: int = 0):
    voice, _ = await synth.voicing.create(name, speech_like_wav(f0=f0, seed=seed), f"{name}.wav",
                                          transcript="Hello, this is my voice.", language="en", consent=CONSENT)
    return voice


async def _speak(synth, voice, params: SynthesisParams = SEEDED) -> np.ndarray:
    chunks = [c async for c in synth.stream(SENTENCE, voice, params)]
    return np.concatenate([c.audio for c in chunks])  # [N] float32 @ 32 kHz


async def test_extra_clips_average_the_style_as_the_engine_does(synth, voice):
    extra = speech_like_wav(f0=210.0, seed=7)
    more, warnings = await synth.voicing.add_clips(voice, [(extra, "second.wav")], consent=CONSENT)
    assert isinstance(warnings, list)
    assert more.version == voice.version + 1
    clips = synth.voices.load_clips(voice.id)
    assert len(clips) == 2 and clips[1].dtype == np.float32 and clips[1].size > 3 * 32000
    assert (synth.voices.root / voice.id / "extra-1.flac").is_file()
    # the engine's own two-reference encode gives the voice's ge; each row is that clip's alone
    _, both = synth.engine.encode_reference(None, clips)
    np.testing.assert_allclose(more.prompt.ge, both, rtol=0, atol=GE_ATOL)
    assert more.clip_ges is not None and more.clip_ges.shape == (2, *voice.prompt.ge.shape)
    np.testing.assert_array_equal(more.clip_ges[0], voice.prompt.ge)
    _, second = synth.engine.encode_reference(None, [clips[1]])
    np.testing.assert_allclose(more.clip_ges[1], second, rtol=0, atol=GE_ATOL)
    assert np.abs(more.prompt.ge - voice.prompt.ge).max() > 1e-3  # the timbre changed
    # the prompt tokens and transcript stay the main clip's (aux references change timbre only)
    np.testing.assert_array_equal(more.prompt.prompt_tokens, voice.prompt.prompt_tokens)
    assert more.prompt_text == voice.prompt_text
    assert json.loads(json.dumps(synth.voices.meta(voice.id)["reference"]))["extras"][0]["duration_s"] > 3
    # stored: a new store reads the same arrays back
    again = VoiceStore(synth.voices.root).get(voice.id)
    np.testing.assert_array_equal(again.clip_ges, more.clip_ges)
    removed = await synth.voicing.delete(voice.id)
    assert "extra-1.flac" in removed.files and not (synth.voices.root / voice.id).exists()


async def test_a_bad_extra_clip_is_refused_and_nothing_changes(synth, voice):
    with pytest.raises(AudioInputError):
        await synth.voicing.add_clips(voice, [(speech_like_wav(), "a.wav"), (b"not audio at all", "b.wav")],
                                      consent=CONSENT)
    assert synth.voices.get(voice.id).version == voice.version
    assert not (synth.voices.root / voice.id / "extra-1.flac").exists()


async def test_aux_voices_fuse_every_clip_of_each_once_and_key_the_audio(synth, voice):
    bob = await _make(synth, "bob", f0=200.0, seed=3)
    bob, _ = await synth.voicing.add_clips(bob, [(speech_like_wav(f0=230.0, seed=4), "b2.wav")], consent=CONSENT)
    params = dataclasses.replace(SEEDED, aux_voices=(bob.id,))
    fused = await synth.voicing.speaking(voice, params)
    # upstream's mean over all three clips (alice's one, bob's two), the engine's three-reference encode
    clips = [*synth.voices.load_clips(voice.id), *synth.voices.load_clips(bob.id)]
    _, three = synth.engine.encode_reference(None, clips)
    np.testing.assert_allclose(fused.prompt.ge, three, rtol=0, atol=GE_ATOL)
    np.testing.assert_array_equal(fused.prompt.prompt_tokens, voice.prompt.prompt_tokens)
    assert fused.timbre == f"{voice.id}@{voice.version},{bob.id}@{bob.version}"
    assert (await synth.voicing.speaking(voice, params)).prompt.ge is fused.prompt.ge  # computed once
    # the prosody key is the voice's (the GPT does not read ge); the audio key is not, and it is not kept
    plain = await _speak(synth, voice)
    mixed = await _speak(synth, voice, params)
    assert synth.counters["prosody_hit"] >= 1 and synth.counters["audio_hit"] == 0
    assert plain.size == mixed.size and np.abs(plain - mixed).max() > 1e-3
    mixed_again = await _speak(synth, voice, params)
    assert synth.counters["audio_hit"] == 0  # never served from the cache
    np.testing.assert_allclose(mixed_again, mixed, atol=1e-5)
    assert not np.allclose(await _speak(synth, voice), mixed, atol=1e-3)  # the plain voice's audio is its own


async def test_a_style_is_its_own_prompt_chosen_per_request_and_deleted_with_the_voice(synth, voice):
    calm, _ = await synth.voicing.add_style(voice, "Calm", speech_like_wav(f0=110.0, seed=9), "calm.wav",
                                           consent=CONSENT, transcript="I am very calm today.", language="en")
    assert calm.version == voice.version + 1 and list(calm.styles) == ["calm"]
    style = calm.styles["calm"]
    assert (style.name, style.prompt_text) == ("Calm", "I am very calm today.")
    clip = synth.voices.load_style_clip(voice.id, "CALM")
    tokens, ge = synth.engine.encode_reference(None, [clip])
    np.testing.assert_allclose(style.prompt.ge, ge, rtol=0, atol=GE_ATOL)
    assert style.prompt.prompt_tokens.size > 0 and style.prompt.prompt_phones.size > 0
    assert not np.array_equal(style.prompt.prompt_phones, calm.prompt.prompt_phones)
    np.testing.assert_array_equal(calm.prompt.ge, voice.prompt.ge)  # the main clip is untouched

    params = dataclasses.replace(SEEDED, style="calm")
    spoken = await synth.voicing.speaking(calm, params)
    assert spoken.style == "calm" and spoken.prompt is style.prompt and spoken.id == voice.id
    with pytest.raises(VoiceNotFound, match="Calm"):
        await synth.voicing.speaking(calm, dataclasses.replace(SEEDED, style="excited"))
    main = await _speak(synth, calm)
    styled = await _speak(synth, calm, params)
    assert synth.counters["prosody_hit"] == 0  # its own prosody key: the main clip's tokens are not reused
    assert main.size != styled.size or np.abs(main - styled).max() > 1e-3
    await _speak(synth, calm, params)
    assert synth.counters["audio_hit"] == 1
    removed = await synth.voicing.delete(voice.id)
    assert removed.cache_entries >= 2 and any(f.startswith("style-") for f in removed.files)
    assert len(synth.cache.store._prosody) == 0 and len(synth.cache.store._audio) == 0


async def test_removing_a_style_and_its_limits(synth, voice):
    v, _ = await synth.voicing.add_style(voice, "excited", speech_like_wav(f0=240.0, seed=5), "e.wav",
                                         consent=CONSENT, transcript="Wow, this is great!", language="en")
    folder = synth.voices.root / voice.id
    assert len(list(folder.glob("style-*.flac"))) == 1
    v = await synth.voicing.remove_style(v, "Excited")
    assert v.styles == {} and list(folder.glob("style-*.flac")) == []
    with np.load(folder / PROMPT_FILE) as z:
        assert not [k for k in z.files if k.startswith("style.")]
    with pytest.raises(VoiceNotFound, match="none yet"):
        await synth.voicing.remove_style(v, "excited")
    with pytest.raises(VoiceError, match="style name"):
        await synth.voicing.add_style(v, "no/slash", speech_like_wav(), "x.wav", consent=CONSENT)


def test_a_schema_1_database_gains_the_styles_column(tmp_path: Path):
    db = sqlite3.connect(tmp_path / "voices.sqlite3")
    db.executescript("""CREATE TABLE voices (id TEXT PRIMARY KEY, name TEXT NOT NULL, name_key TEXT NOT NULL,
        owner_id INTEGER NOT NULL, version INTEGER NOT NULL, language TEXT NOT NULL, prompt_text TEXT NOT NULL,
        enrollment_prompt TEXT, model_id TEXT NOT NULL, created TEXT NOT NULL, updated TEXT NOT NULL,
        consent TEXT NOT NULL, reference TEXT NOT NULL); PRAGMA user_version = 1;""")
    db.close()
    VoiceStore(tmp_path).close()
    db = sqlite3.connect(tmp_path / "voices.sqlite3")
    assert db.execute("PRAGMA user_version").fetchone()[0] == 2
    assert "styles" in [r[1] for r in db.execute("PRAGMA table_info(voices)")]
    db.close()


async def test_extra_clips_and_styles_are_reencoded_for_another_model(tiny_config, golden_v2pro_dir: Path):
    meta = json.loads((golden_v2pro_dir / "meta.json").read_text())
    version = "v2Pro" if "v2Pro" in meta["versions"] else meta["versions"][0]
    models = dataclasses.replace(tiny_config.models, sovits=golden_v2pro_dir / meta["sovits"][version]["file"],
                                 sv=golden_v2pro_dir / meta["sv"]["file"])
    v2 = build_synthesizer(tiny_config)
    try:
        voice = await _make(v2, "carol")
        voice, _ = await v2.voicing.add_clips(voice, [(speech_like_wav(f0=220.0, seed=8), "c2.wav")], consent=CONSENT)
        voice, _ = await v2.voicing.add_style(voice, "calm", speech_like_wav(f0=120.0, seed=2), "calm.wav",
                                              consent=CONSENT, transcript="I am calm.", language="en")
    finally:
        await v2.close()
    pro = build_synthesizer(dataclasses.replace(tiny_config, models=models))
    try:
        await _speak(pro, voice.name)
        assert pro.counters["voice_reencoded"] == 1
        now = pro.voices.get(voice.id)
        assert now.model_id == pro.engine.model_id and now.clip_ges is not None and now.clip_ges.shape[0] == 2
        clips = pro.voices.load_clips(voice.id)
        _, fused = pro.engine.encode_reference(None, clips)  # each clip fused with its own SV features, averaged
        np.testing.assert_allclose(now.prompt.ge, fused, rtol=0, atol=1e-4)
        style = now.styles["calm"]
        _, style_ge = pro.engine.encode_reference(None, [pro.voices.load_style_clip(voice.id, "calm")])
        np.testing.assert_allclose(style.prompt.ge, style_ge, rtol=0, atol=1e-4)
        assert style.prompt.sv_emb is not None and style.prompt_text == "I am calm."
        await _speak(pro, now, dataclasses.replace(SEEDED, style="calm"))
    finally:
        await pro.close()


def test_the_store_refuses_too_many_clips_or_ge_rows_that_do_not_match_and_keeps_the_voice(tmp_path: Path):
    store = VoiceStore(tmp_path)
    v = create(store)
    ge = np.stack([v.prompt.ge] * 10)  # [10, 512, 1]
    with pytest.raises(VoiceError, match="at most 8 extra clips, this would make 9"):
        store.add_clips(v.id, [make_reference(seed=i) for i in range(9)], v.prompt, ge, consent=CONSENT)
    with pytest.raises(VoiceError, match="2 clips need 2 ge rows"):
        store.add_clips(v.id, [make_reference(seed=1)], v.prompt, ge[:3], consent=CONSENT)
    assert store.get(v.id).version == 1 and sorted(p.name for p in (tmp_path / v.id).iterdir()) == [
        "clip.flac", "prompt.npz"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    # a new clip for the main reference with the extras kept needs every clip's ge again
    two = store.add_clips(v.id, [make_reference(seed=1)], v.prompt, ge[:2], consent=CONSENT)
    assert store.replace(two.id, make_prompt(5), model_id="model-b").clip_ges is None  # another model: one mean
    assert len(store.load_clips(v.id)) == 2  # the clips stay for the next re-encode


# ---- the consent given for each extra clip and style -------------------------------------------------------------

CLIP_CONSENT = {"user_id": 7, "statement": "my second clip, second.wav", "at": "2025-02-03T04:05:06+00:00",
                "guild_id": 99, "clip": "second.wav"}
STYLE_CONSENT = {"user_id": 7, "text": "my calm clip, calm.wav", "at": 1738555506, "style": "calm"}


async def test_each_clip_and_style_keeps_its_consent_across_a_restart_and_loses_it_with_the_style(synth, voice):
    root = synth.voices.root
    with_clip, _ = await synth.voicing.add_clips(voice, [(speech_like_wav(f0=210.0, seed=7), "second.wav")],
                                                 consent=CLIP_CONSENT)
    styled, _ = await synth.voicing.add_style(with_clip, "Calm", speech_like_wav(f0=110.0, seed=9), "calm.wav",
                                              consent=STYLE_CONSENT, transcript="I am calm.", language="en")
    synth.voices.close()
    meta = VoiceStore(root).meta(voice.id)  # another process, or the next start, reads the same records
    (extra,) = meta["reference"]["extras"]
    assert extra["consent"] == {"user_id": 7, "text": "my second clip, second.wav", "at": "2025-02-03T04:05:06+00:00",
                                "guild_id": 99, "clip": "second.wav"}
    assert meta["styles"]["calm"]["consent"] == {"user_id": 7, "text": "my calm clip, calm.wav",
                                                 "at": "2025-02-03T04:05:06+00:00", "style": "calm"}
    assert meta["consent"]["text"] == "this is my own voice"  # the voice's own is untouched
    assert b"my calm clip, calm.wav" in db_bytes(root)
    await synth.voicing.remove_style(styled, "calm")
    assert VoiceStore(root).meta(voice.id)["styles"] == {}
    assert b"my calm clip, calm.wav" not in db_bytes(root)  # not left in the database or its WAL either
    assert b"my second clip, second.wav" in db_bytes(root)
    await synth.voicing.delete(voice.id)
    assert b"my second clip, second.wav" not in db_bytes(root)


@pytest.mark.parametrize("consent", [{}, {"user_id": 7}, {"user_id": 7, "text": "  "}, {"text": "no one said"}])
async def test_a_clip_or_style_without_consent_is_refused_before_any_work(synth, voice, consent):
    with pytest.raises(VoiceError, match="needs the speaker's consent"):
        await synth.voicing.add_clips(voice, [(b"not even audio", "x.wav")], consent=consent)
    with pytest.raises(VoiceError, match="needs the speaker's consent"):
        await synth.voicing.add_style(voice, "calm", b"not even audio", "x.wav", consent=consent)
    with pytest.raises(VoiceError, match="needs the speaker's consent"):
        synth.voices.put_style(voice.id, "calm", make_reference(), voice.prompt, language="en", prompt_text="",
                               consent=consent)
    assert synth.voices.get(voice.id).version == voice.version


def test_a_style_stored_before_consent_was_kept_per_style_still_reads(tmp_path: Path):
    """A store written before each style had a consent record (the same schema: the record is part of the style's
    JSON) opens and reads; its old style has no record, a new one has its own."""
    store = VoiceStore(tmp_path)
    v = create(store)
    store.put_style(v.id, "calm", make_reference(seed=3), make_prompt(3), language="en", prompt_text="",
                    consent=STYLE_CONSENT)
    store.close()
    db = sqlite3.connect(tmp_path / "voices.sqlite3")
    (styles,) = db.execute("SELECT styles FROM voices WHERE id = ?", (v.id,)).fetchone()
    old = json.loads(styles)
    del old["calm"]["consent"]
    db.execute("UPDATE voices SET styles = ? WHERE id = ?", (json.dumps(old), v.id))
    db.commit()
    db.close()
    store = VoiceStore(tmp_path)
    assert "consent" not in store.meta(v.id)["styles"]["calm"] and list(store.get(v.id).styles) == ["calm"]
    store.put_style(v.id, "excited", make_reference(seed=4), make_prompt(4), language="en", prompt_text="",
                    consent=STYLE_CONSENT)
    assert store.meta(v.id)["styles"]["excited"]["consent"]["text"] == "my calm clip, calm.wav"
    store.close()


async def test_a_style_whose_transcript_was_dropped_is_said_to_be_the_style_that_is_reference_free(synth, voice):
    from tests.synthesis.test_voicing import WORDS, _padded, _wav

    styled, warnings = await synth.voicing.add_style(voice, "calm", _wav(_padded(25.0, 0.5, 0.5)), "calm.wav",
                                                     consent=STYLE_CONSENT, transcript=WORDS, language="en")
    assert styled.styles["calm"].prompt_text == "" and styled.prompt_text == voice.prompt_text
    line = warnings[0]
    assert line.startswith("the style 'calm' uses seconds ") and "the voice" not in line, line
    assert line.endswith(", so its transcript was not stored and the style 'calm' is reference-free; to keep a "
                         "transcript, send only the seconds you want, with the words said in them"), line
