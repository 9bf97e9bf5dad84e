"""What the stand-in's parts share: Discord's constants, the errors, the records, the body parsers."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .dave import DaveMember
from .model import StoredFile
from .voice_udp import SUPPORTED_MODE

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
INTENT_GUILD_PRESENCES = 1 << 8
INTENTS_PRIVILEGED = INTENT_GUILD_MEMBERS | INTENT_GUILD_PRESENCES | INTENT_MESSAGE_CONTENT
# Application flags: which privileged intents the developer portal switched on (the LIMITED bits: under 100 servers)
APP_FLAG_GATEWAY_PRESENCE, APP_FLAG_GATEWAY_PRESENCE_LIMITED = 1 << 12, 1 << 13
APP_FLAG_GATEWAY_GUILD_MEMBERS, APP_FLAG_GATEWAY_GUILD_MEMBERS_LIMITED = 1 << 14, 1 << 15
APP_FLAG_GATEWAY_MESSAGE_CONTENT, APP_FLAG_GATEWAY_MESSAGE_CONTENT_LIMITED = 1 << 18, 1 << 19
CLOSE_DISALLOWED_INTENTS = 4014  # the gateway's close code for a privileged intent the application lacks
EVENT_INTENTS = {
    "GUILD_MEMBER_ADD": INTENT_GUILD_MEMBERS,
    "VOICE_STATE_UPDATE": INTENT_GUILD_VOICE_STATES,
    "MESSAGE_CREATE": INTENT_GUILD_MESSAGES,
    "MESSAGE_UPDATE": INTENT_GUILD_MESSAGES,
    "MESSAGE_DELETE": INTENT_GUILD_MESSAGES,
}

OPTION_SUBCOMMAND, OPTION_GROUP = 1, 2
OPTION_USER, OPTION_CHANNEL, OPTION_ROLE, OPTION_MENTIONABLE, OPTION_ATTACHMENT = 6, 7, 8, 9, 11
OPTION_CASTS: dict[int, Callable[[Any], Any]] = {3: str, 4: int, 5: bool, 10: float}


class StandinError(Exception):
    """A test drove the stand-in wrongly (unknown command, bot not connected, ...); the message says what."""


class HttpError(Exception):
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
    dave: DaveMember | None = None  # its member of the channel's DAVE group, when the stand-in speaks DAVE


async def read_body(request: web.Request) -> tuple[Any, list[StoredFile]]:
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


def without_user(member: dict[str, Any]) -> dict[str, Any]:
    """A member payload without its ``user`` key (the shape nested under a user)."""
    return {k: v for k, v in member.items() if k != "user"}


def has_component(components: Iterable[Mapping[str, Any]], custom_id: str) -> bool:
    """Whether a component tree contains ``custom_id``."""
    for component in components:
        if component.get("custom_id") == custom_id:
            return True
        if has_component(component.get("components") or [], custom_id):
            return True
    return False
