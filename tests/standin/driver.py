"""Driving the bot the way Discord users do: messages, slash and context-menu commands, autocomplete, buttons,
modals, members moving between voice channels, deleted channels and dropped voice connections."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Iterable, Mapping
from typing import Any


from .base import (
    ATTACHMENT_SIZE_LIMIT, OPTION_SUBCOMMAND, OPTION_GROUP, OPTION_USER, OPTION_CHANNEL, OPTION_ROLE,
    OPTION_MENTIONABLE, OPTION_ATTACHMENT, OPTION_CASTS, StandinError, without_user, has_component,
)
from .model import GUILD_STAGE_VOICE, Channel, Guild, Interaction, VoiceState

log = logging.getLogger(__name__)


class Driver:
    """What a test does as Discord's users; part of :class:`~tests.standin.server.Standin`."""

    async def send_message(
        self, channel_id: int, author_id: int, content: str, *, attachments: Iterable[Mapping[str, Any]] = (),
        mentions: Iterable[int] | None = None,
    ) -> dict[str, Any]:
        """A human posts a message: MESSAGE_CREATE. Mentions default to the ``<@id>`` in ``content``."""
        message = self._new_message(channel_id, self.users[author_id], {"content": content}, [], attachments=attachments)
        if mentions is not None:
            guild = self.guilds[int(message["guild_id"])]
            message["mentions"] = [self._user_with_member(guild, self.users[u]) for u in mentions]
        await self._dispatch("MESSAGE_CREATE", message)
        return message

    async def edit_message(self, message_id: int, content: str) -> dict[str, Any]:
        """A human edits their message: MESSAGE_UPDATE with the full new message."""
        message = self._edit_message(message_id, {"content": content}, [])
        await self._dispatch("MESSAGE_UPDATE", message)
        return message

    async def delete_message(self, message_id: int) -> None:
        """A message disappears: MESSAGE_DELETE."""
        message = self.messages.pop(message_id)
        payload = {"id": str(message_id), "channel_id": message["channel_id"], "guild_id": message["guild_id"]}
        await self._dispatch("MESSAGE_DELETE", payload)

    # ------------------------------------------------------------------ interactions: driving the bot

    async def invoke_slash(
        self, guild_id: int, user_id: int, name: str, options: Mapping[str, Any] | None = None, *,
        subcommand: str | None = None, attachments: Mapping[str, Mapping[str, Any]] | None = None,
        channel_id: int | None = None,
    ) -> int:
        """A member runs a synced slash command; returns the interaction id.

        ``options`` maps option names to values (cast by the synced option type; user, channel and role options
        take ids; attachment options take a payload from ``add_attachment``, or give them in ``attachments``).
        ``subcommand`` is ``"sub"`` or ``"group sub"``.
        """
        command = self._command(guild_id, name, 1)
        resolved: dict[str, dict[str, Any]] = {}
        values = {**(options or {}), **(attachments or {})}
        built = self._build_options(self.guilds[guild_id], command, values, resolved, subcommand, focused=None)
        data = {"id": command["id"], "name": name, "type": 1, "options": built}
        if resolved:
            data["resolved"] = resolved
        if "guild_id" in command:
            data["guild_id"] = command["guild_id"]
        return (await self._create_interaction(2, guild_id, user_id, data, channel_id=channel_id)).id

    async def autocomplete(
        self, guild_id: int, user_id: int, name: str, options: Mapping[str, Any], focused: str, *,
        subcommand: str | None = None, timeout: float = 5.0,
    ) -> list[dict[str, Any]]:
        """A member types into option ``focused``: interaction type 4; returns the bot's choices (response type 8)."""
        command = self._command(guild_id, name, 1)
        built = self._build_options(self.guilds[guild_id], command, options, {}, subcommand, focused=focused)
        data = {"id": command["id"], "name": name, "type": 1, "options": built}
        interaction = await self._create_interaction(4, guild_id, user_id, data)
        reply = await self.wait_reply(interaction.id, lambda r: r.kind == "callback", timeout)
        if reply.type != 8:
            raise StandinError(f"autocomplete answered with response type {reply.type}, expected 8")
        return reply.payload["data"]["choices"]

    async def invoke_message_command(self, guild_id: int, user_id: int, name: str, message_id: int) -> int:
        """A member runs a message context-menu command on a message; returns the interaction id."""
        command = self._command(guild_id, name, 3)
        target = self._message(message_id)
        data = {
            "id": command["id"], "name": name, "type": 3, "target_id": str(message_id),
            "resolved": {"messages": {str(message_id): target}},
        }
        return (await self._create_interaction(2, guild_id, user_id, data, channel_id=int(target["channel_id"]))).id

    async def invoke_user_command(self, guild_id: int, user_id: int, name: str, target_user_id: int) -> int:
        """A member runs a user context-menu command on a member; returns the interaction id."""
        command = self._command(guild_id, name, 2)
        resolved: dict[str, dict[str, Any]] = {}
        self._resolve(self.guilds[guild_id], OPTION_USER, target_user_id, resolved)
        data = {"id": command["id"], "name": name, "type": 2, "target_id": str(target_user_id), "resolved": resolved}
        return (await self._create_interaction(2, guild_id, user_id, data)).id

    async def click_button(self, message: Mapping[str, Any] | int, custom_id: str, user_id: int) -> int:
        """A member clicks a button on a message the bot sent (interaction type 3); returns the interaction id."""
        return await self.use_component(message, custom_id, user_id, component_type=2)

    async def use_component(
        self, message: Mapping[str, Any] | int, custom_id: str, user_id: int, *, component_type: int = 2,
        values: list[str] | None = None,
    ) -> int:
        """A member uses a component (2 button, 3 string select, ...) on a bot message; returns the interaction id."""
        mid = message if isinstance(message, int) else int(message["id"])
        current = self._message(mid)
        if not has_component(current.get("components") or [], custom_id):
            raise StandinError(f"message {mid} has no component with custom_id {custom_id!r}")
        data: dict[str, Any] = {"custom_id": custom_id, "component_type": component_type}
        if values is not None:
            data["values"] = values
        guild_id = int(current["guild_id"])
        interaction = await self._create_interaction(
            3, guild_id, user_id, data, channel_id=int(current["channel_id"]), message=current
        )
        return interaction.id

    async def submit_modal(self, interaction_id: int, user_id: int, values: Mapping[str, str]) -> int:
        """A member submits the modal the bot opened in answer to ``interaction_id`` (type 5); returns its id."""
        parent = self.interactions[interaction_id]
        modal = next((r.payload["data"] for r in parent.replies if r.kind == "callback" and r.type == 9), None)
        if modal is None:
            raise StandinError(f"interaction {interaction_id} was not answered with a modal")
        rows = [
            {"type": 1, "components": [{"type": 4, "custom_id": cid, "value": value}]} for cid, value in values.items()
        ]
        data = {"custom_id": modal["custom_id"], "components": rows}
        return (await self._create_interaction(5, parent.guild_id, user_id, data, channel_id=parent.channel_id)).id

    def _command(self, guild_id: int, name: str, type_: int) -> dict[str, Any]:
        """The synced command (guild first, then global), or an error that lists what is synced."""
        command = self.commands.get((guild_id, name, type_)) or self.commands.get((None, name, type_))
        if command is None:
            synced = sorted(f"{k[1]} (type {k[2]})" for k in self.commands)
            raise StandinError(f"no synced command {name!r} of type {type_}; synced: {synced or 'none'}")
        return command

    def _build_options(
        self, guild: Guild, command: Mapping[str, Any], values: Mapping[str, Any], resolved: dict[str, dict[str, Any]],
        subcommand: str | None, focused: str | None,
    ) -> list[dict[str, Any]]:
        """Turn ``{name: value}`` into Discord's typed option list, nesting subcommands and filling ``resolved``."""
        schema = list(command.get("options") or [])
        path = subcommand.split() if subcommand else []
        chain: list[dict[str, Any]] = []
        for part in path:
            kinds = (OPTION_SUBCOMMAND, OPTION_GROUP)
            node = next((o for o in schema if o["name"] == part and o["type"] in kinds), None)
            if node is None:
                raise StandinError(f"command {command['name']!r} has no subcommand {part!r}")
            chain.append(node)
            schema = list(node.get("options") or [])
        leaf: list[dict[str, Any]] = []
        for name, value in values.items():
            spec = next((o for o in schema if o["name"] == name), None)
            if spec is None:
                raise StandinError(f"no option {name!r}; options are {[o['name'] for o in schema]}")
            option: dict[str, Any] = {"name": name, "type": spec["type"]}
            if name == focused:
                option.update(value=str(value), focused=True)
            else:
                option["value"] = self._resolve(guild, spec["type"], value, resolved)
            leaf.append(option)
        for node in reversed(chain):
            leaf = [{"name": node["name"], "type": node["type"], "options": leaf}]
        return leaf

    def _resolve(self, guild: Guild, type_: int, value: Any, resolved: dict[str, dict[str, Any]]) -> Any:
        """The wire value of one option; entity options also go into ``resolved``."""
        if type_ in OPTION_CASTS:
            return OPTION_CASTS[type_](value)
        if type_ == OPTION_ATTACHMENT:
            if not isinstance(value, Mapping):
                raise StandinError("attachment options take the payload returned by add_attachment()")
            resolved.setdefault("attachments", {})[str(value["id"])] = dict(value)
            return str(value["id"])
        key = str(int(value))
        if type_ in (OPTION_USER, OPTION_MENTIONABLE) and int(value) in self.users:
            resolved.setdefault("users", {})[key] = self.users[int(value)].payload()
            if int(value) in guild.members:
                member = without_user(guild.members[int(value)].payload())
                member["permissions"] = str(guild.permissions_of(int(value)))
                resolved.setdefault("members", {})[key] = member
        elif type_ in (OPTION_ROLE, OPTION_MENTIONABLE) and int(value) in guild.roles:
            resolved.setdefault("roles", {})[key] = guild.roles[int(value)].payload()
        elif type_ == OPTION_CHANNEL and int(value) in guild.channels:
            channel = guild.channels[int(value)].payload()
            resolved.setdefault("channels", {})[key] = {**channel, "permissions": str(guild.permissions_of(0))}
        return key

    async def _create_interaction(
        self, type_: int, guild_id: int, user_id: int, data: dict[str, Any], *, channel_id: int | None = None,
        message: dict[str, Any] | None = None,
    ) -> Interaction:
        """Record an interaction and dispatch INTERACTION_CREATE."""
        guild = self.guilds[guild_id]
        layout = next(lay for lay in self.layouts if lay.guild_id == guild_id)
        channel = self.channels[channel_id or layout.text_channel_id]
        if user_id not in guild.members:
            raise StandinError(f"user {user_id} is not a member of guild {guild_id}")
        member = guild.members[user_id].payload()
        member["permissions"] = str(guild.permissions_of(user_id))
        interaction = Interaction(
            id=self._snowflake(), token="itok_" + secrets.token_urlsafe(24), type=type_, guild_id=guild_id,
            channel_id=channel.id, user_id=user_id, data=data, created_at=time.monotonic(), message=message,
        )
        self.interactions[interaction.id] = interaction
        payload: dict[str, Any] = {
            "id": str(interaction.id),
            "application_id": str(self.application_id),
            "type": type_,
            "token": interaction.token,
            "version": 1,
            "guild_id": str(guild_id),
            "guild": {"id": str(guild_id), "locale": "en-US", "features": []},
            "channel_id": str(channel.id),
            "channel": channel.payload(),
            "member": member,
            "data": data,
            "locale": "en-US",
            "guild_locale": "en-US",
            "app_permissions": str(guild.permissions_of(self.bot_user.id)),
            "entitlements": [],
            "authorizing_integration_owners": {"0": str(guild_id)},
            "context": 0,
            "attachment_size_limit": ATTACHMENT_SIZE_LIMIT,
        }
        if message is not None:
            payload["message"] = message
        await self._dispatch("INTERACTION_CREATE", payload)
        return interaction

    # ------------------------------------------------------------------ gateway: driving the bot

    async def move_member(self, user_id: int, channel_id: int | None, *, guild_id: int | None = None) -> None:
        """A human joins, moves to or leaves (None) a voice channel: VOICE_STATE_UPDATE."""
        if channel_id is not None:
            guild = self.guilds[self.channels[channel_id].guild_id]
        elif guild_id is not None:
            guild = self.guilds[guild_id]
        else:
            in_voice = (g for g in self.guilds.values() if user_id in g.voice_states)
            guild = next(in_voice, self.guilds[self.layout.guild_id])
        if channel_id is None:
            state = guild.voice_states.pop(user_id, None) or VoiceState(user_id, None)
            state.channel_id = None
        else:
            state = guild.voice_states.get(user_id) or VoiceState(user_id, channel_id)
            state.channel_id = channel_id
            state.suppress = self.channels[channel_id].type == GUILD_STAGE_VOICE  # a Stage is joined as audience
            guild.voice_states[user_id] = state
        await self._dispatch("VOICE_STATE_UPDATE", state.payload(guild))

    async def add_stage_channel(self, guild_id: int, name: str = "Stage") -> int:
        """A Stage channel is created: CHANNEL_CREATE; returns its id."""
        guild = self.guilds[guild_id]
        channel = Channel(self._snowflake(), guild_id, name, GUILD_STAGE_VOICE, len(guild.channels))
        guild.channels[channel.id] = channel
        self.channels[channel.id] = channel
        await self._dispatch("CHANNEL_CREATE", channel.payload())
        return channel.id

    async def set_stage_speaker(self, user_id: int, guild_id: int, speaker: bool = True) -> None:
        """A Stage moderator invites a member to speak (or moves them back to the audience): VOICE_STATE_UPDATE."""
        guild = self.guilds[guild_id]
        state = guild.voice_states[user_id]
        state.suppress = not speaker
        await self._dispatch("VOICE_STATE_UPDATE", state.payload(guild))

    async def set_member_overwrite(self, channel_id: int, user_id: int, *, allow: int = 0, deny: int = 0) -> None:
        """A channel's permission overwrite for one member (the bot, say) changes: CHANNEL_UPDATE."""
        channel = self.channels[channel_id]
        channel.member_overwrites[user_id] = (allow, deny)
        await self._dispatch("CHANNEL_UPDATE", channel.payload())

    async def delete_channel(self, channel_id: int) -> None:
        """A channel is deleted: everyone in it (the bot included) is dropped from voice, then CHANNEL_DELETE."""
        channel = self.channels[channel_id]
        guild = self.guilds[channel.guild_id]
        for user_id, state in list(guild.voice_states.items()):
            if state.channel_id != channel_id:
                continue
            if user_id == self.bot_user.id:
                await self.disconnect_voice(guild.id, code=4014)
            else:
                await self.move_member(user_id, None, guild_id=guild.id)
        del guild.channels[channel_id]
        del self.channels[channel_id]
        await self._dispatch("CHANNEL_DELETE", channel.payload())

    async def disconnect_voice(self, guild_id: int, *, code: int = 4014) -> None:
        """Drop the bot's voice connection from the server side.

        ``code=4014`` (disconnected: kicked, channel deleted) first tells the gateway the bot left (VOICE_STATE_UPDATE
        with no channel) and then closes the voice WebSocket, so discord.py gives up. Any other code (4006 session
        no longer valid, 4015 voice server crashed, ...) only closes the voice WebSocket, so discord.py reconnects
        (4015: resumes).
        """
        guild = self.guilds[guild_id]
        if code == 4014 and self.bot_user.id in guild.voice_states:
            state = guild.voice_states.pop(self.bot_user.id)
            state.channel_id = None
            await self._dispatch("VOICE_STATE_UPDATE", state.payload(guild))
        conn = self.voice_connections.get(guild_id)
        if conn is not None and not conn.ws.closed:
            if code != 4014 and guild_id in self._udp:
                self._udp[guild_id].poke(conn.ssrc)
                await asyncio.sleep(0.02)  # let the client's reader thread wake before its socket is replaced
            await conn.ws.close(code=code, message=b"disconnected by the stand-in")
