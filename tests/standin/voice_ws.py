"""The stand-in's voice WebSocket (TLS, because discord.py hard-codes ``wss://``): identify, select protocol,
the session key, heartbeats, and DAVE's opcodes when the stand-in speaks it (``Standin(dave=True)``: see
:mod:`tests.standin.dave`); the audio itself arrives on UDP (:mod:`tests.standin.voice_udp`)."""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from typing import Any

from aiohttp import WSMsgType, web

from .base import VOICE_HEARTBEAT_MS, VOICE_MODES, StandinError, VoiceConnection
from .dave import OP_INVALID_COMMIT_WELCOME, OP_TRANSITION_READY, DaveGroup, DaveListener, DaveMember
from .voice_udp import SUPPORTED_MODE, VoiceUdpEndpoint

log = logging.getLogger(__name__)


class VoiceGateway:
    """Voice WebSocket sessions; part of :class:`~tests.standin.server.Standin`, whose state they use."""

    # ------------------------------------------------------------------ voice WebSocket (TLS)

    async def _handle_voice_ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str(json.dumps({"op": 8, "d": {"heartbeat_interval": VOICE_HEARTBEAT_MS}}))
        conn: VoiceConnection | None = None
        try:
            async for msg in ws:
                if msg.type is WSMsgType.BINARY:
                    if conn is not None:
                        conn.binary_frames.append(msg.data)
                        if conn.dave is not None:
                            await self._dave_group(conn.guild_id).receive_binary(conn.dave, msg.data)
                    continue
                if msg.type is not WSMsgType.TEXT:
                    continue
                frame = json.loads(msg.data)
                conn = await self._voice_op(ws, conn, frame["op"], frame.get("d") or {})
                self._touch()
        finally:
            if conn is not None:
                log.debug("stand-in: voice socket of guild %s closed (%s)", conn.guild_id, ws.close_code)
                if conn.dave is not None:
                    await self._dave_group(conn.guild_id).leave(conn.dave)
        return ws

    async def _voice_op(
        self, ws: web.WebSocketResponse, conn: VoiceConnection | None, op: int, data: dict[str, Any]
    ) -> VoiceConnection | None:
        """Answer one voice opcode; returns the connection once identified."""
        if op in (0, 7):
            guild_id = int(data["server_id"])
            if data.get("token") != self._voice_tokens.get(guild_id) or data.get("session_id") != self._session_id:
                await ws.close(code=4004 if op == 0 else 4006, message=b"Authentication failed.")
                return None
            previous = self.voice_connections.get(guild_id)
            if op == 7 and previous is not None:
                conn = VoiceConnection(guild_id, ws, previous.identify, previous.ssrc, previous.mode, previous.secret_key)
                self.voice_connections[guild_id] = conn
                await ws.send_str(json.dumps({"op": 9, "d": None}))
                # discord.py waits for a secret key on every new voice socket, resumed or not
                await self._send_session_description(conn)
                return conn
            if guild_id not in self._udp:
                self._udp[guild_id] = await VoiceUdpEndpoint.open(self.voice(guild_id))
            conn = VoiceConnection(guild_id, ws, data, ssrc=int.from_bytes(os.urandom(4), "big") >> 1)
            self.voice_connections[guild_id] = conn
            await ws.send_str(json.dumps({"op": 2, "d": {
                "ssrc": conn.ssrc, "ip": "127.0.0.1", "port": self._udp[guild_id].port, "modes": VOICE_MODES,
                "experiments": [],
            }}))
        elif conn is None:
            await ws.close(code=4003, message=b"Not authenticated.")
        elif op == 1:
            mode = data.get("data", {}).get("mode")
            if mode != SUPPORTED_MODE:
                await ws.close(code=4016, message=b"Unknown encryption mode.")
                return conn
            conn.mode, conn.secret_key = mode, os.urandom(32)
            await self._send_session_description(conn)
        elif op == 3:
            conn.heartbeats += 1
            await ws.send_str(json.dumps({"op": 6, "d": {"t": data.get("t")}}))
        elif op == 5:
            self.voice(conn.guild_id).speaking.append((time.monotonic(), int(data.get("speaking", 0))))
        elif op in (OP_TRANSITION_READY, OP_INVALID_COMMIT_WELCOME) and conn.dave is not None:
            await self._dave_group(conn.guild_id).receive_json(conn.dave, op, data)
        return conn

    async def _send_session_description(self, conn: VoiceConnection) -> None:
        """op 4 with the key and the DAVE protocol version: 0 (plain Opus) unless the stand-in speaks DAVE, then
        the version the channel's media session runs; a DAVE session then joins the channel's group."""
        assert conn.secret_key is not None
        udp = self._udp[conn.guild_id]
        udp.register(conn.ssrc, conn.secret_key)
        version = 0
        group = self._dave_group(conn.guild_id) if self.dave else None
        if group is not None:
            max_version = int(conn.identify.get("max_dave_protocol_version") or 0)
            version = group.version_for(max_version)
            conn.dave = _SocketMember(int(conn.identify["user_id"]), max_version, conn.ws)
            user_id = conn.dave.user_id
            udp.openers[conn.ssrc] = lambda seq, payload: group.open_media(user_id, seq, payload)
        await conn.ws.send_str(json.dumps({"op": 4, "d": {
            "mode": conn.mode, "secret_key": list(conn.secret_key), "dave_protocol_version": version,
            "audio_codec": "opus", "media_session_id": secrets.token_hex(16),
        }}))
        if group is not None and conn.dave is not None:
            await group.join(conn.dave)

    # ------------------------------------------------------------------ DAVE

    def _dave_group(self, guild_id: int) -> DaveGroup:
        """The DAVE group of the channel the bot is in (a new one when it moved)."""
        channel_id = self.bot_voice_channel(guild_id)
        group = self.dave_groups.get(guild_id)
        if group is None or (channel_id is not None and group.channel_id != channel_id):
            if channel_id is None:
                raise StandinError(f"the bot is in no voice channel of guild {guild_id}")
            group = self.dave_groups[guild_id] = DaveGroup(channel_id)
        return group

    async def join_listener(
        self, user_id: int, *, guild_id: int | None = None, dave: bool = True, commits: bool = True,
    ) -> DaveListener:
        """A member joins the bot's voice channel and its media session, as a :class:`DaveListener`.

        ``dave=False`` makes it a client without DAVE (the channel downgrades while it stays); ``commits=False``
        keeps it from committing, so the bot's commit is the one announced.
        """
        gid = self.layout.guild_id if guild_id is None else guild_id
        channel_id = self.bot_voice_channel(gid)
        if channel_id is None:
            raise StandinError("join_listener: the bot is not in a voice channel of that guild")
        await self.move_member(user_id, channel_id)
        listener = DaveListener(user_id, channel_id, dave=dave, commits=commits)
        await listener.connect(self._dave_group(gid))
        return listener

    async def leave_listener(self, listener: DaveListener, *, guild_id: int | None = None) -> None:
        """A listener leaves the voice channel (and the media session)."""
        await listener.disconnect()
        await self.move_member(listener.user_id, None, guild_id=self.layout.guild_id if guild_id is None else guild_id)


class _SocketMember(DaveMember):
    """A DAVE member connected over the voice WebSocket (the bot)."""

    def __init__(self, user_id: int, max_version: int, ws: web.WebSocketResponse) -> None:
        super().__init__(user_id, max_version)
        self.ws = ws

    async def send_json(self, op: int, data: dict[str, Any]) -> None:
        if not self.ws.closed:
            await self.ws.send_str(json.dumps({"op": op, "d": data}))

    async def _deliver(self, frame: bytes) -> None:
        if not self.ws.closed:
            await self.ws.send_bytes(frame)
