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
import json
import logging
import os
import re
import secrets
import ssl
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trustme
from aiohttp import WSMsgType, web

from .model import (
    ADMINISTRATOR, EPHEMERAL, EVERYONE_PERMISSIONS, GUILD_TEXT, GUILD_VOICE, LOADING, Channel, Guild, Interaction,
    Member, Reply, Role, SnowflakeFactory, StoredFile, User, VoiceState, mentioned_ids, now_iso,
)
from .voice_udp import SUPPORTED_MODE, VoiceRecording, VoiceUdpEndpoint

log = logging.getLogger(__name__)

API_PREFIX = "/api/v10"
GATEWAY_HEARTBEAT_MS = 41_250  # what Discord announces in HELLO
VOICE_HEARTBEAT_MS = 13_750  # what Discord's voice servers announce in op 8 HELLO
INTERACTION_ACK_WINDOW_S = 3.0  # an interaction must be answered within 3 s, else 404 Unknown interaction
ATTACHMENT_SIZE_LIMIT = 25 * 1024 * 1024  # bytes, sent as attachment_size_limit
VOICE_MODES = ["aead_aes256_gcm_rtpsize", SUPPORTED_MODE]  # offered in voice READY, in Discord's order
JSON_HEADERS = {"Content-Type": "application/json"}  # exactly this: discord.py compares the header string

# Gateway intents (https://discord.com/developers/docs/events/gateway#gateway-intents) the stand-in enforces.
INTENT_GUILD_MEMBERS = 1 << 1
INTENT_GUILD_VOICE_STATES = 1 << 7
INTENT_GUILD_MESSAGES = 1 << 9
INTENT_MESSAGE_CONTENT = 1 << 15
INTENTS_ALL = (1 << 26) - 1  # assumed when IDENTIFY names none
_EVENT_INTENTS = {
    "GUILD_MEMBER_ADD": INTENT_GUILD_MEMBERS,
    "VOICE_STATE_UPDATE": INTENT_GUILD_VOICE_STATES,
    "MESSAGE_CREATE": INTENT_GUILD_MESSAGES,
    "MESSAGE_UPDATE": INTENT_GUILD_MESSAGES,
    "MESSAGE_DELETE": INTENT_GUILD_MESSAGES,
}

_OPTION_SUBCOMMAND, _OPTION_GROUP = 1, 2
_OPTION_USER, _OPTION_CHANNEL, _OPTION_ROLE, _OPTION_MENTIONABLE, _OPTION_ATTACHMENT = 6, 7, 8, 9, 11
_OPTION_CASTS: dict[int, Callable[[Any], Any]] = {3: str, 4: int, 5: bool, 10: float}


class StandinError(Exception):
    """A test drove the stand-in wrongly (unknown command, bot not connected, ...); the message says what."""


class _HttpError(Exception):
    """An error answer in Discord's JSON shape."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class RecordedRequest:
    """One REST request the bot made: path below ``/api/v10``, parsed JSON body and multipart files."""

    method: str
    path: str
    query: dict[str, str]
    json: Any
    files: list[StoredFile]
    at: float  # time.monotonic()
    status: int = 0


@dataclass(frozen=True)
class GuildLayout:
    """The ids of one standard guild: a text channel, two voice channels, an admin in voice, a member not."""

    guild_id: int
    text_channel_id: int
    voice_channel_id: int
    other_voice_channel_id: int
    everyone_role_id: int
    admin_role_id: int
    admin_id: int  # "alice": owner, Admin role, in voice_channel_id at start
    member_id: int  # "bob": @everyone only, not in voice


@dataclass
class VoiceConnection:
    """One voice WebSocket session of the bot in a guild."""

    guild_id: int
    ws: web.WebSocketResponse
    identify: dict[str, Any]
    ssrc: int
    mode: str | None = None
    secret_key: bytes | None = None
    heartbeats: int = 0
    binary_frames: list[bytes] = field(default_factory=list)


class Standin:
    """A local Discord for end-to-end tests.

    Parameters
    ----------
    guilds
        How many standard guilds to create (see ``GuildLayout``).
    token
        The bot token the stand-in accepts.

    Use as ``async with Standin() as standin:``; then point the bot at ``api_base``, ``gateway_url`` and trust
    ``ssl_context_for_clients()``.
    """

    def __init__(self, *, guilds: int = 1, token: str = "standin-bot-token") -> None:
        self.token = token
        self.interaction_ack_window_s = INTERACTION_ACK_WINDOW_S  # tests may shorten it to check a late answer
        self._snowflake = SnowflakeFactory()
        self.application_id = self._snowflake()
        self.bot_user = User(self._snowflake(), "voicebot", bot=True)
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

    # ------------------------------------------------------------------ REST

    async def _handle_rest(self, request: web.Request) -> web.Response:
        path = "/" + request.match_info["tail"]
        body, files = await _read_body(request)
        record = RecordedRequest(request.method, path, dict(request.query), body, files, time.monotonic())
        self.requests.append(record)
        try:
            self._check_auth(request, path)
            for method, rx, handler in self._route_table:
                match = rx.fullmatch(path)
                if match and method == request.method:
                    status, payload = await handler(request, body, files, **match.groupdict())
                    break
            else:
                log.warning("stand-in: no route for %s %s", request.method, path)
                raise _HttpError(404, 0, "404: Not Found")
        except _HttpError as e:
            status, payload = e.status, {"message": e.message, "code": e.code}
        record.status = status
        self._touch()
        if payload is None:
            return web.Response(status=status)
        return web.Response(status=status, body=json.dumps(payload).encode(), headers=JSON_HEADERS)

    def _check_auth(self, request: web.Request, path: str) -> None:
        """Bot routes need ``Authorization: Bot <token>``; webhook and interaction routes carry their token."""
        if path.startswith(("/webhooks/", "/interactions/")):
            return
        if request.headers.get("Authorization") != f"Bot {self.token}":
            raise _HttpError(401, 0, "401: Unauthorized")

    def _routes(self) -> list[tuple[str, re.Pattern[str], Callable[..., Any]]]:
        """The REST routes: (method, path regex with named groups, handler)."""
        table = [
            ("GET", r"/users/@me", self._get_me),
            ("GET", r"/users/(?P<uid>\d+)", self._get_user),
            ("GET", r"/oauth2/applications/@me", self._get_application),
            ("GET", r"/applications/@me", self._get_application),
            ("GET", r"/gateway(?:/bot)?", self._get_gateway),
            ("PUT", r"/applications/(?P<app>\d+)(?:/guilds/(?P<gid>\d+))?/commands", self._put_commands),
            ("GET", r"/applications/(?P<app>\d+)(?:/guilds/(?P<gid>\d+))?/commands", self._get_commands),
            ("POST", r"/applications/(?P<app>\d+)(?:/guilds/(?P<gid>\d+))?/commands", self._post_command),
            ("POST", r"/interactions/(?P<iid>\d+)/(?P<token>[^/]+)/callback", self._interaction_callback),
            ("POST", r"/webhooks/(?P<app>\d+)/(?P<token>[^/]+)", self._followup),
            ("GET", r"/webhooks/(?P<app>\d+)/(?P<token>[^/]+)/messages/(?P<mid>@original|\d+)", self._get_webhook_msg),
            ("PATCH", r"/webhooks/(?P<app>\d+)/(?P<token>[^/]+)/messages/(?P<mid>@original|\d+)", self._edit_webhook_msg),
            ("DELETE", r"/webhooks/(?P<app>\d+)/(?P<token>[^/]+)/messages/(?P<mid>@original|\d+)", self._del_webhook_msg),
            ("GET", r"/channels/(?P<cid>\d+)", self._get_channel),
            ("GET", r"/channels/(?P<cid>\d+)/messages", self._get_history),
            ("POST", r"/channels/(?P<cid>\d+)/messages", self._post_message),
            ("GET", r"/channels/(?P<cid>\d+)/messages/(?P<mid>\d+)", self._get_message),
            ("PATCH", r"/channels/(?P<cid>\d+)/messages/(?P<mid>\d+)", self._patch_message),
            ("DELETE", r"/channels/(?P<cid>\d+)/messages/(?P<mid>\d+)", self._delete_message),
            ("PUT", r"/channels/(?P<cid>\d+)/messages/(?P<mid>\d+)/reactions/(?P<emoji>[^/]+)/@me", self._no_content),
            ("DELETE", r"/channels/(?P<cid>\d+)/messages/(?P<mid>\d+)/reactions/(?P<emoji>[^/]+)/@me", self._no_content),
            ("POST", r"/channels/(?P<cid>\d+)/typing", self._no_content),
            ("GET", r"/guilds/(?P<gid>\d+)", self._get_guild),
            ("GET", r"/guilds/(?P<gid>\d+)/channels", self._get_guild_channels),
            ("GET", r"/guilds/(?P<gid>\d+)/members/(?P<uid>\d+)", self._get_member),
        ]
        return [(m, re.compile(p), h) for m, p, h in table]

    async def _no_content(self, request: web.Request, body: Any, files: list[StoredFile], **_: str) -> tuple[int, None]:
        return 204, None

    async def _get_me(self, request: web.Request, body: Any, files: list[StoredFile]) -> tuple[int, Any]:
        me = self.bot_user.payload()
        me.update(verified=True, mfa_enabled=False, flags=0, locale="en-US", email=None)
        return 200, me

    async def _get_user(self, request: web.Request, body: Any, files: list[StoredFile], uid: str) -> tuple[int, Any]:
        user = self.users.get(int(uid))
        if user is None:
            raise _HttpError(404, 10013, "Unknown User")
        return 200, user.payload()

    async def _get_application(self, request: web.Request, body: Any, files: list[StoredFile]) -> tuple[int, Any]:
        owner = self.users[self.layout.admin_id]
        return 200, {
            "id": str(self.application_id), "name": self.bot_user.username, "icon": None, "description": "",
            "bot_public": True, "bot_require_code_grant": False, "owner": owner.payload(), "team": None,
            "verify_key": "00" * 32, "flags": 0, "summary": "", "rpc_origins": [], "tags": [],
            "bot": self.bot_user.payload(), "approximate_guild_count": len(self.guilds),
        }

    async def _get_gateway(self, request: web.Request, body: Any, files: list[StoredFile]) -> tuple[int, Any]:
        limit = {"total": 1000, "remaining": 1000, "reset_after": 0, "max_concurrency": 1}
        return 200, {"url": self.gateway_url, "shards": 1, "session_start_limit": limit}

    async def _put_commands(
        self, request: web.Request, body: Any, files: list[StoredFile], app: str, gid: str | None
    ) -> tuple[int, Any]:
        guild_id = None if gid is None else int(gid)
        for key in [k for k in self.commands if k[0] == guild_id]:
            del self.commands[key]
        return 200, [self._register_command(guild_id, c) for c in body or []]

    async def _post_command(
        self, request: web.Request, body: Any, files: list[StoredFile], app: str, gid: str | None
    ) -> tuple[int, Any]:
        return 201, self._register_command(None if gid is None else int(gid), body)

    async def _get_commands(
        self, request: web.Request, body: Any, files: list[StoredFile], app: str, gid: str | None
    ) -> tuple[int, Any]:
        guild_id = None if gid is None else int(gid)
        return 200, [c for k, c in self.commands.items() if k[0] == guild_id]

    def _register_command(self, guild_id: int | None, data: dict[str, Any]) -> dict[str, Any]:
        """Store one synced command with an id, as Discord echoes it back."""
        key = (guild_id, data["name"], int(data.get("type", 1)))
        command = {
            "id": str(self._snowflake()), "application_id": str(self.application_id), "version": str(self._snowflake()),
            "type": 1, "description": "", "options": [], "default_member_permissions": None, "nsfw": False, **data,
        }
        if guild_id is not None:
            command["guild_id"] = str(guild_id)
        self.commands[key] = command
        return command

    async def _get_channel(self, request: web.Request, body: Any, files: list[StoredFile], cid: str) -> tuple[int, Any]:
        return 200, self._channel(int(cid)).payload()

    async def _get_guild(self, request: web.Request, body: Any, files: list[StoredFile], gid: str) -> tuple[int, Any]:
        guild = self.guilds.get(int(gid))
        if guild is None:
            raise _HttpError(404, 10004, "Unknown Guild")
        data = guild.payload()
        for key in ("members", "voice_states", "channels", "presences", "threads"):
            data.pop(key)
        return 200, data

    async def _get_guild_channels(
        self, request: web.Request, body: Any, files: list[StoredFile], gid: str
    ) -> tuple[int, Any]:
        return 200, [c.payload() for c in self.guilds[int(gid)].channels.values()]

    async def _get_member(
        self, request: web.Request, body: Any, files: list[StoredFile], gid: str, uid: str
    ) -> tuple[int, Any]:
        member = self.guilds[int(gid)].members.get(int(uid))
        if member is None:
            raise _HttpError(404, 10007, "Unknown Member")
        return 200, member.payload()

    async def _get_history(self, request: web.Request, body: Any, files: list[StoredFile], cid: str) -> tuple[int, Any]:
        limit = int(request.query.get("limit", "50"))
        return 200, list(reversed(self.messages_in(int(cid))))[:limit]

    async def _get_message(
        self, request: web.Request, body: Any, files: list[StoredFile], cid: str, mid: str
    ) -> tuple[int, Any]:
        return 200, self._message(int(mid))

    async def _post_message(self, request: web.Request, body: Any, files: list[StoredFile], cid: str) -> tuple[int, Any]:
        self._channel(int(cid))
        message = self._new_message(int(cid), self.bot_user, body or {}, files)
        await self._dispatch("MESSAGE_CREATE", message)
        return 200, message

    async def _patch_message(
        self, request: web.Request, body: Any, files: list[StoredFile], cid: str, mid: str
    ) -> tuple[int, Any]:
        message = self._edit_message(int(mid), body or {}, files)
        await self._dispatch("MESSAGE_UPDATE", message)
        return 200, message

    async def _delete_message(
        self, request: web.Request, body: Any, files: list[StoredFile], cid: str, mid: str
    ) -> tuple[int, None]:
        message = self.messages.pop(int(mid), None)
        if message is None:
            raise _HttpError(404, 10008, "Unknown Message")
        await self._dispatch("MESSAGE_DELETE", {"id": mid, "channel_id": cid, "guild_id": message.get("guild_id")})
        return 204, None

    def _channel(self, channel_id: int) -> Channel:
        """A channel by id, or Discord's 404."""
        channel = self.channels.get(channel_id)
        if channel is None:
            raise _HttpError(404, 10003, "Unknown Channel")
        return channel

    def _message(self, message_id: int) -> dict[str, Any]:
        """A message by id, or Discord's 404."""
        message = self.messages.get(message_id)
        if message is None:
            raise _HttpError(404, 10008, "Unknown Message")
        return message

    # ------------------------------------------------------------------ messages

    def _new_message(
        self, channel_id: int, author: User, body: Mapping[str, Any], files: list[StoredFile], *,
        interaction: Interaction | None = None, flags: int = 0, attachments: Iterable[Mapping[str, Any]] = (),
    ) -> dict[str, Any]:
        """Create, store and return a message payload."""
        channel = self.channels[channel_id]
        guild = self.guilds[channel.guild_id]
        content = body.get("content") or ""
        mentions = [self.users[u] for u in mentioned_ids(content) if u in self.users]
        message: dict[str, Any] = {
            "id": str(self._snowflake()),
            "channel_id": str(channel_id),
            "guild_id": str(guild.id),
            "author": author.payload(),
            "content": content,
            "timestamp": now_iso(),
            "edited_timestamp": None,
            "tts": bool(body.get("tts", False)),
            "mention_everyone": False,
            "mentions": [self._user_with_member(guild, u) for u in mentions],
            "mention_roles": [],
            "attachments": [*attachments, *(self._store_attachment(f) for f in files)],
            "embeds": body.get("embeds") or [],
            "components": body.get("components") or [],
            "pinned": False,
            "type": 0,
            "flags": int(body.get("flags") or 0) | flags,
        }
        if author.id in guild.members:
            message["member"] = _without_user(guild.members[author.id].payload())
        if interaction is not None:
            message.update(type=20 if interaction.type == 2 else 0, webhook_id=str(self.application_id))
            message["application_id"] = str(self.application_id)
        if body.get("message_reference"):
            message["message_reference"] = body["message_reference"]
            message["type"] = 19
        self.messages[int(message["id"])] = message
        return message

    def _edit_message(self, message_id: int, body: Mapping[str, Any], files: list[StoredFile]) -> dict[str, Any]:
        """Apply an edit payload (content, embeds, components, kept attachments, new files) to a message."""
        message = self._message(message_id)
        for key in ("content", "embeds", "components"):
            if key in body and body[key] is not None:
                message[key] = body[key]
        if "flags" in body and body["flags"] is not None:
            message["flags"] = int(body["flags"]) | (message["flags"] & EPHEMERAL)
        message["flags"] &= ~LOADING
        if "attachments" in body or files:
            keep = {str(a.get("id")) for a in body.get("attachments") or []}
            kept = [a for a in message["attachments"] if a["id"] in keep]
            message["attachments"] = kept + [self._store_attachment(f) for f in files]
        message["edited_timestamp"] = now_iso()
        return message

    def _user_with_member(self, guild: Guild, user: User) -> dict[str, Any]:
        """A user payload with its guild ``member`` (as MESSAGE_CREATE mentions carry)."""
        data = user.payload()
        if user.id in guild.members:
            data["member"] = _without_user(guild.members[user.id].payload())
        return data

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
        self._resolve(self.guilds[guild_id], _OPTION_USER, target_user_id, resolved)
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
        if not _has_component(current.get("components") or [], custom_id):
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
            kinds = (_OPTION_SUBCOMMAND, _OPTION_GROUP)
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
        if type_ in _OPTION_CASTS:
            return _OPTION_CASTS[type_](value)
        if type_ == _OPTION_ATTACHMENT:
            if not isinstance(value, Mapping):
                raise StandinError("attachment options take the payload returned by add_attachment()")
            resolved.setdefault("attachments", {})[str(value["id"])] = dict(value)
            return str(value["id"])
        key = str(int(value))
        if type_ in (_OPTION_USER, _OPTION_MENTIONABLE) and int(value) in self.users:
            resolved.setdefault("users", {})[key] = self.users[int(value)].payload()
            if int(value) in guild.members:
                member = _without_user(guild.members[int(value)].payload())
                member["permissions"] = str(guild.permissions_of(int(value)))
                resolved.setdefault("members", {})[key] = member
        elif type_ in (_OPTION_ROLE, _OPTION_MENTIONABLE) and int(value) in guild.roles:
            resolved.setdefault("roles", {})[key] = guild.roles[int(value)].payload()
        elif type_ == _OPTION_CHANNEL and int(value) in guild.channels:
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

    # ------------------------------------------------------------------ interactions: the bot's answers

    def _interaction_by_token(self, token: str) -> Interaction:
        """The interaction a webhook token belongs to, or Discord's 404."""
        found = next((i for i in self.interactions.values() if i.token == token), None)
        if found is None:
            raise _HttpError(404, 10015, "Unknown Webhook")
        return found

    async def _interaction_callback(
        self, request: web.Request, body: Any, files: list[StoredFile], iid: str, token: str
    ) -> tuple[int, Any]:
        interaction = self.interactions.get(int(iid))
        if interaction is None or interaction.token != token:
            raise _HttpError(404, 10062, "Unknown interaction")
        if interaction.acknowledged:
            raise _HttpError(400, 40060, "Interaction has already been acknowledged.")
        if time.monotonic() - interaction.created_at > self.interaction_ack_window_s:
            log.warning("stand-in: interaction %s answered after %.2f s", iid, time.monotonic() - interaction.created_at)
            raise _HttpError(404, 10062, "Unknown interaction")
        rtype = int(body["type"])
        data = body.get("data") or {}
        message: dict[str, Any] | None = None
        if rtype in (4, 5):
            flags = int(data.get("flags") or 0)
            message = self._new_message(
                interaction.channel_id, self.bot_user, data if rtype == 4 else {"flags": flags & EPHEMERAL}, files,
                interaction=interaction, flags=LOADING if rtype == 5 else 0,
            )
            interaction.original_message_id = int(message["id"])
            if not flags & EPHEMERAL:
                await self._dispatch("MESSAGE_CREATE", message)
        elif rtype == 7:
            if interaction.message is None:
                raise _HttpError(400, 50035, "Invalid Form Body: UPDATE_MESSAGE needs a component interaction")
            message = self._edit_message(int(interaction.message["id"]), data, files)
            await self._dispatch("MESSAGE_UPDATE", message)
        elif rtype not in (6, 8, 9):
            raise _HttpError(400, 50035, f"Invalid Form Body: interaction response type {rtype}")
        interaction.acknowledged = True
        interaction.replies.append(Reply("callback", rtype, body, files, message, time.monotonic()))
        answer: dict[str, Any] = {
            "interaction": {
                "id": iid, "type": interaction.type, "response_message_loading": rtype == 5,
                "response_message_ephemeral": bool(int(data.get("flags") or 0) & EPHEMERAL),
            },
            "resource": {"type": rtype},
        }
        if message is not None:
            answer["interaction"]["response_message_id"] = message["id"]
            answer["resource"]["message"] = message
        return 200, answer

    async def _followup(
        self, request: web.Request, body: Any, files: list[StoredFile], app: str, token: str
    ) -> tuple[int, Any]:
        interaction = self._interaction_by_token(token)
        if not interaction.acknowledged:
            raise _HttpError(404, 10015, "Unknown Webhook")
        body = body or {}
        original = self.messages.get(interaction.original_message_id or 0)
        if original is not None and original["flags"] & LOADING:
            # The first followup after a "thinking" defer replaces the loading message, as Discord does.
            message = self._edit_message(int(original["id"]), body, files)
            message["edited_timestamp"] = None
            if not message["flags"] & EPHEMERAL:
                await self._dispatch("MESSAGE_UPDATE", message)
        else:
            message = self._new_message(interaction.channel_id, self.bot_user, body, files, interaction=interaction)
            if not message["flags"] & EPHEMERAL:
                await self._dispatch("MESSAGE_CREATE", message)
        interaction.replies.append(Reply("followup", None, body, files, message, time.monotonic()))
        return 200, message

    def _webhook_message_id(self, interaction: Interaction, mid: str) -> int:
        """Resolve ``@original`` or an id to a message id of this interaction."""
        if mid != "@original":
            return int(mid)
        if interaction.original_message_id is not None:
            return interaction.original_message_id
        if interaction.message is not None and any(r.type in (6, 7) for r in interaction.replies):
            return int(interaction.message["id"])  # a component interaction's original is the message it sits on
        raise _HttpError(404, 10008, "Unknown Message")

    async def _get_webhook_msg(
        self, request: web.Request, body: Any, files: list[StoredFile], app: str, token: str, mid: str
    ) -> tuple[int, Any]:
        interaction = self._interaction_by_token(token)
        return 200, self._message(self._webhook_message_id(interaction, mid))

    async def _edit_webhook_msg(
        self, request: web.Request, body: Any, files: list[StoredFile], app: str, token: str, mid: str
    ) -> tuple[int, Any]:
        interaction = self._interaction_by_token(token)
        message = self._edit_message(self._webhook_message_id(interaction, mid), body or {}, files)
        if not message["flags"] & EPHEMERAL:
            await self._dispatch("MESSAGE_UPDATE", message)
        kind = "edit_original" if mid == "@original" else "edit_followup"
        interaction.replies.append(Reply(kind, None, body or {}, files, message, time.monotonic()))
        return 200, message

    async def _del_webhook_msg(
        self, request: web.Request, body: Any, files: list[StoredFile], app: str, token: str, mid: str
    ) -> tuple[int, None]:
        interaction = self._interaction_by_token(token)
        message_id = self._webhook_message_id(interaction, mid)
        message = self.messages.pop(message_id, None)
        if message is None:
            raise _HttpError(404, 10008, "Unknown Message")
        await self._dispatch("MESSAGE_DELETE", {"id": str(message_id), "channel_id": message["channel_id"],
                                                "guild_id": message["guild_id"]})
        kind = "delete_original" if mid == "@original" else "delete_followup"
        interaction.replies.append(Reply(kind, None, {}, [], message, time.monotonic()))
        return 204, None

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
            self.identify_payload = data
            self._gateway, self._seq = ws, 0
            self._session_id = secrets.token_hex(16)
            await self._dispatch("READY", {
                "v": 10, "user": {**self.bot_user.payload(), "verified": True, "mfa_enabled": False, "flags": 0},
                "guilds": [{"id": str(g), "unavailable": True} for g in self.guilds],
                "session_id": self._session_id, "resume_gateway_url": self.gateway_url,
                "shard": [0, 1], "application": {"id": str(self.application_id), "flags": 0},
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
        needed = _EVENT_INTENTS.get(event)
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
                           bool(data.get("self_deaf")))
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
            guild.voice_states[user_id] = state
        await self._dispatch("VOICE_STATE_UPDATE", state.payload(guild))

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

    # ------------------------------------------------------------------ attachments

    async def _handle_attachment(self, request: web.Request) -> web.Response:
        stored = self._attachments.get(int(request.match_info["id"]))
        if stored is None or stored.filename != request.match_info["filename"]:
            return web.Response(status=404)
        return web.Response(body=stored.data, headers={"Content-Type": stored.content_type})


async def _read_body(request: web.Request) -> tuple[Any, list[StoredFile]]:
    """Parse a JSON or multipart (``payload_json`` + ``files[n]``) body; (None, []) when there is none."""
    if request.content_type.startswith("multipart/"):
        payload: Any = None
        files: list[StoredFile] = []
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if part.name == "payload_json":
                payload = json.loads(await part.text())  # type: ignore[union-attr]
            else:
                data = await part.read()  # type: ignore[union-attr]
                content_type = part.headers.get("Content-Type", "application/octet-stream")
                files.append(StoredFile(part.filename or part.name or "file", content_type, bytes(data)))
        return payload, files
    raw = await request.read()
    return (json.loads(raw) if raw else None), []


def _without_user(member: dict[str, Any]) -> dict[str, Any]:
    """A member payload without its ``user`` key (the shape nested under a user)."""
    return {k: v for k, v in member.items() if k != "user"}


def _has_component(components: Iterable[Mapping[str, Any]], custom_id: str) -> bool:
    """Whether a component tree contains ``custom_id``."""
    for component in components:
        if component.get("custom_id") == custom_id:
            return True
        if _has_component(component.get("components") or [], custom_id):
            return True
    return False
