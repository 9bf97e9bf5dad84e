"""``/block add|remove|list``: a server's block list of members and roles (Manage Server).

A blocked member, or a member with a blocked role, is not read aloud (auto-read) and cannot use ``/say`` or "Speak
with my voice"; ``bot.speech`` applies the list, this cog only edits and shows it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import discord
from discord import app_commands

from cogs.base import ReplyingCog, UsageError, guild_member, send_ephemeral

if TYPE_CHECKING:
    from bot import VoiceBot

MAX_BLOCKS_SHOWN = 50  # entries listed in one reply (Discord's 2000 characters)


class BlocksCog(ReplyingCog):
    """Edit and show the server's block list."""

    block = app_commands.Group(name="block", description="Members and roles the bot does not read (Manage Server)",
                               guild_only=True, default_permissions=discord.Permissions(manage_guild=True))

    @staticmethod
    def _target(guild: discord.Guild, member: discord.Member | None, role: discord.Role | None) -> tuple[str, int, str]:
        """``(kind, id, mention)`` of the one member or role given; UsageError otherwise."""
        if (member is None) == (role is None):
            raise UsageError("Give one member or one role.")
        if member is not None:
            return "user", member.id, f"<@{member.id}>"
        assert role is not None
        if role.id == guild.id:  # @everyone's id is the guild's
            raise UsageError("@everyone cannot be blocked: turn auto-read off instead (/set guild autoread_channel none).")
        return "role", role.id, f"<@&{role.id}>"

    @block.command(name="add", description="Stop reading a member or everyone with a role; they cannot use /say")
    @app_commands.describe(member="A member to block", role="A role to block")
    @app_commands.checks.has_permissions(manage_guild=True)
    async def add(self, interaction: discord.Interaction, member: discord.Member | None = None,
                  role: discord.Role | None = None) -> None:
        guild, _admin = guild_member(interaction)
        kind, target_id, mention = self._target(guild, member, role)
        if kind == "user" and member is not None and member.bot:
            raise UsageError(f"{mention} is a bot: bots are not read unless given a voice (/set bot-voice).")
        added = await self.store.block(guild.id, kind, target_id)
        await send_ephemeral(interaction, f"Blocked {mention}." if added else f"{mention} was already blocked.")

    @block.command(name="remove", description="Read a blocked member or role again")
    @app_commands.describe(member="A blocked member", role="A blocked role")
    @app_commands.checks.has_permissions(manage_guild=True)
    async def remove(self, interaction: discord.Interaction, member: discord.Member | None = None,
                     role: discord.Role | None = None) -> None:
        guild, _admin = guild_member(interaction)
        kind, target_id, mention = self._target(guild, member, role)
        removed = await self.store.unblock(guild.id, kind, target_id)
        await send_ephemeral(interaction, f"Unblocked {mention}." if removed else f"{mention} was not blocked.")

    @block.command(name="list", description="The members and roles the bot does not read here")
    @app_commands.checks.has_permissions(manage_guild=True)
    async def list_(self, interaction: discord.Interaction) -> None:
        guild, _admin = guild_member(interaction)
        blocks = await self.store.blocks(guild.id)
        if not blocks:
            await send_ephemeral(interaction, "Nobody is blocked here.")
            return
        shown = [f"<@{i}>" if kind == "user" else f"<@&{i}>" for kind, i in blocks[:MAX_BLOCKS_SHOWN]]
        more = f" and {len(blocks) - MAX_BLOCKS_SHOWN} more" if len(blocks) > MAX_BLOCKS_SHOWN else ""
        await send_ephemeral(interaction, f"Blocked ({len(blocks)}): {', '.join(shown)}{more}.")


async def setup(bot: VoiceBot) -> None:
    await bot.add_cog(BlocksCog(bot))
