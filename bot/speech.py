"""The one entry point the cogs call to make the bot speak in a guild.

:class:`SpeechService` owns the per-guild speakers. ``say`` applies the guild's policy (ignored bots, required
role, "in my voice channel"), joins when it should, picks the voice, the speed and the language, rewrites the text
(``bot.textrules``), and queues it; ``say_stream`` does the same for a chat model's reply that is still being
written. Every refusal is a :class:`~engines.base.SpeechError` whose message tells the member what to do, so the
cogs can answer it as it is (slash commands) or drop it quietly (auto-read).

Voice choice for a member, first that exists and may be used in the guild:

1. the voice they selected (``/voice use``: their own, a server voice, or one shared with this guild);
2. their own voice;
3. the guild's ``default_voice``;
4. a server voice of the guild (added by an admin), then a voice recorded by the operator (owner 0).

A voice another member shared is used only when selected: falling back to someone's personal voice would make a
message sound as if that person said it. Bots are read in the voice ``bot_voices`` assigns them, else 3-4.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

from synthesis import SpeechBackend, SpeechError, SynthesisParams, Voice
from synthesis.styles import with_style
from synthesis.types import BusyError

from bot.config import Config
from bot.pronunciations import Pronunciations
from bot.speaker import ErrorCallback, GuildSpeaker, NotInVoice, SpeechItem
from bot.store import JournalEntry, Store
from bot.usage import UsageCounter
from bot.voice_service import VoiceService
from bot.textrules import (
    MessageContext,
    TextRules,
    clean_stream,
    clean_text,
    mentioned_user_ids,
    summarize_attachments,
)

log = logging.getLogger(__name__)

SOURCES = ("slash", "autoread", "chat", "context")
SUMMARY_CHARS = 60  # characters of a message quoted in errors and the restart journal
PLAYBACK_ALLOWANCE = 2.0  # deadline allowance per second of allowed speech (pauses, slow voices)


class SpeechRefused(SpeechError):
    """The guild's settings say this message is not to be read; the message says which setting."""


class NothingToSay(SpeechError):
    """Nothing readable is left after the text rules (only emoji, punctuation or code)."""


class NoVoice(SpeechError):
    """No voice can be used for this member in this guild."""


class VoicePermissionMissing(SpeechError):
    """The bot lacks View Channel, Connect or Speak in the voice channel it would join; the message names them."""


# (discord.Permissions attribute, the name Discord's UI shows) the bot needs in a voice channel to be heard there
_VOICE_PERMISSIONS = (("view_channel", "View Channel"), ("connect", "Connect"), ("speak", "Speak"))


def check_voice_permissions(channel: Any) -> None:
    """Refuse, in one line naming the missing permission, a voice channel the bot could not join or be heard in.

    ``channel`` is a ``discord.VoiceChannel`` (``permissions_for``, ``guild.me``); a channel without them (tests'
    fakes) passes.

    Raises
    ------
    VoicePermissionMissing
        The bot's permissions there lack View Channel, Connect or Speak.
    """
    me = getattr(getattr(channel, "guild", None), "me", None)
    permissions_for = getattr(channel, "permissions_for", None)
    if me is None or not callable(permissions_for):
        return
    perms = permissions_for(me)
    if _is_stage(channel) and not getattr(perms, "mute_members", False):
        where = getattr(channel, "mention", None) or getattr(channel, "name", "that Stage")
        raise VoicePermissionMissing(f"{where} is a Stage: I would join its audience, where I cannot be heard; give me "
                                     "the Mute Members permission there (a Stage moderator), or use a voice channel")
    # the first one missing: Discord (and discord.py) deny the later ones with it, so granting it may be enough
    missing = next((label for attr, label in _VOICE_PERMISSIONS if not getattr(perms, attr, True)), None)
    if missing is not None:
        where = getattr(channel, "mention", None) or getattr(channel, "name", "that voice channel")
        raise VoicePermissionMissing(f"I need the {missing} permission in {where} to speak there; ask a server "
                                     "admin to grant it")


@dataclass(frozen=True)
class SayResult:
    """What was queued: ``ahead`` items are before it (0: next), in ``voice``; ``text`` as it will be read."""

    ahead: int
    voice: Voice
    text: str | None  # None for a streamed reply


class SpeechService:
    """Speech in Discord: per-guild speakers, voice choice, text rules, the restart journal.

    Parameters
    ----------
    synthesizer:
        The synthesizer, local or remote (``stream``, ``busy``; its voices through ``voices``).
    store:
        The bot's database.
    config:
        The whole configuration (``discord`` and ``synthesis`` sections are read).
    on_error:
        ``on_error(guild_id, message)``, sync or async: failures of queued speech, for the guild's text channel.
        May be set later (the cog sets it once it knows where to write).
    voices:
        The voice service every voice is read through (the process's one, from ``Services``); one over
        ``store`` and ``synthesizer`` when not given.
    """

    def __init__(
        self, synthesizer: SpeechBackend, store: Store, config: Config, *, on_error: ErrorCallback | None = None,
        voices: VoiceService | None = None,
    ) -> None:
        self.synthesizer = synthesizer
        self.store = store
        self.voices = voices if voices is not None else VoiceService(store, synthesizer)
        self.config = config
        self.on_error = on_error
        self._speakers: dict[int, GuildSpeaker] = {}
        self._base_params = config.synthesis.params  # the server's defaults, checked at load
        self.pronunciations = Pronunciations(store)
        self._closed = False

    # --- speakers ---------------------------------------------------------------------------------------------------

    def speaker(self, guild_id: int) -> GuildSpeaker:
        """The guild's speaker (created on first use)."""
        spk = self._speakers.get(guild_id)
        if spk is None:
            if self._closed:
                raise SpeechError("the bot is shutting down; try again in a moment")
            d = self.config.discord
            spk = GuildSpeaker(
                guild_id,
                UsageCounter(self.synthesizer, self.store, guild_id),  # /stats: counts only, never the text
                queue_size=d.guild_queue_size,
                idle_disconnect_s=d.idle_disconnect_s,
                alone_disconnect_s=d.alone_disconnect_s,
                reconnect_wait_s=d.reconnect_wait_s,
                on_error=self._report,
            )
            self._speakers[guild_id] = spk
        return spk

    def _report(self, guild_id: int, message: str) -> Any:
        """Forward a speaker's message to the current on_error."""
        if self.on_error is None:
            log.warning("guild %d: %s", guild_id, message)
            return None
        return self.on_error(guild_id, message)

    async def join(self, guild: Any, member: Any) -> Any:
        """Join the member's voice channel (``/join``); returns the channel."""
        channel = _voice_channel(member)
        if channel is None:
            raise NotInVoice("join a voice channel first, then use /join")
        check_voice_permissions(channel)
        await self.speaker(guild.id).join(channel)
        await _become_stage_speaker(channel)
        return channel

    async def leave(self, guild_id: int) -> int:
        """Leave voice and drop the queue; returns how many messages were dropped."""
        spk = self._speakers.get(guild_id)
        return await spk.leave() if spk is not None else 0

    def skip(self, guild_id: int) -> bool:
        """Stop the message being spoken; False when nothing was."""
        spk = self._speakers.get(guild_id)
        return spk.skip() if spk is not None else False

    def clear(self, guild_id: int) -> int:
        """Drop the waiting messages; returns how many."""
        spk = self._speakers.get(guild_id)
        return spk.clear() if spk is not None else 0

    # --- saying things ----------------------------------------------------------------------------------------------

    async def say(
        self,
        guild: Any,
        member: Any,
        text: str,
        *,
        source: str = "slash",
        attachments: Sequence[Any] = (),
        mentions: Sequence[Any] = (),
        voice: Voice | None = None,
        style: str = "",
    ) -> SayResult:
        """Read a member's text aloud in the guild's voice channel.

        Parameters
        ----------
        guild:
            ``discord.Guild`` (``id``, ``get_member``, ``get_channel``, ``get_role``).
        member:
            ``discord.Member`` (``id``, ``display_name``, ``bot``, ``roles``, ``voice``, ``guild_permissions``).
        text:
            The raw message text (Discord markdown).
        source:
            "slash" and "context" may join the member's channel; "autoread" joins only with the guild's
            ``autojoin``; "chat" skips the reading policy.
        attachments:
            The message's attachments (``filename``, ``content_type``), summarised as "sent an image".
        mentions:
            The users the message mentions (``id``, ``display_name``): Discord sends them with every message,
            so names resolve without the members intent.
        voice:
            Force a voice (otherwise chosen as the module docstring says).
        style:
            A named style of the chosen voice ("" = its main clip); VoiceNotFound names its styles when it has no
            such style.

        Raises
        ------
        SpeechRefused, NothingToSay, NoVoice, NotInVoice, QueueFull, VoiceConnectionError, BusyError
            Each with a message that tells the member what to do (BusyError: the synthesizer admits no more
            requests right now).
        """
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
        self._check_capacity()
        settings = await self.store.guild_settings(guild.id)
        is_bot = bool(getattr(member, "bot", False))
        spk = self.speaker(guild.id)
        if source != "chat":
            self._check_policy(settings, member, is_bot, spk)
            await self._check_blocks(guild.id, member)
        if source == "autoread" and settings["autoread_prefix"]:
            text = _strip_prefix(text, settings["autoread_prefix"])
        user = {} if is_bot else await self.store.user_settings(member.id, guild.id)
        chosen = voice or await self._resolve_voice(guild.id, member, settings, user)
        params = await self._with_lexicon(self._params(settings, user), guild.id, None if is_bot else member.id)
        if style:
            with_style(chosen, style)  # refused here, before anything is queued, in one line naming its styles
            params = dataclasses.replace(params, style=style)
        rules = self._rules(settings, params.speed)
        ctx = await self._context(guild, text, attachments, mentions)
        cleaned = clean_text(text, ctx, rules)
        if cleaned is None:
            raise NothingToSay("there is nothing to read in that message (only emoji, punctuation or inline code)")
        await self._connect_for(spk, member, source, settings)
        name = await self._spoken_name(guild, member)
        announce = ""
        if bool(attachments) and cleaned == summarize_attachments(attachments):
            cleaned = f"{name} {cleaned}"  # "sent an image" alone would not say who: the name is always read
        elif settings["announce_author"] and source != "chat":
            announce = f"{name} said: "
        short = cleaned if len(cleaned) <= SUMMARY_CHARS else cleaned[: SUMMARY_CHARS - 1] + "…"
        item = SpeechItem(
            text=cleaned,
            voice=chosen,
            params=params,
            author_id=member.id,
            source=source,
            announce=announce,
            summary=f'{name}\'s message "{short}"',
            deadline_s=self._deadline_s(rules),
        )
        ahead = spk.enqueue(item)
        return SayResult(ahead, chosen, cleaned)

    async def say_stream(
        self, guild: Any, member: Any, pieces: AsyncIterator[str], *, voice: Voice | None = None
    ) -> SayResult:
        """Read a reply that is still being written (a chat model's tokens) for ``member``.

        The pieces go through the text rules as they arrive and are handed to ``synthesizer.stream`` as an async
        iterator, so speech starts at the first complete sentence. The voice is ``voice``, else the guild's voice
        (``default_voice``, a server voice, an operator voice), else the member's own. Joins the member's channel
        when the bot is not in one.
        """
        self._check_capacity()
        settings = await self.store.guild_settings(guild.id)
        spk = self.speaker(guild.id)
        user = await self.store.user_settings(member.id, guild.id)
        chosen = voice or await self._guild_voice(guild.id, settings) or await self._resolve_voice(
            guild.id, member, settings, user
        )
        params = await self._with_lexicon(self._params(settings, user), guild.id, member.id)
        rules = self._rules(settings, params.speed)
        await self._connect_for(spk, member, "chat", settings)
        ctx = await self._context(guild, "", ())
        item = SpeechItem(
            text=clean_stream(pieces, ctx, rules),
            voice=chosen,
            params=params,
            author_id=member.id,
            source="chat",
            summary=f"the reply to {getattr(member, 'display_name', 'a member')}",
            deadline_s=self._deadline_s(rules) + self.config.chat.timeout_s,  # the text arrives over time too
        )
        ahead = spk.enqueue(item)
        return SayResult(ahead, chosen, None)

    def _check_capacity(self) -> None:
        """Answer "busy" now, while the member still waits for the command's reply, not later in the channel."""
        if self.synthesizer.busy:
            raise BusyError("I'm speaking for as many people as I can right now; try again in a moment")

    def _check_policy(self, settings: dict[str, Any], member: Any, is_bot: bool, spk: GuildSpeaker) -> None:
        """ignore_bots, required_role and require_in_voice."""
        if is_bot:
            if member.id not in settings["bot_voices"] and settings["ignore_bots"]:
                raise SpeechRefused("I don't read other bots here (an admin can give this bot a voice in bot_voices)")
            return  # a bot with an assigned voice is read whatever the member rules say
        state = getattr(member, "voice", None)
        if state is not None and _is_stage(getattr(state, "channel", None)) and getattr(state, "suppress", False):
            raise SpeechRefused("you are in the Stage audience: I only read the Stage's speakers")
        role_id = settings["required_role"]
        if role_id and not _has_role(member, role_id) and not _is_manager(member):
            raise SpeechRefused(f"you need the <@&{role_id}> role for me to read your messages")
        if settings["require_in_voice"]:
            mine = _voice_channel(member)
            bot_channel = spk.channel
            if mine is None or (bot_channel is not None and mine.id != bot_channel.id):
                where = "my voice channel" if bot_channel is not None else "a voice channel"
                raise SpeechRefused(f"join {where} first: I only read members who are in it")

    async def _check_blocks(self, guild_id: int, member: Any) -> None:
        """The guild's block list: a blocked member, or a member with a blocked role, is not read."""
        blocks = await self.store.blocks(guild_id)
        if not blocks:
            return
        role_ids = {getattr(r, "id", None) for r in getattr(member, "roles", ())}
        if ("user", member.id) in blocks or any(kind == "role" and rid in role_ids for kind, rid in blocks):
            raise SpeechRefused("you are on this server's block list, so I don't read your messages; ask a server "
                                "admin if that is a mistake")

    async def _connect_for(self, spk: GuildSpeaker, member: Any, source: str, settings: dict[str, Any]) -> None:
        """Make sure the speaker has a voice channel, joining the member's when the source allows it."""
        if spk.is_connected or spk.channel is not None:
            return  # connected, or reconnecting by itself
        channel = _voice_channel(member)
        may_join = source in ("slash", "context", "chat") or settings["autojoin"]
        if channel is not None and may_join:
            check_voice_permissions(channel)
            await spk.join(channel)
            await _become_stage_speaker(channel)
            return
        if channel is None:
            raise NotInVoice("I'm not in a voice channel: join one and use /join")
        raise NotInVoice("I'm not in a voice channel: use /join (or an admin can turn on autojoin)")

    # --- voices -----------------------------------------------------------------------------------------------------

    async def resolve_voice(self, guild: Any, member: Any) -> Voice:
        """The voice ``say`` would use for this member in this guild (NoVoice says how to get one)."""
        settings = await self.store.guild_settings(guild.id)
        user = {} if getattr(member, "bot", False) else await self.store.user_settings(member.id, guild.id)
        return await self._resolve_voice(guild.id, member, settings, user)

    async def _resolve_voice(self, guild_id: int, member: Any, settings: dict[str, Any], user: dict[str, Any]) -> Voice:
        """The voice-choice order of the module docstring."""
        if getattr(member, "bot", False):
            vid = settings["bot_voices"].get(member.id)
            v = await self._get_voice(vid) if vid else None
            if v is not None:
                return v
        else:
            vid = user.get("voice")
            if vid:
                v = await self._get_voice(vid)
                if v is not None and await self._usable(v, guild_id, member.id):
                    return v
                log.info("user %d's selected voice %s is gone or not usable in guild %d", member.id, vid, guild_id)
            own = await self._list_voices(member.id)
            if own:
                return own[0]
        v = await self._guild_voice(guild_id, settings)
        if v is not None:
            return v
        raise NoVoice(
            "you have no voice yet: record one with /voice clone (or an admin can set a server voice with "
            "/set guild default_voice)"
        )

    async def _guild_voice(self, guild_id: int, settings: dict[str, Any]) -> Voice | None:
        """The guild's default voice, else its first server voice, else the first operator voice."""
        if settings["default_voice"]:
            v = await self._get_voice(settings["default_voice"])
            if v is not None:
                return v
        for vid in await self.store.guild_voices(guild_id):
            v = await self._get_voice(vid)
            if v is not None:
                return v
        operator = await self._list_voices(0)
        return operator[0] if operator else None

    async def _usable(self, voice: Voice, guild_id: int, user_id: int) -> bool:
        """May this member speak with this voice in this guild?"""
        if voice.owner_id in (user_id, 0):
            return True
        return voice.id in await self.store.guild_voices(guild_id) or voice.id in await self.store.shared_voices(
            guild_id
        )

    async def _get_voice(self, voice_id: str) -> Voice | None:
        """A voice by id, or None when it no longer exists (the voice service reads it off the event loop)."""
        try:
            return await self.voices.get(voice_id)
        except (SpeechError, KeyError, FileNotFoundError):
            return None

    async def _list_voices(self, owner_id: int) -> list[Voice]:
        """A user's voices (owner 0: the operator's), through the voice service (off the event loop)."""
        return await self.voices.list(owner_id)

    # --- settings -> options ----------------------------------------------------------------------------------------

    def _params(self, settings: dict[str, Any], user: dict[str, Any]) -> SynthesisParams:
        """Synthesis options: the user's language and speed over the guild's over the config's."""
        language = user.get("language") or (
            settings["default_language"] if settings["default_language"] != "auto" else self._base_params.language
        )
        speed = user.get("speed") or self._base_params.speed
        speed = min(max(speed, settings["speed_min"]), settings["speed_max"])  # the guild's limits win
        return dataclasses.replace(self._base_params, language=language, speed=speed)

    async def _with_lexicon(self, params: SynthesisParams, guild_id: int, user_id: int | None) -> SynthesisParams:
        """``params`` with the pronunciation dictionary the member's text is read with (guild's, then theirs)."""
        lexicon = await self.pronunciations.for_member(guild_id, user_id)
        return params if lexicon is None else dataclasses.replace(params, lexicon=lexicon)

    def _rules(self, settings: dict[str, Any], speed: float) -> TextRules:
        """The guild's text rules."""
        return TextRules(
            repeat_cap=settings["repeat_cap"],
            max_seconds=settings["max_seconds"],
            max_chars=min(self.config.discord.max_message_chars,
                          settings["max_message_chars"] or self.config.discord.max_message_chars),
            emoji_mode=settings["emoji_mode"],
            speed=speed,
        )

    def _deadline_s(self, rules: TextRules) -> float:
        """Synthesis deadline of an item: the pipeline's own plus the longest playback the rules allow.

        The audio source holds the stream to the playback pace, so a long message keeps its stream open while
        it is being heard; the pipeline's default deadline alone would cut it off.
        """
        return self.config.synthesis.deadline_s + PLAYBACK_ALLOWANCE * rules.max_seconds

    async def _context(self, guild: Any, text: str, attachments: Sequence[Any],
                       mentions: Sequence[Any] = ()) -> MessageContext:
        """Name resolvers for the guild: stored nicknames first, then the message's mentions, then Discord's cache."""
        nicknames = await self.store.spoken_names(guild.id, mentioned_user_ids(text))
        mentioned = {m.id: getattr(m, "display_name", None) or getattr(m, "name", None) for m in mentions}

        def user_name(uid: int) -> str | None:
            if uid in nicknames:
                return nicknames[uid]
            if mentioned.get(uid):
                return mentioned[uid]
            m = _call(guild, "get_member", uid)
            return getattr(m, "display_name", None) or getattr(m, "name", None)

        def channel_name(cid: int) -> str | None:
            return getattr(_call(guild, "get_channel", cid), "name", None)

        def role_name(rid: int) -> str | None:
            return getattr(_call(guild, "get_role", rid), "name", None)

        return MessageContext(user_name, channel_name, role_name, tuple(attachments))

    async def _spoken_name(self, guild: Any, member: Any) -> str:
        """The name said for a member: stored nickname, else display name."""
        names = await self.store.spoken_names(guild.id, [member.id])
        return names.get(member.id) or getattr(member, "display_name", None) or getattr(member, "name", "someone")

    # --- Discord events ---------------------------------------------------------------------------------------------

    async def on_voice_state_update(self, member: Any, before: Any, after: Any) -> None:
        """Feed ``on_voice_state_update`` here: the bot's own moves, kicks, and members leaving it alone."""
        guild = member.guild
        spk = self._speakers.get(guild.id)
        if spk is None:
            return
        me = getattr(guild, "me", None)
        if me is not None and member.id == me.id:
            if after.channel is None:
                spk.on_voice_left()
            else:
                spk.on_voice_joined(after.channel)
            return
        spk.check_alone()

    async def on_channel_delete(self, channel: Any) -> None:
        """Feed ``on_guild_channel_delete`` here: deleting the bot's voice channel clears its guild's state."""
        spk = self._speakers.get(getattr(getattr(channel, "guild", None), "id", 0))
        if spk is not None and spk.channel is not None and spk.channel.id == channel.id:
            await spk.on_disconnected("left because the voice channel was deleted")

    async def on_guild_remove(self, guild_id: int) -> None:
        """The bot left or was removed from a guild: drop its speaker."""
        spk = self._speakers.pop(guild_id, None)
        if spk is not None:
            await spk.close()

    # --- restarts ---------------------------------------------------------------------------------------------------

    async def shutdown(self) -> int:
        """Stop every speaker, disconnect, and journal the messages that were not read; returns how many."""
        self._closed = True
        entries: list[JournalEntry] = []
        speakers, self._speakers = self._speakers, {}
        for guild_id, spk in speakers.items():
            for item in await spk.close():
                entries.append(JournalEntry(guild_id, item.author_id, item.summary, item.enqueued_at))
        n = await self.store.write_journal(entries)
        if n:
            log.info("journaled %d unread messages for after the restart", n)
        return n

    async def dropped_after_restart(self, guild_id: int) -> list[JournalEntry]:
        """Messages of a guild that the previous run did not read (returned once, then forgotten)."""
        return await self.store.pop_journal(guild_id)


def _is_stage(channel: Any) -> bool:
    """A Stage channel (``discord.StageChannel``): members join its audience, unheard until made speakers."""
    return getattr(getattr(channel, "type", None), "name", None) == "stage_voice"


async def _become_stage_speaker(channel: Any) -> None:
    """In a Stage, move the bot from the audience to the speakers (a Stage moderator may do it itself)."""
    if not _is_stage(channel):
        return
    me = channel.guild.me
    try:
        await me.edit(suppress=False)
    except Exception as e:  # discord.HTTPException: Discord refused it (a permission changed meanwhile)
        raise VoicePermissionMissing(f"I joined the Stage {channel.mention} but Discord did not let me speak there "
                                     f"({e}); give me the Mute Members permission there") from e


def _strip_prefix(text: str, prefix: str) -> str:
    """The auto-read text after the guild's required prefix; SpeechRefused when it does not start with it."""
    if not text.startswith(prefix):
        raise SpeechRefused(f"auto-read here only reads messages starting with {prefix!r}")
    return text[len(prefix):].lstrip()


def _voice_channel(member: Any) -> Any:
    """The voice channel a member is in, or None."""
    state = getattr(member, "voice", None)
    return getattr(state, "channel", None) if state is not None else None


def _has_role(member: Any, role_id: int) -> bool:
    """Does the member have the role?"""
    return any(getattr(r, "id", None) == role_id for r in getattr(member, "roles", ()))


def _is_manager(member: Any) -> bool:
    """Manage Server permission (admins are never locked out by the role rule)."""
    perms = getattr(member, "guild_permissions", None)
    return bool(getattr(perms, "manage_guild", False))


def _call(obj: Any, method: str, arg: Any) -> Any:
    """``obj.method(arg)`` when it exists, else None."""
    fn = getattr(obj, method, None)
    return fn(arg) if callable(fn) else None

