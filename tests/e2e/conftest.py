"""End-to-end fixtures: the local Discord stand-in and the project's real bot, in-process, on the tiny real models.

The bot is :class:`bot.client.VoiceBot` with real services: the synthesizer from
``bot.services.build_synthesizer`` (tiny random-weight models, torch on CPU), a fresh SQLite :class:`bot.store.Store`
and :class:`bot.speech.SpeechService`. It is pointed at the stand-in by configuration only (``discord.api_base``,
``discord.gateway_url``, ``discord.ca_file``). Between the speech service and the synthesizer sits
:class:`RecordingSynthesizer`, which delegates every call to the real synthesizer and only *observes*: the text each
stream received and the moment each sentence's audio left the pipeline.

The synthesizer (engine load ~2 s) is built once per test module and shared, as one process shares it between all
guilds in production; every test gets its own stand-in, bot, database and speech service. Synthesis uses a fixed
seed (``SEED``), so the same text in the same voice gives the same samples, alone or batched with other requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import discord
import discord.gateway
import discord.http
import numpy as np
import pytest
import pytest_asyncio

from bot.client import VoiceBot
from bot.config import Config, load_config
from bot.services import Services, build_synthesizer
from bot.speech import SpeechService
from bot.store import Store
from synthesis.types import AudioChunk, Voice
from tests.audio_samples import speech_like_wav
from tests.chat_standin import ChatStandIn
from tests.standin.server import Standin

SEED = 1234  # fixed synthesis seed: solo and concurrent runs of one text and voice give identical samples
READY_TIMEOUT_S = 10.0  # login + READY + command sync; generous for a loaded 2-core machine
GUILD_READY_TIMEOUT_S = 0.05  # the stand-in sends every GUILD_CREATE right after READY
HOLD_TIMEOUT_S = 15.0  # longest a held stream waits for its condition (then ``held`` is False and the test fails)
COMMANDS = ("join", "leave", "say", "skip", "clear", "Speak with my voice", "voice", "forget-me", "settings", "set",
            "phrases", "ask", "pronounce", "block", "stats", "help")
WARMUP_TEXT = "Warm up the text front end. And the models as well."


# ---- the observing wrapper ---------------------------------------------------------------------------------------

@dataclass
class StreamRecord:
    """One ``stream`` call as the wrapper saw it.

    ``text`` is the whole text (a string request) or the pieces joined (a streamed request); ``pieces`` holds the
    streamed pieces with their arrival times. ``chunks`` holds each sentence's audio with the ``time.monotonic()``
    at which the real pipeline handed it over (the sentence was synthesized by then). ``completed``: the real stream
    ran to its end; ``closed_at``: when the consumer closed it (end, skip or error). ``held``: with
    ``RecordingSynthesizer.hold`` set, whether its condition came true while the stream held its second chunk back.
    """

    text: str
    voice: Voice | str
    started_at: float
    streamed: bool = False
    pieces: list[tuple[float, str]] = field(default_factory=list)
    chunks: list[tuple[float, AudioChunk]] = field(default_factory=list)
    completed: bool = False
    closed_at: float | None = None
    held: bool | None = None

    @property
    def sentences(self) -> list[str]:
        """The sentences synthesized so far, in order (a first sentence's early words are a chunk of their own)."""
        return [c.sentence for _, c in self.chunks if not c.timings.get("partial")]

    @property
    def audio(self) -> np.ndarray:
        """``[N]`` float32 @ 32 kHz: everything synthesized, in order."""
        if not self.chunks:
            return np.zeros(0, np.float32)
        return np.concatenate([c.audio for _, c in self.chunks])

    @property
    def seconds(self) -> float:
        """Seconds of audio synthesized."""
        return sum(c.audio.size / c.sample_rate for _, c in self.chunks)


class RecordingSynthesizer:
    """Delegates everything to the real :class:`synthesis.pipeline.Synthesizer`; records what ``stream`` sees.

    Only an observer: the chunks are the real pipeline's, passed through unchanged and in order, and closing the
    wrapper closes the real stream (so skips still stop model work). With ``hold`` set (a condition), each stream
    hands its first chunk over and then holds the second back until the condition is true (at most
    ``HOLD_TIMEOUT_S``), so a test orders events ("playback started before the rest was synthesized") instead of
    timing them.
    """

    def __init__(self, real: Any) -> None:
        self.real = real
        self.streams: list[StreamRecord] = []
        self.hold: Callable[[], bool] | None = None
        self._changed = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def stream(self, text: str | AsyncIterator[str], voice: Voice | str, params: Any = None,
               **kwargs: Any) -> AsyncIterator[AudioChunk]:
        """The real ``stream``, observed."""
        record = StreamRecord(text if isinstance(text, str) else "", voice, time.monotonic(),
                              streamed=not isinstance(text, str))
        self.streams.append(record)
        self._touch()
        if not isinstance(text, str):
            text = self._tee(text, record)
        return self._observe(self.real.stream(text, voice, params, **kwargs), record)

    async def _tee(self, pieces: AsyncIterator[str], record: StreamRecord) -> AsyncIterator[str]:
        """Pass streamed text pieces through, noting each."""
        async for piece in pieces:
            record.pieces.append((time.monotonic(), piece))
            record.text += piece
            yield piece

    async def _observe(self, inner: AsyncIterator[AudioChunk], record: StreamRecord) -> AsyncIterator[AudioChunk]:
        """Pass chunks through, noting when each sentence arrived; close the real stream with this one."""
        try:
            async for chunk in inner:
                if self.hold is not None and len(record.chunks) == 1:
                    record.held = await self._holds(self.hold)
                record.chunks.append((time.monotonic(), chunk))
                self._touch()
                yield chunk
            record.completed = True
        finally:
            record.closed_at = time.monotonic()
            self._touch()
            await inner.aclose()  # type: ignore[attr-defined]

    def _touch(self) -> None:
        """Wake waiters."""
        self._changed.set()

    async def _holds(self, condition: Callable[[], bool]) -> bool:
        """Wait until ``condition()`` (True) or HOLD_TIMEOUT_S (False)."""
        try:
            await self._until(condition, HOLD_TIMEOUT_S, "the hold condition")
        except asyncio.TimeoutError:
            return False
        return True

    async def wait_streams(self, count: int, timeout: float = 10.0) -> list[StreamRecord]:
        """Wait until ``count`` streams have been opened; returns them all."""
        await self._until(lambda: len(self.streams) >= count, timeout, f"{count} synthesis streams")
        return self.streams

    async def wait_closed(self, record: StreamRecord, timeout: float = 15.0) -> None:
        """Wait until a stream has been closed by its consumer."""
        await self._until(lambda: record.closed_at is not None, timeout, "the synthesis stream closed")

    async def _until(self, condition: Any, timeout: float, what: str) -> None:
        """Wait for ``condition()``, woken on every change."""
        deadline = time.monotonic() + timeout
        while not condition():
            left = deadline - time.monotonic()
            if left <= 0:
                raise asyncio.TimeoutError(f"{what} not seen within {timeout} s")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(left, 0.05))
            except asyncio.TimeoutError:
                pass


# ---- configuration and the shared synthesizer --------------------------------------------------------------------

def _with_seed(cfg: Config) -> Config:
    """The config with the fixed synthesis seed and no common phrases to precompute."""
    return dataclasses.replace(cfg, synthesis=dataclasses.replace(cfg.synthesis, seed=SEED), phrases=())


@pytest.fixture(scope="module")
def real_synthesizer(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real synthesizer on the tiny models (own voice and cache folders), warmed up once per module."""
    data = tmp_path_factory.mktemp("e2e-synth")
    cfg = _with_seed(load_config(tiny_models / "config.yaml"))
    cfg = dataclasses.replace(
        cfg,
        voices=dataclasses.replace(cfg.voices, dir=data / "voices"),
        cache=dataclasses.replace(cfg.cache, dir=data / "cache"),
    )
    synth = build_synthesizer(cfg)

    async def warm_up() -> None:
        # the first request loads the G2P and tokenizer data; keep that out of every timing below
        voice, _ = await synth.voicing.create("warm-up", speech_like_wav(4.0, 180.0, 9), "warm-up.wav", owner_id=1,
                                            consent={"user_id": 1, "text": "test fixture"})
        await synth.synthesize(WARMUP_TEXT, voice)
        await synth.voicing.delete(voice.id)

    asyncio.run(warm_up())
    yield synth
    asyncio.run(synth.close())


# ---- a slow OpenAI-compatible chat model -------------------------------------------------------------------------

CHAT_REPLY = (
    "Sure, here is a short answer for you. The weather today looks calm and mild. "
    "Take a light jacket when you go out tonight."
)
CHAT_PIECE_DELAY_S = 0.08  # seconds between two streamed pieces (one word each): ~1.6 s for the whole reply


@pytest_asyncio.fixture
async def chat_model() -> AsyncIterator[ChatStandIn]:
    """The slow chat model (one word every CHAT_PIECE_DELAY_S), listening on a free loopback port."""
    words = CHAT_REPLY.split(" ")
    model = await ChatStandIn([w + " " for w in words[:-1]] + [words[-1]], CHAT_PIECE_DELAY_S).start()
    yield model
    await model.close()


# ---- the stand-in and the bot ------------------------------------------------------------------------------------

@pytest_asyncio.fixture
async def standin(request: pytest.FixtureRequest) -> AsyncIterator[Standin]:
    """A started stand-in; ``@pytest.mark.parametrize("standin", [2], indirect=True)`` gives it two guilds."""
    async with Standin(guilds=getattr(request, "param", 1)) as server:
        yield server


@dataclass
class BotEnv:
    """Everything one end-to-end test drives and observes."""

    standin: Standin
    bot: VoiceBot
    services: Services
    synth: RecordingSynthesizer
    store: Store
    speech: SpeechService
    chat_model: ChatStandIn

    async def add_voice(self, owner_id: int, name: str, f0: float, seed: int = 0) -> Voice:
        """Store a voice for ``owner_id`` from 4 s of synthetic speech at pitch ``f0`` (setup, not under test)."""
        clip = speech_like_wav(4.0, f0, seed)
        voice, _ = await self.synth.real.voicing.create(
            name, clip, f"{name}.wav", owner_id=owner_id, consent={"user_id": owner_id, "text": "test fixture"}
        )
        return voice


@pytest_asyncio.fixture
async def env(
    standin: Standin, tiny_config: Config, real_synthesizer: Any, chat_model: ChatStandIn,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[BotEnv]:
    """The real bot logged in to the stand-in, its commands synced, ready; closed (and discord.py's globals
    restored) after the test."""
    # VoiceBot.login sets these process-wide; monkeypatch puts the originals back after the test
    monkeypatch.setattr(discord.http.Route, "BASE", discord.http.Route.BASE)
    monkeypatch.setattr(discord.gateway.DiscordWebSocket, "DEFAULT_GATEWAY",
                        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY)
    config = _with_seed(tiny_config)
    config = dataclasses.replace(config, discord=dataclasses.replace(
        config.discord,
        api_base=standin.api_base,
        gateway_url=standin.gateway_url,
        ca_file=standin.ca_pem_path,
        guild_ready_timeout_s=GUILD_READY_TIMEOUT_S,
    ), chat=dataclasses.replace(config.chat, enabled=True, base_url=chat_model.url, model="e2e-model",
                                timeout_s=10.0))
    synth = RecordingSynthesizer(real_synthesizer)
    store = Store(config.discord.database)
    await store.open()
    speech = SpeechService(synth, store, config)
    services = Services(config, synth, store, speech)  # type: ignore[arg-type]  # the wrapper delegates
    bot = VoiceBot(services)
    task = asyncio.create_task(bot.start(standin.token))
    try:
        await asyncio.wait_for(bot.wait_until_ready(), READY_TIMEOUT_S)
        await standin.wait_commands(*COMMANDS, timeout=READY_TIMEOUT_S)
        yield BotEnv(standin, bot, services, synth, store, speech, chat_model)
    finally:
        await bot.close()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10)
        await store.close()
