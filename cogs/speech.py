"""Speaking in voice channels: ``/join /leave /say /skip /clear``, auto-read, and "Speak with my voice".

The work happens in :mod:`bot.speech`, which also applies the guild's reading policy (bots, roles, who is in voice,
autojoin); this cog picks the messages of the auto-read channel (or the bot's voice chat), feeds discord.py's voice
and guild events to the speech service, and tells the guild when queued speech fails.
Another bot that streams its answer by editing one message is followed: each edit's new text is handed on as a
stream, so each sentence is spoken once, as soon as it is complete, in the voice the guild gave that bot.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands
from discord.ext import commands

from cogs.base import ReplyingCog, UsageError, guild_member, reply_error, send_ephemeral, style_autocomplete
from synthesis import SpeechError

if TYPE_CHECKING:
    from bot import SpeechService, VoiceBot

log = logging.getLogger(__name__)

EDIT_SETTLE_S = 4.0  # seconds without an edit after which a followed bot's message counts as finished
FOLLOW_MEMORY = 256  # followed messages remembered (what was already spoken of each)
READABLE_TYPES = (discord.MessageType.default, discord.MessageType.reply)


@dataclass
class _Followed:
    """A streamed bot message: the text already handed on, and the live stream of new text (if any)."""

    seen: str = ""
    queue: asyncio.Queue[str] | None = None


class SpeechCog(ReplyingCog):
    """Voice-channel speech commands and listeners."""

    def __init__(self, bot: VoiceBot) -> None:
        super().__init__(bot)
        self._followed: collections.OrderedDict[int, _Followed] = collections.OrderedDict()
        self._report_channels: dict[int, int] = {}  # guild id -> channel id of the last command there
        self.ctx_menu = app_commands.ContextMenu(name="Speak with my voice", callback=self.speak_message)
        self.ctx_menu.guild_only = True
        self.ctx_menu.error(self._ctx_menu_error)

    @property
    def speech(self) -> SpeechService:
        speech = self.services.speech
        if speech is None:
            raise UsageError("Speech is not running in this process (the bot was started with `serve`).")
        return speech

    async def cog_load(self) -> None:
        self.bot.tree.add_command(self.ctx_menu)
        if self.services.speech is not None:
            self.services.speech.on_error = self._report

    async def cog_unload(self) -> None:
        self.bot.tree.remove_command(self.ctx_menu.name, type=self.ctx_menu.type)
        if self.services.speech is not None and self.services.speech.on_error == self._report:
            self.services.speech.on_error = None

    # ---- commands --------------------------------------------------------------------------------------------------

    @app_commands.command(name="join", description="Join your voice channel")
    @app_commands.guild_only()
    async def join(self, interaction: discord.Interaction) -> None:
        guild, member = guild_member(interaction)
        if _member_channel(member) is None:
            raise UsageError("Join a voice channel first, then run /join again.")
        self._remember_channel(interaction)
        await interaction.response.defer(ephemeral=True, thinking=True)  # connecting can take seconds
        channel = await self.speech.join(guild, member)
        await send_ephemeral(interaction, f"Joined {channel.mention}. Use /say, or write in the auto-read channel.")

    @app_commands.command(name="leave", description="Leave the voice channel and drop the queue")
    @app_commands.guild_only()
    async def leave(self, interaction: discord.Interaction) -> None:
        guild, _member = guild_member(interaction)
        speaker = self.speech.speaker(guild.id)
        if not speaker.is_connected and speaker.channel is None:
            raise UsageError("I am not in a voice channel here.")
        await interaction.response.defer(ephemeral=True, thinking=True)
        dropped = await self.speech.leave(guild.id)
        note = f" ({dropped} message(s) dropped)" if dropped else ""
        await send_ephemeral(interaction, f"Left the voice channel{note}.")

    async def _style_autocomplete(self, interaction: discord.Interaction, current: str):
        return await style_autocomplete(self.services, interaction, current)

    @app_commands.command(name="say", description="Say something in your voice in the voice channel")
    @app_commands.describe(text="What to say", style="A named style of your voice (/voice style add)")
    @app_commands.autocomplete(style=_style_autocomplete)
    @app_commands.guild_only()
    async def say(self, interaction: discord.Interaction, text: app_commands.Range[str, 1, 2000],
                  style: str = "") -> None:
        guild, member = guild_member(interaction)
        self._remember_channel(interaction)
        await interaction.response.defer(ephemeral=True, thinking=True)  # may join the channel first
        result = await self.speech.say(guild, member, text, source="slash", style=style)
        await send_ephemeral(interaction, _queued_text(result.ahead))

    @app_commands.command(name="skip", description="Stop the message being spoken")
    @app_commands.guild_only()
    async def skip(self, interaction: discord.Interaction) -> None:
        guild, _member = guild_member(interaction)
        if self.speech.skip(guild.id):
            await send_ephemeral(interaction, "Skipped.")
        else:
            await send_ephemeral(interaction, "Nothing is being spoken right now.")

    @app_commands.command(name="clear", description="Drop every message waiting to be spoken")
    @app_commands.guild_only()
    async def clear(self, interaction: discord.Interaction) -> None:
        guild, _member = guild_member(interaction)
        n = self.speech.clear(guild.id)
        await send_ephemeral(interaction, f"Cleared {n} waiting message(s)." if n else "The queue was already empty.")

    async def speak_message(self, interaction: discord.Interaction, message: discord.Message) -> None:
        """Context menu "Speak with my voice": read a message aloud in the invoking member's voice."""
        guild, member = guild_member(interaction)
        if not message.content and not message.attachments:
            raise UsageError("That message has no text to speak.")
        self._remember_channel(interaction)
        await interaction.response.defer(ephemeral=True, thinking=True)
        result = await self.speech.say(guild, member, message.content, source="context",
                                       attachments=message.attachments, mentions=message.mentions)
        await send_ephemeral(interaction, _queued_text(result.ahead))

    async def _ctx_menu_error(self, interaction: discord.Interaction, error: app_commands.AppCommandError) -> None:
        """Context menus get no cog error handler from discord.py; route them to the same replies."""
        await reply_error(interaction, error)

    # ---- auto-read -------------------------------------------------------------------------------------------------

    @commands.Cog.listener()
    async def on_message(self, message: discord.Message) -> None:
        try:
            await self._autoread(message)
        except SpeechError as e:  # queue full, no voice: the author is not waiting on a reply, so just log
            log.info("auto-read skipped a message in guild %s: %s", message.guild and message.guild.id, e)

    async def _autoread(self, message: discord.Message) -> None:
        """Read a message of the auto-read channel (or the bot's voice chat); ``bot.speech`` applies the policy."""
        guild = message.guild
        if guild is None or self.services.speech is None or message.type not in READABLE_TYPES:
            return
        if self.bot.user is not None and message.author.id == self.bot.user.id:
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

    # ---- following a bot that streams by editing -------------------------------------------------------------------

    @commands.Cog.listener()
    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        followed = self._followed.get(payload.message_id)
        if followed is None or payload.guild_id is None:
            return
        content = payload.data.get("content")
        if content is None:  # an embed-only update
            return
        try:
            await self._follow(payload.message, content, None)
        except SpeechError as e:
            log.info("stopped following message %d: %s", payload.message_id, e)

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
            await self.speech.say_stream(guild, message.author, self._pieces(followed, queue), voice=voice)
        except BaseException:
            followed.queue = None
            raise

    async def _pieces(self, followed: _Followed, queue: asyncio.Queue[str]) -> AsyncIterator[str]:
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

    # ---- voice connection events, errors of queued speech ----------------------------------------------------------

    @commands.Cog.listener()
    async def on_voice_state_update(
        self, member: discord.Member, before: discord.VoiceState, after: discord.VoiceState
    ) -> None:
        if self.services.speech is not None:
            await self.services.speech.on_voice_state_update(member, before, after)

    @commands.Cog.listener()
    async def on_guild_channel_delete(self, channel: discord.abc.GuildChannel) -> None:
        if self.services.speech is not None:
            await self.services.speech.on_channel_delete(channel)

    @commands.Cog.listener()
    async def on_guild_remove(self, guild: discord.Guild) -> None:
        if self.services.speech is not None:
            await self.services.speech.on_guild_remove(guild.id)

    @commands.Cog.listener()
    async def on_guild_available(self, guild: discord.Guild) -> None:
        """After a restart, tell the guild which messages the previous run did not read."""
        speech = self.services.speech
        if speech is None:
            return
        entries = await speech.dropped_after_restart(guild.id)
        if entries:
            listed = "; ".join(e.summary for e in entries[:5])
            more = f" and {len(entries) - 5} more" if len(entries) > 5 else ""
            await self._report(guild.id, f"I restarted, so {len(entries)} message(s) were not read: {listed}{more}.")

    def _remember_channel(self, interaction: discord.Interaction) -> None:
        """Where this guild's members last talked to the bot: reports about queued speech go there."""
        if interaction.guild_id is not None and interaction.channel_id is not None:
            self._report_channels[interaction.guild_id] = interaction.channel_id

    async def _report(self, guild_id: int, message: str) -> None:
        """Tell a guild that queued speech failed: in the channel last used for commands, else the auto-read one."""
        guild = self.bot.get_guild(guild_id)
        if guild is None:
            return
        channel_id = self._report_channels.get(guild_id)
        if channel_id is None:
            channel_id = (await self.store.guild_settings(guild_id))["autoread_channel"]
        channel = guild.get_channel(channel_id) if channel_id is not None else None
        if not isinstance(channel, discord.abc.Messageable):
            log.warning("guild %d: %s (no channel to tell)", guild_id, message)
            return
        try:
            await channel.send(message[:2000], allowed_mentions=discord.AllowedMentions.none())
        except discord.HTTPException as e:
            log.warning("guild %d: could not report %r: %s", guild_id, message, e)


def _member_channel(member: discord.Member) -> Any:
    """The voice channel the member is in, or None."""
    return member.voice.channel if member.voice is not None else None


def _is_autoread_channel(channel: Any, settings: dict[str, Any], speaker: Any) -> bool:
    """The guild's auto-read channel, or (``read_voice_chat``) the text chat of the bot's voice channel."""
    if settings["autoread_channel"] is not None and channel.id == settings["autoread_channel"]:
        return True
    return bool(settings["read_voice_chat"] and speaker.channel is not None and channel.id == speaker.channel.id)


def _queued_text(ahead: Any) -> str:
    """The acknowledgement of a queued message."""
    if isinstance(ahead, int) and ahead > 0:
        return f"Queued; {ahead} message(s) ahead of yours."
    return "Speaking."


async def setup(bot: VoiceBot) -> None:
    await bot.add_cog(SpeechCog(bot))
