"""What the bot and its doors (Discord, every HTTP protocol, the command line) need from a synthesizer, as protocols.

Two implement them: the local :class:`~synthesis.pipeline.Synthesizer` (the engine in this process) and
:class:`~synthesis.cluster.client.RemoteSynthesizer` (the engine on Ray Serve replicas). The bot is typed against these,
never against either class, so a third backend is one class that pyright checks against them.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

from synthesis.types import SpeechSynthesizer, SynthesisParams, Voice

if TYPE_CHECKING:  # only types: the protocols cost no import of the pipeline, the voice store or the model
    from synthesis.voicing import Progress
    from synthesis.voices import Removed, VoiceStore


class VoiceMaker(Protocol):
    """Makes, changes, precomputes and deletes voices with the loaded model (``SpeechBackend.voicing``)."""

    async def create(self, name: str, data: bytes, filename: str = "", *, consent: Mapping[str, Any],
                     owner_id: int = 0, transcript: str | None = None, language: str = "auto",
                     enrollment_prompt: str | None = None, progress: Progress | None = None,
                     phrases: Sequence[str] = (), voice_id: str | None = None) -> tuple[Voice, list[str]]:
        """Check and encode an uploaded clip, store the voice with its consent record, start precomputing
        ``phrases``; returns the voice and the clip's warnings."""
        ...

    async def add_clips(self, voice: Voice, uploads: Sequence[tuple[bytes, str]], *,
                        consent: Mapping[str, Any]) -> tuple[Voice, list[str]]:
        """More clips of the same speaker, fused into the voice's timbre, each stored with the speaker's consent
        record: the new version and warnings."""
        ...

    async def add_style(self, voice: Voice, style: str, data: bytes, filename: str, *, consent: Mapping[str, Any],
                        transcript: str = "", language: str = "auto") -> tuple[Voice, list[str]]:
        """A named style (a reference of its own, stored with the speaker's consent record): the new version and
        warnings."""
        ...

    async def remove_style(self, voice: Voice, style: str) -> Voice:
        """The voice without the style: the new version."""
        ...

    def precompute(self, voice: Voice, phrases: Sequence[str], progress: Progress | None = None,
                   params: SynthesisParams | None = None) -> asyncio.Task[int]:
        """Compute the prosody of ``phrases`` in the background; the task says how many (cancel it to stop)."""
        ...

    async def stop_precompute(self, voice_id: str | None = None) -> None:
        """Stop the precompute of one voice (of every voice when None) and wait for it."""
        ...

    async def delete(self, voice_id: str) -> Removed:
        """Remove the voice and every derived byte (files, rows, cache entries)."""
        ...


class SpeechBackend(SpeechSynthesizer, Protocol):
    """A synthesizer, whole: speech (``stream``), its admission state, its voices, its lifecycle and metrics."""

    @property
    def voices(self) -> VoiceStore:
        """The voice store (reads, listing, deleting; a lookup by id or name: ``voices.lookup``)."""
        ...

    @property
    def voicing(self) -> VoiceMaker:
        """Voice work that needs the model."""
        ...

    @property
    def busy(self) -> bool:
        """True when a new request would be refused (every admission place is taken)."""
        ...

    @property
    def engine_name(self) -> str: ...

    @property
    def device(self) -> str: ...

    @property
    def precision(self) -> str: ...

    @property
    def sample_rate(self) -> int:
        """Hz of the audio it speaks (the model's: 32000, v4/v5 48000, v3 24000)."""
        ...

    def metrics(self) -> dict[str, object]:
        """Counters, recent timings, load and the engine, for ``/metrics`` and ``/health``."""
        ...

    async def warm_up(self) -> None:
        """Pay the one-time costs before the first request."""
        ...

    async def close(self) -> None:
        """Stop the background work and release the engine, the caches and the voice store."""
        ...
