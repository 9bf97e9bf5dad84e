"""Speaking in voice channels: ``/join /leave /say /skip /clear``, auto-read, and "Speak with my voice".

The work happens in :mod:`bot.speech`, which also applies the guild's reading policy (bots, roles, who is in voice,
autojoin), and :mod:`bot.autoread`, which picks the messages read aloud without a command (the auto-read channel, the
bot's voice chat, bots that stream by editing). This cog hands them discord.py's message, voice and guild events, and
tells the guild when queued speech fails.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands
from discord.ext import commands

from bot.autoread import AutoReader
from cogs.base import ReplyingCog, UsageError, guild_member, reply_error, send_ephemeral, style_autocomplete

if TYPE_CHECKING:
    from bot import VoiceBot
    from bot.speech import SpeechService

log = logging.getLogger(__name__)


class SpeechCog(ReplyingCog):
    """Voice-channel speech commands and listeners."""

    def __init__(self, bot: VoiceBot) -> None:
        super().__init__(bot)
        speech = self.services.speech  # None in a process without speech (`serve`): nothing is read aloud
        self.autoread = AutoReader(speech, self.store, self.voices) if speech is not None else None
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

    # ---- auto-read (bot.autoread decides) -------------------------------------------------------------------------

    @commands.Cog.listener()
    async def on_message(self, message: discord.Message) -> None:
        if self.autoread is not None:
            await self.autoread.on_message(message, self.bot.user.id if self.bot.user is not None else None)

    @commands.Cog.listener()
    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        if self.autoread is not None:
            await self.autoread.on_edit(payload)

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


def _queued_text(ahead: Any) -> str:
    """The acknowledgement of a queued message."""
    if isinstance(ahead, int) and ahead > 0:
        return f"Queued; {ahead} message(s) ahead of yours."
    return "Speaking."


async def setup(bot: VoiceBot) -> None:
    await bot.add_cog(SpeechCog(bot))
