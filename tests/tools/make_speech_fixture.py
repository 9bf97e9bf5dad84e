"""Write tests/data/speech/*.ogg: two synthetic voices (espeak-ng) saying a few sentences, Opus at 16 kHz.

The files are committed, so the tests need no espeak-ng; run this only to remake them
(``apt-get install espeak-ng``, then ``python tests/tools/make_speech_fixture.py``).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from synthesis.audio import encode_audio, resample  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "data" / "speech"
RATE = 16_000  # Hz
VOICES = {
    # name: (espeak voice, pitch 0-99, words per minute, text)
    "speaker_a": ("en-us", 35, 150, "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea "
                  "shore, and the shells she sells are surely sea shells."),
    "speaker_b": ("en-gb+f3", 75, 140, "I would like a cup of tea with milk and two sugars, please. Thank you very "
                  "much for your help today, it was kind of you."),
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (voice, pitch, wpm, text) in VOICES.items():
        with tempfile.TemporaryDirectory() as tmp:
            wav = Path(tmp) / "x.wav"
            subprocess.run(["espeak-ng", "-v", voice, "-p", str(pitch), "-s", str(wpm), "-w", str(wav), text],
                           check=True)
            x, sr = sf.read(wav, dtype="float32")
        x = resample(np.asarray(x, np.float32), int(sr), RATE)
        x *= np.float32(0.5 / max(float(np.max(np.abs(x))), 1e-6))
        (OUT / f"{name}.ogg").write_bytes(encode_audio(x, RATE, "ogg"))
        print(f"{name}: {x.size / RATE:.1f} s")


if __name__ == "__main__":
    main()
