"""The window plan, pure: which decode of a sentence comes next from what is known, and how the pieces join."""

from __future__ import annotations

import numpy as np

from engines.base import FRAME_SAMPLES, token_sample
from synthesis.windows import (CROSSFADE_SAMPLES, EARLY_CONTEXT_TOKENS, EARLY_HOLDBACK_TOKENS, Piece, SampledPieces,
                               Spoken, WindowPlan, at_speed)

SPT = 1280  # samples per token at speed 1, 32 kHz


def _decode(piece: Piece, known: int) -> np.ndarray:
    """A stand-in decode: every token's samples hold its index (a piece's audio is its tokens', in order)."""
    end = known if piece.end is None else piece.end
    return np.repeat(np.arange(piece.start, end, dtype=np.float32), SPT)


def _speak(plan: WindowPlan, total: int, steps: list[int], windows=lambda: True):
    """Feed ``total`` tokens in the batches ``steps`` (the GPT's), decode every piece the plan asks for as soon as it
    asks; the pieces, in order, and the whole sentence."""
    pieces, known = [], 0
    for n in steps + [0]:
        known = min(total, known + n)
        done = known == total and n == 0
        while (piece := plan.next(known, done, windows())) is not None:
            pieces.append(piece)
            if piece.window:
                plan.window_out(piece, _decode(piece, known))
            else:
                return pieces, plan.whole(piece, _decode(piece, known), known)
    raise AssertionError("the plan never asked for the rest")


def test_windows_double_then_the_rest_from_their_context():
    plan = WindowPlan(16, 1.0)
    pieces, whole = _speak(plan, 100, [1] * 100)
    held = EARLY_HOLDBACK_TOKENS
    assert [(p.start, p.end, p.upto) for p in pieces] == [
        (0, 16, 16 - held), (16 - held - EARLY_CONTEXT_TOKENS, 32, 32 - held),
        (32 - held - EARLY_CONTEXT_TOKENS, 64, 64 - held), (64 - held - EARLY_CONTEXT_TOKENS, None, None)]
    assert whole.size == 100 * SPT
    # every token's samples where they belong: what went out, then the rest, continuous across the hand-overs
    tokens = np.arange(100, dtype=np.float32)
    middle = whole.reshape(100, SPT)[:, SPT // 2]
    assert np.array_equal(middle, tokens)


def test_a_cache_hit_decodes_the_same_pieces_as_the_gpt():
    """Tokens that come at once (a prosody-cache hit) give the same windows as tokens one by one: the audio depends
    only on the tokens."""
    one_by_one, whole = _speak(WindowPlan(16, 1.0), 70, [1] * 70)
    at_once, whole_at_once = _speak(WindowPlan(16, 1.0), 70, [70])
    assert one_by_one == at_once and np.array_equal(whole, whole_at_once)


def test_no_windows_when_not_wanted_or_too_short():
    pieces, whole = _speak(WindowPlan(16, 1.0), 40, [1] * 40, windows=lambda: False)
    assert pieces == [Piece(0, None, None, 0)] and whole.size == 40 * SPT
    pieces, _ = _speak(WindowPlan(16, 1.0), 12, [1] * 12)  # the sentence ends before its first window
    assert pieces == [Piece(0, None, None, 0)]
    pieces, _ = _speak(WindowPlan(0, 1.0), 80, [80])  # no first window asked for
    assert pieces == [Piece(0, None, None, 0)]


def test_windows_stop_for_good_once_not_wanted():
    plan = WindowPlan(16, 1.0)
    pieces, whole = _speak(plan, 90, [1] * 90, windows=lambda: plan.sent is None)  # wanted until one went out
    assert [p.end for p in pieces] == [16, None]
    assert pieces[1].start == 16 - EARLY_HOLDBACK_TOKENS - EARLY_CONTEXT_TOKENS
    assert whole.size == 90 * SPT


def test_faster_speech_takes_more_tokens_per_window():
    speed = 1.5
    plan = WindowPlan(at_speed(16, speed), speed)
    assert plan.next(23, False) is None
    first = plan.next(24, False)
    assert first == Piece(0, 24, 24 - at_speed(EARLY_HOLDBACK_TOKENS, speed), 0)


def test_sampled_pieces_go_out_but_the_last_fade():
    rate = 48000
    pieces = SampledPieces(rate)
    chunks = [np.ones(4800, np.float32), np.ones(4800, np.float32), np.ones(100, np.float32)]
    out = [pieces.add(c) for c in chunks]
    whole = pieces.whole()
    sent = np.concatenate([o for o in out if o is not None])
    assert sent.size == pieces.sent and np.array_equal(whole[:sent.size], sent)  # exactly the first samples
    assert whole.size - sent.size == int(round(0.005 * rate))  # the last fade waits for the sentence's end
    assert whole[0] == 0.0 and whole[-1] == 0.0


def test_spoken_continues_with_a_crossfade():
    sent = Spoken(20, np.full(20 * SPT, 0.5, np.float32), np.full(4 * SPT, 0.5, np.float32))
    assert sent.start == 20 - EARLY_CONTEXT_TOKENS
    rest = np.full(30 * SPT, -0.5, np.float32)  # tokens 12..42
    out = sent.join(rest, 30)
    assert out.size == 42 * SPT
    join = 20 * SPT
    assert np.all(out[:join] == 0.5) and np.all(out[join + CROSSFADE_SAMPLES:] == -0.5)
    assert 0.5 >= out[join] > out[join + CROSSFADE_SAMPLES // 2] > out[join + CROSSFADE_SAMPLES - 1] >= -0.5
    upto, past = sent.continuation(rest, 30, 30)
    assert upto.size == 10 * SPT and past.size == 12 * SPT  # up to a token, and the samples after it


def test_spoken_at_another_speed_cuts_at_frame_edges_and_carries_the_noise_on():
    """At speed != 1 a piece goes on from the latent frame edge where its interpolation put the hand-over token, and
    is decoded with the noise the tail has at the same frames."""
    speed, size = 1.25, 30  # the piece: 30 tokens from token 12 (the sent 20 minus 8 of context)
    frames = int(2 * size / speed) + 1
    piece = np.arange(frames * FRAME_SAMPLES, dtype=np.float32)
    sent = Spoken(20, np.zeros(100, np.float32), np.zeros(4000, np.float32), speed, frame=57)
    first = token_sample(8, size, speed)
    assert first % FRAME_SAMPLES == 0 and first == round(8 * frames / size) * FRAME_SAMPLES
    out, past = sent.continuation(piece, size, 24)
    assert np.array_equal(out[CROSSFADE_SAMPLES:], piece[first + CROSSFADE_SAMPLES:token_sample(12, size, speed)])
    assert past.size == piece.size - token_sample(12, size, speed)
    assert sent.noise_offset(size) == 57 - first // FRAME_SAMPLES  # the tail's frame 57 is the piece's frame `first`
    # at speed 1: two frames per token, the noise offset twice the piece's first token
    assert Spoken(20, np.zeros(1), np.zeros(1), frame=40).noise_offset(size) == 2 * 12


