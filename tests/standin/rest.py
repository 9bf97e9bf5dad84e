"""The stand-in's REST API (``/api/v10``): the routes discord.py calls, messages, the bot's answers to
interactions (callback, follow-ups, webhook messages) and attachment downloads."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiohttp import web

from .base import JSON_HEADERS, HttpError, RecordedRequest, read_body, without_user
from .model import (
    EPHEMERAL, GUILD_STAGE_VOICE, LOADING, MUTE_MEMBERS, Channel, Guild, Interaction, Reply, StoredFile, User,
    mentioned_ids, now_iso,
)

log = logging.getLogger(__name__)


class RestApi:
    """REST routes and their handlers; part of :class:`~tests.standin.server.Standin`, whose state they use."""

    # ------------------------------------------------------------------ REST

    async def _handle_rest(self, request: web.Request) -> web.Response:
        path = "/" + request.match_info["tail"]
        body, files = await read_body(request)
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
                raise HttpError(404, 0, "404: Not Found")
        except HttpError as e:
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
            raise HttpError(401, 0, "401: Unauthorized")

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
            ("PATCH", r"/guilds/(?P<gid>\d+)/voice-states/@me", self._edit_my_voice_state),
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
            raise HttpError(404, 10013, "Unknown User")
        return 200, user.payload()

    async def _get_application(self, request: web.Request, body: Any, files: list[StoredFile]) -> tuple[int, Any]:
        owner = self.users[self.layout.admin_id]
        return 200, {
            "id": str(self.application_id), "name": self.bot_user.username, "icon": None, "description": "",
            "bot_public": True, "bot_require_code_grant": False, "owner": owner.payload(), "team": None,
            "verify_key": "00" * 32, "flags": self.application_flags, "summary": "", "rpc_origins": [], "tags": [],
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

    async def _edit_my_voice_state(self, request: web.Request, body: Any, files: list[StoredFile],
                                   gid: str) -> tuple[int, Any]:
        """The bot becomes a Stage speaker (``suppress: false``; needs Mute Members there) or goes back to the
        audience: VOICE_STATE_UPDATE."""
        guild = self.guilds[int(gid)]
        state = guild.voice_states.get(self.bot_user.id)
        if state is None or state.channel_id is None or self.channels[state.channel_id].type != GUILD_STAGE_VOICE:
            raise HttpError(400, 50024, "Cannot execute action on this channel type")
        suppress = bool((body or {}).get("suppress", state.suppress))
        allow, deny = self.channels[state.channel_id].member_overwrites.get(self.bot_user.id, (0, 0))
        if not suppress and not (guild.permissions_of(self.bot_user.id) & ~deny | allow) & MUTE_MEMBERS:
            raise HttpError(403, 50013, "Missing Permissions")
        state.suppress = suppress
        await self._dispatch("VOICE_STATE_UPDATE", state.payload(guild))
        return 204, None

    async def _get_guild(self, request: web.Request, body: Any, files: list[StoredFile], gid: str) -> tuple[int, Any]:
        guild = self.guilds.get(int(gid))
        if guild is None:
            raise HttpError(404, 10004, "Unknown Guild")
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
            raise HttpError(404, 10007, "Unknown Member")
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
            raise HttpError(404, 10008, "Unknown Message")
        await self._dispatch("MESSAGE_DELETE", {"id": mid, "channel_id": cid, "guild_id": message.get("guild_id")})
        return 204, None

    def _channel(self, channel_id: int) -> Channel:
        """A channel by id, or Discord's 404."""
        channel = self.channels.get(channel_id)
        if channel is None:
            raise HttpError(404, 10003, "Unknown Channel")
        return channel

    def _message(self, message_id: int) -> dict[str, Any]:
        """A message by id, or Discord's 404."""
        message = self.messages.get(message_id)
        if message is None:
            raise HttpError(404, 10008, "Unknown Message")
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
            message["member"] = without_user(guild.members[author.id].payload())
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
            data["member"] = without_user(guild.members[user.id].payload())
        return data

    # ------------------------------------------------------------------ interactions: the bot's answers

    def _interaction_by_token(self, token: str) -> Interaction:
        """The interaction a webhook token belongs to, or Discord's 404."""
        found = next((i for i in self.interactions.values() if i.token == token), None)
        if found is None:
            raise HttpError(404, 10015, "Unknown Webhook")
        return found

    async def _interaction_callback(
        self, request: web.Request, body: Any, files: list[StoredFile], iid: str, token: str
    ) -> tuple[int, Any]:
        interaction = self.interactions.get(int(iid))
        if interaction is None or interaction.token != token:
            raise HttpError(404, 10062, "Unknown interaction")
        if interaction.acknowledged:
            raise HttpError(400, 40060, "Interaction has already been acknowledged.")
        if time.monotonic() - interaction.created_at > self.interaction_ack_window_s:
            log.warning("stand-in: interaction %s answered after %.2f s", iid, time.monotonic() - interaction.created_at)
            raise HttpError(404, 10062, "Unknown interaction")
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
                raise HttpError(400, 50035, "Invalid Form Body: UPDATE_MESSAGE needs a component interaction")
            message = self._edit_message(int(interaction.message["id"]), data, files)
            await self._dispatch("MESSAGE_UPDATE", message)
        elif rtype not in (6, 8, 9):
            raise HttpError(400, 50035, f"Invalid Form Body: interaction response type {rtype}")
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
            raise HttpError(404, 10015, "Unknown Webhook")
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
        raise HttpError(404, 10008, "Unknown Message")

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
            raise HttpError(404, 10008, "Unknown Message")
        await self._dispatch("MESSAGE_DELETE", {"id": str(message_id), "channel_id": message["channel_id"],
                                                "guild_id": message["guild_id"]})
        kind = "delete_original" if mid == "@original" else "delete_followup"
        interaction.replies.append(Reply(kind, None, {}, [], message, time.monotonic()))
        return 204, None

    # ------------------------------------------------------------------ attachments

    async def _handle_attachment(self, request: web.Request) -> web.Response:
        stored = self._attachments.get(int(request.match_info["id"]))
        if stored is None or stored.filename != request.match_info["filename"]:
            return web.Response(status=404)
        return web.Response(body=stored.data, headers={"Content-Type": stored.content_type})
