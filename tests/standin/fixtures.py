"""pytest fixtures for the stand-in. Enable them in a conftest with ``from tests.standin.fixtures import standin``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from .server import Standin


@pytest_asyncio.fixture
async def standin() -> AsyncIterator[Standin]:
    """A started stand-in with one standard guild, closed after the test."""
    async with Standin() as server:
        yield server
