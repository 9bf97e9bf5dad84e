"""Fixtures of the HTTP door tests: a server on the fake synthesizer, and a client session."""

from __future__ import annotations

import aiohttp
import pytest

from tests.bot.test_http_fakes import start


@pytest.fixture
async def server(tmp_path):
    """The HTTP API on :class:`tests.bot.test_http_fakes.FakeSynth`, with its default settings."""
    srv = await start(tmp_path)
    yield srv
    await srv.close()


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s
