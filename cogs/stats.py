"""``/stats``: this server's usage for its admins: messages, characters spoken, sentences, cache hit rate.

Only counts are kept (``bot.usage``): no message text is stored for them.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING

import discord
from discord import app_commands

from cogs.base import ReplyingCog, guild_member, send_ephemeral

if TYPE_CHECKING:
    from bot import VoiceBot


class StatsCog(ReplyingCog):
    """Usage statistics per server."""

    @app_commands.command(name="stats", description="What the bot has spoken in this server (Manage Server)")
    @app_commands.guild_only()
    @app_commands.default_permissions(manage_guild=True)
    @app_commands.checks.has_permissions(manage_guild=True)
    async def stats(self, interaction: discord.Interaction) -> None:
        guild, _admin = guild_member(interaction)
        usage = await self.store.usage(guild.id)
        if usage is None:
            await send_ephemeral(interaction, "Nothing has been spoken in this server yet.")
            return
        since = datetime.datetime.fromtimestamp(usage["since"], datetime.timezone.utc).strftime("%Y-%m-%d")
        sentences, hits = int(usage["sentences"]), int(usage["cache_hits"])
        rate = hits / sentences if sentences else 0.0
        await send_ephemeral(interaction, (
            f"Since {since}: {int(usage['messages']):,} messages, {int(usage['characters']):,} characters spoken in "
            f"{sentences:,} sentences; {rate:.0%} of sentences came from the cache ({hits:,}). Only these counts are "
            "stored, never what was said."))


async def setup(bot: VoiceBot) -> None:
    await bot.add_cog(StatsCog(bot))
