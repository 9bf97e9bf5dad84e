"""bot.autoread on its own: which messages it hands on, and what of a followed bot's edits (tests/cogs/test_speech.py
drives it through the cog)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import discord
import pytest

import bot.autoread
from bot.autoread import AutoReader
from bot.speaker import NotInVoice

GUILD, CHANNEL, OTHER_CHANNEL, ME, ALICE, NARRATOR_BOT = 1, 10, 11, 100, 200, 300


class Speech:
    """The two SpeechService calls the reader makes, recorded; each stream is drained into a list by a task."""

    def __init__(self) -> None:
        self.says: list[tuple[int, str, str]] = []
        self.streams: list[list[str]] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.refuse: Exception | None = None

    def speaker(self, guild_id: int) -> Any:
        return SimpleNamespace(channel=None)

    async def say(self, guild: Any, author: Any, text: str, *, source: str, **_: Any) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.says.append((author.id, text, source))

    async def say_stream(self, guild: Any, author: Any, pieces: Any, *, voice: Any) -> None:
        got: list[str] = []
        self.streams.append(got)

        async def drain() -> None:
            async for piece in pieces:
                got.append(piece)
        self.tasks.append(asyncio.create_task(drain()))


class Store:
    def __init__(self) -> None:
        self.settings: dict[str, Any] = {"autoread_channel": CHANNEL, "read_voice_chat": False, "ignore_bots": True,
                                         "bot_voices": {NARRATOR_BOT: "narrator"}}

    async def guild_settings(self, guild_id: int) -> dict[str, Any]:
        return self.settings


class Voices:
    async def get(self, voice_id: str) -> str:
        return voice_id


def message(author: int, content: str, *, mid: int = 1, channel: int = CHANNEL, webhook: bool = False) -> Any:
    return SimpleNamespace(id=mid, guild=SimpleNamespace(id=GUILD), type=discord.MessageType.default,
                           author=SimpleNamespace(id=author), channel=SimpleNamespace(id=channel), content=content,
                           webhook_id=5 if webhook else None, attachments=[], mentions=[])


def edit(author: int, content: str | None, *, mid: int = 1) -> Any:
    data = {} if content is None else {"content": content}
    return SimpleNamespace(message_id=mid, guild_id=GUILD, data=data, message=message(author, content or "", mid=mid))


async def until(condition: Any) -> None:
    """Let the drain tasks run until ``condition()`` holds (the bound only stops a broken test hanging)."""
    async def wait() -> None:
        while not condition():
            await asyncio.sleep(0)
    await asyncio.wait_for(wait(), 10)


@pytest.fixture
def reader() -> tuple[AutoReader, Speech, Store]:
    speech, store = Speech(), Store()
    return AutoReader(speech, store, Voices()), speech, store  # type: ignore[arg-type]


async def test_only_the_autoread_channel_is_read_and_never_the_bot_itself(reader) -> None:
    autoread, speech, store = reader
    await autoread.on_message(message(ALICE, "hello"), ME)
    await autoread.on_message(message(ALICE, "elsewhere", channel=OTHER_CHANNEL), ME)
    await autoread.on_message(message(ME, "my own words"), ME)
    await autoread.on_message(message(ALICE, "from a webhook", webhook=True), ME)
    store.settings["ignore_bots"] = False
    await autoread.on_message(message(ALICE, "a webhook, now read", webhook=True), ME)
    assert speech.says == [(ALICE, "hello", "autoread"), (ALICE, "a webhook, now read", "autoread")]
    speech.refuse = NotInVoice("join a voice channel first")  # dropped quietly: nobody waits on a reply
    await autoread.on_message(message(ALICE, "not in voice"), ME)


async def test_a_followed_bots_edits_reach_one_stream_and_a_rewrite_speaks_only_what_is_beyond(reader,
                                                                                              monkeypatch) -> None:
    monkeypatch.setattr(bot.autoread, "EDIT_SETTLE_S", 3600.0)  # the stream stays open through every edit
    autoread, speech, _store = reader
    await autoread.on_message(message(NARRATOR_BOT, "Once upon"), ME)
    await autoread.on_edit(edit(NARRATOR_BOT, "Once upon a time."))
    await autoread.on_edit(edit(NARRATOR_BOT, None))  # an embed-only update
    await autoread.on_edit(edit(NARRATOR_BOT, "ONCE UPON A TIME. The end."))  # rewritten: 17 characters were said
    await until(lambda: speech.streams and len(speech.streams[0]) == 3)
    assert speech.streams == [["Once upon", " a time.", " The end."]]
    await autoread.on_edit(edit(ALICE, "an edit of a message nobody follows", mid=2))
    assert len(speech.streams) == 1 and speech.says == []
    for task in speech.tasks:
        task.cancel()


async def test_a_stream_that_settled_gives_way_to_a_new_one_and_old_messages_are_forgotten(reader, monkeypatch) -> None:
    monkeypatch.setattr(bot.autoread, "EDIT_SETTLE_S", 0.01)  # each stream ends once its queue stays empty
    monkeypatch.setattr(bot.autoread, "FOLLOW_MEMORY", 2)
    autoread, speech, _store = reader
    await autoread.on_message(message(NARRATOR_BOT, "First.", mid=1), ME)
    await asyncio.gather(*speech.tasks)
    await autoread.on_edit(edit(NARRATOR_BOT, "First. Second.", mid=1))
    await asyncio.gather(*speech.tasks)
    assert speech.streams == [["First."], [" Second."]]
    for mid in (2, 3):  # two more followed messages: the first one falls out of memory
        await autoread.on_message(message(NARRATOR_BOT, f"Message {mid}.", mid=mid), ME)
    await asyncio.gather(*speech.tasks)
    await autoread.on_edit(edit(NARRATOR_BOT, "First. Second. Third.", mid=1))
    await autoread.on_edit(edit(NARRATOR_BOT, "Message 3. More.", mid=3))
    await asyncio.gather(*speech.tasks)
    assert speech.streams[2:] == [["Message 2."], ["Message 3."], [" More."]]
