"""What the device worker knows of each request it speaks: the state it alone reads and writes, on its own thread.

A request (:class:`Speaking`) is opened when it is admitted and closed when its stream ends; its sentences
(:class:`Sentence`) are registered in order as the text is split, each then handed its :class:`Utterance` (with its
tokens on a prosody-cache hit, else a GPT request). The event loop never writes these fields: it posts messages
(``synthesis.scheduler``'s handles), which the worker applies between two steps.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from engines.base import VoicePrompt
from synthesis.windows import Piece, SampledPieces, WindowPlan

# A speaking request with less audio than this left to play: its work goes first. Shorter guards let more streams
# than the cores keep up with break each other's speech (see FINDINGS.md#playback-guard).
LOW_BUFFER_S = 3.0


def complete(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any = None,
             error: BaseException | None = None) -> None:
    """Set ``future`` (of ``loop``) from any thread, with a result or an error; ignored if its awaiter gave up or the
    loop is closed."""

    def _set() -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(_set)
    except RuntimeError:  # the caller's loop is closed
        pass


@dataclass(frozen=True)
class Utterance:
    """What the vocoder needs to speak one sentence.

    Attributes
    ----------
    phones, prompt: the sentence's phone ids and the voice.
    speed, noise_scale, seed, steps, cfg: ``Engine.decode``'s options (steps/cfg: a diffusion sampler's, else None).
    sample_rate: Hz of the engine's audio.
    first_window: tokens of the first early window (0: the sentence is decoded whole once its GPT ended).
    keep_windows: decode the windows also while they are held back (a seeded request: its samples must not depend
        on whether another request was speaking; a sentence decoded whole differs from its windows at their joins).
    sampled: a diffusion family: the sampler's chunks go out as they are made.
    """

    phones: np.ndarray
    prompt: VoicePrompt
    speed: float
    noise_scale: float
    seed: int
    steps: int | None
    cfg: float | None
    sample_rate: int
    first_window: int = 0
    keep_windows: bool = False
    sampled: bool = False


@dataclass(frozen=True)
class SentenceAudio:
    """A sentence as the worker spoke it: ``audio`` the whole sentence faded ``[N]`` float32, of which the first
    ``emitted`` samples went out early; its ``tokens``; seconds of GPT and of vocoder work."""

    audio: np.ndarray
    emitted: int
    tokens: np.ndarray
    gpt_s: float
    vocoder_s: float


class Speaking:
    """One request the worker speaks: its place in the admission order, its class, its overall limit, and when its
    listener runs out of audio (``runs_out``, a ``clock()`` time; inf until it speaks, from ``played`` messages)."""

    __slots__ = ("rid", "priority", "at", "live", "runs_out", "sentences", "closed")

    def __init__(self, rid: int, priority: int, at: float, live: bool) -> None:
        self.rid = rid
        self.priority = priority
        self.at = at
        self.live = live
        self.runs_out = math.inf
        self.sentences: dict[int, Sentence] = {}
        self.closed = False

    @property
    def speaking(self) -> bool:
        return self.runs_out != math.inf

    def low(self, now: float) -> bool:
        """Less than :data:`LOW_BUFFER_S` of audio left to play: its work goes before other work, also before the
        first sentences of requests that have not started (a later start is heard less than a gap in speech)."""
        return self.runs_out - now < LOW_BUFFER_S


@dataclass(eq=False)
class Sentence:
    """One sentence of a :class:`Speaking` request, from its registration to its last sample.

    ``wait_s`` bounds how long its work may wait for the device once somebody waits for it (``started``); once the
    request speaks only the request's ``at`` applies (a request that started is finished).
    """

    request: Speaking
    index: int
    wait_s: float
    started: float = math.inf  # when the listener began waiting for it (inf: nobody yet)
    utterance: Utterance | None = None  # set when its work is handed over
    gpt: Any = None  # its GPT job (queued once the GPT of the sentence before it ended)
    gpt_queued: bool = False
    seen: list[np.ndarray] = field(default_factory=list[np.ndarray])  # tokens as they were decoded
    known: int = 0
    tokens: np.ndarray | None = None  # all of them, once the GPT ended (or from the cache)
    gpt_s: float = 0.0
    vocoder_s: float = 0.0
    plan: WindowPlan | None = None
    sampled: SampledPieces | None = None
    pieces: Iterator[np.ndarray] | None = None  # a diffusion sentence's sampler chunks
    busy: bool = False  # a decode of it is queued or running
    first_out: bool = False  # its first audio was made (the next sentence's vocoder work may start)
    ended: bool = False  # spoken, failed, cancelled or settled without the worker: nothing more of it runs
    held: list[np.ndarray] = field(default_factory=list[np.ndarray])  # windows held back (another request starts)
    emitted: int = 0  # samples that went out early
    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future[SentenceAudio] | None = None
    on_audio: Callable[[np.ndarray], None] | None = None  # early audio, called on ``loop``

    @property
    def opens(self) -> bool:
        """The first sentence of its request: it starts new work rather than finishing some."""
        return self.index == 0

    def limit(self, submitted: float) -> float:
        """The ``clock()`` time by which work of it queued at ``submitted`` must have left its queue."""
        if self.started == math.inf or self.request.speaking:
            return self.request.at
        return min(self.request.at, max(self.started, submitted) + self.wait_s)

    def feed(self, tokens: np.ndarray) -> None:
        self.seen.append(np.asarray(tokens, np.int64))
        self.known += int(tokens.size)

    def all_tokens(self) -> np.ndarray:
        """The tokens known so far (all of them once :attr:`tokens` is set)."""
        if self.tokens is not None:
            return self.tokens
        return np.concatenate(self.seen) if self.seen else np.zeros(0, np.int64)

    def next_piece(self, windows: bool) -> Piece | None:
        """The plan's next decode (see :class:`~synthesis.windows.WindowPlan`)."""
        assert self.plan is not None
        return self.plan.next(self.known, self.tokens is not None, windows)

    def deliver(self, result: SentenceAudio | None = None, error: BaseException | None = None) -> None:
        """End it: its result or error to whoever awaits it (from any thread; ignored if they gave up)."""
        self.ended = True
        if self.future is not None and self.loop is not None:
            complete(self.loop, self.future, result, error)

    def emit(self, audio: np.ndarray) -> None:
        """Early audio to the listener (with whatever was held back before it)."""
        if self.held:
            audio = np.concatenate([*self.held, audio])
            self.held = []
        self.emitted += audio.size
        if self.on_audio is not None and self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(self.on_audio, audio)
            except RuntimeError:
                pass
