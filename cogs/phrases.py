"""``/phrases add|list|remove``: a guild's own common phrases, precomputed for its voices in the background.

A phrase's prosody (the GPT's semantic tokens) is computed ahead of time for every voice the guild uses, so saying
it later skips the slowest stage.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import discord
from discord import app_commands

from bot import Voice, VoiceNotFound
from cogs.base import MAX_CHOICES, ReplyingCog, UsageError, guild_member, send_ephemeral

if TYPE_CHECKING:
    from bot import VoiceBot

log = logging.getLogger(__name__)


class PhrasesCog(ReplyingCog):
    """The guild's phrase list."""

    phrases = app_commands.Group(name="phrases", description="This server's common phrases", guild_only=True)

    def __init__(self, bot: VoiceBot) -> None:
        super().__init__(bot)
        self._background: set[asyncio.Task] = set()

    async def guild_voices(self, guild: discord.Guild) -> list[Voice]:
        """The voices a guild speaks with: server voices, shared voices, the default and the bots' voices."""
        store = self.store
        ids = [*await store.guild_voices(guild.id), *await store.shared_voices(guild.id)]
        settings = await store.guild_settings(guild.id)
        if settings["default_voice"]:
            ids.append(settings["default_voice"])
        ids += list(settings["bot_voices"].values())
        voices = []
        for voice_id in dict.fromkeys(ids):
            try:
                voices.append(await self.voices.get(voice_id))
            except VoiceNotFound:
                continue
        return voices

    @phrases.command(name="add", description="Add a phrase; it is prepared for this server's voices (Manage Server)")
    @app_commands.describe(text="A phrase people here say often, e.g. 'Good game, everyone!'")
    @app_commands.checks.has_permissions(manage_guild=True)
    async def add(self, interaction: discord.Interaction, text: str) -> None:
        guild, _member = guild_member(interaction)
        if not await self.store.add_phrase(guild.id, text):
            await send_ephemeral(interaction, "That phrase is already on the list.")
            return
        phrase = " ".join(text.split())
        voices = await self.guild_voices(guild)
        for task in self.voices.precompute(voices, [phrase]):
            self._background.add(task)
            task.add_done_callback(self._precompute_done)
        note = f" Preparing it for {len(voices)} voice(s) in the background." if voices else ""
        await send_ephemeral(interaction, f"Added “{phrase}”.{note}")

    def _precompute_done(self, task: asyncio.Task) -> None:
        """Log a failed background precompute (it only costs speed later)."""
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("precomputing a guild phrase failed", exc_info=task.exception())

    @phrases.command(name="list", description="This server's common phrases")
    async def list_phrases(self, interaction: discord.Interaction) -> None:
        guild, _member = guild_member(interaction)
        items = await self.store.phrases(guild.id)
        if not items:
            await send_ephemeral(interaction, "No phrases yet; a Manage Server member can add some with /phrases add.")
            return
        body = "\n".join(f"{i}. {p}" for i, p in enumerate(items, 1))
        await send_ephemeral(interaction, f"**{len(items)} phrase(s)**\n{body}"[:2000])

    async def _phrase_autocomplete(self, interaction: discord.Interaction, current: str):
        if interaction.guild_id is None:
            return []
        needle = current.strip().lower()
        return [
            app_commands.Choice(name=p[:100], value=p[:100])
            for p in await self.store.phrases(interaction.guild_id)
            if needle in p.lower()
        ][:MAX_CHOICES]

    @phrases.command(name="remove", description="Remove a phrase (Manage Server)")
    @app_commands.autocomplete(text=_phrase_autocomplete)
    @app_commands.checks.has_permissions(manage_guild=True)
    async def remove(self, interaction: discord.Interaction, text: str) -> None:
        guild, _member = guild_member(interaction)
        if not await self.store.remove_phrase(guild.id, text):
            raise UsageError(f"“{text}” is not on this server's list; see /phrases list.")
        await send_ephemeral(interaction, f"Removed “{' '.join(text.split())}”.")

    async def cog_unload(self) -> None:
        for task in list(self._background):
            task.cancel()


async def setup(bot: VoiceBot) -> None:
    await bot.add_cog(PhrasesCog(bot))
