"""A gateway-less harness for the cogs: real discord.py interactions, a recording REST adapter, fake services.

As discord.py's own ``tests/test_app_commands_invoke.py`` does, interactions are real :class:`discord.Interaction`
objects built from payloads and run through the real command tree, so option parsing, checks, autocomplete, views
and error handlers are all discord.py's. Only the REST edge is replaced: :class:`RecordingAdapter` stands in for
the webhook adapter that interaction responses go through, records every call and answers with message payloads.
The synthesizer and the speech service are fakes (allowed for tests of the Discord layer only).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, AsyncIterator

import numpy as np
import pytest
from discord.webhook import async_ as webhook_async

import discord
from bot.config import config_from_dict
from engines.base import SAMPLE_RATE
from synthesis.types import AudioChunk, Voice, VoiceNotFound, VoiceStyle
from tests.fake_voices import FakeVoices

APP_ID = 100000000000000900
BOT_ID = 100000000000000901
OTHER_BOT_ID = 100000000000000902
GUILD_ID = 100000000000001000
TEXT_ID = 100000000000001100
VOICE_ID = 100000000000001101
AUTOREAD_ID = 100000000000001102
ALICE = 100000000000002001  # an ordinary member, in the voice channel
BOB = 100000000000002002  # an ordinary member, not in voice
ADMIN = 100000000000002003  # has Manage Server
CLONER_ROLE = 100000000000003001

MANAGE_GUILD = 1 << 5
BASIC_PERMS = (1 << 10) | (1 << 11) | (1 << 20) | (1 << 21) | (1 << 31)  # view, send, connect, speak, app cmds


def _user(uid: int, name: str, bot: bool = False) -> dict[str, Any]:
    return {"id": str(uid), "username": name, "global_name": name.title(), "discriminator": "0", "avatar": None,
            "bot": bot}


def _member(uid: int, name: str, roles: list[int] = (), bot: bool = False, perms: int = BASIC_PERMS):
    return {"user": _user(uid, name, bot), "roles": [str(r) for r in roles], "joined_at": "2024-01-01T00:00:00+00:00",
            "deaf": False, "mute": False, "flags": 0, "nick": None, "permissions": str(perms)}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


@dataclass
class Call:
    """One REST call an interaction made."""

    method: str
    path: str
    payload: dict[str, Any] | None
    files: list[tuple[str, bytes]] = field(default_factory=list)


class RecordingAdapter(webhook_async.AsyncWebhookAdapter):
    """Records interaction responses, followups and edits; answers with plausible message payloads."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Call] = []
        self.ids = itertools.count(300_000_000_000_000_000)
        self.messages: dict[int, dict[str, Any]] = {}  # message id -> payload
        self.original: dict[str, int] = {}  # interaction token -> id of its original response message
        self.changed = asyncio.Event()

    def _message(self, payload: dict[str, Any] | None, mid: int | None = None) -> dict[str, Any]:
        """Create or update a message payload from a request payload."""
        payload = payload or {}
        if mid is None or mid not in self.messages:
            mid = mid or next(self.ids)
            self.messages[mid] = {
                "id": str(mid), "channel_id": str(TEXT_ID), "type": 0, "content": "", "author": _user(BOT_ID, "voicebot", True),
                "attachments": [], "embeds": [], "mentions": [], "mention_roles": [], "pinned": False,
                "mention_everyone": False, "tts": False, "timestamp": _now(), "edited_timestamp": None,
                "flags": 0, "components": [], "application_id": str(APP_ID),
            }
        msg = self.messages[mid]
        for key in ("content", "embeds", "components", "flags"):
            if key in payload:
                msg[key] = payload[key] if payload[key] is not None else ([] if key != "content" else "")
        return msg

    async def request(self, route, session, *, payload=None, multipart=None, files=None, **kwargs):
        files_seen: list[tuple[str, bytes]] = []
        if multipart:
            for part in multipart:
                if part["name"] == "payload_json":
                    payload = json.loads(part["value"])
                elif "filename" in part:
                    fp = part["value"]
                    fp.seek(0)
                    files_seen.append((part["filename"], fp.read()))
        path = route.url.split("/api/v10", 1)[-1]
        self.calls.append(Call(route.method, path, payload, files_seen))
        self.changed.set()
        parts = path.split("?")[0].strip("/").split("/")
        if parts[0] == "interactions":  # POST /interactions/{id}/{token}/callback
            token = parts[2]
            rtype = payload["type"]
            data = payload.get("data") or {}
            resource: dict[str, Any] = {"type": rtype}
            if rtype in (4, 5):
                msg = self._message(data)
                self.original[token] = int(msg["id"])
                resource["message"] = msg
            elif rtype == 7:  # update the component's message
                resource["message"] = self._message(data, self.original.get(token))
            return {"interaction": {"id": parts[1], "type": 2, "response_message_id": self.original.get(token),
                                    "response_message_loading": rtype == 5,
                                    "response_message_ephemeral": bool(data.get("flags", 0) & 64)},
                    "resource": resource}
        token = parts[2]
        if parts[-1] == "@original" or (len(parts) == 5 and parts[3] == "messages"):
            mid = self.original.get(token) if parts[-1] == "@original" else int(parts[-1])
            if route.method == "DELETE":
                return None
            return self._message(payload, mid)
        # a followup: POST /webhooks/{app}/{token}
        msg = self._message(payload)
        return msg

    def for_token(self, token: str) -> list[Call]:
        """Every call made with one interaction's token."""
        return [c for c in self.calls if f"/{token}/" in c.path or c.path.endswith(f"/{token}") or
                f"/{token}?" in c.path]

    def texts(self, token: str) -> list[str]:
        """The contents sent or edited for one interaction, in order."""
        out = []
        for c in self.for_token(token):
            p = c.payload or {}
            data = p.get("data", p) if "type" in p and "data" in p else p
            if data.get("content"):
                out.append(data["content"])
        return out

    def original_content(self, token: str) -> str:
        mid = self.original.get(token)
        return self.messages[mid]["content"] if mid is not None else ""


# ---- fakes (Discord-layer tests only) -----------------------------------------------------------------------------

class FakeVoicing:
    """Records create/delete/precompute (the fake synthesizer's ``voicing``)."""

    def __init__(self, voices: "FakeVoices") -> None:
        self.voices = voices
        self.created: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.precomputed: list[tuple[str, tuple[str, ...]]] = []
        self.changed: list[tuple[Any, ...]] = []  # add_clips / add_style / remove_style calls
        self.consents: list[dict[str, Any]] = []  # the consent record each add_clips / add_style was given
        self.fail_with: Exception | None = None
        # set: the clip's speech was partly left out (the line the real voicing gives), so no transcript is stored
        self.kept: str | None = None

    async def create(self, name, data, filename="", *, owner_id=0, transcript=None, language="auto",
                     consent=None, enrollment_prompt=None, progress=None, phrases=(), voice_id=None):
        self.created.append(dict(name=name, data=data, filename=filename, owner_id=owner_id, transcript=transcript,
                                 language=language, consent=consent, enrollment_prompt=enrollment_prompt))
        if self.fail_with is not None:
            raise self.fail_with
        for stage, frac in (("decoding", 0.0), ("encoding", 0.3), ("storing", 0.8), ("done", 1.0)):
            if progress:
                progress(stage, frac)
            await asyncio.sleep(0)
        text = "" if self.kept else (transcript or enrollment_prompt or "").strip()
        voice = self.voices.add(name, owner_id, voice_id, prompt_text=text)
        return voice, [*([self.kept] if self.kept else []), "the clip is a little quiet"]

    async def add_clips(self, voice, uploads, *, consent):
        self.changed.append(("add_clips", voice.id, [(data, name) for data, name in uploads]))
        self.consents.append(consent)
        clips = 1 if voice.clip_ges is None else voice.clip_ges.shape[0]
        ges = np.zeros((clips + len(uploads), *voice.prompt.ge.shape), np.float32)
        return self.voices._put(dataclasses.replace(voice, version=voice.version + 1, clip_ges=ges)), []

    async def add_style(self, voice, style, data, filename, *, consent, transcript="", language="auto"):
        self.changed.append(("add_style", voice.id, style, data, transcript, language))
        self.consents.append(consent)
        kept = "" if self.kept else transcript  # set: the clip's speech was partly left out, as on create
        styles = {**voice.styles, style.casefold(): VoiceStyle(style, language, kept, voice.prompt)}
        return self.voices._put(dataclasses.replace(voice, version=voice.version + 1, styles=styles)), (
            [self.kept] if self.kept else [])

    async def remove_style(self, voice, style):
        self.changed.append(("remove_style", voice.id, style))
        styles = {k: v for k, v in voice.styles.items() if k != style.casefold()}
        return self.voices._put(dataclasses.replace(voice, version=voice.version + 1, styles=styles))

    async def delete(self, voice_id: str) -> None:
        if self.voices.by_id.pop(voice_id, None) is None:
            raise VoiceNotFound(f"no voice with id {voice_id!r}")
        self.deleted.append(voice_id)

    def precompute(self, voice, phrases, progress=None, params=None) -> asyncio.Task[int]:
        phrases = tuple(phrases)
        self.precomputed.append((voice.id, phrases))

        async def run() -> int:
            for i in range(len(phrases)):
                await asyncio.sleep(0)
                if progress:
                    progress("precompute", (i + 1) / len(phrases))
            return len(phrases)

        return asyncio.create_task(run())


class FakeSynthesizer:
    """Streams a sine per voice (frequency from the voice id); its ``voicing`` records create/delete/precompute."""

    busy = False  # (never refuses: the cogs' tests are not about admission)

    def __init__(self) -> None:
        self.voices = FakeVoices()
        self.voicing = FakeVoicing(self.voices)
        self.streamed: list[tuple[str, str]] = []

    # what the voicing recorded, read where the tests read it
    created = property(lambda self: self.voicing.created)
    deleted = property(lambda self: self.voicing.deleted)
    precomputed = property(lambda self: self.voicing.precomputed)

    async def stream(self, text, voice, params=None, *, deadline=None) -> AsyncIterator[AudioChunk]:
        v = voice if isinstance(voice, Voice) else self.voices.get(voice)
        self.streamed.append((text if isinstance(text, str) else "<stream>", v.id))
        freq = 200.0 + 10 * (int(v.id[1:], 16) % 50)
        t = np.arange(int(0.5 * SAMPLE_RATE)) / SAMPLE_RATE
        for i, sentence in enumerate(s for s in str(text).split(".") if s.strip()):
            yield AudioChunk((0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), sentence, i)


# ---- the harness ---------------------------------------------------------------------------------------------------

class Harness:
    """A VoiceBot with its cogs loaded, a guild in its cache, and helpers to invoke commands."""

    def __init__(self, bot, services, adapter: RecordingAdapter) -> None:
        self.bot = bot
        self.services = services
        self.adapter = adapter
        self.state = bot._connection
        self.ids = itertools.count(400_000_000_000_000_000)
        self.guild: discord.Guild = self.state._get_guild(GUILD_ID)
        self.downloads: list[str] = []
        self.attachment_bytes: dict[str, bytes] = {}

    # payloads ---------------------------------------------------------------------------------------------------
    def member_payload(self, user_id: int) -> dict[str, Any]:
        (m,) = [m for m in guild_payload()["members"] if m["user"]["id"] == str(user_id)]
        perms = MANAGE_GUILD | BASIC_PERMS if user_id == ADMIN else BASIC_PERMS
        return dict(m, permissions=str(perms))

    def _base(self, itype: int, user_id: int, data: dict[str, Any]) -> dict[str, Any]:
        iid = next(self.ids)
        return {"id": str(iid), "application_id": str(APP_ID), "type": itype, "token": f"tok{iid}", "version": 1,
                "guild_id": str(GUILD_ID), "channel": {"id": str(TEXT_ID), "type": 0},
                "channel_id": str(TEXT_ID), "member": self.member_payload(user_id), "data": data,
                "attachment_size_limit": 25 * 1024 * 1024, "app_permissions": str(BASIC_PERMS), "locale": "en-US",
                "entitlements": [], "authorizing_integration_owners": {}, "context": 0}

    def attachment(self, filename: str, data: bytes | None, content_type: str | None, size: int | None = None):
        aid = next(self.ids)
        url = f"https://cdn.invalid/attachments/{aid}/{filename}"
        if data is not None:
            self.attachment_bytes[url] = data
        payload = {"id": str(aid), "filename": filename, "size": size if size is not None else len(data or b""),
                   "url": url, "proxy_url": url}
        if content_type:
            payload["content_type"] = content_type
        return payload

    def _options(self, command, values: dict[str, Any], focused: str | None) -> tuple[list, dict]:
        opts, resolved = [], {}
        params = {p.name: p for p in command.parameters}
        for name, value in values.items():
            ptype = params[name].type
            opt = {"name": name, "type": ptype.value}
            if ptype is discord.AppCommandOptionType.attachment:
                resolved.setdefault("attachments", {})[value["id"]] = value
                opt["value"] = value["id"]
            elif ptype is discord.AppCommandOptionType.user:
                member = self.member_payload(value)
                resolved.setdefault("users", {})[str(value)] = member["user"]
                resolved.setdefault("members", {})[str(value)] = {k: v for k, v in member.items() if k != "user"}
                opt["value"] = str(value)
            elif ptype in (discord.AppCommandOptionType.channel, discord.AppCommandOptionType.role):
                opt["value"] = str(value)
            else:
                opt["value"] = value
            if name == focused:
                opt["focused"] = True
            opts.append(opt)
        return opts, resolved

    def _command(self, qualified: str):
        parts = qualified.split()
        cmd = self.bot.tree.get_command(parts[0])
        assert cmd is not None, qualified
        for p in parts[1:]:
            cmd = cmd.get_command(p)
            assert cmd is not None, qualified
        return cmd

    def slash_payload(self, qualified: str, user_id: int, focused: str | None = None, **values: Any):
        command = self._command(qualified)
        opts, resolved = self._options(command, values, focused)
        data: dict[str, Any] = {"name": command.name, "type": 1, "options": opts}
        node = command
        while node.parent is not None:
            data = {"name": node.parent.name, "type": 1, "options": [{**data, "type": 1 if isinstance(node, discord.app_commands.Command) else 2}]}
            node = node.parent
        data["id"] = str(next(self.ids))
        if resolved:
            data["resolved"] = resolved
        return self._base(4 if focused else 2, user_id, data)

    # invoking ---------------------------------------------------------------------------------------------------
    async def slash(self, qualified: str, user_id: int = ALICE, **values: Any) -> str:
        """Run a slash command to completion; return the interaction token (for the adapter's lookups)."""
        payload = self.slash_payload(qualified, user_id, **values)
        await self.bot.tree._call(discord.Interaction(data=payload, state=self.state))
        return payload["token"]

    def start_slash(self, qualified: str, user_id: int = ALICE, **values: Any) -> tuple[str, asyncio.Task]:
        """Start a slash command that waits (e.g. for a button); return its token and task."""
        payload = self.slash_payload(qualified, user_id, **values)
        task = asyncio.create_task(self.bot.tree._call(discord.Interaction(data=payload, state=self.state)))
        return payload["token"], task

    async def autocomplete(self, qualified: str, focused: str, user_id: int = ALICE, **values: Any) -> list[dict]:
        payload = self.slash_payload(qualified, user_id, focused=focused, **values)
        await self.bot.tree._call(discord.Interaction(data=payload, state=self.state))
        (call,) = [c for c in self.adapter.for_token(payload["token"])]
        assert call.payload["type"] == 8
        return call.payload["data"]["choices"]

    async def context_menu(self, name: str, user_id: int, message: dict[str, Any]) -> str:
        data = {"id": str(next(self.ids)), "name": name, "type": 3, "target_id": message["id"],
                "resolved": {"messages": {message["id"]: message}}}
        payload = self._base(2, user_id, data)
        await self.bot.tree._call(discord.Interaction(data=payload, state=self.state))
        return payload["token"]

    async def wait_for(self, predicate, timeout: float = 3.0) -> None:
        """Wait until ``predicate()`` is true (checked whenever the adapter records a call)."""
        async def loop() -> None:
            while not predicate():
                self.adapter.changed.clear()
                try:
                    await asyncio.wait_for(self.adapter.changed.wait(), 0.05)
                except asyncio.TimeoutError:
                    pass
        await asyncio.wait_for(loop(), timeout)

    async def click(self, token: str, label: str, user_id: int = ALICE) -> None:
        """Click the button labelled ``label`` on the original response of the interaction ``token``."""
        mid = self.adapter.original[token]
        msg = self.adapter.messages[mid]
        buttons = [c for row in msg["components"] for c in row.get("components", [])]
        (button,) = [b for b in buttons if b.get("label") == label]
        payload = self._base(3, user_id, {"custom_id": button["custom_id"], "component_type": 2})
        payload["message"] = msg
        self.adapter.original[payload["token"]] = mid  # a component's "original" is the message it sits on
        self.state.parse_interaction_create(payload)
        await asyncio.sleep(0)

    def message(self, author_id: int, content: str, channel_id: int = AUTOREAD_ID, webhook: bool = False,
                mid: int | None = None) -> discord.Message:
        data = self.message_payload(author_id, content, channel_id, webhook, mid)
        channel = self.guild.get_channel(channel_id)
        return discord.Message(state=self.state, channel=channel, data=data)

    def message_payload(self, author_id: int, content: str, channel_id: int = AUTOREAD_ID, webhook: bool = False,
                        mid: int | None = None) -> dict[str, Any]:
        m = next((m for m in guild_payload()["members"] if m["user"]["id"] == str(author_id)), None)
        author = m["user"] if m else _user(author_id, "hook", True)
        data = {"id": str(mid or next(self.ids)), "channel_id": str(channel_id), "guild_id": str(GUILD_ID),
                "type": 0, "content": content, "author": author,
                "attachments": [], "embeds": [], "mentions": [], "mention_roles": [], "pinned": False,
                "mention_everyone": False, "tts": False, "timestamp": _now(), "edited_timestamp": None, "flags": 0,
                "components": []}
        if m is not None and not webhook:
            mp = self.member_payload(author_id)
            mp.pop("user")
            data["member"] = mp
        if webhook:
            data["webhook_id"] = "777"
        return data


def guild_payload() -> dict[str, Any]:
    everyone = {"id": str(GUILD_ID), "name": "@everyone", "permissions": str(BASIC_PERMS), "position": 0,
                "color": 0, "hoist": False, "managed": False, "mentionable": False, "flags": 0}
    cloner = dict(everyone, id=str(CLONER_ROLE), name="cloners", position=1)
    channels = [
        {"id": str(TEXT_ID), "type": 0, "name": "general", "position": 0, "permission_overwrites": []},
        {"id": str(AUTOREAD_ID), "type": 0, "name": "tts", "position": 1, "permission_overwrites": []},
        {"id": str(VOICE_ID), "type": 2, "name": "Lounge", "position": 2, "permission_overwrites": [],
         "bitrate": 64000, "user_limit": 0},
    ]
    members = [_member(BOT_ID, "voicebot", bot=True), _member(ALICE, "alice"), _member(BOB, "bob", [CLONER_ROLE]),
               _member(ADMIN, "admin"), _member(OTHER_BOT_ID, "chatbot", bot=True)]
    voice_states = [{"user_id": str(ALICE), "channel_id": str(VOICE_ID), "session_id": "s1", "deaf": False,
                     "mute": False, "self_deaf": False, "self_mute": False, "self_video": False,
                     "suppress": False, "request_to_speak_timestamp": None}]
    return {"id": str(GUILD_ID), "name": "Test Server", "owner_id": str(ADMIN), "roles": [everyone, cloner],
            "channels": channels, "members": members, "voice_states": voice_states, "emojis": [], "stickers": [],
            "features": [], "member_count": len(members), "threads": [], "stage_instances": [],
            "guild_scheduled_events": [], "soundboard_sounds": [], "large": False, "premium_tier": 0,
            "preferred_locale": "en-US", "afk_timeout": 300, "verification_level": 0,
            "default_message_notifications": 0, "explicit_content_filter": 0, "mfa_level": 0, "nsfw_level": 0,
            "system_channel_flags": 0, "unavailable": False}


@pytest.fixture
def config(tmp_path: Path):
    return config_from_dict({"discord": {"max_attachment_mb": 1.0, "database": str(tmp_path / "bot.sqlite3")},
                             "phrases": ["Hello!", "Good night."]}, base_dir=tmp_path)


class FakeSpeaker:
    """The part of a GuildSpeaker the cogs read."""

    def __init__(self) -> None:
        self.channel = None
        self.is_connected = False


class FakeSpeech:
    """The SpeechService surface the cogs call, recording every call (the speech layer has its own tests)."""

    def __init__(self, synthesizer: FakeSynthesizer, store) -> None:
        self.synthesizer, self.store = synthesizer, store
        self.calls: list[tuple] = []
        self.styles: list[str] = []  # the style of each say call
        self.speakers: dict[int, FakeSpeaker] = {}
        self.streams: list[list[str]] = []  # pieces received by each say_stream, as consumed
        self.consumers: list[asyncio.Task] = []
        self.on_error = None
        self.raise_on_say: Exception | None = None

    def speaker(self, guild_id: int) -> FakeSpeaker:
        return self.speakers.setdefault(guild_id, FakeSpeaker())

    async def join(self, guild, member):
        channel = member.voice.channel
        spk = self.speaker(guild.id)
        spk.channel, spk.is_connected = channel, True
        self.calls.append(("join", guild.id, channel.id))
        return channel

    async def leave(self, guild_id: int) -> int:
        self.calls.append(("leave", guild_id))
        self.speakers[guild_id] = FakeSpeaker()
        return 2

    def skip(self, guild_id: int) -> bool:
        self.calls.append(("skip", guild_id))
        return self.speaker(guild_id).is_connected

    def clear(self, guild_id: int) -> int:
        self.calls.append(("clear", guild_id))
        return 3

    async def say(self, guild, member, text, *, source="slash", attachments=(), mentions=(), voice=None, style=""):
        self.calls.append(("say", member.id, text, source, tuple(a.filename for a in attachments),
                           voice.id if voice else None))
        self.styles.append(style)
        if self.raise_on_say is not None:
            raise self.raise_on_say
        return SimpleNamespace(ahead=len([c for c in self.calls if c[0] == "say"]) - 1, voice=voice, text=text)

    async def say_stream(self, guild, member, pieces, *, voice=None):
        received: list[str] = []
        self.streams.append(received)
        self.calls.append(("say_stream", member.id, voice.id if voice else None))

        async def consume() -> None:  # as the speaker would, when the item's turn comes
            async for piece in pieces:
                received.append(piece)

        self.consumers.append(asyncio.create_task(consume()))
        return SimpleNamespace(ahead=0, voice=voice, text=None)

    async def resolve_voice(self, guild, member):
        from bot.speech import NoVoice

        vid = (await self.store.user_settings(member.id, guild.id))["voice"]
        own = self.synthesizer.voices.list(owner_id=member.id)
        if vid:
            return self.synthesizer.voices.get(vid)
        if own:
            return own[0]
        raise NoVoice("you have no voice yet: record one with /voice clone")

    async def on_voice_state_update(self, member, before, after) -> None:
        self.calls.append(("voice_state", member.id))

    async def on_channel_delete(self, channel) -> None:
        self.calls.append(("channel_delete", channel.id))

    async def on_guild_remove(self, guild_id: int) -> None:
        self.calls.append(("guild_remove", guild_id))

    async def dropped_after_restart(self, guild_id: int):
        return []

    async def shutdown(self) -> None:
        self.calls.append(("shutdown",))


@pytest.fixture
async def harness(config, tmp_path):
    """The bot with every cog loaded against a fresh SQLite store, fake synthesizer and speech."""
    from bot.client import VoiceBot
    from bot.store import Store
    from bot.voice_service import VoiceService
    from cogs import EXTENSIONS

    store = Store(tmp_path / "bot.sqlite3")
    await store.open()
    # the fields of bot.services.Services (not imported: it builds the real engine stack)
    synthesizer = FakeSynthesizer()
    services = SimpleNamespace(config=config, synthesizer=synthesizer, store=store,
                               speech=FakeSpeech(synthesizer, store),
                               voices=VoiceService(store, synthesizer, phrases=config.phrases))
    bot = VoiceBot(services, extensions=EXTENSIONS, sync_commands=False)
    await bot._async_setup_hook()
    state = bot._connection
    state.user = discord.ClientUser(state=state, data=_user(BOT_ID, "voicebot", True))
    state.application_id = APP_ID
    state._add_guild_from_data(guild_payload())
    await bot.setup_hook()
    adapter = RecordingAdapter()
    token = webhook_async.async_context.set(adapter)
    h = Harness(bot, services, adapter)

    async def fake_download(url: str) -> bytes:
        h.downloads.append(url)
        return h.attachment_bytes[url]

    bot.http.get_from_cdn = fake_download  # Attachment.read() fetches through this
    try:
        yield h
    finally:
        for task in services.speech.consumers:
            task.cancel()
        webhook_async.async_context.reset(token)
        for cog in list(bot.cogs):
            await bot.remove_cog(cog)
        await store.close()
