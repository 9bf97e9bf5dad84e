"""Talking to a chat model: ``/ask prompt``, ``/ask reset``, and (where the guild allows it) mentioning the bot.

The reply is written into the channel while the model is still writing it (one message, edited at most once per
``EDIT_INTERVAL_S``; a long reply continues in further messages) and the same pieces are handed to
:meth:`bot.speech.SpeechService.say_stream`, so the first sentence is spoken before the model has finished. The
model and the memory of each channel's conversation are :class:`bot.chat.ChatClient`'s; a model that is down, slow
or answers garbage becomes a :class:`bot.chat.ChatError` whose message is shown to the asker. Everything here is
awaited on the event loop, never blocking it, so a slow model delays only its own reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import discord
from discord import app_commands
from discord.ext import commands

from bot import SpeechError
from bot.chat import ChatClient, ChatError
from bot.speaker import NotInVoice
from bot.speech import NoVoice
from cogs.base import ReplyingCog, UsageError, describe_error, guild_member, send_ephemeral

if TYPE_CHECKING:
    from bot import VoiceBot

log = logging.getLogger(__name__)

EDIT_INTERVAL_S = 1.0  # seconds between edits of a growing reply (Discord rate-limits edits to ~5 per 5 s)
MESSAGE_CHARS = 2000  # Discord's limit on a message's content
PAGE_CHARS = 1700  # reply characters per message; the rest of the 2000 is for the question and a cut-off note
QUOTE_CHARS = 200  # characters of the question quoted above the reply to /ask
NOTE_CHARS = 290  # characters of the reason in a cut-off note
PLACEHOLDER = "…"  # the answer to a mention until the model's first words arrive
READABLE_TYPES = (discord.MessageType.default, discord.MessageType.reply)
NO_MENTIONS = discord.AllowedMentions.none()  # a model's "@everyone" must never ping anyone
_MENTION_RE = re.compile(r"<(@!?|@&|#)(\d{15,21})>")


Edit = Callable[[str], Awaitable[Any]]  # replaces the content of one message
Send = Callable[[str], Awaitable[Any]]  # sends a new message, returns it (it has ``edit``)


@dataclass
class _Outcome:
    """How one answer ended: the chat model's error (None: complete) and why it was not spoken (None: queued)."""

    chat_error: ChatError | None
    speech_error: SpeechError | None


class _LiveReply:
    """A reply that grows as the model writes: edits at most once per ``EDIT_INTERVAL_S``, pages past PAGE_CHARS.

    Parameters
    ----------
    edit_first : Edit
        Sets the content of the reply's first message (the deferred interaction response, or a placeholder).
    send_next : Send
        Sends a further message for a long reply and returns it.
    header : str
        Shown above the reply in the first message (the quoted question); not counted as reply text.
    """

    def __init__(self, edit_first: Edit, send_next: Send, header: str = "") -> None:
        self.text = ""  # the whole reply so far
        self._header = header
        self._send_next = send_next
        self._edits: list[Edit] = [edit_first]  # one per message of the reply
        self._starts: list[int] = [0]  # where each message's part of the text starts
        self._shown: list[str] = [""]  # what each message shows now
        self._changed = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._dead = False  # the first message is gone (deleted by someone): stop editing

    @property
    def has_text(self) -> bool:
        """Whether the model has written anything visible."""
        return bool(self.text.strip())

    @property
    def messages(self) -> int:
        """How many messages the reply uses."""
        return len(self._edits)

    def start(self) -> None:
        """Start the editor task."""
        self._task = _spawn(self._run(), "editing a chat reply")

    def append(self, piece: str) -> None:
        """Add a piece of the reply (shown by the next edit)."""
        self.text += piece
        self._changed.set()

    async def finish(self, note: str = "") -> None:
        """Stop the editor after its current edit, then show the whole reply (and ``note`` below it)."""
        await self._stop()
        if self.has_text or note:
            await self._sync(note)

    def abandon(self) -> None:
        """Stop editing at once, showing nothing more (the caller is being cancelled)."""
        if self._task is not None:
            self._task.cancel()

    async def _stop(self) -> None:
        """Let the editor task end after the edit it is making."""
        self._closing.set()
        self._changed.set()
        if self._task is not None:
            with contextlib.suppress(Exception):  # its done-callback has logged it
                await self._task

    async def _run(self) -> None:
        """Edit when the text changed, then wait EDIT_INTERVAL_S (or until finishing) before the next edit."""
        while True:
            await self._changed.wait()
            if self._closing.is_set():
                return
            self._changed.clear()
            await self._sync()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), EDIT_INTERVAL_S)
            if self._closing.is_set():
                return

    def _capacity(self, page: int) -> int:
        """Reply characters that fit in message ``page``."""
        return PAGE_CHARS - (len(self._header) if page == 0 else 0)

    async def _sync(self, note: str = "") -> None:
        """Make the messages show the text: fill the last one, continue in a new one when it is full."""
        if self._dead or not (self.has_text or note):
            return
        text = self.text
        try:
            while len(text) - self._starts[-1] > self._capacity(len(self._starts) - 1):
                page, start = len(self._starts) - 1, self._starts[-1]
                cut = _cut_point(text, start, self._capacity(page))
                await self._show(page, text[start:cut])
                rest = text[cut : cut + PAGE_CHARS].strip() or PLACEHOLDER
                message = await self._send_next(rest)
                self._starts.append(cut)
                self._edits.append(_editor(message))
                self._shown.append(rest)
            last = text[self._starts[-1] :].rstrip()
            if note:
                last = f"{last}\n{note}" if last.strip() else note
            await self._show(len(self._starts) - 1, last)
        except discord.NotFound:
            log.info("a chat reply's message was deleted; it is no longer updated")
            self._dead = True
        except discord.HTTPException as e:  # rate limits are waited out by discord.py; this is anything else
            log.warning("could not update a chat reply (will retry with the next piece): %s", e)

    async def _show(self, page: int, part: str) -> None:
        """Set message ``page`` to ``part`` (with the header on the first) unless it already shows it."""
        content = (self._header + part if page == 0 else part).strip()[:MESSAGE_CHARS]
        if content and content != self._shown[page]:
            await self._edits[page](content)
            self._shown[page] = content


class _Tee:
    """The reply's pieces for the speech queue: ``put`` never waits; the reader gets them in order until ``close``."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._closed = False

    def put(self, piece: str) -> None:
        """Hand on one piece."""
        self._queue.put_nowait(piece)

    def close(self) -> None:
        """No more pieces: the reader's iteration ends after the ones queued."""
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(None)

    async def pieces(self) -> AsyncIterator[str]:
        """The pieces, as they are put."""
        while (piece := await self._queue.get()) is not None:
            yield piece


@dataclass
class _Turn:
    """One channel's queue of questions: a lock, and how many answers hold or wait for it."""

    lock: asyncio.Lock
    users: int = 0


class ChatCog(ReplyingCog):
    """``/ask`` and mention replies through the configured chat model."""

    ask = app_commands.Group(name="ask", description="Talk to the chat model", guild_only=True)

    def __init__(self, bot: VoiceBot) -> None:
        super().__init__(bot)
        self._own_client: ChatClient | None = None  # made here when the services do not provide one
        self._turns: dict[int, _Turn] = {}  # channel id -> its questions, answered one at a time

    async def cog_load(self) -> None:
        if getattr(self.services, "chat", None) is None and self.services.config.chat.enabled:
            self._own_client = ChatClient(self.services.config.chat)

    async def cog_unload(self) -> None:
        if self._own_client is not None:
            await self._own_client.close()
            self._own_client = None

    @property
    def chat(self) -> ChatClient:
        """The chat client; UsageError when the operator has not turned the chat model on."""
        client = getattr(self.services, "chat", None) or self._own_client
        if not self.services.config.chat.enabled or client is None:
            raise UsageError("The chat model is off: the bot's operator can turn it on with chat.enabled in "
                             "config.yaml.")
        return client

    # ---- commands --------------------------------------------------------------------------------------------------

    @ask.command(name="prompt", description="Ask the chat model; the reply is written here and spoken in your voice")
    @app_commands.describe(text="Your question or message")
    async def ask_prompt(self, interaction: discord.Interaction, text: app_commands.Range[str, 1, 2000]) -> None:
        guild, member = guild_member(interaction)
        chat = self.chat
        settings = await self.store.guild_settings(guild.id)
        if not settings["chat_enabled"]:
            raise UsageError("The chat model is turned off in this server; an admin can turn it on with "
                             "/set guild chat_enabled true.")
        assert interaction.channel_id is not None
        await interaction.response.defer(thinking=True)  # public: the reply is for the channel

        async def edit_first(content: str) -> Any:
            return await interaction.edit_original_response(content=content, allowed_mentions=NO_MENTIONS)

        async def send_next(content: str) -> Any:
            return await interaction.followup.send(content, wait=True, allowed_mentions=NO_MENTIONS)

        reply = _LiveReply(edit_first, send_next, header=_quote(text))
        try:
            outcome = await self._answer(chat, guild, member, interaction.channel_id, text, reply)
        except Exception:
            if not reply.has_text:
                await _delete_original(interaction)
            raise
        if outcome.chat_error is not None and not reply.has_text:
            await _delete_original(interaction)  # the public "thinking…" gives way to the asker's error reply
            raise outcome.chat_error
        if outcome.speech_error is not None:
            await send_ephemeral(interaction, f"I could not speak the reply: {outcome.speech_error}")

    @ask.command(name="reset", description="Make the chat model forget this channel's conversation")
    async def ask_reset(self, interaction: discord.Interaction) -> None:
        guild_member(interaction)
        assert interaction.channel_id is not None
        self.chat.reset(interaction.channel_id)
        log.info("user %d reset the chat memory of channel %d", interaction.user.id, interaction.channel_id)
        await interaction.response.send_message(
            f"{interaction.user.display_name} cleared my memory of this channel's conversation; the next question "
            "starts afresh.", allowed_mentions=NO_MENTIONS)

    # ---- mentions --------------------------------------------------------------------------------------------------

    @commands.Cog.listener()
    async def on_message(self, message: discord.Message) -> None:
        try:
            await self._on_mention(message)
        except discord.HTTPException as e:  # nobody waits on an interaction here: log it
            log.warning("could not answer a mention in channel %d: %s", message.channel.id, e)

    async def _on_mention(self, message: discord.Message) -> None:
        """Answer a member who mentioned the bot, when the config and the guild allow it."""
        me, guild = self.bot.user, message.guild
        if guild is None or me is None or message.type not in READABLE_TYPES:
            return
        if message.author.bot or message.webhook_id is not None or not isinstance(message.author, discord.Member):
            return  # never answer bots: two chat bots would talk forever
        if not any(u.id == me.id for u in message.mentions) or not self.services.config.chat.enabled:
            return
        settings = await self.store.guild_settings(guild.id)
        if not (settings["chat_enabled"] and settings["mention_chat"]):
            return
        prompt = _prompt_from(message, me.id)
        if not prompt:
            await message.reply("Mention me together with a question, and I'll answer it (and say it).",
                                mention_author=False, allowed_mentions=NO_MENTIONS)
            return
        placeholder = await message.reply(PLACEHOLDER, mention_author=False, allowed_mentions=NO_MENTIONS)

        async def send_next(content: str) -> Any:
            return await message.channel.send(content, allowed_mentions=NO_MENTIONS)

        reply = _LiveReply(_editor(placeholder), send_next)
        outcome = await self._answer(self.chat, guild, message.author, message.channel.id, prompt, reply)
        if outcome.chat_error is not None and not reply.has_text:
            await placeholder.edit(content=describe_error(outcome.chat_error)[0], allowed_mentions=NO_MENTIONS)
        if outcome.speech_error is not None:
            log.info("the reply to a mention in guild %d was not spoken: %s", guild.id, outcome.speech_error)

    # ---- answering -------------------------------------------------------------------------------------------------

    async def _answer(self, chat: ChatClient, guild: discord.Guild, member: discord.Member, channel_id: int,
                      prompt: str, reply: _LiveReply) -> _Outcome:
        """Stream the model's reply into ``reply`` and into speech; one answer at a time per channel."""
        async with self._turn(channel_id):
            tee = _Tee()
            speaking = None
            if self.services.speech is not None:
                speaking = _spawn(self._speak(guild, member, tee.pieces()), f"speaking a chat reply in {guild.id}")
            reply.start()
            chat_error: ChatError | None = None
            try:
                async with contextlib.aclosing(chat.stream_reply(channel_id, prompt)) as pieces:
                    async for piece in pieces:
                        tee.put(piece)  # first: speech must not wait for an edit
                        reply.append(piece)
            except ChatError as e:
                log.info("chat reply in channel %d failed: %s", channel_id, e)
                chat_error = e
            except BaseException:
                tee.close()
                reply.abandon()
                raise
            tee.close()
            note = _cut_off_note(chat_error) if chat_error is not None and reply.has_text else ""
            await reply.finish(note)
            speech_error = await speaking if speaking is not None else None
        return _Outcome(chat_error, speech_error)

    async def _speak(self, guild: discord.Guild, member: discord.Member, pieces: AsyncIterator[str]) -> SpeechError | None:
        """Queue the pieces for speech in the member's chosen voice; the reason when that is not possible."""
        speech = self.services.speech
        assert speech is not None
        try:
            try:
                voice = await speech.resolve_voice(guild, member)
            except NoVoice:
                voice = None  # say_stream tries the guild's voice, else says how to get one
            await speech.say_stream(guild, member, pieces, voice=voice)
        except NotInVoice as e:  # neither the asker nor the bot is in voice: a text answer is all they want
            log.debug("chat reply in guild %d not spoken: %s", guild.id, e)
        except SpeechError as e:
            return e
        except Exception:
            log.exception("queueing a chat reply for speech in guild %d failed", guild.id)
        return None

    @contextlib.asynccontextmanager
    async def _turn(self, channel_id: int) -> AsyncIterator[None]:
        """Hold the channel's turn: questions in one channel are answered in order, so its memory stays coherent."""
        turn = self._turns.get(channel_id)
        if turn is None:
            turn = self._turns[channel_id] = _Turn(asyncio.Lock())
        turn.users += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.users -= 1
            if turn.users == 0:
                del self._turns[channel_id]


def _spawn(coro: Any, what: str) -> asyncio.Task[Any]:
    """A task whose unexpected failure is logged, never lost."""
    task = asyncio.create_task(coro)

    def done(t: asyncio.Task[Any]) -> None:
        if not t.cancelled() and t.exception() is not None:
            log.error("%s failed", what, exc_info=t.exception())

    task.add_done_callback(done)
    return task


def _editor(message: Any) -> Edit:
    """Replaces the content of a sent message."""

    async def edit(content: str) -> Any:
        return await message.edit(content=content, allowed_mentions=NO_MENTIONS)

    return edit


async def _delete_original(interaction: discord.Interaction) -> None:
    """Remove the deferred response, if it is still there."""
    try:
        await interaction.delete_original_response()
    except discord.HTTPException as e:
        log.debug("could not delete the deferred /ask response: %s", e)


def _cut_point(text: str, start: int, limit: int) -> int:
    """Where to end a message holding ``text[start:]``: a line break or space in its second half, else ``limit``."""
    end = start + limit
    for sep in ("\n", " "):
        at = text.rfind(sep, start + limit // 2, end)
        if at > start:
            return at + 1
    return end


def _quote(question: str) -> str:
    """The question as a one-line quote above the reply."""
    line = " ".join(question.split())
    if len(line) > QUOTE_CHARS:
        line = line[: QUOTE_CHARS - 1] + "…"
    return f"> {line}\n"


def _cut_off_note(error: ChatError) -> str:
    """The note under a reply that stopped half-way."""
    reason = describe_error(error)[0]
    if len(reason) > NOTE_CHARS:
        reason = reason[: NOTE_CHARS - 1] + "…"
    return f"-# (cut off: {reason})"


def _prompt_from(message: discord.Message, bot_id: int) -> str:
    """The message without the bot's mention, other mentions as names (the model sees no raw ids)."""
    guild = message.guild
    assert guild is not None
    mentioned = {u.id: u for u in message.mentions}  # resolved by Discord: the member cache may not hold them

    def name(m: re.Match[str]) -> str:
        kind, snowflake = m.group(1), int(m.group(2))
        if kind in ("@", "@!"):
            if snowflake == bot_id:
                return ""
            member = mentioned.get(snowflake) or guild.get_member(snowflake)
            return f"@{member.display_name}" if member is not None else "@someone"
        if kind == "@&":
            role = guild.get_role(snowflake)
            return f"@{role.name}" if role is not None else "@a role"
        channel = guild.get_channel(snowflake)
        return f"#{channel.name}" if channel is not None else "#a channel"

    text = _MENTION_RE.sub(name, message.content)
    return re.sub(r"[ \t]{2,}", " ", text).strip(" \t\n,:")


async def setup(bot: VoiceBot) -> None:
    await bot.add_cog(ChatCog(bot))
