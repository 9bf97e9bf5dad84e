"""What the device worker knows of each request it speaks, and how the event loop talks to it about them.

A request (:class:`Speaking`) is opened when it is admitted and closed when its stream ends; its sentences
(:class:`Sentence`) are registered in order as the text is split, each then handed its :class:`Utterance` (with its
tokens on a prosody-cache hit, else a GPT request). The worker alone reads and writes that state, on its own thread;
the event loop holds handles (:class:`RequestHandle`, :class:`SentenceHandle`) that post messages (:data:`Message`),
which the worker applies between two steps, in the order they were posted.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, TypeVar

import numpy as np

from engines.base import SemanticRequest, SpeechError, VoicePrompt
from synthesis.windows import Piece, SampledPieces, WindowPlan

T = TypeVar("T")

# A speaking request with less audio than this left to play: its work goes first. Shorter guards let more streams
# than the cores keep up with break each other's speech (see FINDINGS.md#playback-guard).
LOW_BUFFER_S = 3.0


class WorkerClosed(SpeechError):
    """The synthesis worker has shut down."""


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

    def all_known(self, tokens: np.ndarray) -> None:
        """Every token of it is known (its GPT ended, or the prosody cache had them)."""
        self.tokens = np.asarray(tokens, np.int64)
        self.known = int(self.tokens.size)

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


# ---- messages: what the event loop tells the worker (applied on a device thread, in the order they were posted) -

@dataclass(frozen=True)
class Opened:
    request: Speaking  # admitted


@dataclass(frozen=True)
class Registered:
    sentence: Sentence  # the request's next sentence


@dataclass(frozen=True)
class Handed:
    """A sentence's work, with where its audio goes."""

    sentence: Sentence
    utterance: Utterance
    tokens: np.ndarray | None
    request: SemanticRequest | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[SentenceAudio]
    on_audio: Callable[[np.ndarray], None] | None


@dataclass(frozen=True)
class Waiting:
    sentence: Sentence  # its listener waits for it from ``now`` on
    now: float


@dataclass(frozen=True)
class Played:
    request: Speaking  # its listener has audio until ``runs_out``
    runs_out: float


@dataclass(frozen=True)
class Cancelled:
    sentence: Sentence  # nobody waits for it any more


@dataclass(frozen=True)
class Settled:
    sentence: Sentence  # needs nothing (more) from the worker


@dataclass(frozen=True)
class Closed:
    request: Speaking  # its stream ended


Message = Opened | Registered | Handed | Waiting | Played | Cancelled | Settled | Closed
Post = Callable[[Message], bool]


class Calls(Protocol):
    """What runs a sentence's own calls (the device worker's ``call``)."""

    async def call(self, fn: Callable[[], T], *, priority: int = ..., deadline: float | None = None,
                   order: tuple[Any, ...] = (), sentence: Sentence | None = None) -> T: ...


class RequestHandle:
    """The event loop's side of a request the worker speaks (:meth:`DeviceWorker.open`): it registers the request's
    sentences in order and reports playback, as messages; it never touches the worker's state."""

    def __init__(self, state: Speaking, post: Post, clock: Callable[[], float]) -> None:
        self._state = state
        self._post = post
        self._clock = clock

    @property
    def rid(self) -> int:
        """The request's place in the admission order."""
        return self._state.rid

    def sentence(self, index: int, wait_s: float = math.inf) -> SentenceHandle:
        """Register the request's next sentence (in order: sentence ``index`` comes after ``index - 1``); its work
        may wait ``wait_s`` for the device once somebody waits for it (:meth:`SentenceHandle.waiting`)."""
        s = Sentence(self._state, index, wait_s)
        self._post(Registered(s))
        return SentenceHandle(s, self._post, self._clock)

    def played(self, runs_out: float) -> None:
        """The listener has audio until ``runs_out`` (a ``clock()`` time): the request is speaking."""
        self._post(Played(self._state, runs_out))

    def close(self) -> None:
        """The request ended: nothing more of it runs."""
        self._post(Closed(self._state))


class SentenceHandle:
    """The event loop's side of one sentence: its work handed over, its audio awaited."""

    def __init__(self, state: Sentence, post: Post, clock: Callable[[], float]) -> None:
        self._state = state
        self._post = post
        self._clock = clock

    @property
    def order(self) -> tuple[int, int]:
        """(request, sentence): its place in the worker's order."""
        return self._state.request.rid, self._state.index

    async def call(self, worker: Calls, fn: Callable[[], T]) -> T:
        """``fn()`` on ``worker``'s vocoder lane as this sentence's work (its class, order, urgency, wait bound)."""
        return await worker.call(fn, priority=self._state.request.priority, order=self.order, sentence=self._state)

    async def speak(self, utterance: Utterance, *, tokens: np.ndarray | None = None,
                    request: SemanticRequest | None = None,
                    on_audio: Callable[[np.ndarray], None] | None = None) -> SentenceAudio:
        """The sentence, from its ``tokens`` (a prosody-cache hit) or its GPT ``request``: the whole sentence, once
        spoken; ``on_audio`` gets its early audio on this event loop as it is made (windows, a sampler's chunks)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[SentenceAudio] = loop.create_future()
        if not self._post(Handed(self._state, utterance, tokens, request, loop, future, on_audio)):
            raise WorkerClosed("the synthesis worker is shut down")
        try:
            return await future
        except asyncio.CancelledError:
            self._post(Cancelled(self._state))
            raise

    def waiting(self) -> None:
        """The listener waits for this sentence from now on (its wait bound starts)."""
        self._post(Waiting(self._state, self._clock()))

    def settle(self) -> None:
        """The sentence needs nothing (more) from the worker: its audio was cached, or it ended here."""
        self._post(Settled(self._state))
