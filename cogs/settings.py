"""``/settings``, ``/set guild <setting> <value>`` and ``/set user <setting> <value>``.

The settings themselves (types, defaults, bounds, help) are the store's one table of definitions; this cog only
turns what a member typed into a typed value (names of channels, roles and voices into ids) and shows values back.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands

from bot import VoiceNotFound
from bot.store import GUILD_SETTINGS, USER_SETTINGS, SettingDef, setting_def
from cogs.base import (
    MAX_CHOICES,
    ReplyingCog,
    UsageError,
    find_voice,
    guild_member,
    send_ephemeral,
    usable_voices,
    voice_autocomplete,
)

if TYPE_CHECKING:
    from bot import VoiceBot

log = logging.getLogger(__name__)

_USER_ID_RE = re.compile(r"^<@!?(\d{15,21})>$|^(\d{15,21})$")


def _setting_choices(table: dict[str, SettingDef]) -> list[app_commands.Choice[str]]:
    """Static choices for a setting-name option (Discord allows 25; both tables are smaller)."""
    assert len(table) <= MAX_CHOICES
    return [app_commands.Choice(name=f"{name}: {d.help}"[:100], value=name) for name, d in table.items()]


class SettingsCog(ReplyingCog):
    """Show and change guild and user settings."""

    set_group = app_commands.Group(name="set", description="Change a setting", guild_only=True)

    # ---- show ------------------------------------------------------------------------------------------------------

    @app_commands.command(name="settings", description="Show this server's settings and yours")
    @app_commands.guild_only()
    async def settings(self, interaction: discord.Interaction) -> None:
        guild, member = guild_member(interaction)
        guild_values = await self.store.guild_settings(guild.id)
        user_values = await self.store.user_settings(member.id, guild.id)
        lines = ["**Server settings** (change with `/set guild`, needs Manage Server)"]
        lines += [f"`{n}` = {await self._show(guild, d, guild_values[n])}" for n, d in GUILD_SETTINGS.items()]
        lines.append("**Your settings** (change with `/set user`)")
        lines += [f"`{n}` = {await self._show(guild, d, user_values[n])}" for n, d in USER_SETTINGS.items()]
        await send_ephemeral(interaction, "\n".join(lines)[:2000])

    async def _voice_name(self, voice_id: str) -> str:
        """A voice's name, or a note that it is gone."""
        try:
            return f"**{(await self.voices.get(voice_id)).name}**"
        except VoiceNotFound:
            return f"(deleted voice {voice_id})"

    async def _show(self, guild: discord.Guild, d: SettingDef, value: Any) -> str:
        """A value as a member reads it."""
        if value is None or value == {}:
            return "none"
        if d.kind == "bool":
            return "on" if value else "off"
        if d.kind == "channel":
            return f"<#{value}>"
        if d.kind == "role":
            return f"<@&{value}>"
        if d.kind == "voice":
            return await self._voice_name(value)
        if d.kind == "voice_map":
            return ", ".join([f"<@{bot_id}> → {await self._voice_name(vid)}" for bot_id, vid in value.items()])
        if d.kind == "float":
            return f"{value:g}"
        return str(value)

    # ---- change ----------------------------------------------------------------------------------------------------

    async def _value_autocomplete(self, interaction: discord.Interaction, current: str) -> list[app_commands.Choice[str]]:
        """Suggestions that fit the chosen setting: on/off, channels, roles, voices, choices."""
        scope = "user" if interaction.command is not None and interaction.command.name == "user" else "guild"
        table = USER_SETTINGS if scope == "user" else GUILD_SETTINGS
        d = table.get(getattr(interaction.namespace, "setting", None) or "")
        guild = interaction.guild
        if d is None or guild is None:
            return []
        needle = current.strip().lower().lstrip("#@")
        pairs: list[tuple[str, str]] = []  # (label, value)
        if d.kind == "bool":
            pairs = [("true", "true"), ("false", "false")]
        elif d.kind == "choice":
            pairs = [(c, c) for c in d.choices]
        elif d.kind == "channel":
            pairs = [(f"#{c.name}", str(c.id)) for c in guild.text_channels]
        elif d.kind == "role":
            pairs = [(f"@{r.name}", str(r.id)) for r in guild.roles if not r.is_default()]
        elif d.kind in ("voice", "voice_map"):
            choices = await usable_voices(self.services, guild.id, interaction.user.id)
            if d.kind == "voice_map":
                bots = [m for m in guild.members if m.bot and m.id != guild.me.id]
                pairs = [(f"@{m.name} {c.voice.name}", f"{m.id} {c.voice.id}") for m in bots for c in choices]
                pairs += [(f"@{m.name} none", f"{m.id} none") for m in bots]
            else:
                pairs = [(c.label, c.voice.id) for c in choices]
        if d.nullable or d.kind in ("channel", "role", "voice", "text"):
            pairs.append(("none", "none"))
        return [
            app_commands.Choice(name=label[:100], value=value[:100])
            for label, value in pairs
            if needle in label.lower()
        ][:MAX_CHOICES]

    @set_group.command(name="guild", description="Change a server setting (needs Manage Server)")
    @app_commands.describe(setting="The setting to change", value="The new value (none to reset)")
    @app_commands.choices(setting=_setting_choices(GUILD_SETTINGS))
    @app_commands.autocomplete(value=_value_autocomplete)
    @app_commands.checks.has_permissions(manage_guild=True)
    async def set_guild(self, interaction: discord.Interaction, setting: str, value: str) -> None:
        guild, member = guild_member(interaction)
        d = setting_def("guild", setting)
        if d.kind == "voice_map":
            await self._set_bot_voice(interaction, guild, member, value)
            return
        typed = await self._parse(guild, member, d, value)
        if d.kind == "channel" and typed is not None:
            channel = guild.get_channel(typed)
            if channel is None or not isinstance(channel, (discord.TextChannel, discord.VoiceChannel)):
                raise UsageError(f"{setting} must be a text channel of this server; pick one from the suggestions.")
        if d.kind == "role" and typed is not None and guild.get_role(typed) is None:
            raise UsageError(f"{setting} must be a role of this server; pick one from the suggestions.")
        stored = await self.store.set_guild_setting(guild.id, setting, typed)
        await send_ephemeral(interaction, f"`{setting}` is now {await self._show(guild, d, stored)}.")

    @set_group.command(name="user", description="Change one of your settings")
    @app_commands.describe(
        setting="The setting to change", value="The new value (none to reset)",
        here="Only in this server (default: everywhere)",
    )
    @app_commands.choices(setting=_setting_choices(USER_SETTINGS))
    @app_commands.autocomplete(value=_value_autocomplete)
    async def set_user(self, interaction: discord.Interaction, setting: str, value: str, here: bool = False) -> None:
        guild, member = guild_member(interaction)
        d = setting_def("user", setting)
        typed = await self._parse(guild, member, d, value)
        if d.kind == "voice" and typed is not None and not here:
            if (await self.voices.get(typed)).owner_id != member.id:
                here = True  # a server or shared voice only exists in this server
        stored = await self.store.set_user_setting(member.id, setting, typed, guild_id=guild.id if here else None)
        scope = "in this server" if here else "everywhere"
        await send_ephemeral(interaction, f"Your `{setting}` is now {await self._show(guild, d, stored)} {scope}.")

    async def _voice_autocomplete(self, interaction: discord.Interaction, current: str):
        return await voice_autocomplete(self.services, interaction, current)

    @set_group.command(name="bot-voice", description="The voice another bot's messages are read in (Manage Server)")
    @app_commands.describe(bot="The bot whose messages are read", voice="A server or shared voice (none: stop)")
    @app_commands.autocomplete(voice=_voice_autocomplete)
    @app_commands.checks.has_permissions(manage_guild=True)
    async def set_bot_voice(self, interaction: discord.Interaction, bot: discord.Member, voice: str) -> None:
        guild, member = guild_member(interaction)
        await self._set_bot_voice(interaction, guild, member, f"{bot.id} {voice}", target=bot)

    async def _parse(self, guild: discord.Guild, member: discord.Member, d: SettingDef, raw: str) -> Any:
        """What the member typed -> the typed value (names of channels, roles and voices become ids)."""
        text = raw.strip()
        if d.kind == "voice" and text.lower() not in ("", "none", "null", "off", "unset", "-"):
            choice = await find_voice(self.services, guild.id, member.id, text)
            if d.scope == "guild" and choice.kind == "yours":
                raise UsageError(
                    f"**{choice.voice.name}** is your private voice: share it first with /voice share, "
                    "then make it the server default."
                )
            return choice.voice.id
        if d.kind == "channel":
            by_name = discord.utils.get(guild.text_channels, name=text.lstrip("#"))
            if by_name is not None:
                return by_name.id
        if d.kind == "role":
            by_name = discord.utils.get(guild.roles, name=text.lstrip("@"))
            if by_name is not None and not by_name.is_default():
                return by_name.id
        return d.parse(text)

    async def _set_bot_voice(
        self,
        interaction: discord.Interaction,
        guild: discord.Guild,
        member: discord.Member,
        value: str,
        target: discord.Member | None = None,
    ) -> None:
        """``/set guild bot_voices <@bot> <voice|none>``: one entry of the map."""
        parts = value.split(maxsplit=1)
        match = _USER_ID_RE.match(parts[0]) if parts else None
        if match is None or len(parts) < 2:
            raise UsageError(
                "bot_voices takes a bot and a voice: `@SomeBot narrator`, or `@SomeBot none` to remove it "
                "(or use /set bot-voice)."
            )
        bot_id = int(match.group(1) or match.group(2))
        target = target or guild.get_member(bot_id)
        if target is not None and not target.bot:
            raise UsageError(f"{target.display_name} is not a bot; bot_voices is for bots whose messages are read.")
        voice_id = None
        if parts[1].strip().lower() not in ("none", "off", "-"):
            choice = await find_voice(self.services, guild.id, member.id, parts[1])
            if choice.kind == "yours":
                raise UsageError(f"**{choice.voice.name}** is your private voice: share it first with /voice share.")
            voice_id = choice.voice.id
        mapping = await self.store.set_bot_voice(guild.id, bot_id, voice_id)
        d = GUILD_SETTINGS["bot_voices"]
        await send_ephemeral(interaction, f"`bot_voices` is now {await self._show(guild, d, mapping)}.")


async def setup(bot: VoiceBot) -> None:
    await bot.add_cog(SettingsCog(bot))
