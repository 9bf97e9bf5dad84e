"""The stand-in's voice WebSocket (TLS, because discord.py hard-codes ``wss://``): identify, select protocol,
the session key, heartbeats; the audio itself arrives on UDP (:mod:`tests.standin.voice_udp`)."""

from __future__ import annotations

import json
import logging
import os
import secrets
import time
from typing import Any

from aiohttp import WSMsgType, web

from .base import VOICE_HEARTBEAT_MS, VOICE_MODES, VoiceConnection
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
                    continue
                if msg.type is not WSMsgType.TEXT:
                    continue
                frame = json.loads(msg.data)
                conn = await self._voice_op(ws, conn, frame["op"], frame.get("d") or {})
                self._touch()
        finally:
            if conn is not None:
                log.debug("stand-in: voice socket of guild %s closed (%s)", conn.guild_id, ws.close_code)
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
        return conn

    async def _send_session_description(self, conn: VoiceConnection) -> None:
        """op 4 with the key; DAVE stays off (protocol version 0), so the payload is plain Opus."""
        assert conn.secret_key is not None
        self._udp[conn.guild_id].register(conn.ssrc, conn.secret_key)
        await conn.ws.send_str(json.dumps({"op": 4, "d": {
            "mode": conn.mode, "secret_key": list(conn.secret_key), "dave_protocol_version": 0,
            "audio_codec": "opus", "media_session_id": secrets.token_hex(16),
        }}))
