"""A voice named by id or name is read from the store off the event loop (the store reads files and SQLite)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from synthesis import SynthesisParams
from synthesis.types import VoiceNotFound


def _spy(store: Any, name: str, seen: list[tuple[str, bool]]) -> None:
    """Wrap ``store.<name>``: record, per call, whether it ran on a thread with a running event loop."""
    real = getattr(store, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        seen.append((name, on_loop))
        return real(*args, **kwargs)

    setattr(store, name, wrapped)


@pytest.mark.parametrize("by", ["id", "name"])
async def test_the_voice_store_is_read_off_the_event_loop(synth: Any, voice: Any, by: str) -> None:
    seen: list[tuple[str, bool]] = []
    for name in ("get", "find"):
        _spy(synth.voices, name, seen)
    key = voice.id if by == "id" else voice.name
    chunks = [c async for c in synth.stream("Hi.", key, SynthesisParams(language="en", seed=1))]
    assert chunks and chunks[0].audio.size > 0
    # by id: one get; by name: get misses (the name is no id), then find
    assert [n for n, _ in seen] == (["get"] if by == "id" else ["get", "find"])
    assert not any(on_loop for _, on_loop in seen), seen
    assert threading.current_thread() is threading.main_thread()  # (the test itself runs on the loop's thread)


async def test_an_unknown_voice_is_still_refused(synth: Any, voice: Any) -> None:
    with pytest.raises(VoiceNotFound):
        async for _ in synth.stream("Hi.", "nobody", SynthesisParams(language="en", seed=1)):
            pass
