"""The process: services built once, then the Discord bot and/or the HTTP API run until interrupted."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from bot.config import Config
from bot.services import Services, build_synthesizer

log = logging.getLogger(__name__)


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread / platform without signals
            pass
    await stop.wait()


async def run_api(config: Config, host: str | None = None, port: int | None = None) -> None:
    """``serve``: the HTTP API alone."""
    from bot.http import start_server

    services = Services(config, build_synthesizer(config))
    await services.synthesizer.warm_up()
    runner: Any = await start_server(services, host, port)
    try:
        await _wait_for_signal()
    finally:
        await runner.cleanup()
        await services.synthesizer.close()


async def run_bot_and_api(config: Config, token: str) -> None:
    """``run``: the Discord bot, plus the HTTP API when enabled, in one process."""
    from bot.client import VoiceBot
    from bot.http import start_server
    from bot.speech import SpeechService
    from bot.store import Store

    synthesizer = build_synthesizer(config)
    await synthesizer.warm_up()
    store = Store(config.discord.database)
    await store.open()
    services = Services(config, synthesizer, store)
    assert services.voices is not None
    await services.voices.recover()  # finish or undo a voice creation or deletion a crash interrupted
    services.speech = SpeechService(synthesizer, store, config, voices=services.voices)
    if config.chat.enabled:
        from bot.chat import ChatClient

        services.chat = ChatClient(config.chat)
    runner: Any = None
    try:
        if config.http.enabled:
            runner = await start_server(services)
        async with VoiceBot(services) as bot:
            bot_task = asyncio.create_task(bot.start(token))
            stop_task = asyncio.create_task(_wait_for_signal())
            done, _ = await asyncio.wait({bot_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
            stop_task.cancel()
            if bot_task in done:
                bot_task.result()  # raises e.g. LoginFailure with its message
    finally:
        if runner is not None:
            await runner.cleanup()
        if services.chat is not None:
            await services.chat.close()
        await store.close()
        await synthesizer.close()
