"""Plain data that flows through the synthesis pipeline and out of it (numpy at the edges)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import AsyncIterator, Protocol

import numpy as np

from engines.base import SAMPLE_RATE, SpeechError, VoicePrompt

LANGUAGES = ("auto", "auto_yue", "en", "zh", "ja", "yue", "ko", "all_zh", "all_ja", "all_yue", "all_ko")
SPLIT_METHODS = ("cut0", "cut1", "cut2", "cut3", "cut4", "cut5")


class BusyError(SpeechError):
    """The synthesis queue is full; try again shortly."""


class DeadlineError(SpeechError):
    """A request ran past its deadline and was dropped."""


class VoiceNotFound(SpeechError):
    """No voice with that name or id."""


class AudioInputError(SpeechError):
    """An uploaded clip cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class SynthesisParams:
    """Per-request options (upstream api_v2 names where they exist)."""

    language: str = "auto"
    top_k: int = 15
    top_p: float = 1.0
    temperature: float = 1.0
    repetition_penalty: float = 1.35
    speed: float = 1.0
    noise_scale: float = 0.5
    seed: int = -1  # -1: random
    split_method: str = "cut5"
    fragment_interval: float = 0.3  # seconds of silence after each sentence

    def __post_init__(self) -> None:
        if self.language not in LANGUAGES:
            raise ValueError(f"language must be one of {', '.join(LANGUAGES)}, got {self.language!r}")
        if self.split_method not in SPLIT_METHODS:
            raise ValueError(f"split_method must be one of {', '.join(SPLIT_METHODS)}, got {self.split_method!r}")
        if not 0.25 <= self.speed <= 4.0:
            raise ValueError(f"speed must be between 0.25 and 4.0, got {self.speed}")
        if not 0.0 <= self.fragment_interval <= 5.0:
            raise ValueError(f"fragment_interval must be between 0 and 5 s, got {self.fragment_interval}")
        if self.noise_scale < 0:
            raise ValueError(f"noise_scale must be >= 0, got {self.noise_scale}")


@dataclass(frozen=True)
class Voice:
    """A stored voice profile: identity plus the precomputed prompt (loading it does no model work)."""

    id: str  # stable id (uuid hex)
    name: str
    owner_id: int  # Discord user id, 0 for server/CLI voices
    version: int  # bumped on every change; part of every cache key
    language: str  # language of the reference transcript
    prompt_text: str  # reference transcript ("" = reference-free)
    prompt: VoicePrompt
    model_id: str  # identity of the model that encoded it


@dataclass(frozen=True)
class AudioChunk:
    """A piece of synthesized speech.

    ``audio`` is ``[N]`` float32 in [-1, 1] @ ``sample_rate`` Hz, mono. ``sentence`` is the text it belongs to,
    ``index`` the sentence's 0-based position in the request.
    """

    audio: np.ndarray
    sentence: str
    index: int
    sample_rate: int = SAMPLE_RATE
    timings: dict[str, float] = field(default_factory=dict)  # gpt_s, sovits_s, prosody_hit, audio_hit

    def to_int16(self) -> np.ndarray:
        return (np.clip(self.audio, -1.0, 1.0) * 32767.0).astype(np.int16)


class SpeechSynthesizer(Protocol):
    """What the bot and the HTTP API need from the pipeline (implemented by ``synthesis.pipeline.Synthesizer``)."""

    def stream(
        self,
        text: str | AsyncIterator[str],
        voice: Voice | str,
        params: SynthesisParams | None = None,
        *,
        deadline: float | None = None,
    ) -> AsyncIterator[AudioChunk]:
        """Yield audio sentence by sentence; closing the iterator (or cancelling its task) stops the model work."""
        ...
