"""/join /leave /say /skip /clear, "Speak with my voice", auto-read and following a bot that streams by editing."""

from __future__ import annotations

import asyncio

import discord

import bot.autoread
from bot.speaker import NotInVoice
from tests.cogs.conftest import (
    ADMIN, ALICE, AUTOREAD_ID, BOB, BOT_ID, GUILD_ID, OTHER_BOT_ID, TEXT_ID, VOICE_ID,
)
from tests.cogs.test_voices import last_reply


def says(h):
    return [c for c in h.services.speech.calls if c[0] == "say"]


async def test_say_defers_then_queues(harness):
    h = harness
    token = await h.slash("say", ALICE, text="Hello there")
    calls = h.adapter.for_token(token)
    assert calls[0].payload == {"type": 5, "data": {"flags": 64}}  # deferred (joining can take seconds), ephemeral
    assert last_reply(h, token) == ("Speaking.", True)
    assert says(h) == [("say", ALICE, "Hello there", "slash", (), None)]
    token = await h.slash("say", ALICE, text="Again")
    assert last_reply(h, token)[0] == "Queued; 1 message(s) ahead of yours."


async def test_say_refusal_is_ephemeral_with_the_fix(harness):
    h = harness
    h.services.speech.raise_on_say = NotInVoice("join a voice channel first, then use /join")
    token = await h.slash("say", BOB, text="hi")
    assert last_reply(h, token) == ("Join a voice channel first, then use /join", True)


async def test_join_leave_skip_clear(harness):
    h = harness
    token = await h.slash("join", BOB)  # Bob is not in a voice channel
    assert last_reply(h, token) == ("Join a voice channel first, then run /join again.", True)
    token = await h.slash("leave", ALICE)
    assert last_reply(h, token) == ("I am not in a voice channel here.", True)
    token = await h.slash("join", ALICE)
    assert last_reply(h, token)[0].startswith(f"Joined <#{VOICE_ID}>")
    token = await h.slash("skip", ALICE)
    assert last_reply(h, token)[0] == "Skipped."
    token = await h.slash("clear", ALICE)
    assert last_reply(h, token)[0] == "Cleared 3 waiting message(s)."
    token = await h.slash("leave", ALICE)
    assert last_reply(h, token)[0] == "Left the voice channel (2 message(s) dropped)."
    assert [c[0] for c in h.services.speech.calls] == ["join", "skip", "clear", "leave"]


async def test_context_menu_speaks_the_message_in_my_voice(harness):
    h = harness
    msg = h.message_payload(BOB, "Look at this!", channel_id=TEXT_ID)
    msg["attachments"] = [{"id": "1", "filename": "cat.png", "size": 10, "url": "https://x.invalid/cat.png",
                           "proxy_url": "https://x.invalid/cat.png", "content_type": "image/png"}]
    token = await h.context_menu("Speak with my voice", ALICE, msg)
    assert last_reply(h, token) == ("Speaking.", True)
    assert says(h) == [("say", ALICE, "Look at this!", "context", ("cat.png",), None)]
    empty = h.message_payload(BOB, "", channel_id=TEXT_ID)
    token = await h.context_menu("Speak with my voice", ALICE, empty)
    assert last_reply(h, token) == ("That message has no text to speak.", True)


async def test_autoread_reads_only_the_autoread_channel(harness):
    h = harness
    cog = h.bot.get_cog("SpeechCog")
    store = h.services.store
    await cog.on_message(h.message(ALICE, "not configured yet"))
    await store.set_guild_setting(GUILD_ID, "autoread_channel", AUTOREAD_ID)
    await cog.on_message(h.message(ALICE, "in general", channel_id=TEXT_ID))
    await cog.on_message(h.message(ALICE, "hello everyone"))
    await cog.on_message(h.message(BOT_ID, "my own words"))
    await cog.on_message(h.message(OTHER_BOT_ID, "from a webhook", webhook=True))
    assert says(h) == [("say", ALICE, "hello everyone", "autoread", (), None)]
    # the policy (bots, roles, voice) is the speech service's; its refusals are dropped quietly
    h.services.speech.raise_on_say = NotInVoice("join a voice channel first")
    await cog.on_message(h.message(BOB, "not in voice"))


async def test_autoread_voice_chat(harness):
    h = harness
    cog = h.bot.get_cog("SpeechCog")
    await h.services.store.set_guild_setting(GUILD_ID, "read_voice_chat", True)
    await cog.on_message(h.message(ALICE, "typed in the voice chat", channel_id=VOICE_ID))
    assert says(h) == []  # the bot is not in that channel
    await h.slash("join", ALICE)
    await cog.on_message(h.message(ALICE, "typed in the voice chat", channel_id=VOICE_ID))
    assert says(h) == [("say", ALICE, "typed in the voice chat", "autoread", (), None)]


async def test_following_a_bot_that_streams_by_editing(harness, monkeypatch):
    monkeypatch.setattr(bot.autoread, "EDIT_SETTLE_S", 0.1)
    h = harness
    cog = h.bot.get_cog("SpeechCog")
    store, speech = h.services.store, h.services.speech
    narrator = h.services.synthesizer.voices.add("narrator", ADMIN)
    await store.set_guild_setting(GUILD_ID, "autoread_channel", AUTOREAD_ID)
    await store.set_bot_voice(GUILD_ID, OTHER_BOT_ID, narrator.id)
    mid = 555_555_555_555_555_555

    async def edit(content: str) -> None:
        data = h.message_payload(OTHER_BOT_ID, content, mid=mid)
        msg = h.message(OTHER_BOT_ID, content, mid=mid)
        await cog.on_raw_message_edit(discord.RawMessageUpdateEvent(data, msg))

    await cog.on_message(h.message(OTHER_BOT_ID, "The weather today", mid=mid))
    await edit("The weather today is sunny. Tomor")
    await edit("The weather today is sunny. Tomorrow it rains.")
    await edit("The weather today is sunny. Tomorrow it rains.")  # no new text
    await asyncio.wait_for(speech.consumers[0], 2)  # the stream ends once the edits settle
    assert speech.calls[0] == ("say_stream", OTHER_BOT_ID, narrator.id)
    assert speech.streams[0] == ["The weather today", " is sunny. Tomor", "row it rains."]
    # a late edit speaks only what is new, in a new stream
    await edit("The weather today is sunny. Tomorrow it rains. Bye!")
    await asyncio.wait_for(speech.consumers[1], 2)
    assert speech.streams[1] == [" Bye!"]
    # ordinary messages of people still go through say
    await cog.on_message(h.message(ALICE, "thanks"))
    assert [c[0] for c in speech.calls] == ["say_stream", "say_stream", "say"]


async def test_queued_speech_failures_are_reported_where_commands_are_used(harness, monkeypatch):
    h = harness
    sent = []

    async def send_message(channel_id, *, params):
        sent.append((int(channel_id), params.payload["content"], params.payload["allowed_mentions"]))
        return h.message_payload(BOT_ID, params.payload["content"], channel_id=int(channel_id))

    monkeypatch.setattr(h.bot.http, "send_message", send_message)
    cog = h.bot.get_cog("SpeechCog")
    assert h.services.speech.on_error == cog._report
    await h.services.store.set_guild_setting(GUILD_ID, "autoread_channel", AUTOREAD_ID)
    await cog._report(GUILD_ID, "I could not read Alice's message: the engine is busy")
    await h.slash("say", ALICE, text="hi")  # the channel last used for a command wins
    await cog._report(GUILD_ID, "second")
    assert [(c, t) for c, t, _ in sent] == [
        (AUTOREAD_ID, "I could not read Alice's message: the engine is busy"), (TEXT_ID, "second")]
    assert sent[0][2] == {"parse": []}  # never pings anyone


async def test_voice_events_reach_the_speech_service(harness):
    h = harness
    cog = h.bot.get_cog("SpeechCog")
    voice_channel = h.guild.get_channel(VOICE_ID)
    member = h.guild.get_member(ALICE)
    await cog.on_voice_state_update(member, member.voice, member.voice)
    await cog.on_guild_channel_delete(voice_channel)
    assert h.services.speech.calls == [("voice_state", ALICE), ("channel_delete", VOICE_ID)]
