"""Plain data that flows through the synthesis pipeline and out of it (numpy at the edges)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Awaitable, Protocol

import numpy as np

from engines import SpeechError
from engines.base import SAMPLE_RATE, SamplingParams, VoicePrompt

if TYPE_CHECKING:  # the text front-end imports this module: a runtime import would be circular
    from synthesis.text.lexicon import Lexicon

LANGUAGES = ("auto", "auto_yue", "en", "zh", "ja", "yue", "ko", "all_zh", "all_ja", "all_yue", "all_ko")
SPLIT_METHODS = ("cut0", "cut1", "cut2", "cut3", "cut4", "cut5")
MAX_NOISE_SCALE = 10.0  # SoVITS noise scale bound (upstream's default is 0.5)


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
    # the GPT's sampling options: their defaults are upstream's, written once in engines.SamplingParams
    top_k: int = SamplingParams.top_k
    top_p: float = SamplingParams.top_p
    temperature: float = SamplingParams.temperature
    repetition_penalty: float = SamplingParams.repetition_penalty
    speed: float = 1.0
    noise_scale: float = 0.5
    seed: int = -1  # -1: random
    split_method: str = "cut5"
    fragment_interval: float = 0.3  # seconds of silence after each sentence
    # the pronunciation dictionary applied before G2P (a guild's with its member's on top, the HTTP API's file)
    lexicon: Lexicon | None = None
    # a named style of the voice (its own reference: prompt tokens, transcript, ge); "" = the voice's main clip
    style: str = ""
    # upstream's ``aux_ref_audio_paths``: ids of stored voices whose clips' ``ge`` is averaged with the voice's
    aux_voices: tuple[str, ...] = ()
    # the v3/v4/v5 sampler (upstream's ``sample_steps``, ``cfg_rate``): None = the model family's defaults; the
    # family checks its own values (v5: 4, 8, 16 or 32 steps, cfg 0-2); a v2-family model refuses them
    steps: int | None = None
    cfg: float | None = None

    def __post_init__(self) -> None:
        if self.language not in LANGUAGES:
            raise ValueError(f"language must be one of {', '.join(LANGUAGES)}, got {self.language!r}")
        if self.split_method not in SPLIT_METHODS:
            raise ValueError(f"split_method must be one of {', '.join(SPLIT_METHODS)}, got {self.split_method!r}")
        # the GPT's options are checked where the engine defines them (finite, in range), with the same messages
        SamplingParams(top_k=self.top_k, top_p=self.top_p, temperature=self.temperature,
                       repetition_penalty=self.repetition_penalty)
        _check_number("speed", self.speed, 0.25, 4.0)
        _check_number("fragment_interval", self.fragment_interval, 0.0, 5.0)
        _check_number("noise_scale", self.noise_scale, 0.0, MAX_NOISE_SCALE)
        if not _whole(self.seed) or not -1 <= self.seed < 2**63:
            raise ValueError(f"seed must be a whole number from -1 (random) to 2**63-1, got {self.seed!r}")
        if self.steps is not None:
            _check_whole("steps", self.steps, 1)
        if self.cfg is not None:
            _check_number("cfg", self.cfg, 0.0, 2.0)


@dataclass(frozen=True)
class Limits:
    """The pipeline's operational limits: the defaults of config ``synthesis:`` and ``voices:`` (bot.config).

    Each value is checked here, once, so that a limit no request could live with is refused where it is set.
    """

    queue_size: int = 64  # requests admitted at once (from the call to stream() until its stream ends); more: busy
    deadline_s: float = 120.0  # longest wait for a sentence once its text arrived and it is due (first: half)
    stream_pause_s: float = 1.5  # flush streamed text after this pause
    stream_max_chars: int = 300  # ...or once this much is pending
    max_text_chars: int = 5000  # longest text accepted in one request
    first_chunk_tokens: int = 16  # first sentence: speak its first tokens before its GPT ends (0 = off)
    max_upload_bytes: int = 25 * 1024 * 1024  # uploads larger than this are refused before decoding
    max_upload_s: float = 600.0  # uploads longer than this are refused while decoding
    min_speech_s: float = 3.0  # GPT-SoVITS wants 3-10 s of reference speech
    max_speech_s: float = 10.0  # longer clips are cut to their best stretch of speech

    def __post_init__(self) -> None:
        for name in ("queue_size", "stream_max_chars", "max_text_chars", "max_upload_bytes"):
            _check_whole(name, getattr(self, name), 1)
        _check_whole("first_chunk_tokens", self.first_chunk_tokens, 0)
        for name in ("deadline_s", "stream_pause_s", "max_upload_s", "min_speech_s"):
            _check_positive(name, getattr(self, name))
        _check_positive("max_speech_s", self.max_speech_s)
        if self.max_speech_s < self.min_speech_s:
            raise ValueError(f"max_speech_s must be >= min_speech_s ({self.min_speech_s:g}), got {self.max_speech_s:g}")


def _check_whole(name: str, value: object, lo: int) -> None:
    """Refuse anything but a whole number ``>= lo``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{name} must be a whole number >= {lo}, got {value!r}")


def _check_positive(name: str, value: object) -> None:
    """Refuse anything but a finite number above 0."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not (ok and math.isfinite(float(value)) and float(value) > 0):  # type: ignore[arg-type]
        raise ValueError(f"{name} must be a finite number above 0, got {value!r}")


def _whole(value: object) -> bool:
    """An int or numpy integer, not a bool (``object``: the declared type is not trusted at the door)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_number(name: str, value: object, lo: float, hi: float) -> None:
    """Refuse anything but a finite number in ``[lo, hi]``."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not (ok and math.isfinite(float(value)) and lo <= float(value) <= hi):  # type: ignore[arg-type]
        raise ValueError(f"{name} must be a finite number from {lo:g} to {hi:g}, got {value!r}")


@dataclass(frozen=True)
class VoiceStyle:
    """A named style of a voice ("calm", "excited"): a reference of its own, chosen per request.

    Attributes
    ----------
    name: as the user typed it (matched case-insensitively).
    language, prompt_text: its transcript and the transcript's language ("" text: reference-free).
    prompt: its encoding (prompt tokens, ge, phones, BERT; the voice's model made it).
    """

    name: str
    language: str
    prompt_text: str
    prompt: VoicePrompt


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
    # each clip's ``ge`` ``[K, gin, 1]`` float32 (main clip first, then the extra clips; ``prompt.ge`` is their mean,
    # as upstream fuses aux references); None: one clip, its ``ge`` is ``prompt.ge``
    clip_ges: np.ndarray | None = field(default=None, compare=False)
    # the named styles stored with the voice: name -> its own reference (prompt tokens, ge, phones, BERT)
    styles: dict[str, VoiceStyle] = field(default_factory=dict[str, VoiceStyle], compare=False)
    # what this object speaks with, beyond the stored voice, for the cache keys: the style chosen ("" = main clip)
    # and the aux voices whose clips were fused into ``prompt.ge`` ("" = none; see ``synthesis.styles``)
    style: str = ""
    timbre: str = ""

    @property
    def ges(self) -> np.ndarray:
        """Each clip's ``ge`` ``[K, gin, 1]`` float32 (K = 1 for a voice of one clip)."""
        return self.clip_ges if self.clip_ges is not None else np.asarray(self.prompt.ge, np.float32)[None]


PCM16_SCALE = 32767.0  # full scale of s16 PCM: +1.0 -> 32767, -1.0 -> -32767 (symmetric, never -32768)


def to_pcm16(samples: np.ndarray) -> np.ndarray:
    """Float audio -> ``[N]`` int16: clipped to [-1, 1], scaled by :data:`PCM16_SCALE`, rounded to the nearest step.

    The one float -> int16 conversion (Discord, every HTTP format, WAV files): rounding, not truncation, so the
    error is at most half a step and symmetric around 0 (truncation pulls every sample toward 0 by up to a step).
    """
    x = np.asarray(samples, dtype=np.float32)
    return np.rint(np.clip(x, -1.0, 1.0) * np.float32(PCM16_SCALE)).astype(np.int16)


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
    timings: dict[str, float] = field(default_factory=dict[str, float])  # gpt_s, sovits_s, prosody_hit, audio_hit

    def to_int16(self) -> np.ndarray:
        """``[N]`` int16 (:func:`to_pcm16`)."""
        return to_pcm16(self.audio)


class AudioStream(Protocol):
    """One request's audio, sentence by sentence (an async iterator of chunks); closing it (or cancelling its
    consumer) stops the model work."""

    def __aiter__(self) -> AsyncIterator[AudioChunk]: ...

    # (plain methods returning awaitables, so that an async generator and a class with ``async def`` both fit)
    def __anext__(self) -> Awaitable[AudioChunk]: ...

    def aclose(self) -> Awaitable[None]:
        """Stop the request and release what it holds (an async generator's ``aclose``)."""
        ...


class SpeechSynthesizer(Protocol):
    """Speech from text: the part of :class:`~synthesis.backend.SpeechBackend` a guild's speaker uses (so a
    wrapper that counts or records a stream needs only this)."""

    def stream(
        self,
        text: str | AsyncIterator[str],
        voice: Voice | str,
        params: SynthesisParams | None = None,
        *,
        deadline: float | None = None,
    ) -> AudioStream:
        """Yield audio sentence by sentence; closing the iterator (or cancelling its task) stops the model work."""
        ...
