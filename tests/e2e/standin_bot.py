"""The real bot, its cogs and speech service, logged in to the stand-in with the Discord layer's fake synthesizer
(a sine per voice, ``tests/cogs/conftest.py``): for the Discord features that need no model (settings, refusals,
what is read), fast enough for many small tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import discord
import discord.gateway
import discord.http
import pytest
import pytest_asyncio

from bot.client import VoiceBot
from bot.config import Config, config_from_dict
from bot.services import Services
from bot.speech import SpeechService
from bot.store import Store
from tests.cogs.conftest import FakeSynthesizer
from tests.standin.server import Standin

READY_TIMEOUT_S = 10.0


@dataclass
class LightEnv:
    """The stand-in, the bot, and what a test reads: the store, the fake synthesizer's streamed texts."""

    standin: Standin
    bot: VoiceBot
    store: Store
    synth: FakeSynthesizer
    speech: SpeechService


def standin_config(standin: Standin, tmp_path: Path) -> Config:
    """A config pointing discord.py at the stand-in (database in ``tmp_path``)."""
    return config_from_dict({"discord": {
        "api_base": standin.api_base, "gateway_url": standin.gateway_url, "ca_file": str(standin.ca_pem_path),
        "guild_ready_timeout_s": 0.05, "database": str(tmp_path / "bot.sqlite3")}}, base_dir=tmp_path)


def point_at_standin(monkeypatch: pytest.MonkeyPatch) -> None:
    """VoiceBot.login sets discord.py's endpoints process-wide; put the originals back after the test."""
    monkeypatch.setattr(discord.http.Route, "BASE", discord.http.Route.BASE)
    monkeypatch.setattr(discord.gateway.DiscordWebSocket, "DEFAULT_GATEWAY",
                        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY)


@pytest_asyncio.fixture
async def light(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LightEnv]:
    """The bot logged in to a fresh stand-in, commands synced and ready; closed after the test."""
    point_at_standin(monkeypatch)
    async with Standin() as standin:
        config = standin_config(standin, tmp_path)
        store = Store(config.discord.database)
        await store.open()
        synth = FakeSynthesizer()
        speech = SpeechService(synth, store, config)
        services = Services(config, synth, store, speech)  # type: ignore[arg-type]  # the Discord layer's fake
        bot = VoiceBot(services)
        task = asyncio.create_task(bot.start(standin.token))
        try:
            await asyncio.wait_for(bot.wait_until_ready(), READY_TIMEOUT_S)
            await standin.wait_commands("join", "say", "settings", timeout=READY_TIMEOUT_S)
            yield LightEnv(standin, bot, store, synth, speech)
        finally:
            await bot.close()
            await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10)
            await store.close()
