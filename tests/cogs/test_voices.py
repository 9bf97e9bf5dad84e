"""/voice and /forget-me through discord.py's real command tree, with a recording REST edge."""

from __future__ import annotations

import asyncio
import io
import sys

import numpy as np
import pytest
import soundfile as sf

import cogs.voices
from synthesis.types import AudioInputError
from tests.cogs.conftest import ADMIN, ALICE, BOB, CLONER_ROLE, GUILD_ID

CONSENT = "This is my own voice, or I have the speaker's permission"
OGG = b"OggS" + bytes(range(256)) * 20


@pytest.fixture(autouse=True)
def fast_edits(harness, monkeypatch):
    # load_extension gives the cog a fresh module object: patch the one it runs in
    monkeypatch.setattr(sys.modules["cogs.voices"], "EDIT_INTERVAL_S", 0.0)


def last_reply(h, token: str) -> tuple[str, bool]:
    """The last content sent for an interaction and whether it was ephemeral."""
    call = [c for c in h.adapter.for_token(token) if c.payload and (c.payload.get("data") or c.payload).get("content")][-1]
    data = call.payload.get("data", call.payload) if "type" in call.payload else call.payload
    return data["content"], bool(data.get("flags", 0) & 64)


async def clone(h, user=ALICE, click=CONSENT, **options):
    clip = options.pop("clip", None) or h.attachment("me.ogg", OGG, "audio/ogg")
    token, task = h.start_slash("voice clone", user, clip=clip, **options)
    await h.wait_for(lambda: token in h.adapter.original or task.done())
    if click and not task.done():
        await h.click(token, click, user)
    await asyncio.wait_for(task, 3)
    return token, clip


async def settle_background(h):
    cog = h.bot.get_cog("VoiceCog")
    await asyncio.gather(*cog._background, return_exceptions=True)
    await asyncio.sleep(0.01)


async def test_clone_asks_consent_before_download_and_create(harness):
    h = harness
    clip = h.attachment("me.ogg", OGG, "audio/ogg")
    token, task = h.start_slash("voice clone", ALICE, clip=clip, transcript="hello there")
    await h.wait_for(lambda: token in h.adapter.original)
    text, ephemeral = last_reply(h, token)
    assert ephemeral and "I confirm this recording is my own voice" in text
    await asyncio.sleep(0.05)
    assert h.downloads == [] and h.services.synthesizer.created == []  # nothing until the click
    await h.click(token, CONSENT)
    await asyncio.wait_for(task, 3)
    assert h.downloads == [clip["url"]]
    (call,) = h.services.synthesizer.created
    assert call["data"] == OGG and call["owner_id"] == ALICE and call["transcript"] == "hello there"
    assert call["name"] == "Alice" and call["consent"]["user_id"] == ALICE
    assert call["consent"]["statement"] == cogs.voices.consent_statement(False)
    voice = h.services.synthesizer.voices.find("Alice")
    assert await h.services.store.voice_journal() == []  # the creation committed, in one step
    assert (await h.services.store.user_settings(ALICE))["voice"] == voice.id  # her first voice is her voice
    assert h.services.synthesizer.precomputed == [(voice.id, ("Hello!", "Good night."))]
    await settle_background(h)
    await h.wait_for(lambda: "Common phrases ready" in h.adapter.original_content(token))
    final = h.adapter.original_content(token)
    assert "**Alice** is ready as your voice. Hear it with `/voice preview Alice`." in final  # with its transcript
    assert "Note: the clip is a little quiet" in final and "To give it a transcript" not in final
    assert "Common phrases ready (2/2)." in final


async def test_clone_says_which_seconds_were_kept_and_how_to_keep_a_transcript(harness):
    """The clip had more speech than the seconds kept: the voice is made without the transcript, and the member is
    told which seconds it uses, why, and how to upload again with a transcript (one line each)."""
    h = harness
    kept = ("the voice uses seconds 3.2-13.1 of the 30.0 s clip, the most continuous part of its 25.3 s of speech "
            "(GPT-SoVITS takes 3-10 s), and leaves out 15.4 s of speech, so its transcript was not stored and the voice "
            "is reference-free; to keep a transcript, send only the seconds you want, with the words said in them")
    h.services.synthesizer.voicing.kept = kept
    token, _ = await clone(h, transcript="hello there, and a lot more")
    await settle_background(h)
    await h.wait_for(lambda: "Common phrases ready" in h.adapter.original_content(token))
    lines = h.adapter.original_content(token).splitlines()
    assert lines[0] == ("**Alice** is ready as your voice, without its transcript (see the first note). Hear it with "
                        "`/voice preview Alice`.")
    assert lines[1] == f"Note: {kept}" and lines[2] == "Note: the clip is a little quiet"
    assert lines[3] == ("To give it a transcript: trim your recording to the seconds it uses, remove this voice with "
                        "`/voice delete Alice`, and run `/voice clone` again with the words said in them as "
                        "`transcript`.")
    assert h.services.synthesizer.voices.find("Alice").prompt_text == ""
    token = await h.slash("voice list", ALICE)
    assert "• **Alice** (yours, no transcript)" in last_reply(h, token)[0]


async def test_cancel_and_strangers_download_nothing(harness):
    h = harness
    clip = h.attachment("me.ogg", OGG, "audio/ogg")
    token, task = h.start_slash("voice clone", ALICE, clip=clip)
    await h.wait_for(lambda: token in h.adapter.original)
    await h.click(token, CONSENT, user_id=BOB)  # someone else's click is refused
    await asyncio.sleep(0.05)
    assert not task.done() and h.downloads == []
    await h.click(token, "Cancel")
    await asyncio.wait_for(task, 3)
    assert h.adapter.original_content(token) == "Cancelled; nothing was downloaded."
    assert h.downloads == [] and h.services.synthesizer.created == []


async def test_oversized_attachment_refused_before_download(harness):
    h = harness  # the config's limit is 1 MB
    big = h.attachment("long.wav", None, "audio/wav", size=3 * 1024 * 1024)
    token, task = h.start_slash("voice clone", ALICE, clip=big)
    await asyncio.wait_for(task, 3)
    text, ephemeral = last_reply(h, token)
    assert ephemeral and "That file is 3.0 MB; the limit is 1 MB" in text
    assert h.downloads == [] and h.services.synthesizer.created == []


async def test_non_audio_attachment_refused(harness):
    h = harness
    token, task = h.start_slash("voice clone", ALICE, clip=h.attachment("cat.png", b"\x89PNG", "image/png"))
    await asyncio.wait_for(task, 3)
    text, ephemeral = last_reply(h, token)
    assert ephemeral and "`cat.png` (image/png) is not a recording" in text
    assert h.downloads == []


async def test_cloning_switch_and_role(harness):
    h = harness
    store = h.services.store
    await store.set_guild_setting(GUILD_ID, "cloning_enabled", False)
    token, _ = await clone(h, ALICE)
    text, ephemeral = last_reply(h, token)
    assert ephemeral and "cloning is turned off" in text and "/set guild cloning_enabled true" in text
    await store.set_guild_setting(GUILD_ID, "cloning_enabled", True)
    await store.set_guild_setting(GUILD_ID, "clone_role", CLONER_ROLE)
    token, _ = await clone(h, ALICE)
    text, _ = last_reply(h, token)
    assert f"needs the <@&{CLONER_ROLE}> role" in text
    await clone(h, BOB)  # Bob has the role
    assert [c["owner_id"] for c in h.services.synthesizer.created] == [BOB]


async def test_server_voice_needs_manage_server(harness):
    h = harness
    token, _ = await clone(h, ALICE, server=True)
    text, _ = last_reply(h, token)
    assert "Only members with Manage Server can add server voices" in text
    await clone(h, ADMIN, server=True, name="Narrator")
    voice = h.services.synthesizer.voices.find("Narrator")
    assert await h.services.store.guild_voices(GUILD_ID) == [voice.id]
    assert h.services.synthesizer.created[0]["consent"]["server_voice"] is True


async def test_enroll_sentence_becomes_the_prompt(harness):
    h = harness
    token = await h.slash("voice enroll", ALICE, language="en")
    text, ephemeral = last_reply(h, token)
    sentence = next(s for s in cogs.voices.ENROLL_SENTENCES["en"] if s in text)
    assert ephemeral
    await clone(h, ALICE)
    (call,) = h.services.synthesizer.created
    assert call["enrollment_prompt"] == sentence and call["language"] == "en" and call["transcript"] is None


async def test_bad_clip_is_explained(harness):
    h = harness
    h.services.synthesizer.voicing.fail_with = AudioInputError("the clip has only 1.2 s of speech; record 3-10 s")
    token, _ = await clone(h, ALICE)
    assert h.adapter.original_content(token) == "The clip has only 1.2 s of speech; record 3-10 s"
    assert h.services.synthesizer.voices.list() == []


async def test_voice_autocomplete_use_and_list(harness):
    h = harness
    voices, store = h.services.synthesizer.voices, h.services.store
    own = voices.add("alto", ALICE)
    server = voices.add("narrator", ADMIN)
    shared = voices.add("bobby", BOB)
    voices.add("secret", BOB)  # not shared: invisible to Alice
    await store.add_guild_voice(GUILD_ID, server.id, ADMIN)
    await store.share_voice(shared.id, GUILD_ID, BOB)
    choices = await h.autocomplete("voice use", "name", ALICE, name="")
    assert choices == [{"name": "alto (yours)", "value": own.id}, {"name": "narrator (server)", "value": server.id},
                       {"name": "bobby (shared)", "value": shared.id}]
    assert await h.autocomplete("voice use", "name", ALICE, name="AR") == [
        {"name": "narrator (server)", "value": server.id}]
    assert [c["value"] for c in await h.autocomplete("voice share", "name", ALICE, name="")] == [own.id]

    await h.slash("voice use", ALICE, name=server.id)
    assert (await store.user_settings(ALICE, GUILD_ID))["voice"] == server.id
    assert (await store.user_settings(ALICE))["voice"] is None  # a server voice is chosen for this server only
    await h.slash("voice use", ALICE, name="alto")  # typed by name
    assert (await store.user_settings(ALICE, GUILD_ID))["voice"] == own.id
    token = await h.slash("voice use", ALICE, name="secret")
    text, ephemeral = last_reply(h, token)
    assert ephemeral and "no voice called 'secret' you can use here" in text and "/voice list" in text

    token = await h.slash("voice list", ALICE)
    text, _ = last_reply(h, token)
    # the fake voices are reference-free (no transcript): the member sees it on their own
    assert text.splitlines() == ["• **alto** (yours, no transcript) ← you speak with this", "• **narrator** (server)",
                                 "• **bobby** (shared)"]


async def test_share_unshare(harness):
    h = harness
    own = h.services.synthesizer.voices.add("alto", ALICE)
    await h.slash("voice share", ALICE, name="alto")
    assert await h.services.store.shared_voices(GUILD_ID) == [own.id]
    token = await h.slash("voice share", ALICE, name="alto")
    assert "already shared" in last_reply(h, token)[0]
    await h.slash("voice unshare", ALICE, name="alto")
    assert await h.services.store.shared_voices(GUILD_ID) == []
    token = await h.slash("voice share", BOB, name="alto")  # not Bob's
    assert "no voice called 'alto' of yours" in last_reply(h, token)[0]


async def test_delete_confirmed_removes_everything(harness):
    h = harness
    voices, store = h.services.synthesizer.voices, h.services.store
    own = voices.add("alto", ALICE)
    await store.share_voice(own.id, GUILD_ID, ALICE)
    await store.set_user_setting(ALICE, "voice", own.id)
    token, task = h.start_slash("voice delete", ALICE, name="alto")
    await h.wait_for(lambda: token in h.adapter.original)
    await h.click(token, "Delete it")
    await asyncio.wait_for(task, 3)
    assert h.services.synthesizer.deleted == [own.id]
    assert await store.shared_voices(GUILD_ID) == [] and await store.voice_journal() == []
    assert (await store.user_settings(ALICE))["voice"] is None
    assert "is deleted" in h.adapter.original_content(token)


async def test_delete_someone_elses_voice(harness):
    h = harness
    voices, store = h.services.synthesizer.voices, h.services.store
    shared = voices.add("bobby", BOB)
    await store.share_voice(shared.id, GUILD_ID, BOB)
    token = await h.slash("voice delete", ALICE, name="bobby")
    text, ephemeral = last_reply(h, token)
    assert ephemeral and "belongs to someone else" in text
    server = voices.add("narrator", BOB)
    await store.add_guild_voice(GUILD_ID, server.id, BOB)
    await h.slash("voice delete", ADMIN, name="narrator")  # an admin removes it from the server, files stay
    assert await store.guild_voices(GUILD_ID) == [] and h.services.synthesizer.deleted == []


async def test_forget_me(harness):
    h = harness
    voices, store = h.services.synthesizer.voices, h.services.store
    a1, a2 = voices.add("alto", ALICE), voices.add("alto2", ALICE)
    other = voices.add("bobby", BOB)
    await store.set_user_setting(ALICE, "speed", 1.5)
    await store.share_voice(a1.id, GUILD_ID, ALICE)
    token, task = h.start_slash("forget-me", ALICE)
    await h.wait_for(lambda: token in h.adapter.original)
    await h.click(token, "Forget me")
    await asyncio.wait_for(task, 3)
    assert sorted(h.services.synthesizer.deleted) == sorted([a1.id, a2.id])
    assert list(voices.by_id) == [other.id]
    assert (await store.user_settings(ALICE))["speed"] is None
    assert await store.shared_voices(GUILD_ID) == []
    assert h.adapter.original_content(token).startswith("Done: 2 voice(s)")


async def test_preview_sends_a_short_wav(harness):
    h = harness
    own = h.services.synthesizer.voices.add("alto", ALICE)
    token = await h.slash("voice preview", ALICE)
    calls = h.adapter.for_token(token)
    assert calls[0].payload == {"type": 5, "data": {"flags": 64}}  # deferred, ephemeral
    (name, data), = calls[-1].files
    audio, rate = sf.read(io.BytesIO(data))
    assert name == "alto.wav" and rate == 32000
    assert len(audio) == 2 * 16000  # two sentences (the fake splits at '.') x 0.5 s
    spectrum = np.abs(np.fft.rfft(audio))
    assert abs(np.argmax(spectrum) * rate / len(audio) - (200 + 10 * int(own.id[1:]))) < 3
    token = await h.slash("voice preview", BOB)
    assert "You have no voice yet" in last_reply(h, token)[0]


@pytest.mark.parametrize("name", ["j.doe", "O'Brien", "a/b", "x" * 33])
async def test_a_name_the_store_refuses_is_refused_before_consent(harness, name):
    """Issue 16, 8: the voice store's rule, applied before the consent question, the download and the encoding."""
    h = harness
    token, task = h.start_slash("voice clone", ALICE, clip=h.attachment("me.ogg", OGG, "audio/ogg"), name=name)
    await asyncio.wait_for(task, 3)
    text, ephemeral = last_reply(h, token)
    assert ephemeral and "is not allowed" in text and "name option" in text
    assert "I confirm" not in text  # no consent question was asked
    assert h.downloads == [] and h.services.synthesizer.created == []


async def _consented(h, qualified: str, user=ALICE, **options):
    token, task = h.start_slash(qualified, user, **options)
    await h.wait_for(lambda: token in h.adapter.original or task.done())
    assert h.downloads == []  # nothing before the click
    await h.click(token, CONSENT, user)
    await asyncio.wait_for(task, 3)
    return token


async def test_add_clip_asks_consent_and_averages_the_clip_in(harness):
    h = harness
    own = h.services.synthesizer.voices.add("alto", ALICE)
    clip = h.attachment("second.ogg", OGG, "audio/ogg")
    token = await _consented(h, "voice add-clip", name=own.id, clip=clip)
    assert h.downloads == [clip["url"]]
    assert h.services.synthesizer.voicing.changed == [("add_clips", own.id, [(OGG, "second.ogg")])]
    assert h.adapter.original_content(token) == "**alto** now speaks with the timbre of its 2 clips."
    # someone else's voice: refused before consent or download
    bobs = h.services.synthesizer.voices.add("bobby", BOB)
    await h.services.store.share_voice(bobs.id, GUILD_ID, BOB)
    token = await h.slash("voice add-clip", ALICE, name=bobs.id, clip=h.attachment("x.ogg", OGG, "audio/ogg"))
    assert h.downloads == [clip["url"]] and "no voice called 'v002' of yours" in last_reply(h, token)[0]


async def test_styles_are_added_offered_to_say_and_removed(harness):
    h = harness
    own = h.services.synthesizer.voices.add("alto", ALICE)
    await h.services.store.set_user_setting(ALICE, "voice", own.id)
    token = await _consented(h, "voice style add", name=own.id, style="calm",
                             clip=h.attachment("calm.ogg", OGG, "audio/ogg"), transcript="I am calm.", language="en")
    assert h.services.synthesizer.voicing.changed == [("add_style", own.id, "calm", OGG, "I am calm.", "en")]
    assert "**alto** has the style **calm**: use it with `/say style:calm`." in h.adapter.original_content(token)
    assert await h.autocomplete("say", "style", ALICE, text="hi", style="") == [{"name": "calm", "value": "calm"}]
    assert await h.autocomplete("say", "style", ALICE, text="hi", style="exc") == []
    assert await h.autocomplete("voice style remove", "style", ALICE, name=own.id, style="") == [
        {"name": "calm", "value": "calm"}]
    await h.slash("say", ALICE, text="Hello there", style="calm")
    assert h.services.speech.styles[-1] == "calm"
    token = await h.slash("voice list", ALICE)
    assert "styles: calm" in last_reply(h, token)[0]
    token = await h.slash("voice style add", ALICE, name=own.id, style="no/slash",
                          clip=h.attachment("x.ogg", OGG, "audio/ogg"))
    assert "Style name 'no/slash' is not allowed" in last_reply(h, token)[0] and len(h.downloads) == 1
    token = await h.slash("voice style remove", ALICE, name=own.id, style="calm")
    assert last_reply(h, token)[0] == "**alto** no longer has the style **calm**."
    assert await h.autocomplete("say", "style", ALICE, text="hi", style="") == []


async def test_a_clip_or_style_is_stored_with_the_consent_given_for_it(harness):
    """The consent asked before an extra clip or a style is handed on with it: who, when, the words shown, which
    clip, voice and style (the voice store keeps it with the clip or style: tests/synthesis/test_voice_styles.py)."""
    h = harness
    own = h.services.synthesizer.voices.add("alto", ALICE)
    await _consented(h, "voice add-clip", name=own.id, clip=h.attachment("second.ogg", OGG, "audio/ogg"))
    h.downloads.clear()
    await _consented(h, "voice style add", name=own.id, style="calm",
                     clip=h.attachment("calm.ogg", OGG, "audio/ogg"), transcript="I am calm.", language="en")
    clip_consent, style_consent = h.services.synthesizer.voicing.consents
    for consent, filename in ((clip_consent, "second.ogg"), (style_consent, "calm.ogg")):
        assert consent["user_id"] == ALICE and consent["guild_id"] == GUILD_ID and consent["voice_id"] == own.id
        assert consent["statement"] == cogs.voices.consent_statement(False)
        assert consent["clip"] == filename and consent["clip_bytes"] == len(OGG) and consent["at"].endswith("+00:00")
    assert style_consent["style"] == "calm" and "style" not in clip_consent


async def test_a_style_whose_transcript_was_dropped_says_the_style_is_reference_free(harness):
    h = harness
    kept = ("the style 'calm' uses seconds 3.2-13.1 of the 30.0 s clip, the most continuous part of its 25.3 s of "
            "speech (GPT-SoVITS takes 3-10 s), and leaves out 15.4 s of speech, so its transcript was not stored and "
            "the style 'calm' is reference-free; to keep a transcript, send only the seconds you want, with the words "
            "said in them")
    h.services.synthesizer.voicing.kept = kept
    own = h.services.synthesizer.voices.add("alto", ALICE)
    token = await _consented(h, "voice style add", name=own.id, style="calm",
                             clip=h.attachment("calm.ogg", OGG, "audio/ogg"), transcript="I am calm.", language="en")
    lines = h.adapter.original_content(token).splitlines()
    assert lines == ["**alto** has the style **calm**: use it with `/say style:calm`. The style **calm** is "
                     "reference-free: its transcript was not kept (see the first note).", f"Note: {kept}"]
    assert "the voice is reference-free" not in h.adapter.original_content(token)
