"""Which messages are read aloud without a command: the auto-read channel, the bot's voice chat, and bots that stream.

A message in a guild's auto-read channel, or (``read_voice_chat``) in the text chat of the voice channel the bot is
in, is handed to :class:`~bot.speech.SpeechService`, which applies the guild's reading policy (bots, roles, who is in
voice, autojoin). A bot the guild gave a voice is followed instead: such a bot often streams its answer by editing
one message, so each edit's new text is handed on as one stream, and each sentence is spoken once, as soon as it is
complete, in the voice the guild gave it.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import discord

from synthesis import SpeechError

if TYPE_CHECKING:
    from bot.speech import SpeechService
    from bot.store import Store
    from bot.voice_service import VoiceService

__all__ = ["AutoReader", "EDIT_SETTLE_S"]

log = logging.getLogger(__name__)

EDIT_SETTLE_S = 4.0  # seconds without an edit after which a followed bot's message counts as finished
FOLLOW_MEMORY = 256  # followed messages remembered (what was already spoken of each)
READABLE_TYPES = (discord.MessageType.default, discord.MessageType.reply)


@dataclass
class _Followed:
    """A streamed bot message: the text already handed on, and the live stream of new text (if any)."""

    seen: str = ""
    queue: asyncio.Queue[str] | None = None


class AutoReader:
    """Reads a guild's messages aloud as its settings ask; the speech cog hands it discord.py's message events.

    Neither method raises for speech that cannot be queued (queue full, no voice, the author not in voice): nobody
    waits on a reply to a message, so the refusal is logged and the message dropped.

    Parameters
    ----------
    speech : SpeechService
        Speaks in a guild, with the guild's reading policy.
    store : Store
        The guild settings read here: ``autoread_channel``, ``read_voice_chat``, ``ignore_bots``, ``bot_voices``.
    voices : VoiceService
        Finds the voice a followed bot speaks with.
    """

    def __init__(self, speech: SpeechService, store: Store, voices: VoiceService) -> None:
        self.speech = speech
        self.store = store
        self.voices = voices
        self._followed: collections.OrderedDict[int, _Followed] = collections.OrderedDict()

    async def on_message(self, message: discord.Message, me: int | None) -> None:
        """Read ``message`` if it is in the guild's auto-read channel (or the bot's voice chat).

        ``me`` is the bot's own user id: its own messages are never read.
        """
        try:
            await self._read(message, me)
        except SpeechError as e:
            log.info("auto-read skipped a message in guild %s: %s", message.guild and message.guild.id, e)

    async def on_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        """A message was edited: hand on the new text of a followed bot's message."""
        if payload.message_id not in self._followed or payload.guild_id is None:
            return
        content = payload.data.get("content")
        if content is None:  # an embed-only update
            return
        try:
            await self._follow(payload.message, content, None)
        except SpeechError as e:
            log.info("stopped following message %d: %s", payload.message_id, e)

    async def _read(self, message: discord.Message, me: int | None) -> None:
        """Hand a message of the auto-read channel on to the speech service (a bot with a voice: follow it)."""
        guild = message.guild
        if guild is None or message.type not in READABLE_TYPES or message.author.id == me:
            return
        settings = await self.store.guild_settings(guild.id)
        if not _is_autoread_channel(message.channel, settings, self.speech.speaker(guild.id)):
            return
        bot_voice = settings["bot_voices"].get(message.author.id)
        if bot_voice is not None:  # a bot the guild gave a voice: read it, following its edits
            await self._follow(message, message.content, bot_voice)
            return
        if message.webhook_id is not None and settings["ignore_bots"]:
            return
        await self.speech.say(guild, message.author, message.content, source="autoread",
                              attachments=message.attachments, mentions=message.mentions)

    async def _follow(self, message: discord.Message, content: str, voice_id: str | None) -> None:
        """Hand on the text of ``message`` that was not handed on before; start a stream when none is open."""
        followed = self._followed.get(message.id)
        if followed is None:
            if voice_id is None:
                return
            followed = self._followed[message.id] = _Followed()
            while len(self._followed) > FOLLOW_MEMORY:
                self._followed.popitem(last=False)
        self._followed.move_to_end(message.id)
        if not content.startswith(followed.seen):  # rewritten: only text beyond what was handed on is new
            log.debug("message %d was rewritten; continuing after char %d", message.id, len(followed.seen))
        delta = content[len(followed.seen):]
        followed.seen = content if len(content) > len(followed.seen) else followed.seen
        if not delta:
            return
        if followed.queue is not None:
            followed.queue.put_nowait(delta)
            return
        guild = message.guild
        assert guild is not None
        settings = await self.store.guild_settings(guild.id)
        voice_id = voice_id or settings["bot_voices"].get(message.author.id)
        if voice_id is None:  # the guild took the bot's voice away
            return
        voice = await self.voices.get(voice_id)
        queue: asyncio.Queue[str] = asyncio.Queue()
        queue.put_nowait(delta)
        followed.queue = queue
        try:
            await self.speech.say_stream(guild, message.author, _pieces(followed, queue), voice=voice)
        except BaseException:
            followed.queue = None
            raise


async def _pieces(followed: _Followed, queue: asyncio.Queue[str]) -> AsyncIterator[str]:
    """The new text of a followed message, until it has not been edited for ``EDIT_SETTLE_S``."""
    try:
        while True:
            try:
                yield await asyncio.wait_for(queue.get(), EDIT_SETTLE_S)
            except asyncio.TimeoutError:
                if queue.empty():
                    return
    finally:
        if followed.queue is queue:
            followed.queue = None  # a later edit opens a new stream with the text after this one


def _is_autoread_channel(channel: Any, settings: dict[str, Any], speaker: Any) -> bool:
    """The guild's auto-read channel, or (``read_voice_chat``) the text chat of the bot's voice channel."""
    if settings["autoread_channel"] is not None and channel.id == settings["autoread_channel"]:
        return True
    return bool(settings["read_voice_chat"] and speaker.channel is not None and channel.id == speaker.channel.id)
