"""The argument handling the local and the remote paths share (issue 14): ``stream``'s text argument
(:func:`synthesis.pipeline.stream_sentences`) and ``create``'s arguments (:func:`synthesis.voicing.create_voice`), one
body each, so the two paths cannot drift."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import pytest

from engines import SpeechError
from synthesis.pipeline import stream_sentences
from synthesis.cluster.client import RemoteVoicing
from synthesis.types import Limits, SynthesisParams
from synthesis.voices import VoiceError
from synthesis.voicing import VoiceOrder, Voicing, create_voice
from tests.fake_voices import make_voice

EN = SynthesisParams(language="en")


async def _collect(text: str | AsyncIterator[str], limits: Limits) -> list[str]:
    return [s async for s in stream_sentences(text, EN, limits)]


async def _pieces(*items: str | float) -> AsyncIterator[str]:
    """Text pieces; a number is a pause of that many seconds before the next piece."""
    for item in items:
        if isinstance(item, str):
            yield item
        else:
            await asyncio.sleep(item)


async def test_a_string_and_its_pieces_give_the_same_sentences() -> None:
    text = "Hello there. How are you today? I am fine."
    whole = await _collect(text, Limits())
    assert whole == ["Hello there.", "How are you today?", "I am fine."]
    assert await _collect(_pieces("Hello th", "ere. How are", " you today? I am", " fine."), Limits()) == whole


async def test_a_pause_speaks_what_is_pending_and_a_long_text_is_refused() -> None:
    limits = Limits(stream_pause_s=0.05, max_text_chars=20)
    out: list[tuple[float, str]] = []
    loop = asyncio.get_running_loop()
    started = loop.time()
    async for s in stream_sentences(_pieces("Wait for it", 0.5, " now. Done."), EN, limits):
        out.append((loop.time() - started, s))
    assert [s for _, s in out] == ["Wait for it.", "now.", "Done."]  # (the splitter ends a cut sentence)
    assert out[0][0] < 0.4  # flushed at the pause, before the next piece arrived (0.5 s)
    with pytest.raises(SpeechError, match="the text is 21 characters long; the limit is 20: send it in parts"):
        await _collect("x" * 21, limits)


def test_the_local_and_the_remote_create_are_one_body() -> None:
    assert Voicing.create is create_voice and RemoteVoicing.create is create_voice


class _Replicas:
    """The remote synthesizer's ``call`` and nothing else: it isolates :class:`RemoteVoicing` from Ray."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    async def call(self, method: str, *args: Any) -> Any:
        self.calls.append((method, args))
        if method == "create_voice":
            order: VoiceOrder = args[0]
            return make_voice(order.name, order.owner_id, voice_id=order.voice_id), ["trimmed"], "replica-7"
        return 2  # precompute: phrases done


async def test_the_remote_create_checks_packs_and_precomputes_as_the_local_one() -> None:
    replicas = _Replicas()
    voicing = RemoteVoicing(replicas)  # type: ignore[arg-type]
    with pytest.raises(VoiceError, match="is not allowed"):
        await voicing.create("no/slash", b"clip", "a.wav", consent={"user_id": 1, "text": "yes"})
    assert replicas.calls == []  # refused before any work on a replica
    progress: list[tuple[str, float]] = []
    voice, warnings = await voicing.create(
        "Alice", b"clip", "a.wav", consent={"user_id": 5, "text": "I agree."}, owner_id=5, transcript="Hi.",
        language="en", progress=lambda stage, frac: progress.append((stage, frac)), phrases=["Hello!", "Bye."],
        voice_id="ab" * 16)
    assert (voice.name, voice.owner_id, voice.id, warnings) == ("Alice", 5, "ab" * 16, ["trimmed"])
    assert voicing.last_replica == "replica-7" and progress == [("encoding", 0.0), ("done", 1.0)]
    method, (order, data, filename) = replicas.calls[0]
    assert (method, data, filename) == ("create_voice", b"clip", "a.wav")
    assert order == VoiceOrder("Alice", {"user_id": 5, "text": "I agree."}, 5, "Hi.", "en", None, "ab" * 16)
    async with asyncio.timeout(30):  # the phrases' precompute runs on a replica, in the background
        while len(replicas.calls) < 2:
            await asyncio.sleep(0.001)
    assert replicas.calls[1][0] == "precompute" and replicas.calls[1][1][:2] == ("ab" * 16, ["Hello!", "Bye."])
