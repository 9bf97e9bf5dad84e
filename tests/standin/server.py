"""A local Discord that an unmodified discord.py 2.7.1 client logs in to: REST, gateway, voice WS (TLS) and UDP.

Everything listens on 127.0.0.1 on free ports. The bot under test is pointed at it by configuration only:
``discord.http.Route.BASE = standin.api_base``, ``DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(standin.gateway_url)``
and a connector that trusts the stand-in's CA (``aiohttp.TCPConnector(ssl=standin.ssl_context_for_clients())``),
because discord.py hard-codes ``wss://`` for the voice WebSocket.

The stand-in records every REST request and everything the bot answers to each interaction, and drives the bot
through the same gateway events Discord sends (slash commands, buttons, context menus, autocomplete, messages,
members moving between voice channels, deleted channels, voice drops). The facts it follows are in
``shared/reference/discord-standin.md``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import trustme
from aiohttp import web

from .base import APP_FLAG_GATEWAY_MESSAGE_CONTENT_LIMITED, API_PREFIX, INTERACTION_ACK_WINDOW_S, StandinError, RecordedRequest, GuildLayout, VoiceConnection
from .dave import DaveGroup
from .driver import Driver
from .gateway import Gateway
from .model import (
    ADMINISTRATOR, EVERYONE_PERMISSIONS, GUILD_TEXT, GUILD_VOICE, Channel, Guild, Interaction, Member, Reply, Role,
    SnowflakeFactory, StoredFile, User, VoiceState, bot_token_for,
)
from .rest import RestApi
from .voice_udp import VoiceRecording, VoiceUdpEndpoint
from .voice_ws import VoiceGateway

log = logging.getLogger(__name__)


class Standin(Driver, RestApi, Gateway, VoiceGateway):
    """A local Discord for end-to-end tests.

    Parameters
    ----------
    guilds
        How many standard guilds to create (see ``GuildLayout``).
    token
        The bot token the stand-in accepts.
    dave
        Speak DAVE (protocol version 1) to voice clients that support it: the stand-in is the MLS delivery service
        and external sender of each channel (``dave_groups``), and ``join_listener`` adds members who decrypt.

    Use as ``async with Standin() as standin:``; then point the bot at ``api_base``, ``gateway_url`` and trust
    ``ssl_context_for_clients()``.
    """

    def __init__(self, *, guilds: int = 1, token: str | None = None, dave: bool = False,
                 application_flags: int = APP_FLAG_GATEWAY_MESSAGE_CONTENT_LIMITED) -> None:
        self.dave = dave
        # GET /applications/@me ``flags``; without a Message Content bit, an IDENTIFY asking for it is closed (4014)
        self.application_flags = application_flags
        self.dave_groups: dict[int, DaveGroup] = {}  # per guild: the group of the channel the bot is in
        self.interaction_ack_window_s = INTERACTION_ACK_WINDOW_S  # tests may shorten it to check a late answer
        self._snowflake = SnowflakeFactory()
        self.application_id = self._snowflake()
        self.bot_user = User(self._snowflake(), "voicebot", bot=True)
        self.token = token if token is not None else bot_token_for(self.bot_user.id)
        self.users: dict[int, User] = {self.bot_user.id: self.bot_user}
        self.guilds: dict[int, Guild] = {}
        self.layouts: list[GuildLayout] = [self._build_guild(f"Guild {i + 1}") for i in range(guilds)]
        self.channels: dict[int, Channel] = {c.id: c for g in self.guilds.values() for c in g.channels.values()}
        self.messages: dict[int, dict[str, Any]] = {}
        self.interactions: dict[int, Interaction] = {}
        self.requests: list[RecordedRequest] = []
        self.commands: dict[tuple[int | None, str, int], dict[str, Any]] = {}  # (guild or None, name, type)
        self.identify_payload: dict[str, Any] | None = None
        self.presence_updates: list[dict[str, Any]] = []
        self.gateway_voice_updates: list[dict[str, Any]] = []  # op 4 payloads from the bot
        self.voice_connections: dict[int, VoiceConnection] = {}  # the latest per guild, open or closed
        self._attachments: dict[int, StoredFile] = {}
        self._recordings: dict[int, VoiceRecording] = {}
        self._udp: dict[int, VoiceUdpEndpoint] = {}
        self._voice_tokens: dict[int, str] = {}
        self._gateway: web.WebSocketResponse | None = None
        self._gateway_sockets: set[web.WebSocketResponse] = set()
        self._session_id = ""
        self._seq = 0
        self._ready = asyncio.Event()
        self._changed = asyncio.Event()
        self._runners: list[web.AppRunner] = []
        self._route_table = self._routes()
        self._tmp = tempfile.TemporaryDirectory(prefix="standin-")
        self._ca = trustme.CA()
        self.ca_pem_path = Path(self._tmp.name) / "standin-ca.pem"
        self._ca.cert_pem.write_to_path(str(self.ca_pem_path))
        self.http_port = 0
        self.voice_port = 0

    # ------------------------------------------------------------------ lifetime and addresses

    async def start(self) -> None:
        """Listen on free ports of 127.0.0.1: HTTP (REST, gateway, attachments) and HTTPS (voice WebSocket)."""
        http_app = web.Application(client_max_size=64 * 1024 * 1024)
        http_app.router.add_route("*", API_PREFIX + "/{tail:.*}", self._handle_rest)
        http_app.router.add_get("/gateway", self._handle_gateway)
        http_app.router.add_get("/attachments/{id}/{filename}", self._handle_attachment)
        voice_app = web.Application()
        voice_app.router.add_get("/", self._handle_voice_ws)
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ca.issue_cert("127.0.0.1", "localhost").configure_cert(server_ctx)
        self.http_port = await self._serve(http_app, None)
        self.voice_port = await self._serve(voice_app, server_ctx)
        log.info("stand-in listening: REST/gateway on %s, voice on %s", self.http_port, self.voice_port)

    async def _serve(self, app: web.Application, ssl_context: ssl.SSLContext | None) -> int:
        """Start one app on a free port and return the port."""
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        self._runners.append(runner)
        server = site._server  # aiohttp keeps the listening server here; there is no public accessor
        assert server is not None and server.sockets
        return server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Close every socket and stop listening."""
        for conn in list(self.voice_connections.values()):
            await conn.ws.close(code=1001)
        for ws in list(self._gateway_sockets):
            await ws.close(code=1001)
        for udp in self._udp.values():
            udp.close()
        for group in self.dave_groups.values():
            await group.close()
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
        self._tmp.cleanup()

    async def __aenter__(self) -> Standin:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def api_base(self) -> str:
        """The value for ``discord.http.Route.BASE``."""
        return f"http://127.0.0.1:{self.http_port}{API_PREFIX}"

    @property
    def gateway_url(self) -> str:
        """The value for ``DiscordWebSocket.DEFAULT_GATEWAY`` (discord.py adds the query)."""
        return f"ws://127.0.0.1:{self.http_port}/gateway"

    def ssl_context_for_clients(self) -> ssl.SSLContext:
        """An SSL context that trusts the stand-in's CA, for ``aiohttp.TCPConnector(ssl=...)``."""
        ctx = ssl.create_default_context()
        self._ca.configure_trust(ctx)
        return ctx

    # ------------------------------------------------------------------ the world

    @property
    def layout(self) -> GuildLayout:
        """The first guild's ids."""
        return self.layouts[0]

    def _build_guild(self, name: str) -> GuildLayout:
        """Create a standard guild with roles, channels, two humans and the bot as members."""
        gid = self._snowflake()
        admin = self._new_user("alice")
        member = self._new_user("bob")
        guild = Guild(gid, name, owner_id=admin.id)
        admin_role = Role(self._snowflake(), "Admin", ADMINISTRATOR, position=1)
        guild.roles = {gid: Role(gid, "@everyone", EVERYONE_PERMISSIONS), admin_role.id: admin_role}
        text = Channel(self._snowflake(), gid, "general", GUILD_TEXT, 0)
        voice = Channel(self._snowflake(), gid, "Voice", GUILD_VOICE, 1)
        other_voice = Channel(self._snowflake(), gid, "Other Voice", GUILD_VOICE, 2)
        guild.channels = {c.id: c for c in (text, voice, other_voice)}
        guild.members = {
            admin.id: Member(admin, [admin_role.id]),
            member.id: Member(member),
            self.bot_user.id: Member(self.bot_user),
        }
        guild.voice_states = {admin.id: VoiceState(admin.id, voice.id)}
        self.guilds[gid] = guild
        return GuildLayout(gid, text.id, voice.id, other_voice.id, gid, admin_role.id, admin.id, member.id)

    def _new_user(self, username: str) -> User:
        """Create and register a human user."""
        user = User(self._snowflake(), username)
        self.users[user.id] = user
        return user

    async def add_member(self, guild_id: int, username: str, *, admin: bool = False) -> int:
        """Add a human to a guild (dispatching GUILD_MEMBER_ADD when the bot is connected); returns the user id."""
        guild = self.guilds[guild_id]
        user = self._new_user(username)
        admin_roles = [r.id for r in guild.roles.values() if r.permissions & ADMINISTRATOR]
        guild.members[user.id] = Member(user, admin_roles[:1] if admin else [])
        if self._gateway is not None:
            await self._dispatch("GUILD_MEMBER_ADD", {**guild.members[user.id].payload(), "guild_id": str(guild_id)})
        return user.id

    def add_attachment(self, name: str, data: bytes, content_type: str) -> dict[str, Any]:
        """Serve ``data`` at ``http://127.0.0.1:PORT/attachments/<id>/<name>`` and return its attachment payload."""
        return self._store_attachment(StoredFile(name, content_type, data))

    def _store_attachment(self, stored: StoredFile) -> dict[str, Any]:
        """Register a file for download and build its Discord attachment payload."""
        if not self.http_port:
            raise StandinError("start the stand-in before adding attachments (their URL needs its port)")
        aid = self._snowflake()
        self._attachments[aid] = stored
        url = f"http://127.0.0.1:{self.http_port}/attachments/{aid}/{stored.filename}"
        return {
            "id": str(aid), "filename": stored.filename, "size": len(stored.data), "url": url, "proxy_url": url,
            "content_type": stored.content_type,
        }

    def attachment_bytes(self, attachment: Mapping[str, Any]) -> bytes:
        """The bytes behind an attachment payload (one the bot uploaded, or one added with ``add_attachment``)."""
        return self._attachments[int(attachment["id"])].data

    def voice(self, guild_id: int | None = None) -> VoiceRecording:
        """What the bot has sent on a guild's voice UDP (first guild by default)."""
        gid = self.layout.guild_id if guild_id is None else guild_id
        if gid not in self._recordings:
            self._recordings[gid] = VoiceRecording(gid)
        return self._recordings[gid]

    def bot_voice_channel(self, guild_id: int | None = None) -> int | None:
        """The voice channel the bot is in, per the stand-in's state, or None."""
        guild = self.guilds[self.layout.guild_id if guild_id is None else guild_id]
        state = guild.voice_states.get(self.bot_user.id)
        return None if state is None else state.channel_id

    def member_voice_channel(self, guild_id: int, user_id: int) -> int | None:
        """The voice channel a member is in, or None."""
        state = self.guilds[guild_id].voice_states.get(user_id)
        return None if state is None else state.channel_id

    # ------------------------------------------------------------------ records and waiting

    def replies_for(self, interaction_id: int) -> list[Reply]:
        """Everything the bot answered to an interaction so far, in order."""
        return list(self.interactions[interaction_id].replies)

    def messages_in(self, channel_id: int) -> list[dict[str, Any]]:
        """The messages that exist in a channel, oldest first (deleted ones are gone)."""
        return [m for m in self.messages.values() if int(m["channel_id"]) == channel_id]

    def requests_matching(self, method: str, path_pattern: str) -> list[RecordedRequest]:
        """Recorded REST requests with this method whose path (below /api/v10) fully matches the regex."""
        rx = re.compile(path_pattern)
        return [r for r in self.requests if r.method == method and rx.fullmatch(r.path)]

    async def wait_for(self, condition: Callable[[], Any], timeout: float = 5.0, what: str = "condition") -> Any:
        """Wait until ``condition()`` returns something truthy (checked on every change) and return it."""
        deadline = time.monotonic() + timeout
        while True:
            result = condition()
            if result:
                return result
            left = deadline - time.monotonic()
            if left <= 0:
                raise asyncio.TimeoutError(f"stand-in: {what} not met within {timeout} s")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(left, 0.05))
            except asyncio.TimeoutError:
                pass

    async def wait_ready(self, timeout: float = 5.0) -> None:
        """Wait until the bot has identified and been sent READY and every GUILD_CREATE."""
        await asyncio.wait_for(self._ready.wait(), timeout)

    async def wait_commands(self, *names: str, timeout: float = 5.0) -> None:
        """Wait until application commands with these names have been synced (globally or to any guild)."""
        synced = lambda: all(any(key[1] == n for key in self.commands) for n in names)  # noqa: E731
        await self.wait_for(synced, timeout, f"commands {names} synced")

    async def wait_reply(
        self, interaction_id: int, predicate: Callable[[Reply], bool] | None = None, timeout: float = 5.0
    ) -> Reply:
        """Wait for the first reply to an interaction that satisfies ``predicate`` (any reply when None)."""
        def find() -> Reply | None:
            return next((r for r in self.interactions[interaction_id].replies if predicate is None or predicate(r)), None)
        return await self.wait_for(find, timeout, f"a reply to interaction {interaction_id}")

    async def wait_message(
        self, channel_id: int, predicate: Callable[[dict[str, Any]], bool], timeout: float = 5.0
    ) -> dict[str, Any]:
        """Wait for a message in a channel that satisfies ``predicate`` and return it."""
        def find() -> dict[str, Any] | None:
            return next((m for m in self.messages_in(channel_id) if predicate(m)), None)
        return await self.wait_for(find, timeout, f"a matching message in channel {channel_id}")

    def _touch(self) -> None:
        """Wake waiters after a change."""
        self._changed.set()


__all__ = ["GuildLayout", "RecordedRequest", "Standin", "StandinError", "VoiceConnection"]
