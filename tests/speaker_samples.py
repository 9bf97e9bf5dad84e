"""Uploads with one or several speakers, built from the committed speech (tests/data/speech), and who speaks when.

Two recorded voices exist: ``speaker_a`` (espeak-ng en-us, low pitch) and ``speaker_b`` (espeak-ng en-gb+f3, a
female variant). A third is made from ``speaker_a`` by the resample trick: the same samples played 12 % faster
(or 10 % slower), which moves pitch *and* formants by that factor, as a shorter (longer) vocal tract would, and
changes the tempo too. It is another voice to a listener; it is not another human recording, and the README says so.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import soxr

from tests.audio_samples import SPEECH_RATE, recorded_speech

ROOM_NOISE = 0.0005  # peak-0.5 speech over -66 dBFS room noise, as in tests.audio_samples.upload_scenarios
VOICED_LEVEL = 0.01  # |x| above this is where a part's speech starts and ends (its own leading silence is no one's)

Part = tuple[float, float, str]  # (start_s, end_s, who): where one speaker's speech lies in the clip


@cache
def voice(name: str) -> np.ndarray:
    """``[N]`` float32 @ 16 kHz: ``a``, ``b``, ``a_up`` (a, formants +12 %) or ``a_down`` (a, formants -10 %)."""
    if name in ("a", "b"):
        return recorded_speech(f"speaker_{name}")
    factor = {"a_up": 1.12, "a_down": 0.9}[name]
    a = recorded_speech("speaker_a")
    return np.asarray(soxr.resample(a, SPEECH_RATE, int(round(SPEECH_RATE / factor))), np.float32)


def build(items: list[tuple[str, float] | float], seed: int = 0) -> tuple[np.ndarray, list[Part]]:
    """A clip of speakers and gaps in order, over quiet room noise.

    Parameters
    ----------
    items: ``(voice name, seconds)`` to take the first ``seconds`` of that voice (``0`` for all of it), or a float
        for that many seconds of room noise alone; ``("noise", seconds)`` is a burst of loud white noise.

    Returns
    -------
    ``(samples [N] float32 @ 16 kHz, parts)``, one part per speaker item: where its speech lies, in seconds.
    """
    rng = np.random.default_rng(seed)
    pieces: list[np.ndarray] = [np.zeros(int(0.5 * SPEECH_RATE), np.float32)]
    parts: list[Part] = []
    pos = pieces[0].size
    for item in items:
        if isinstance(item, float):
            sig = np.zeros(int(item * SPEECH_RATE), np.float32)
        elif item[0] == "noise":
            sig = (0.3 * rng.standard_normal(int(item[1] * SPEECH_RATE))).astype(np.float32)
        else:
            name, seconds = item
            sig = voice(name)
            sig = sig[: int(seconds * SPEECH_RATE)] if seconds else sig
            loud = np.flatnonzero(np.abs(sig) > VOICED_LEVEL)
            parts.append(((pos + loud[0]) / SPEECH_RATE, (pos + loud[-1] + 1) / SPEECH_RATE, name))
        pieces.append(sig)
        pos += sig.size
    pieces.append(np.zeros(int(0.5 * SPEECH_RATE), np.float32))
    x = np.concatenate(pieces)
    x += (ROOM_NOISE * rng.standard_normal(x.size)).astype(np.float32)
    return x, parts


# name: (items, number of speakers)
CASES: dict[str, tuple[list[tuple[str, float] | float], int]] = {
    "a then b": ([("a", 0), ("b", 0)], 2),
    "b then a": ([("b", 0), ("a", 0)], 2),
    "a then a with formants +12 %": ([("a", 0), ("a_up", 0)], 2),
    "a with formants -10 % then b": ([("a_down", 0), ("b", 0)], 2),
    "4 s of b then a": ([("b", 4.0), ("a", 0)], 2),
    "a then 4 s of b": ([("a", 0), ("b", 4.0)], 2),
    "b, a, b again": ([("b", 0), ("a", 0), ("b", 5.0)], 2),
    "a, a noise burst, b": ([("a", 0), ("noise", 3.0), ("b", 0)], 2),
    "a, a long pause, b": ([("a", 0), 4.0, ("b", 0)], 2),
    "a alone": ([("a", 0)], 1),
    "b alone": ([("b", 0)], 1),
    "a with formants +12 % alone": ([("a_up", 0)], 1),
    "a twice": ([("a", 0), ("a", 0)], 1),
    "a, a noise burst, a again": ([("a", 0), ("noise", 3.0), ("a", 0)], 1),
    "b, a pause, b again": ([("b", 0), 3.0, ("b", 0)], 1),
}


def other_speech_inside(start_s: float, end_s: float, parts: list[Part]) -> tuple[str, float]:
    """Who has the most speech in ``[start_s, end_s)``, and how many seconds of anyone else's speech it holds."""
    seconds: dict[str, float] = {}
    for s, e, who in parts:
        seconds[who] = seconds.get(who, 0.0) + max(0.0, min(end_s, e) - max(start_s, s))
    main = max(seconds, key=lambda w: seconds[w])
    return main, sum(v for w, v in seconds.items() if w != main)
