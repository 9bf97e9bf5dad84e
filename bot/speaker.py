"""One guild's voice: its queue of messages, its voice connection, and the task that speaks them one by one.

All per-guild speech state lives in :class:`GuildSpeaker`. Its player task is started on demand and carries a
done-callback (Red's ``TriviaSession.start`` + ``_error_handler`` pattern), so a failure is logged and reported
through ``on_error(guild_id, message)``, never lost. Each item runs as its own task: ``synthesizer.stream(...)`` feeds
a :class:`~bot.audio_source.StreamAudioSource` while the voice client plays it, starting with the first chunk.
``skip()`` stops the source (the next 20 ms read ends playback) and cancels the item's task, which closes the stream
so the model work stops.

The voice client is used through a small protocol (``play``, ``stop``, ``is_playing``, ``is_connected``,
``move_to``, ``disconnect``, ``channel``) and channels through ``id``, ``members`` and ``connect(...)``, so tests can
drive it with a fake client whose thread reads the source every 20 ms, as discord.py's player does.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol, Sequence

from synthesis import SpeechError, SynthesisParams, Voice
from synthesis.types import SpeechSynthesizer

from bot.audio_source import DEFAULT_BUFFER_S, StreamAudioSource
from bot.dave_voice import DaveVoiceClient

log = logging.getLogger(__name__)

ANNOUNCE_REPEAT_S = 60.0  # "X said" is not repeated for the same author within this many seconds
CONNECT_TIMEOUT_S = 15.0  # seconds to join a voice channel
RECONNECT_WAIT_S = 5.0  # seconds to let discord.py restore a dropped connection before reconnecting ourselves
RECONNECT_ATTEMPTS = 3  # reconnections tried for one item before giving up on it
CONNECTED_POLL_S = 0.05  # polling interval while waiting for discord.py to reconnect

ErrorCallback = Callable[[int, str], "Awaitable[None] | None"]


class QueueFull(SpeechError):
    """The guild's speech queue is full."""


class NotInVoice(SpeechError):
    """The bot is not in a voice channel (or cannot join one)."""


class VoiceConnectionError(SpeechError):
    """Joining or keeping a voice connection failed."""


class VoiceClientLike(Protocol):
    """What the speaker needs from ``discord.VoiceClient``."""

    channel: Any

    def play(self, source: Any, *, after: Callable[[Exception | None], Any] | None = None) -> None: ...

    def stop(self) -> None: ...

    def is_playing(self) -> bool: ...

    def is_connected(self) -> bool: ...

    async def move_to(self, channel: Any) -> None: ...

    async def disconnect(self, *, force: bool = False) -> None: ...


class VoiceChannelLike(Protocol):
    """What the speaker needs from ``discord.VoiceChannel`` (``members``: who is in it, each with ``.bot``)."""

    id: int

    @property
    def members(self) -> Sequence[Any]: ...

    async def connect(self, *, timeout: float, reconnect: bool, self_deaf: bool, cls: Any) -> Any: ...


@dataclass
class SpeechItem:
    """One message to speak.

    Attributes
    ----------
    text: the cleaned text, or an async iterator of text pieces (a chat reply being written).
    voice: the voice (or its id) to speak with.
    params: synthesis options (None: the synthesizer's defaults).
    author_id: who wrote it (0: the bot itself).
    source: where it came from: "slash", "autoread", "chat" or "context".
    announce: the "X said: " prefix, spoken when the author changed or after ``ANNOUNCE_REPEAT_S`` ("" = never).
    summary: a short description for the restart journal and error messages.
    deadline_s: seconds the synthesis may take from the item's start, playback included (the source's buffer
        holds the stream back to the playback pace); None: the synthesizer's default.
    enqueued_at: unix seconds.
    """

    text: str | AsyncIterator[str]
    voice: Voice | str
    params: SynthesisParams | None = None
    author_id: int = 0
    source: str = "slash"
    announce: str = ""
    summary: str = ""
    deadline_s: float | None = None
    enqueued_at: float = field(default_factory=time.time)


class GuildSpeaker:
    """The speech queue, voice connection and player task of one guild.

    Parameters
    ----------
    guild_id:
        The guild's id (used in logs and ``on_error``).
    synthesizer:
        Anything with ``stream(text, voice, params) -> AsyncIterator[AudioChunk]``.
    queue_size:
        Most items waiting (the one speaking not counted); more raise :class:`QueueFull`.
    idle_disconnect_s:
        Leave the voice channel after this long with nothing to say.
    alone_disconnect_s:
        Leave after being alone (no humans) in the channel this long.
    on_error:
        ``on_error(guild_id, message)``, sync or async: a message for the guild's text channel.
    """

    def __init__(
        self,
        guild_id: int,
        synthesizer: SpeechSynthesizer,
        *,
        queue_size: int = 20,
        idle_disconnect_s: float = 600.0,
        alone_disconnect_s: float = 10.0,
        on_error: ErrorCallback | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        reconnect_wait_s: float = RECONNECT_WAIT_S,
        buffer_s: float = DEFAULT_BUFFER_S,
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        self.guild_id = guild_id
        self.on_error = on_error
        self._synth = synthesizer
        self._queue_size = queue_size
        self._idle_s = idle_disconnect_s
        self._alone_s = alone_disconnect_s
        self._connect_timeout_s = connect_timeout_s
        self._reconnect_wait_s = reconnect_wait_s
        self._buffer_s = buffer_s

        self._queue: collections.deque[SpeechItem] = collections.deque()
        self._wakeup = asyncio.Event()  # an item was queued
        self._vc: VoiceClientLike | None = None
        self._channel: VoiceChannelLike | None = None  # where we should be (reconnects go here)
        self._connect_lock = asyncio.Lock()
        self._player: asyncio.Task[None] | None = None
        self._item_task: asyncio.Task[None] | None = None
        self._alone_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._current: SpeechItem | None = None
        self._source: StreamAudioSource | None = None
        self._last_author: tuple[int, float] | None = None  # (author id, monotonic time) of the last spoken item
        self._left_at: float | None = None  # monotonic time the bot's voice state went to no channel
        self._closed = False

        self.items_spoken = 0
        self.underrun_frames = 0
        self.last_ttfa_s: float | None = None  # item start -> first real frame read by the player

    # --- state ------------------------------------------------------------------------------------------------------

    @property
    def voice_client(self) -> VoiceClientLike | None:
        """The current voice client (None when not joined)."""
        return self._vc

    @property
    def channel(self) -> VoiceChannelLike | None:
        """The voice channel the speaker belongs in (None after leave)."""
        return self._channel

    @property
    def is_connected(self) -> bool:
        return self._vc is not None and self._vc.is_connected()

    @property
    def current(self) -> SpeechItem | None:
        """The item being spoken."""
        return self._current

    @property
    def queued(self) -> list[SpeechItem]:
        """The items waiting, next first."""
        return list(self._queue)

    # --- voice connection -------------------------------------------------------------------------------------------

    async def join(self, channel: VoiceChannelLike) -> None:
        """Join ``channel``, or move there when already connected elsewhere in the guild."""
        self._check_open()
        async with self._connect_lock:
            self._channel = channel
            vc = self._vc
            if vc is not None and vc.is_connected():
                if getattr(vc.channel, "id", None) != channel.id:
                    try:
                        await vc.move_to(channel)
                    except Exception as e:
                        raise VoiceConnectionError(f"I could not move to {_channel_name(channel)}: {e}") from e
            else:
                await self._drop_voice_client()
                self._vc = await self._connect(channel)
        self._ensure_player()  # starts the idle timer

    async def leave(self) -> int:
        """Stop speaking, drop the queue and disconnect; returns how many items were dropped (current included)."""
        dropped = len(self._queue) + (1 if self._current is not None else 0)
        self._channel = None
        self._queue.clear()
        self.skip()
        self._cancel_alone_timer()
        player = self._player
        if player is not None and player is not asyncio.current_task() and not player.done():
            player.cancel()  # and wait, so that a join right after starts a fresh player
            await asyncio.gather(player, return_exceptions=True)
        await self._drop_voice_client()
        return dropped

    async def _connect(self, channel: VoiceChannelLike) -> VoiceClientLike:
        """channel.connect() with a timeout and a clear error; adopts an existing connection of this guild."""
        try:
            return await asyncio.wait_for(
                channel.connect(timeout=self._connect_timeout_s, reconnect=True, self_deaf=True, cls=DaveVoiceClient),
                self._connect_timeout_s + 1.0,
            )
        except TimeoutError as e:
            raise VoiceConnectionError(
                f"joining {_channel_name(channel)} timed out: check that I can see it and have the Connect permission"
            ) from e
        except Exception as e:
            existing = getattr(getattr(channel, "guild", None), "voice_client", None)
            if existing is not None and existing.is_connected():  # e.g. a connection left over from before
                log.info("guild %d: adopting the existing voice connection", self.guild_id)
                if getattr(existing.channel, "id", None) != channel.id:
                    await existing.move_to(channel)
                return existing
            raise VoiceConnectionError(
                f"I could not join {_channel_name(channel)} ({e}): check my Connect and Speak permissions"
            ) from e

    async def _ensure_voice(self) -> VoiceClientLike:
        """A connected voice client: the current one, one discord.py restored, or a fresh connection."""
        async with self._connect_lock:
            vc = self._vc
            if vc is not None and vc.is_connected():
                return vc
            if vc is not None:  # discord.py reconnects by itself after most drops; give it a moment
                deadline = time.monotonic() + self._reconnect_wait_s
                # while a kick is being confirmed (on_voice_left), wait for the verdict instead of rejoining
                while time.monotonic() < deadline or (
                    self._left_at is not None and time.monotonic() < deadline + self._reconnect_wait_s
                ):
                    await asyncio.sleep(CONNECTED_POLL_S)
                    if vc.is_connected() and self._vc is vc:
                        return vc
                log.warning("guild %d: voice connection lost, reconnecting", self.guild_id)
                await self._drop_voice_client()
            if self._channel is None:
                raise NotInVoice("I'm not in a voice channel: join one and use /join")
            self._vc = await self._connect(self._channel)
            return self._vc

    async def _drop_voice_client(self) -> None:
        """Disconnect and forget the voice client, whatever state it is in."""
        vc, self._vc = self._vc, None
        if vc is None:
            return
        try:
            vc.stop()
            await vc.disconnect(force=True)
        except Exception:
            log.debug("guild %d: disconnecting a broken voice client failed", self.guild_id, exc_info=True)

    async def on_disconnected(self, reason: str) -> None:
        """The bot was removed from voice (kicked, channel deleted): clear all state, no reconnect.

        A disconnection the speaker caused itself (leave, idle) is ignored.
        """
        self._left_at = None
        if self._vc is None:
            return
        dropped = await self.leave()
        log.info("guild %d: %s; dropped %d messages", self.guild_id, reason, dropped)
        if dropped:
            self._report(f"I {reason}, so {dropped} message{'s' if dropped != 1 else ''} will not be read.")

    def on_voice_left(self) -> None:
        """The bot's voice state says it is in no channel.

        That is either a kick (clear everything) or discord.py reconnecting (it leaves and rejoins within moments).
        Decide after ``reconnect_wait_s``: still out -> :meth:`on_disconnected`.
        """
        if self._vc is None or self._left_at is not None:
            return
        self._left_at = time.monotonic()
        self._spawn(self._confirm_left(), "left-check")

    def on_voice_joined(self, channel: VoiceChannelLike) -> None:
        """The bot's voice state shows it in ``channel`` (joined, rejoined, or moved by someone): follow it."""
        self._left_at = None
        if self._channel is not None:
            self._channel = channel
        self.check_alone()

    async def _confirm_left(self) -> None:
        """Treat a lasting absence from voice as a kick."""
        await asyncio.sleep(self._reconnect_wait_s)
        if self._left_at is not None and not self.is_connected:
            self._left_at = None
            await self.on_disconnected("was disconnected from the voice channel")

    def check_alone(self) -> None:
        """Start (or cancel) the leave-when-alone timer from who is in the channel now."""
        vc = self._vc
        channel = getattr(vc, "channel", None) if vc is not None else None
        if channel is None or self._closed:
            self._cancel_alone_timer()
            return
        if _humans(channel):
            self._cancel_alone_timer()
        elif self._alone_task is None or self._alone_task.done():
            self._alone_task = self._spawn(self._leave_when_alone(), "alone")

    async def _leave_when_alone(self) -> None:
        """Wait the grace time, then leave if still alone."""
        await asyncio.sleep(self._alone_s)
        channel = getattr(self._vc, "channel", None)
        if channel is not None and not _humans(channel):
            log.info("guild %d: alone in the voice channel, leaving", self.guild_id)
            self._alone_task = None  # leave() must not cancel this very task
            await self.leave()

    def _cancel_alone_timer(self) -> None:
        """Forget a pending leave-when-alone."""
        if self._alone_task is not None and self._alone_task is not asyncio.current_task():
            self._alone_task.cancel()
        self._alone_task = None

    # --- the queue --------------------------------------------------------------------------------------------------

    def enqueue(self, item: SpeechItem) -> int:
        """Queue an item; returns how many items are ahead of it (0: it is next).

        Raises
        ------
        QueueFull
            ``queue_size`` items are already waiting.
        """
        self._check_open()
        if len(self._queue) >= self._queue_size:
            raise QueueFull(
                f"the queue is full ({len(self._queue)} messages waiting): wait for them to be read, or use /skip or "
                "/clear"
            )
        ahead = len(self._queue) + (1 if self._current is not None else 0)
        self._queue.append(item)
        self._wakeup.set()
        self._ensure_player()
        return ahead

    def skip(self) -> bool:
        """Stop the current item now (its audio ends within one frame, its synthesis is cancelled); False if idle."""
        source, task = self._source, self._item_task
        if source is not None:
            source.stop()
        if task is not None and not task.done():
            task.cancel()
            return True
        return source is not None

    def clear(self) -> int:
        """Drop every waiting item (not the one speaking); returns how many."""
        n = len(self._queue)
        self._queue.clear()
        return n

    def stop(self) -> int:
        """Clear the queue and skip the current item; returns how many items were dropped in all."""
        n = self.clear()
        return n + (1 if self.skip() else 0)

    async def close(self) -> list[SpeechItem]:
        """Stop everything and disconnect; returns the items that were not spoken (current first)."""
        pending = ([self._current] if self._current is not None else []) + list(self._queue)
        self._closed = True
        self._queue.clear()
        self.skip()
        self._cancel_alone_timer()
        tasks = [t for t in (self._player, self._item_task, *self._background) if t is not None and not t.done()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._drop_voice_client()
        self._channel = None
        return pending

    def _check_open(self) -> None:
        """Refuse work after close()."""
        if self._closed:
            raise SpeechError("the bot is shutting down; try again in a moment")

    # --- the player task --------------------------------------------------------------------------------------------

    def _ensure_player(self) -> None:
        """Start the player task unless it runs."""
        if self._player is None or self._player.done():
            self._player = asyncio.create_task(self._run(), name=f"speaker-{self.guild_id}")
            self._player.add_done_callback(self._player_done)

    def _player_done(self, task: asyncio.Task[None]) -> None:
        """The player task's done-callback: an escaped exception is logged and reported."""
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("guild %d: the speech player failed", self.guild_id, exc_info=exc)
            self._report("Speech stopped after an internal error (it was logged); the next message restarts it.")

    async def _run(self) -> None:
        """Speak queued items one at a time; leave after ``idle_disconnect_s`` with nothing to say."""
        while True:
            item = await self._next_item()
            if item is None:
                if self._vc is not None:
                    log.info("guild %d: idle for %.0f s, leaving the voice channel", self.guild_id, self._idle_s)
                    self._channel = None
                    self._cancel_alone_timer()
                    await self._drop_voice_client()
                return
            self._current = item
            task = asyncio.create_task(self._speak(item), name=f"speak-{self.guild_id}")
            self._item_task = task
            try:
                await asyncio.wait({task})
            except asyncio.CancelledError:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                raise
            finally:
                self._current = None
                self._item_task = None
            if not task.cancelled() and task.exception() is not None:
                self._report(_describe(task.exception(), item))

    async def _next_item(self) -> SpeechItem | None:
        """The next item, or None after ``idle_disconnect_s`` without one."""
        deadline = time.monotonic() + self._idle_s
        while not self._queue:
            self._wakeup.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except TimeoutError:
                return None
        return self._queue.popleft()

    async def _speak(self, item: SpeechItem) -> None:
        """Synthesize and play one item; playback starts with the first chunk and survives a reconnect."""
        text = item.text
        prefix = self._announce_prefix(item)
        if prefix and isinstance(text, str):
            text = prefix + text
        source = StreamAudioSource(buffer_s=self._buffer_s)
        self._source = source
        producer: asyncio.Task[None] | None = None
        vc: VoiceClientLike | None = None
        try:
            deadline = time.monotonic() + item.deadline_s if item.deadline_s is not None else None
            stream = self._synth.stream(text, item.voice, item.params, deadline=deadline)
            producer = asyncio.create_task(_produce(stream, source), name=f"synth-{self.guild_id}")
            await source.wait_ready()
            reconnects = 0
            while not source.exhausted:
                vc = await self._ensure_voice()
                error = await self._play(vc, source)
                if source.finished or source.stopped:
                    break
                if error is not None:
                    raise VoiceConnectionError(f"playback failed: {error}") from error
                if vc.is_connected():  # our player was stopped from outside: treat as a skip
                    break
                reconnects += 1
                if reconnects > RECONNECT_ATTEMPTS:
                    raise VoiceConnectionError("the voice connection keeps dropping; try /join again")
                log.warning("guild %d: voice dropped mid-message; resuming once reconnected", self.guild_id)
            await producer  # a synthesis error surfaces after what was made has been played
            self.items_spoken += 1
        finally:
            self._source = None
            source.stop()
            if source.first_frame_at is not None:  # before any await: whoever sees items_spoken sees this too
                self.last_ttfa_s = source.first_frame_at - source.created_at
            if producer is not None:
                if not producer.done():
                    producer.cancel()
                await asyncio.gather(producer, return_exceptions=True)
            if vc is not None and vc.is_playing():
                vc.stop()
            self.underrun_frames += source.frames_silence

    async def _play(self, vc: VoiceClientLike, source: StreamAudioSource) -> Exception | None:
        """Play ``source`` on ``vc`` until discord.py's player ends; returns the player's error, if any."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Exception | None] = loop.create_future()

        def resolve(error: Exception | None) -> None:
            if not done.done():
                done.set_result(error)

        def after(error: Exception | None) -> None:  # runs on the player thread
            try:
                loop.call_soon_threadsafe(resolve, error)
            except RuntimeError:  # loop closed: nobody is waiting any more
                pass

        if vc.is_playing():
            vc.stop()
        try:
            vc.play(source, after=after)
        except Exception as e:
            if not vc.is_connected():
                return None  # dropped between the check and play(): the caller reconnects
            return e
        return await done

    def _announce_prefix(self, item: SpeechItem) -> str:
        """The "X said" prefix when the author changed or spoke last over a minute ago."""
        now = time.monotonic()
        last, self._last_author = self._last_author, (item.author_id, now)
        if not item.announce:
            return ""
        if last is not None and last[0] == item.author_id and now - last[1] < ANNOUNCE_REPEAT_S:
            return ""
        return item.announce

    # --- reporting --------------------------------------------------------------------------------------------------

    def _report(self, message: str) -> None:
        """Hand a message to on_error (sync or async); never raises."""
        if self.on_error is None:
            log.warning("guild %d: %s", self.guild_id, message)
            return
        try:
            result = self.on_error(self.guild_id, message)
        except Exception:
            log.exception("guild %d: the on_error callback failed", self.guild_id)
            return
        if inspect.isawaitable(result):
            self._spawn(result, "report")

    def _spawn(self, aw: Awaitable[Any], what: str) -> asyncio.Task[Any]:
        """A background task that is kept referenced and whose failure is logged."""
        task = asyncio.ensure_future(aw)
        self._background.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("guild %d: background %s task failed", self.guild_id, what, exc_info=t.exception())

        task.add_done_callback(done)
        return task


async def _produce(stream: AsyncIterator[Any], source: StreamAudioSource) -> None:
    """Feed a synthesis stream into a source; always ends the source and closes the stream (stops model work)."""
    try:
        async for chunk in stream:
            if not await source.feed(chunk.audio, chunk.sample_rate):
                break  # the source was stopped (skip)
    finally:
        source.end()
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


def _humans(channel: Any) -> list[Any]:
    """The non-bot members of a voice channel."""
    return [m for m in getattr(channel, "members", ()) if not getattr(m, "bot", False)]


def _channel_name(channel: Any) -> str:
    """A channel's name for messages."""
    name = getattr(channel, "name", None)
    return f"the voice channel {name}" if name else "the voice channel"


def _describe(exc: BaseException | None, item: SpeechItem) -> str:
    """A message for the guild about a failed item."""
    what = item.summary or "a message"
    if isinstance(exc, SpeechError):
        return f"I could not read {what}: {exc}"
    log.error("speaking %s failed", what, exc_info=exc)
    return f"I could not read {what} because of an internal error (it was logged)."
