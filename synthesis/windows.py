"""Which piece of a sentence the vocoder decodes next, and how the pieces join: pure, no model and no threads.

A sentence is spoken whole (one decode once its GPT ended), or, for a first sentence, in growing windows while its
GPT still runs (:class:`WindowPlan`), or, for a diffusion family, in its sampler's chunks (:class:`SampledPieces`).
The device worker (:mod:`synthesis.scheduler`) asks the plan after every token batch and every decode; the plan
answers from what is known (tokens so far, GPT done, what went out) and never from a clock, so a sentence's audio
depends only on its tokens.

Windows: once ``first`` tokens are known they are decoded and go out without their last
:data:`EARLY_HOLDBACK_TOKENS`, which lack right context; each next window ends at twice the tokens of the one before
(``first`` 16: windows end at 16, 32, 64, 128 tokens) and is decoded from :data:`EARLY_CONTEXT_TOKENS` before its
unsent tokens, going out crossfaded (:class:`Spoken`); after the GPT ends the rest is decoded the same way. A window of
N new tokens must be ready before the N - 4 tokens of audio sent before it have played (40 ms each), and takes N GPT
steps and the decode of N + 8 tokens: about 12.5 N + 60 ms against 40 (N - 4) on a 2-core AVX2 CPU, so it holds on a
CPU twice as slow (see FINDINGS.md#early-word-windows). Windows end at fixed token counts and every one the sentence
reaches is decoded, so a prosody-cache hit speaks the same samples as the run that filled it. A window decoded with 8
tokens of left context matches the whole sentence's decode at about 30 dB SNR, the first window (no right context) at
24 dB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from engines.base import FRAME_SAMPLES, SAMPLE_RATE, token_sample
from synthesis.audio import FADE_S, fade_edges, raised_cosine

EARLY_HOLDBACK_TOKENS = 4  # a window's last tokens lack right context: the next piece replaces them
EARLY_CONTEXT_TOKENS = 8  # tokens before a piece decoded with it as left context (their audio is not used again)
CROSSFADE_SAMPLES = 640  # 20 ms @ 32 kHz where one piece of a sentence hands over to the next
# Faster than this a first sentence is spoken whole. At speed s a token is 40 / s ms of audio while its GPT step costs
# the same, so the windows' margin shrinks by s: faster than 1, the first window and the held-back tokens are s times
# as many (:func:`at_speed`: as many latent frames as at speed 1; the later windows double from the first). At 2 the
# third window came late beside a busy process on 2 cores (see FINDINGS.md#early-words-at-other-speeds).
EARLY_MAX_SPEED = 1.5


def at_speed(tokens: int, speed: float) -> int:
    """``tokens`` at speed 1 and slower, ``speed`` times as many faster: the first window and the held-back tokens
    are as many latent frames at any speed as at speed 1 (see :data:`EARLY_MAX_SPEED`; the held-back tokens lack
    right context, and 4 of them at speed 2 joined the next piece at a correlation of 0.94-0.97 past the crossfade
    where 8 joined at 0.99, tiny model; real size, default noise, at speed 1.5: hand-overs 15.8-18.7 dB with 6 held
    back, 12.7-14.5 dB with 4)."""
    return math.ceil(tokens * max(1.0, speed))


@dataclass(frozen=True)
class Piece:
    """A decode the plan asks for: tokens ``start`` to ``end`` (None: to the last) with the prior noise from latent
    frame ``noise_offset`` on; the audio of the tokens up to ``upto`` goes out (None: all of it, the sentence's
    rest)."""

    start: int
    end: int | None
    upto: int | None
    noise_offset: int

    @property
    def window(self) -> bool:
        return self.upto is not None


@dataclass
class Spoken:
    """What the windows sent of a sentence: ``audio`` (its first ``tokens`` tokens' samples, as they went out) and
    ``tail``, the last window's samples past them (decoded without right context), for the crossfade; at ``speed``;
    ``frame``: the prior-noise frame at which the tail begins.

    A piece that continues it is cut at a latent frame edge (:func:`~engines.token_sample`), where its waveform is in
    phase with the tail's also at speed != 1, and decoded with the noise the tail has at the same frames, so two
    pieces differ only by their context (real size, noise scale 0.5, speed 1: 18-20 dB between them at a hand-over,
    7 dB when each piece drew its noise from frame 0)."""

    tokens: int
    audio: np.ndarray
    tail: np.ndarray
    speed: float = 1.0
    frame: int = 0

    @property
    def start(self) -> int:
        """The first token of the next piece's decode: :data:`EARLY_CONTEXT_TOKENS` before the unsent ones."""
        return max(0, self.tokens - EARLY_CONTEXT_TOKENS)

    def noise_offset(self, size: int) -> int:
        """The noise offset of the next piece (``size`` tokens from :attr:`start`): its frame at the hand-over gets
        the tail's noise there."""
        return max(0, self.frame - token_sample(self.tokens - self.start, size, self.speed) // FRAME_SAMPLES)

    def continuation(self, piece: np.ndarray, size: int, end: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The unsent samples of ``piece`` (a decode of ``size`` tokens from token :attr:`start`) up to token ``end``
        (None: all), crossfaded from :attr:`tail` at their start; and the samples of ``piece`` past them."""
        first = token_sample(self.tokens - self.start, size, self.speed)
        last = piece.size if end is None else min(piece.size, token_sample(end - self.start, size, self.speed))
        out = np.array(piece[first:last], dtype=np.float32)
        n = max(0, min(CROSSFADE_SAMPLES, self.tail.size, out.size))
        if n:
            rise = raised_cosine(n)
            out[:n] = self.tail[:n] * (1 - rise) + out[:n] * rise
        return out, np.asarray(piece[last:], dtype=np.float32)

    def join(self, rest: np.ndarray, size: int) -> np.ndarray:
        """The whole sentence: what went out, then the rest (a decode of its ``size`` tokens from :attr:`start`)."""
        return np.concatenate([self.audio, self.continuation(rest, size)[0]])


class WindowPlan:
    """A sentence's decodes: windows ending at ``first``, twice that, ... tokens while they are wanted, then the rest.

    Parameters
    ----------
    first: tokens of the first window (0: no windows, the sentence is decoded whole).
    speed: the sentence's speed (every piece is decoded at it; tokens found in it by ``token_sample``).
    sample_rate: Hz of the decoded audio (for the sentence's fades).
    """

    def __init__(self, first: int, speed: float, sample_rate: int = SAMPLE_RATE) -> None:
        self.speed = speed
        self.sample_rate = sample_rate
        self._end: float = first if first > 0 else math.inf  # the next window's last token (exclusive)
        self.sent: Spoken | None = None  # what went out so far

    def next(self, known: int, done: bool, windows: bool = True) -> Piece | None:
        """The next decode, given ``known`` tokens and whether the GPT is ``done``; None: wait for more tokens.

        ``windows`` False stops the windows for good (the sentence's rest is then decoded whole after what went
        out). Every window the tokens reach is decoded, also after the GPT ended (a cache hit's tokens come at once).
        """
        if not windows:
            self._end = math.inf
        sent = self.sent
        while self._end <= known:
            end = int(self._end)
            self._end *= 2
            upto = end - at_speed(EARLY_HOLDBACK_TOKENS, self.speed)
            if upto <= (sent.tokens if sent is not None else 0):
                continue  # (a first window of at most the held-back tokens: nothing to send)
            start = sent.start if sent is not None else 0
            return Piece(start, end, upto, sent.noise_offset(end - start) if sent is not None else 0)
        if not done:
            return None
        if sent is None:
            return Piece(0, None, None, 0)
        return Piece(sent.start, None, None, sent.noise_offset(known - sent.start))

    def window_out(self, piece: Piece, audio: np.ndarray) -> np.ndarray:
        """A window's decode (``piece``): the samples that go out now (the first faded in, later ones crossfaded)."""
        assert piece.end is not None and piece.upto is not None, "a window"
        size, sent = piece.end - piece.start, self.sent
        if sent is None:
            cut = token_sample(piece.upto, size, self.speed)
            out = fade_edges(audio[:cut], tail=False, sample_rate=self.sample_rate)
            tail = np.asarray(audio[cut:], dtype=np.float32)
            whole = out
        else:
            out, tail = sent.continuation(audio, size, piece.upto)
            whole = np.concatenate([sent.audio, out])
        self.sent = Spoken(piece.upto, whole, tail, self.speed,
                           piece.noise_offset + (audio.size - tail.size) // FRAME_SAMPLES)
        return out

    def whole(self, piece: Piece, audio: np.ndarray, tokens: int) -> np.ndarray:
        """The sentence (``tokens`` tokens) faded, from the rest's decode (``piece``) after what went out."""
        if self.sent is None:
            return fade_edges(audio, sample_rate=self.sample_rate)
        return fade_edges(self.sent.join(audio, tokens - piece.start), head=False)  # (went out faded in)


class SampledPieces:
    """A diffusion family's sentence as its sampler makes it: each chunk's samples go out as soon as it is made, but
    the last :data:`~synthesis.audio.FADE_S`, which the sentence's fade-out may still cover; so the samples that go out
    are exactly the first ones of the whole sentence faded."""

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        self._fade = int(round(FADE_S * sample_rate))
        self._got: list[np.ndarray] = []
        self.sent = 0  # samples that went out

    def add(self, piece: np.ndarray) -> np.ndarray | None:
        """A sampler chunk: the samples that go out now (None: none yet)."""
        self._got.append(np.asarray(piece, dtype=np.float32))
        whole = np.concatenate(self._got)
        upto = whole.size - self._fade
        if whole.size < 2 * self._fade or upto <= self.sent:  # (the fade-in is then as long as the whole sentence's)
            return None
        out = fade_edges(whole, tail=False, sample_rate=self.sample_rate)[self.sent:upto]
        self.sent = upto
        return out

    def whole(self) -> np.ndarray:
        """The whole sentence, faded."""
        whole = np.concatenate(self._got) if self._got else np.zeros(0, np.float32)
        return fade_edges(whole, sample_rate=self.sample_rate)
