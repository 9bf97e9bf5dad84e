"""The stand-in's gateway WebSocket: HELLO/IDENTIFY/READY, heartbeats, dispatches filtered by intents, and
the bot's own voice state updates (op 4), which hand it to the voice server."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Mapping
from typing import Any

from aiohttp import WSMsgType, web

from .base import (
    APP_FLAG_GATEWAY_GUILD_MEMBERS, APP_FLAG_GATEWAY_GUILD_MEMBERS_LIMITED, APP_FLAG_GATEWAY_MESSAGE_CONTENT,
    APP_FLAG_GATEWAY_MESSAGE_CONTENT_LIMITED, APP_FLAG_GATEWAY_PRESENCE, APP_FLAG_GATEWAY_PRESENCE_LIMITED,
    CLOSE_DISALLOWED_INTENTS, EVENT_INTENTS, GATEWAY_HEARTBEAT_MS, INTENT_GUILD_MEMBERS, INTENT_GUILD_PRESENCES,
    INTENT_MESSAGE_CONTENT, INTENTS_ALL, INTENTS_PRIVILEGED, StandinError,
)
from .model import GUILD_STAGE_VOICE, VoiceState

log = logging.getLogger(__name__)


class Gateway:
    """The gateway session; part of :class:`~tests.standin.server.Standin`, whose state it uses."""

    # ------------------------------------------------------------------ gateway

    async def _handle_gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self._gateway_sockets.add(ws)
        await ws.send_str(json.dumps({"op": 10, "d": {"heartbeat_interval": GATEWAY_HEARTBEAT_MS}, "s": None, "t": None}))
        try:
            async for msg in ws:
                if msg.type is not WSMsgType.TEXT:
                    continue
                frame = json.loads(msg.data)
                await self._gateway_op(ws, frame["op"], frame.get("d"))
        finally:
            self._gateway_sockets.discard(ws)
            if self._gateway is ws:
                self._gateway = None
                self._ready.clear()
        return ws

    async def _gateway_op(self, ws: web.WebSocketResponse, op: int, data: Any) -> None:
        """Answer one client opcode."""
        if op == 1:
            await ws.send_str(json.dumps({"op": 11, "d": None, "s": None, "t": None}))
        elif op == 2:
            if data.get("token") != self.token:
                await ws.close(code=4004, message=b"Authentication failed.")
                return
            if self._disallowed_intents(int(data.get("intents", 0))):
                await ws.close(code=CLOSE_DISALLOWED_INTENTS, message=b"Disallowed intent(s).")
                return
            self.identify_payload = data
            self._gateway, self._seq = ws, 0
            self._session_id = secrets.token_hex(16)
            await self._dispatch("READY", {
                "v": 10, "user": {**self.bot_user.payload(), "verified": True, "mfa_enabled": False, "flags": 0},
                "guilds": [{"id": str(g), "unavailable": True} for g in self.guilds],
                "session_id": self._session_id, "resume_gateway_url": self.gateway_url,
                "shard": [0, 1], "application": {"id": str(self.application_id), "flags": self.application_flags},
                "private_channels": [], "relationships": [], "presences": [], "user_settings": {},
                "geo_ordered_rtc_regions": ["local"], "guild_join_requests": [],
            })
            for guild in self.guilds.values():
                await self._dispatch("GUILD_CREATE", guild.payload())
            self._ready.set()
        elif op == 6:
            if data.get("token") != self.token or data.get("session_id") != self._session_id:
                await ws.send_str(json.dumps({"op": 9, "d": False, "s": None, "t": None}))
                return
            self._gateway = ws
            await self._dispatch("RESUMED", {})
            self._ready.set()
        elif op == 3:
            self.presence_updates.append(data)
        elif op == 4:
            self.gateway_voice_updates.append(data)
            await self._bot_voice_state(int(data["guild_id"]), data.get("channel_id"), data)
        elif op == 8:
            guild = self.guilds[int(data["guild_id"])]
            chunk = {"guild_id": str(guild.id), "members": [m.payload() for m in guild.members.values()],
                     "chunk_index": 0, "chunk_count": 1, "not_found": [], "nonce": data.get("nonce")}
            await self._dispatch("GUILD_MEMBERS_CHUNK", chunk)
        self._touch()

    def _disallowed_intents(self, intents: int) -> int:
        """The privileged intents asked for that the application's flags do not switch on (Discord closes 4014)."""
        allowed = 0
        for intent, flags in ((INTENT_GUILD_MEMBERS, APP_FLAG_GATEWAY_GUILD_MEMBERS | APP_FLAG_GATEWAY_GUILD_MEMBERS_LIMITED),
                              (INTENT_GUILD_PRESENCES, APP_FLAG_GATEWAY_PRESENCE | APP_FLAG_GATEWAY_PRESENCE_LIMITED),
                              (INTENT_MESSAGE_CONTENT,
                               APP_FLAG_GATEWAY_MESSAGE_CONTENT | APP_FLAG_GATEWAY_MESSAGE_CONTENT_LIMITED)):
            if self.application_flags & flags:
                allowed |= intent
        return intents & INTENTS_PRIVILEGED & ~allowed

    async def _dispatch(self, event: str, data: Any) -> None:
        """Send one dispatch (op 0) to the connected bot, filtered by the intents it identified with."""
        ws = self._gateway
        if ws is None or ws.closed:
            raise StandinError(f"cannot dispatch {event}: no bot is connected to the gateway")
        data = self._filter_by_intents(event, data)
        if data is None:
            log.debug("stand-in: %s withheld, the bot lacks the intent", event)
            return
        self._seq += 1
        await ws.send_str(json.dumps({"op": 0, "t": event, "s": self._seq, "d": data}))

    def _filter_by_intents(self, event: str, data: Any) -> Any:
        """What Discord would send for an event given the IDENTIFY intents: the data, a redacted copy or None."""
        intents = int((self.identify_payload or {}).get("intents", INTENTS_ALL))
        needed = EVENT_INTENTS.get(event)
        if needed is not None and not intents & needed:
            if not (event == "VOICE_STATE_UPDATE" and int(data["user_id"]) == self.bot_user.id):
                return None
        if event in ("MESSAGE_CREATE", "MESSAGE_UPDATE") and not intents & INTENT_MESSAGE_CONTENT:
            by_bot = int(data["author"]["id"]) == self.bot_user.id
            mentions_bot = any(int(u["id"]) == self.bot_user.id for u in data.get("mentions", []))
            if not (by_bot or mentions_bot):  # privileged: content, embeds, attachments, components are emptied
                data = {**data, "content": "", "embeds": [], "attachments": [], "components": []}
        return data

    async def _bot_voice_state(self, guild_id: int, channel_id: str | None, data: Mapping[str, Any]) -> None:
        """The bot asked (op 4) to join, move or leave: VOICE_STATE_UPDATE, then VOICE_SERVER_UPDATE on a join."""
        guild = self.guilds[guild_id]
        bot_id = self.bot_user.id
        if channel_id is None:
            state = guild.voice_states.pop(bot_id, None) or VoiceState(bot_id, None, self._session_id)
            state.channel_id = None
            await self._dispatch("VOICE_STATE_UPDATE", state.payload(guild))
            self._voice_tokens.pop(guild_id, None)
            return
        if int(channel_id) not in guild.channels:
            log.warning("stand-in: bot asked to join unknown channel %s", channel_id)
            return
        previous = guild.voice_states.get(bot_id)
        rejoin = previous is not None and previous.channel_id == int(channel_id)
        state = VoiceState(bot_id, int(channel_id), self._session_id, bool(data.get("self_mute")),
                           bool(data.get("self_deaf")),
                           suppress=guild.channels[int(channel_id)].type == GUILD_STAGE_VOICE)  # a Stage: audience
        guild.voice_states[bot_id] = state
        token = secrets.token_hex(8)
        self._voice_tokens[guild_id] = token
        server_update = {"token": token, "guild_id": str(guild_id), "endpoint": f"127.0.0.1:{self.voice_port}"}
        # The two events are unordered on Discord. For a re-join of the same channel (discord.py's resume after
        # close code 4015, sent while it still counts itself connected) it only completes the handshake when the
        # server update comes first, so that order is used there.
        if rejoin:
            await self._dispatch("VOICE_SERVER_UPDATE", server_update)
        await self._dispatch("VOICE_STATE_UPDATE", state.payload(guild))
        if not rejoin:
            await self._dispatch("VOICE_SERVER_UPDATE", server_update)
