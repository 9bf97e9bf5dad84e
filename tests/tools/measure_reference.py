"""Print how well the reference stretch of an upload is chosen, with the voice detector and by loudness alone.

For each upload of :func:`tests.audio_samples.upload_scenarios` (speech beside a noise burst, music, a second
speaker) it prints the chosen stretch and how many of its seconds are speech, noise or music. Run from the
repository root: ``python tests/tools/measure_reference.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from synthesis import audio  # noqa: E402
from tests.audio_samples import SPEECH_RATE, upload_scenarios  # noqa: E402


def overlap(start: float, end: float, spans: list[tuple[float, float, str]]) -> dict[str, float]:
    """Seconds of [start, end) that lie in each kind of span."""
    out: dict[str, float] = {}
    for s, e, what in spans:
        out[what] = out.get(what, 0.0) + max(0.0, min(end, e) - max(start, s))
    return out


def main() -> None:
    for name, (x, spans) in upload_scenarios().items():
        dec = audio.Decoded(x, SPEECH_RATE, x.size / SPEECH_RATE)
        for label, patch in (("VAD", None), ("loudness", mock.patch.object(audio, "_voice_frames", lambda *a: None))):
            if patch is None:
                ref = audio.prepare_reference(dec)
            else:
                with patch:
                    ref = audio.prepare_reference(dec)
            parts = overlap(ref.start_s, ref.end_s, spans)
            text = ", ".join(f"{what} {sec:.1f} s" for what, sec in sorted(parts.items()) if sec > 0.005)
            print(f"{name:28s} {label:8s} {ref.start_s:5.1f}-{ref.end_s:5.1f} s: {text or 'nothing'}"
                  f"{'  warnings: ' + '; '.join(w[:40] for w in ref.warnings) if ref.warnings else ''}")


if __name__ == "__main__":
    main()
