"""Print how well uploads with more than one speaker are split, and what the split costs in time.

For each case of :data:`tests.speaker_samples.CASES` it prints the chosen reference stretch, whose speech it holds,
how much of another speaker's speech slipped in, whether the user is warned, and the BIC ratio of the clip's best
single split (one speaker should stay under ``synthesis.speakers.PENALTY``, two above it) and the largest
shift of median pitch across any split (``PITCH_SHIFT_ST`` lowers the bar above it). With ``--long`` and
espeak-ng installed it also makes 55-71 s monologues in four espeak-ng voices and pairs of them, the calibration
of ``PENALTY`` on long clips. Last, the time of the choice on a 60 s clip. Run from the repository root:
``nice -n 19 python tests/tools/measure_speakers.py [--long]``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from synthesis import audio, speakers  # noqa: E402
from tests.audio_samples import SPEECH_RATE  # noqa: E402
from tests.speaker_samples import CASES, build, other_speech_inside  # noqa: E402

TEXT = (
    "It was a bright cold day in April, and the clocks were striking thirteen. Winston Smith, his chin nuzzled into "
    "his breast in an effort to escape the vile wind, slipped quickly through the glass doors of Victory Mansions, "
    "though not quickly enough to prevent a swirl of gritty dust from entering along with him. The hallway smelt of "
    "boiled cabbage and old rag mats. At one end of it a coloured poster, too large for indoor display, had been "
    "tacked to the wall. It depicted simply an enormous face, more than a metre wide: the face of a man of about "
    "forty-five, with a heavy black moustache and ruggedly handsome features. Winston made for the stairs. It was no "
    "use trying the lift. Even at the best of times it was seldom working, and at present the electric current was "
    "cut off during daylight hours. Are you sure? Yes! Absolutely, I told you so, didn't I? Numbers like 1,234 and "
    "56 were read aloud, slowly, one by one."
)
LONG_VOICES = {"us": ("en-us", 35, 150), "gb": ("en-gb", 60, 160), "us_f": ("en-us+f2", 50, 140),
               "scot": ("en-gb-scotland", 45, 170)}


def best_split(x: np.ndarray) -> tuple[float, float]:
    """The BIC ratio of the best single split of the clip's voiced frames (what the first search step sees), and
    the largest shift of median pitch between the two sides of any split, in semitones."""
    dec = audio.Decoded(x, SPEECH_RATE, x.size / SPEECH_RATE)
    seen: dict[str, float] = {}

    def spy(z: np.ndarray, logf0: np.ndarray | None = None) -> list[int]:
        mom = speakers._Moments(z)  # pyright: ignore[reportPrivateUsage]
        m = int(round(speakers.MIN_TURN_S / speakers.HOP_S))
        c = np.arange(m, z.shape[0] - m + 1)
        ratio = mom.bic_ratio(np.zeros(c.size, np.int64), c, np.full(c.size, z.shape[0]))
        seen["ratio"] = float(ratio.max()) if ratio.size else 0.0
        if logf0 is not None:  # the largest pitch shift between the two sides of any split
            shifts = [speakers._pitch_shift(logf0, 0, int(k), z.shape[0]) for k in c[::10]]  # pyright: ignore
            seen["shift"] = max(shifts, default=0.0)
        return real(z, logf0)

    real = speakers._changes  # pyright: ignore[reportPrivateUsage]
    with mock.patch.object(speakers, "_changes", spy):
        audio.prepare_reference(dec)
    return seen.get("ratio", float("nan")), seen.get("shift", float("nan"))


def report(name: str, x: np.ndarray, parts: list[tuple[float, float, str]], n_speakers: int) -> bool:
    ref = audio.prepare_reference(audio.Decoded(x, SPEECH_RATE, x.size / SPEECH_RATE))
    who, other = other_speech_inside(ref.start_s, ref.end_s, parts)
    warned = any("more than one speaker" in w for w in ref.warnings)
    ratio, shift = best_split(x)
    ok = other <= audio.FRAME_S and warned == (n_speakers > 1)
    print(f"{name:34s} {n_speakers} spk  {ref.start_s:5.1f}-{ref.end_s:5.1f} s  {who:6s} other {other:4.2f} s  "
          f"warned {'yes' if warned else 'no ':3s}  best-split ratio {ratio:5.2f}  max pitch shift {shift:4.1f} st  "
          f"{'ok' if ok else 'WRONG'}")
    return ok


def long_cases() -> list[tuple[str, np.ndarray, list[tuple[float, float, str]], int]]:
    if shutil.which("espeak-ng") is None:
        print("(--long needs espeak-ng)")
        return []
    voices: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (v, pitch, wpm) in LONG_VOICES.items():
            wav = Path(tmp) / f"{name}.wav"
            subprocess.run(["espeak-ng", "-v", v, "-p", str(pitch), "-s", str(wpm), "-w", str(wav), TEXT], check=True)
            y, sr = sf.read(wav, dtype="float32")
            y = audio.resample(np.asarray(y, np.float32), int(sr), SPEECH_RATE)
            voices[name] = y * np.float32(0.5 / float(np.max(np.abs(y))))
    s = SPEECH_RATE
    out = []
    for name, y in voices.items():
        out.append((f"{name} monologue", y, [(0.0, y.size / s, name)], 1))
    for first, second, a_s, b_s in (("us", "gb", 30, 30), ("gb", "scot", 30, 30), ("us_f", "us", 30, 30),
                                     ("us", "gb", 50, 5), ("scot", "us", 5, 50)):
        y = np.concatenate([voices[first][: a_s * s], voices[second][: b_s * s]])
        y = y + (0.0005 * np.random.default_rng(0).standard_normal(y.size)).astype(np.float32)
        out.append((f"{a_s} s {first} then {b_s} s {second}", y, [(0.0, a_s, first), (a_s, a_s + b_s, second)], 2))
    return out


def timing() -> None:
    x, _ = build([("a", 0), ("b", 0)] * 3 + [("a", 0), 4.0])  # about 60 s with two speakers
    x = x[: 60 * SPEECH_RATE]
    dec = audio.Decoded(x, SPEECH_RATE, x.size / SPEECH_RATE)
    audio.prepare_reference(dec)  # the VAD session is created once, not timed
    for label, patch in (("with speakers", None),
                         ("without", mock.patch.object(audio, "_one_speaker", lambda *a: None))):
        times = []
        for _ in range(3):
            t = time.perf_counter()
            if patch is None:
                audio.prepare_reference(dec)
            else:
                with patch:
                    audio.prepare_reference(dec)
            times.append(time.perf_counter() - t)
        print(f"60 s clip, prepare_reference {label}: best of 3 {min(times) * 1000:.0f} ms")
    voiced = np.ones(int(x.size / SPEECH_RATE / audio.FRAME_S), bool)
    t = time.perf_counter()
    speakers.speaker_turns(x, SPEECH_RATE, voiced, audio.FRAME_S)
    print(f"60 s clip, speaker_turns alone (every frame taken as voiced, the most work): "
          f"{(time.perf_counter() - t) * 1000:.0f} ms")


def main() -> None:
    cases = [(name, *build(items), n) for name, (items, n) in CASES.items()]
    if "--long" in sys.argv:
        cases += long_cases()
    right = sum(report(name, x, parts, n) for name, x, parts, n in cases)
    print(f"{right} of {len(cases)} right (stretch within one speaker, warned exactly when there are two)")
    timing()


if __name__ == "__main__":
    main()
