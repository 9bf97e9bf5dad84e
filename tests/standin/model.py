"""The stand-in's world: users, guilds, channels, roles, members, voice states, messages and interactions.

Everything here is plain data that renders itself as the JSON payloads Discord's API v10 sends. The server
(``server.py``) mutates it and dispatches the matching gateway events; tests read it to assert on what the bot did.
"""

from __future__ import annotations

import base64
import datetime
import itertools
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

DISCORD_EPOCH_MS = 1_420_070_400_000  # 2015-01-01T00:00:00Z in ms, the origin of snowflake timestamps

# Permission bits (https://discord.com/developers/docs/topics/permissions), as Discord encodes them.
ADMINISTRATOR = 1 << 3
VIEW_CHANNEL = 1 << 10
SEND_MESSAGES = 1 << 11
EMBED_LINKS = 1 << 14
ATTACH_FILES = 1 << 15
READ_MESSAGE_HISTORY = 1 << 16
MUTE_MEMBERS = 1 << 22  # with it a member may make themselves a Stage speaker (a Stage moderator)
CONNECT = 1 << 20
SPEAK = 1 << 21
USE_VAD = 1 << 25
USE_APPLICATION_COMMANDS = 1 << 31
ALL_PERMISSIONS = (1 << 51) - 1  # what an administrator effectively holds
EVERYONE_PERMISSIONS = (
    VIEW_CHANNEL | SEND_MESSAGES | EMBED_LINKS | ATTACH_FILES | READ_MESSAGE_HISTORY
    | CONNECT | SPEAK | USE_VAD | USE_APPLICATION_COMMANDS
)

# Channel types
GUILD_TEXT = 0
GUILD_VOICE = 2
GUILD_STAGE_VOICE = 13

# Message flags
EPHEMERAL = 1 << 6
LOADING = 1 << 7

_MENTION_RE = re.compile(r"<@!?(\d+)>")


def now_iso() -> str:
    """The current UTC time as Discord formats timestamps."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


class SnowflakeFactory:
    """Makes unique, time-ordered snowflake ids (ms since the Discord epoch << 22 | counter)."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def __call__(self) -> int:
        ms = int(time.time() * 1000) - DISCORD_EPOCH_MS
        return (ms << 22) | (next(self._counter) & 0x3FFFFF)


def bot_token_for(user_id: int) -> str:
    """A random token of a real bot token's shape: base64url(user id) . base64url(timestamp) . 27-char signature."""
    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")

    return f"{b64(str(user_id).encode())}.{b64(int(time.time()).to_bytes(4, 'big'))[:6]}.{secrets.token_urlsafe(20)[:27]}"


@dataclass
class User:
    id: int
    username: str
    bot: bool = False

    def payload(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "username": self.username,
            "discriminator": "0",
            "global_name": self.username,
            "avatar": None,
            "bot": self.bot,
            "public_flags": 0,
        }


@dataclass
class Role:
    id: int
    name: str
    permissions: int
    position: int = 0

    def payload(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "name": self.name,
            "color": 0,
            "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
            "hoist": False,
            "icon": None,
            "unicode_emoji": None,
            "position": self.position,
            "permissions": str(self.permissions),
            "managed": False,
            "mentionable": False,
            "flags": 0,
        }


@dataclass
class Channel:
    id: int
    guild_id: int
    name: str
    type: int = GUILD_TEXT
    position: int = 0
    # member overwrites: user id -> (allow, deny) permission bits, as the channel's permission_overwrites send them
    member_overwrites: dict[int, tuple[int, int]] = field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": str(self.id),
            "type": self.type,
            "guild_id": str(self.guild_id),
            "name": self.name,
            "position": self.position,
            "permission_overwrites": [{"id": str(uid), "type": 1, "allow": str(allow), "deny": str(deny)}
                                      for uid, (allow, deny) in self.member_overwrites.items()],
            "nsfw": False,
            "parent_id": None,
            "last_message_id": None,
            "rate_limit_per_user": 0,
            "flags": 0,
        }
        if self.type in (GUILD_VOICE, GUILD_STAGE_VOICE):
            data.update(bitrate=64000, user_limit=0, rtc_region=None, video_quality_mode=1)
        else:
            data["topic"] = None
        return data


@dataclass
class Member:
    user: User
    role_ids: list[int] = field(default_factory=list)
    nick: str | None = None
    joined_at: str = field(default_factory=now_iso)

    def payload(self) -> dict[str, Any]:
        return {
            "user": self.user.payload(),
            "nick": self.nick,
            "avatar": None,
            "roles": [str(r) for r in self.role_ids],
            "joined_at": self.joined_at,
            "premium_since": None,
            "deaf": False,
            "mute": False,
            "flags": 0,
            "pending": False,
            "communication_disabled_until": None,
        }


@dataclass
class VoiceState:
    user_id: int
    channel_id: int | None
    session_id: str = field(default_factory=lambda: secrets.token_hex(16))
    self_mute: bool = False
    self_deaf: bool = False
    suppress: bool = False  # in a Stage channel: in the audience (everyone joins a Stage suppressed)

    def payload(self, guild: Guild | None = None) -> dict[str, Any]:
        data: dict[str, Any] = {
            "user_id": str(self.user_id),
            "channel_id": None if self.channel_id is None else str(self.channel_id),
            "session_id": self.session_id,
            "deaf": False,
            "mute": False,
            "self_deaf": self.self_deaf,
            "self_mute": self.self_mute,
            "self_video": False,
            "suppress": self.suppress,
            "request_to_speak_timestamp": None,
        }
        if guild is not None:
            data["guild_id"] = str(guild.id)
            member = guild.members.get(self.user_id)
            if member is not None:
                data["member"] = member.payload()
        return data


@dataclass
class Guild:
    id: int
    name: str
    owner_id: int
    channels: dict[int, Channel] = field(default_factory=dict)
    roles: dict[int, Role] = field(default_factory=dict)
    members: dict[int, Member] = field(default_factory=dict)
    voice_states: dict[int, VoiceState] = field(default_factory=dict)
    joined_at: str = field(default_factory=now_iso)

    def permissions_of(self, user_id: int) -> int:
        """The guild-level permission integer of a member: @everyone OR their roles; admins hold all."""
        perms = self.roles[self.id].permissions
        member = self.members.get(user_id)
        for role_id in member.role_ids if member else ():
            perms |= self.roles[role_id].permissions
        return ALL_PERMISSIONS if perms & ADMINISTRATOR else perms

    def channel_of_type(self, type_: int) -> Channel:
        """The first channel of a type (raises KeyError when the guild has none)."""
        for channel in self.channels.values():
            if channel.type == type_:
                return channel
        raise KeyError(f"guild {self.id} has no channel of type {type_}")

    def payload(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "name": self.name,
            "icon": None,
            "splash": None,
            "discovery_splash": None,
            "banner": None,
            "description": None,
            "owner_id": str(self.owner_id),
            "afk_channel_id": None,
            "afk_timeout": 300,
            "verification_level": 0,
            "default_message_notifications": 0,
            "explicit_content_filter": 0,
            "mfa_level": 0,
            "nsfw_level": 0,
            "premium_tier": 0,
            "premium_subscription_count": 0,
            "premium_progress_bar_enabled": False,
            "preferred_locale": "en-US",
            "features": [],
            "emojis": [],
            "stickers": [],
            "system_channel_id": None,
            "system_channel_flags": 0,
            "rules_channel_id": None,
            "public_updates_channel_id": None,
            "safety_alerts_channel_id": None,
            "vanity_url_code": None,
            "application_id": None,
            "max_members": 500000,
            "joined_at": self.joined_at,
            "large": False,
            "unavailable": False,
            "member_count": len(self.members),
            "roles": [r.payload() for r in self.roles.values()],
            "channels": [c.payload() for c in self.channels.values()],
            "members": [m.payload() for m in self.members.values()],
            "voice_states": [v.payload() for v in self.voice_states.values() if v.channel_id is not None],
            "presences": [],
            "threads": [],
            "stage_instances": [],
            "guild_scheduled_events": [],
            "soundboard_sounds": [],
        }


@dataclass
class StoredFile:
    """One file part of a multipart request (``files[n]``), or one served attachment."""

    filename: str
    content_type: str
    data: bytes


@dataclass
class Reply:
    """One thing the bot did in answer to an interaction.

    kind: ``callback`` (``type`` is the response type 4-9), ``followup``, ``edit_original``, ``delete_original``,
    ``edit_followup`` or ``delete_followup``. ``payload`` is the parsed JSON (``payload_json`` for multipart);
    ``message`` the message that resulted, if any; ``at`` the ``time.monotonic()`` of arrival.
    """

    kind: str
    type: int | None
    payload: dict[str, Any]
    files: list[StoredFile]
    message: dict[str, Any] | None
    at: float

    @property
    def content(self) -> str | None:
        """The content this reply set (from its payload), else that of the message it made, edited or deleted."""
        data = self.payload.get("data", self.payload) if self.kind == "callback" else self.payload
        if isinstance(data, dict) and "content" in data:
            return data["content"]
        return None if self.message is None else self.message.get("content")

    @property
    def ephemeral(self) -> bool:
        """Whether the reply asked for an ephemeral message (flag 64)."""
        data = self.payload.get("data", self.payload) if self.kind == "callback" else self.payload
        return bool(isinstance(data, dict) and int(data.get("flags") or 0) & EPHEMERAL)


@dataclass
class Interaction:
    """An interaction the stand-in created and the bot's answers to it."""

    id: int
    token: str
    type: int
    guild_id: int
    channel_id: int
    user_id: int
    data: dict[str, Any]
    created_at: float  # time.monotonic() when INTERACTION_CREATE was sent
    message: dict[str, Any] | None = None  # the message a component belongs to
    replies: list[Reply] = field(default_factory=list)
    original_message_id: int | None = None
    acknowledged: bool = False


def mentioned_ids(content: str) -> list[int]:
    """User ids mentioned as ``<@id>`` or ``<@!id>`` in message content, in order, without repeats."""
    seen: dict[int, None] = {}
    for match in _MENTION_RE.finditer(content):
        seen[int(match.group(1))] = None
    return list(seen)
