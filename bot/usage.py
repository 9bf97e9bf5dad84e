"""Usage statistics for ``/stats``: what a guild's speaker synthesized, counted as it streams, stored as numbers.

:class:`UsageCounter` sits between a :class:`~bot.speaker.GuildSpeaker` and the synthesizer: it passes every
stream through unchanged and, when the stream ends, adds one message, its characters, its sentences and how many of
them came from the prosody or audio cache to the guild's counters in the store. The text itself is never kept.
"""

from __future__ import annotations

import logging
from typing import AsyncGenerator, AsyncIterator

from synthesis import SynthesisParams, Voice
from synthesis.types import AudioChunk, AudioStream, SpeechSynthesizer

from bot.store import Store, StoreError

__all__ = ("UsageCounter",)

log = logging.getLogger(__name__)


class UsageCounter:
    """A synthesizer for one guild's speaker that counts what it streams.

    Parameters
    ----------
    synthesizer:
        The real one.
    store:
        Where the counters are added, once per stream.
    guild_id:
        Whose counters.
    """

    def __init__(self, synthesizer: SpeechSynthesizer, store: Store, guild_id: int) -> None:
        self._synth = synthesizer
        self._store = store
        self.guild_id = guild_id

    def stream(self, text: str | AsyncIterator[str], voice: Voice | str, params: SynthesisParams | None = None, *,
               deadline: float | None = None) -> AsyncGenerator[AudioChunk, None]:
        """The real stream, counted."""
        counts = {"characters": len(text) if isinstance(text, str) else 0, "sentences": 0, "cache_hits": 0}
        if not isinstance(text, str):
            text = self._count_pieces(text, counts)
        return self._count_chunks(self._synth.stream(text, voice, params, deadline=deadline), counts)

    async def _count_pieces(self, pieces: AsyncIterator[str], counts: dict[str, int]) -> AsyncIterator[str]:
        """Pass a streamed text through, counting its characters."""
        async for piece in pieces:
            counts["characters"] += len(piece)
            yield piece

    async def _count_chunks(self, inner: AudioStream, counts: dict[str, int]) -> AsyncGenerator[AudioChunk, None]:
        """Pass the audio through; at the end (finished, skipped or failed) add the counts to the store."""
        try:
            async for chunk in inner:
                timings = chunk.timings
                if not timings.get("partial"):  # a first sentence's early words are part of their sentence
                    counts["sentences"] += 1
                    counts["cache_hits"] += bool(timings.get("prosody_hit") or timings.get("audio_hit"))
                yield chunk
        finally:
            await inner.aclose()
            try:
                await self._store.add_usage(self.guild_id, messages=1, **counts)
            except StoreError as e:  # statistics never stop speech
                log.warning("guild %d: usage counters not saved: %s", self.guild_id, e)
