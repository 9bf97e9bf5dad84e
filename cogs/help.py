"""``/help``: the commands this member can use in this server, each with what it does.

A command is listed when discord.py's own checks pass for the member (Manage Server and the like), its default
permissions are met, and the server's settings allow it (cloning, the chat model, the block list).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands

from cogs.base import ReplyingCog, guild_member, send_ephemeral

if TYPE_CHECKING:
    from bot import VoiceBot

MAX_REPLY_CHARS = 2000  # Discord's limit on a message


class HelpCog(ReplyingCog):
    """List the usable commands."""

    @app_commands.command(name="help", description="The commands you can use here")
    @app_commands.guild_only()
    async def help(self, interaction: discord.Interaction) -> None:
        guild, member = guild_member(interaction)
        hidden = await self._switched_off(guild.id, member)
        lines: list[str] = []
        for command in self.bot.tree.get_commands(guild=None) + self.bot.tree.get_commands(guild=guild):
            if isinstance(command, app_commands.ContextMenu):
                if command.name not in hidden and _permitted(command, interaction):
                    lines.append(f"right-click a message -> Apps -> **{command.name}**")
                continue
            for leaf in _leaves(command):
                if leaf.qualified_name in hidden or not _permitted(leaf, interaction):
                    continue
                if await _checks_pass(leaf, interaction):
                    lines.append(f"`/{leaf.qualified_name}` {leaf.description}")
        lines.sort(key=lambda line: line.startswith("right"))  # slash commands first, in the tree's order
        for part in _pages(["**Commands you can use here**", *lines]):
            await send_ephemeral(interaction, part)

    async def _switched_off(self, guild_id: int, member: discord.Member) -> set[str]:
        """Commands this server's settings take away from this member."""
        settings = await self.store.guild_settings(guild_id)
        admin = member.guild_permissions.manage_guild
        off: set[str] = set()
        clone_role = settings["clone_role"]
        if not settings["cloning_enabled"] or (clone_role and not admin and member.get_role(clone_role) is None):
            off |= {"voice clone", "voice enroll"}
        if not settings["chat_enabled"] or not self.services.config.chat.enabled:
            off |= {"ask prompt", "ask reset"}
        blocks = await self.store.blocks(guild_id)
        role_ids = {r.id for r in member.roles}
        if ("user", member.id) in blocks or any(k == "role" and i in role_ids for k, i in blocks):
            off |= {"say", "Speak with my voice"}
        return off


def _pages(lines: list[str]) -> list[str]:
    """Whole lines joined into messages of at most MAX_REPLY_CHARS (a longer line is cut)."""
    pages: list[str] = []
    for line in lines:
        line = line[:MAX_REPLY_CHARS]
        if pages and len(pages[-1]) + 1 + len(line) <= MAX_REPLY_CHARS:
            pages[-1] += "\n" + line
        else:
            pages.append(line)
    return pages


def _leaves(command: Any) -> list[Any]:
    """A command, or every subcommand of a group, depth first."""
    if isinstance(command, app_commands.Group):
        return [leaf for sub in command.commands for leaf in _leaves(sub)]
    return [command]


def _permitted(command: Any, interaction: discord.Interaction) -> bool:
    """The member holds the default permissions of the command's top-level command (Discord applies those)."""
    root = command.root_parent if getattr(command, "root_parent", None) is not None else command
    needed = getattr(root, "default_permissions", None)
    return needed is None or interaction.permissions >= needed


async def _checks_pass(command: app_commands.Command[Any, ..., Any], interaction: discord.Interaction) -> bool:
    """discord.py's checks of the command (has_permissions, guild_only ...) for this member, without running it."""
    try:
        return await command._check_can_run(interaction)
    except app_commands.AppCommandError:
        return False


async def setup(bot: VoiceBot) -> None:
    await bot.add_cog(HelpCog(bot))
