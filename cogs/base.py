"""What every cog shares: one translation of errors into replies, and finding the voices a member may use.

A mistake gets an ephemeral reply that says how to fix it; an unexpected failure is logged with its traceback and
the user is told it was logged. :class:`ReplyingCog` wires this into discord.py's ``cog_app_command_error``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import discord
from discord import app_commands
from discord.ext import commands

from bot import SpeechError, Voice

if TYPE_CHECKING:
    from bot import Services, VoiceBot

__all__ = ("UsageError", "ReplyingCog", "VoiceChoice", "reply_error", "usable_voices", "find_voice")

log = logging.getLogger(__name__)

MAX_CHOICES = 25  # Discord's limit on autocomplete suggestions
UNEXPECTED = (
    "Something went wrong on my side; it has been logged. Try again, and if it keeps happening tell the "
    "bot's operator."
)


class UsageError(SpeechError):
    """A user's mistake (wrong argument, missing permission, nothing to act on); the message says the fix."""


def _perm_names(perms: list[str]) -> str:
    """``['manage_guild']`` -> ``'Manage Server'``."""
    names = {"manage_guild": "Manage Server"}
    return ", ".join(names.get(p, p.replace("_", " ").title()) for p in perms)


def _sentence(text: str) -> str:
    """Capitalise the first letter, as replies are sentences."""
    return text[:1].upper() + text[1:] if text else text


def describe_error(error: BaseException) -> tuple[str, bool]:
    """The reply for an error and whether it was unexpected (to be logged with its traceback).

    Parameters
    ----------
    error : BaseException
        What a command raised; discord.py's ``CommandInvokeError`` wrapper is looked through.

    Returns
    -------
    tuple[str, bool]
        ``(message, unexpected)``.
    """
    if isinstance(error, app_commands.CommandInvokeError):
        error = error.original
    if isinstance(error, SpeechError):  # includes UsageError and the synthesis errors, whose text names the fix
        return _sentence(str(error)), False
    if isinstance(error, app_commands.NoPrivateMessage):
        return "This command only works in a server.", False
    if isinstance(error, app_commands.MissingPermissions):
        return f"You need the {_perm_names(error.missing_permissions)} permission to do that.", False
    if isinstance(error, app_commands.BotMissingPermissions):
        return (
            f"I need the {_perm_names(error.missing_permissions)} permission here; ask a server admin to grant it.",
            False,
        )
    if isinstance(error, app_commands.CommandOnCooldown):
        return f"Slow down: try again in {error.retry_after:.0f} s.", False
    if isinstance(error, app_commands.TransformerError):
        return f"{error.value!r} is not a valid {error.type.name}; pick one of the suggestions.", False
    if isinstance(error, app_commands.CheckFailure):
        return (str(error) or "You can't use this command here."), False
    if isinstance(error, discord.Forbidden):
        return (
            "Discord refused: I am missing a permission here (View Channel, Connect, Speak or Send Messages); "
            "ask a server admin to grant it.",
            False,
        )
    if isinstance(error, (asyncio.TimeoutError, TimeoutError)):
        return "Discord did not answer in time; try again in a moment.", False
    if isinstance(error, discord.ClientException):
        return _sentence(str(error)) + ".", False
    return UNEXPECTED, True


async def send_ephemeral(interaction: discord.Interaction, content: str, **kwargs) -> None:
    """Reply ephemerally, as a response or a followup, whichever is still possible."""
    if interaction.response.is_done():
        await interaction.followup.send(content, ephemeral=True, **kwargs)
    else:
        await interaction.response.send_message(content, ephemeral=True, **kwargs)


async def reply_error(interaction: discord.Interaction, error: BaseException) -> None:
    """Translate ``error`` and tell the user (ephemeral); log it when it was unexpected."""
    message, unexpected = describe_error(error)
    name = interaction.command.qualified_name if interaction.command else "?"
    if unexpected:
        original = error.original if isinstance(error, app_commands.CommandInvokeError) else error
        log.error("command /%s failed", name, exc_info=original)
    else:
        log.debug("command /%s refused: %s", name, message)
    try:
        await send_ephemeral(interaction, message)
    except discord.HTTPException:
        log.warning("could not deliver the error reply for /%s (interaction expired?)", name)


class ReplyingCog(commands.Cog):
    """A cog whose slash-command errors become ephemeral replies (one ``cog_app_command_error`` for all).

    Parameters
    ----------
    bot : VoiceBot
        The client; the cog keeps its :class:`~bot.services.Services`.
    """

    def __init__(self, bot: VoiceBot) -> None:
        self.bot = bot
        self.services = bot.services
        assert self.services.store is not None and self.services.voices is not None, "the Discord cogs need the store"
        self.store = self.services.store
        self.voices = self.services.voices  # a voice's life: create, share, delete, forget-me, and reading voices

    async def cog_app_command_error(
        self, interaction: discord.Interaction, error: app_commands.AppCommandError
    ) -> None:
        await reply_error(interaction, error)


# ---- the voices a member may use in a guild -----------------------------------------------------------------------

@dataclass(frozen=True)
class VoiceChoice:
    """A voice a member may use in a guild, and how it is available to them."""

    voice: Voice
    kind: str  # "yours", "server", "shared" or "operator" (bot.voice_service.KIND_ORDER)

    @property
    def label(self) -> str:
        """``'alice (yours)'``: how lists and autocomplete show it."""
        return f"{self.voice.name} ({self.kind})"


async def usable_voices(services: Services, guild_id: int, user_id: int) -> list[VoiceChoice]:
    """The member's own voices, the guild's server voices, voices shared with the guild, the operator's voices.

    Each voice appears once, under the most personal way it is available.
    """
    assert services.voices is not None, "the Discord cogs need the store"
    return [VoiceChoice(voice, kind) for voice, kind in await services.voices.usable(guild_id, user_id)]


async def find_voice(services: Services, guild_id: int, user_id: int, value: str, *, own: bool = False) -> VoiceChoice:
    """The usable voice named (or with the id) ``value``; the member's own voices win a name clash.

    Raises
    ------
    UsageError
        No such voice is usable here; the message points at ``/voice list``.
    """
    choices = await usable_voices(services, guild_id, user_id)
    if own:
        choices = [c for c in choices if c.voice.owner_id == user_id]
    value = value.strip()
    for c in choices:
        if c.voice.id == value:
            return c
    for c in choices:
        if c.voice.name.lower() == value.lower():
            return c
    where = "of yours" if own else "you can use here"
    raise UsageError(f"There is no voice called {value!r} {where}: see /voice list, or clone one with /voice clone.")


async def voice_autocomplete(
    services: Services, interaction: discord.Interaction, current: str, *, own: bool = False
) -> list[app_commands.Choice[str]]:
    """Up to 25 usable voices whose name contains ``current``; the value sent back is the voice id."""
    if interaction.guild_id is None:
        return []
    choices = await usable_voices(services, interaction.guild_id, interaction.user.id)
    needle = current.strip().lower()
    return [
        app_commands.Choice(name=c.label[:100], value=c.voice.id)
        for c in choices
        if (not own or c.voice.owner_id == interaction.user.id) and needle in c.voice.name.lower()
    ][:MAX_CHOICES]


async def style_autocomplete(
    services: Services, interaction: discord.Interaction, current: str, *, own: bool = False
) -> list[app_commands.Choice[str]]:
    """Up to 25 named styles, containing ``current``, of the voice the command's ``name`` option names, else of the
    voice the member speaks with here."""
    if interaction.guild is None or not isinstance(interaction.user, discord.Member):
        return []
    named = getattr(interaction.namespace, "name", None)
    try:
        if named:
            voice = (await find_voice(services, interaction.guild.id, interaction.user.id, str(named), own=own)).voice
        elif services.speech is not None:
            voice = await services.speech.resolve_voice(interaction.guild, interaction.user)
        else:
            return []
    except (SpeechError, UsageError):  # no such voice (yet): nothing to offer
        return []
    needle = current.strip().lower()
    names = sorted(s.name for s in voice.styles.values())
    return [app_commands.Choice(name=n, value=n) for n in names if needle in n.lower()][:MAX_CHOICES]


def guild_member(interaction: discord.Interaction) -> tuple[discord.Guild, discord.Member]:
    """The guild and the invoking member; UsageError outside a server."""
    if interaction.guild is None or not isinstance(interaction.user, discord.Member):
        raise UsageError("This command only works in a server.")
    return interaction.guild, interaction.user


def is_admin(interaction: discord.Interaction) -> bool:
    """Whether the invoking member has Manage Server here."""
    return interaction.permissions.manage_guild
