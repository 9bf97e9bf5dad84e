"""Fixtures shared by the synthesis tests: a Synthesizer over the tiny model set and one voice made in it."""

from __future__ import annotations

import pytest

from bot.services import build_synthesizer
from tests.audio_samples import speech_like_wav

CONSENT = {"user_id": 1, "text": "this is my own voice"}


@pytest.fixture
async def synth(tiny_config):
    """A Synthesizer as the bot builds it (a test module may override this fixture, e.g. to spy on the engine)."""
    s = build_synthesizer(tiny_config)
    yield s
    await s.close()


@pytest.fixture
async def voice(synth):
    """The voice "alice", made from a speech-like clip with its transcript."""
    v, _ = await synth.voicing.create("alice", speech_like_wav(), "alice.wav", transcript="Hello, this is my voice.",
                                      language="en", consent=CONSENT)
    return v
