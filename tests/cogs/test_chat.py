"""``/ask`` and mention replies against a local OpenAI-compatible stand-in (aiohttp, SSE) that streams slowly.

The chat client is the real one (``bot.chat.ChatClient``) talking HTTP to the stand-in; the speech service is the
harness's fake, which consumes each ``say_stream`` as the speaker would.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import sys
from typing import Any

import discord
import pytest

from bot.chat import ChatClient
from bot.config import ChatConfig, config_from_dict
from bot.speaker import NotInVoice, QueueFull
from tests.cogs.conftest import ALICE, BOB, BOT_ID, GUILD_ID, OTHER_BOT_ID, TEXT_ID, _user
from tests.chat_standin import ChatStandIn
from tests.cogs.test_voices import last_reply

PIECES = ["The sky", " is blue", " because air", " scatters", " blue light", " the most.", " Sunsets", " are red."]
PIECE_DELAY_S = 0.02  # seconds between streamed pieces
# The edit interval the tests run with: longer than any test, so a growing reply is edited once when its first words
# come and once more when it is complete, whatever the machine's speed (the shipped interval is 1 s).
EDIT_S = 600.0


@pytest.fixture
async def standin():
    s = await ChatStandIn(PIECES, PIECE_DELAY_S, stall_piece="Let me think.").start()
    yield s
    await s.close()


def chat_section(url: str, **kw: Any) -> dict[str, Any]:
    return {"enabled": True, "base_url": url, "model": "tiny", "api_key_env": "VOICEBOT_TEST_CHAT_KEY",
            "system_prompt": "Be brief.", "memory_messages": 4, "timeout_s": 1.0, **kw}


@pytest.fixture
def config(tmp_path, standin):
    """The harness's config with the chat model on, pointing at the stand-in."""
    return config_from_dict({"discord": {"max_attachment_mb": 1.0, "database": str(tmp_path / "bot.sqlite3")},
                             "phrases": ["Hello!"], "chat": chat_section(standin.url)}, base_dir=tmp_path)


@pytest.fixture
def long_edit_interval(monkeypatch):
    # load_extension gives the cog a fresh module object: patch the one it runs in
    monkeypatch.setattr(sys.modules["cogs.chat"], "EDIT_INTERVAL_S", EDIT_S)


def edits_of(h, token: str) -> list:
    return [c for c in h.adapter.for_token(token) if c.method == "PATCH"]


def record_speech(h, standin: ChatStandIn, *, release_from: int | None = None) -> list[tuple[str, bool]]:
    """Wrap say_stream: each piece speech receives, with whether the stand-in had finished writing by then.

    With ``release_from``, speech receiving piece ``k >= release_from`` lets a paced stand-in write the next one.
    """
    got: list[tuple[str, bool]] = []
    speech = h.services.speech
    original = speech.say_stream

    async def say_stream(guild, member, pieces, *, voice=None):
        async def watched():
            async for piece in pieces:
                got.append((piece, standin.finished))
                if release_from is not None and len(got) > release_from:
                    standin.allow()
                yield piece
        return await original(guild, member, watched(), voice=voice)

    speech.say_stream = say_stream
    return got


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


# ---- /ask prompt ---------------------------------------------------------------------------------------------------

async def test_ask_speaks_the_first_piece_and_edits_while_the_model_writes(harness, standin, long_edit_interval):
    h = harness
    voice = h.services.synthesizer.voices.add("alice-voice", ALICE)
    # Paced by events: the model writes its second piece once the reply has been edited to show the first, and
    # each later one once speech has received the one before it. So the first edit and the first spoken words
    # happen while the model is still writing, by construction; a cog that waited for the whole reply would stall.
    standin.pace()
    heard = record_speech(h, standin, release_from=1)
    edits: list[tuple[int, bool]] = []  # at each edit: pieces the model had written, whether it had finished
    request = h.adapter.request

    async def recorded(route, *a, **kw):
        if route.method == "PATCH":
            edits.append((standin.sent, standin.finished))
            if len(edits) == 1:
                standin.allow()
        return await request(route, *a, **kw)

    h.adapter.request = recorded
    token = await asyncio.wait_for(h.slash("ask prompt", ALICE, text="Why is the sky blue?"), 10)

    calls = h.adapter.for_token(token)
    assert calls[0].payload == {"type": 5}  # deferred in public: the reply is for the channel
    assert h.services.speech.calls == [("say_stream", ALICE, voice.id)]  # in the asker's voice
    await asyncio.wait_for(h.services.speech.consumers[0], 2)
    assert "".join(p for p, _ in heard) == "".join(PIECES)
    assert heard[0] == (PIECES[0], False)  # speech had the first words while the model was still writing
    full = "".join(PIECES)
    assert h.adapter.original_content(token) == f"> Why is the sky blue?\n{full}"
    # the message grew while the model wrote (its first piece shown at once), then no edit until the interval
    # passed or the reply was complete: one edit with the first words, one with all of them
    assert edits == [(1, False), (len(PIECES), True)]
    assert standin.requests[0]["messages"] == [{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Why is the sky blue?"}]


async def test_conversation_memory_is_per_channel_and_reset_forgets_it(harness, standin):
    h = harness
    standin.pieces = ["Four."]
    await h.slash("ask prompt", ALICE, text="What is 2+2?")
    standin.pieces = ["Eight."]
    await h.slash("ask prompt", BOB, text="And doubled?")
    assert standin.requests[1]["messages"][1:] == [
        {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "Four."},
        {"role": "user", "content": "And doubled?"}]
    token = await h.slash("ask reset", BOB)
    assert last_reply(h, token) == (
        "Bob cleared my memory of this channel's conversation; the next question starts afresh.", False)
    await h.slash("ask prompt", ALICE, text="Hi")
    assert standin.requests[2]["messages"] == [{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Hi"}]


async def test_questions_in_one_channel_are_answered_in_order(harness, standin):
    h = harness
    standin.pieces = ["One", " two."]
    t1, task1 = h.start_slash("ask prompt", ALICE, text="first")
    t2, task2 = h.start_slash("ask prompt", BOB, text="second")
    await asyncio.wait_for(asyncio.gather(task1, task2), 5)
    # the second question was sent only after the first answer was complete, with it in the memory
    assert [r["messages"][-1]["content"] for r in standin.requests] == ["first", "second"]
    assert standin.requests[1]["messages"][1:3] == [{"role": "user", "content": "first"},
                                                    {"role": "assistant", "content": "One two."}]
    assert h.adapter.original_content(t2) == "> second\nOne two."


async def test_chat_off_in_the_config_or_the_guild_is_explained(harness, standin):
    h = harness
    await h.services.store.set_guild_setting(GUILD_ID, "chat_enabled", False)
    token = await h.slash("ask prompt", ALICE, text="hello?")
    assert last_reply(h, token) == (
        "The chat model is turned off in this server; an admin can turn it on with /set guild chat_enabled true.",
        True)
    config = h.services.config
    h.services.config = config_from_dict({"chat": {"enabled": False}})
    token = await h.slash("ask prompt", ALICE, text="hello?")
    assert last_reply(h, token) == (
        "The chat model is off: the bot's operator can turn it on with chat.enabled in config.yaml.", True)
    h.services.config = config
    assert standin.requests == [] and h.services.speech.calls == []


async def test_a_down_endpoint_gives_the_asker_a_clear_message(harness, standin):
    h = harness
    url = dead_url()
    h.services.chat = ChatClient(ChatConfig(**chat_section(url)))
    try:
        token = await h.slash("ask prompt", ALICE, text="anyone there?")
    finally:
        await h.services.chat.close()
    assert last_reply(h, token) == (
        f"Cannot reach the chat model at {url}: is the server running, and is chat.base_url right?", True)
    # the public "thinking…" was removed, not left hanging
    assert [(c.method, c.path.rsplit("/", 1)[-1]) for c in h.adapter.for_token(token)][1] == ("DELETE", "@original")
    assert edits_of(h, token) == []


async def test_garbage_from_the_endpoint_gives_a_clear_message(harness, standin):
    h = harness
    standin.mode = "no-choices"
    token = await h.slash("ask prompt", ALICE, text="hello")
    text, ephemeral = last_reply(h, token)
    assert ephemeral and "is not an OpenAI-compatible chat stream" in text and "chat.base_url" in text


async def test_a_slow_endpoint_is_cut_off_and_never_blocks_other_speech(harness, standin, long_edit_interval):
    h = harness
    standin.mode = "stall"
    chat = h.bot.get_cog("ChatCog")._own_client
    chat.config = dataclasses.replace(chat.config, timeout_s=0.5)
    heard = record_speech(h, standin)
    token, task = h.start_slash("ask prompt", ALICE, text="Tell me a story")
    await h.wait_for(lambda: heard)  # the model wrote its first words, then stalls
    say_token = await h.slash("say", BOB, text="meanwhile")  # the event loop is free
    assert not task.done() and last_reply(h, say_token) == ("Speaking.", True)  # answered while /ask waits
    await asyncio.wait_for(task, 3)
    assert h.adapter.original_content(token) == (
        "> Tell me a story\nLet me think.\n-# (cut off: The chat model at "
        f"{standin.url} sent nothing for 0.5 s (chat.timeout_s): it may be busy or still loading the model; "
        "try again, or raise chat.timeout_s)")
    await asyncio.wait_for(h.services.speech.consumers[0], 2)  # speech ended with what was written
    assert [p for p, _ in heard] == ["Let me think."]


async def test_speech_refusals_do_not_stop_the_text_reply(harness, standin, monkeypatch):
    h = harness
    standin.pieces = ["Fine", ", thanks."]
    speech = h.services.speech

    async def full(*a, **kw):
        raise QueueFull("the queue is full (20 messages); try again when some have been read")

    monkeypatch.setattr(speech, "say_stream", full)
    token = await h.slash("ask prompt", ALICE, text="How are you?")
    assert h.adapter.original_content(token) == "> How are you?\nFine, thanks."
    assert last_reply(h, token) == (
        "I could not speak the reply: the queue is full (20 messages); try again when some have been read", True)

    async def not_in_voice(*a, **kw):
        raise NotInVoice("I'm not in a voice channel: join one and use /join")

    monkeypatch.setattr(speech, "say_stream", not_in_voice)
    token = await h.slash("ask prompt", BOB, text="And you?")
    assert last_reply(h, token) == ("> And you?\nFine, thanks.", False)  # a text answer is all Bob wanted


# ---- mentions ------------------------------------------------------------------------------------------------------

@pytest.fixture
def channel_rest(harness, monkeypatch):
    """Record the channel messages the bot sends and edits (REST, not interaction webhooks)."""
    h = harness
    log: list[tuple[str, int, str]] = []

    async def send_message(channel_id, *, params):
        mid = next(h.ids)
        log.append(("send", mid, params.payload["content"]))
        assert params.payload["allowed_mentions"]["parse"] == []
        return h.message_payload(BOT_ID, params.payload["content"], channel_id=int(channel_id), mid=mid)

    async def edit_message(channel_id, message_id, *, params):
        log.append(("edit", int(message_id), params.payload["content"]))
        return h.message_payload(BOT_ID, params.payload["content"], channel_id=int(channel_id), mid=int(message_id))

    monkeypatch.setattr(h.bot.http, "send_message", send_message)
    monkeypatch.setattr(h.bot.http, "edit_message", edit_message)
    return log


def mention(h, author: int, content: str, mentions: list[int]) -> discord.Message:
    data = h.message_payload(author, content, channel_id=TEXT_ID)
    data["mentions"] = [_user(uid, "voicebot" if uid == BOT_ID else "bob", uid == BOT_ID) for uid in mentions]
    return discord.Message(state=h.state, channel=h.guild.get_channel(TEXT_ID), data=data)


async def test_mentions_are_answered_only_where_the_guild_allows(harness, standin, channel_rest,
                                                                 long_edit_interval, monkeypatch):
    h = harness
    cog = h.bot.get_cog("ChatCog")
    standin.pace()  # the model writes the rest of its reply once the message shows its first piece
    edit = h.bot.http.edit_message

    async def edit_then_release(channel_id, message_id, *, params):
        result = await edit(channel_id, message_id, params=params)
        if [kind for kind, _, _ in channel_rest].count("edit") == 1:
            standin.allow(len(PIECES))
        return result

    monkeypatch.setattr(h.bot.http, "edit_message", edit_then_release)
    question = mention(h, ALICE, f"<@{BOT_ID}> is <@{BOB}> right about the sky?", [BOT_ID, BOB])
    await cog.on_message(question)  # mention_chat is off by default
    assert channel_rest == [] and standin.requests == []
    await h.services.store.set_guild_setting(GUILD_ID, "mention_chat", True)
    await cog.on_message(mention(h, OTHER_BOT_ID, f"<@{BOT_ID}> hi", [BOT_ID]))  # never answer bots
    await cog.on_message(mention(h, ALICE, "no mention of the bot here", []))
    assert channel_rest == []
    await cog.on_message(question)
    assert standin.requests[0]["messages"][-1] == {"role": "user", "content": "is @Bob right about the sky?"}
    (mid,) = {m for _, m, _ in channel_rest}
    # "…" at once, replaced by the model's first words, then (the edit interval not yet over) by the whole reply
    assert channel_rest == [("send", mid, "…"), ("edit", mid, PIECES[0]), ("edit", mid, "".join(PIECES))]
    assert h.services.speech.calls == [("say_stream", ALICE, None)]
    await asyncio.wait_for(h.services.speech.consumers[0], 2)
    assert "".join(h.services.speech.streams[0]) == "".join(PIECES)


async def test_a_mention_to_a_broken_endpoint_is_answered_with_the_reason(harness, standin, channel_rest):
    h = harness
    cog = h.bot.get_cog("ChatCog")
    await h.services.store.set_guild_setting(GUILD_ID, "mention_chat", True)
    standin.mode = "no-choices"
    await cog.on_message(mention(h, ALICE, f"<@{BOT_ID}> hello", [BOT_ID]))
    assert channel_rest[0][2] == "…"
    assert "is not an OpenAI-compatible chat stream" in channel_rest[-1][2] and channel_rest[-1][0] == "edit"
    await cog.on_message(mention(h, ALICE, f"<@{BOT_ID}>", [BOT_ID]))
    assert channel_rest[-1][2].startswith("Mention me together with a question")


# ---- long replies --------------------------------------------------------------------------------------------------

async def test_a_long_reply_continues_in_new_messages():
    from cogs.chat import MESSAGE_CHARS, _LiveReply

    shown: dict[int, str] = {}

    class Sent:
        def __init__(self, n: int) -> None:
            self.n = n

        async def edit(self, *, content: str, allowed_mentions) -> None:
            shown[self.n] = content

    async def edit_first(content: str) -> None:
        shown[0] = content

    async def send_next(content: str) -> Sent:
        shown[len(shown)] = content
        return Sent(len(shown) - 1)

    words = [f"word{i:04d}" for i in range(500)]  # 4,499 characters
    reply = _LiveReply(edit_first, send_next, header="> q\n")
    reply.start()
    for w in words:
        reply.append(w + " ")
    await reply.finish()
    assert reply.messages == len(shown) == 3
    assert all(len(c) <= MESSAGE_CHARS for c in shown.values())
    assert shown[0].startswith("> q\nword0000 ")
    assert " ".join(shown[i] for i in range(3)).removeprefix("> q\n").split() == words
