"""The command line on a diffusion family: ``models make-tiny --family v5turbo`` then ``say`` writes the model's
48 kHz audio, offline; a reference without its transcript is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf

from tests.audio_samples import speech_like_wav
from tests.bot.test_cli import _assert_no_voice_left, _cli

RATE = 48000  # Hz, v5turbo output


def test_make_tiny_v5turbo_then_say_writes_48k_audio(tmp_path: Path) -> None:
    models = tmp_path / "models"
    r = _cli("models", "make-tiny", str(models), "--family", "v5turbo")
    assert r.returncode == 0, r.stderr
    assert f"wrote a tiny v5turbo model set and {models / 'config.yaml'}" in r.stdout
    config = str(models / "config.yaml")
    ref = tmp_path / "ref.wav"
    ref.write_bytes(speech_like_wav(4.0))
    out = tmp_path / "out.wav"
    r = _cli("--config", config, "say", "Hello there. How are you today?", "--ref", str(ref), "--ref-text",
             "This is my voice.", "--lang", "en", "-o", str(out), "--timings", "--json", "--seed", "3")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert [s["text"] for s in report["sentences"]] == ["Hello there.", "How are you today?"]  # one entry each
    assert all(s["gpt_s"] > 0 and s["sovits_s"] > 0 for s in report["sentences"])
    audio, rate = sf.read(out, dtype="float32")
    assert rate == RATE and abs(audio.size / rate - report["audio_s"]) < 1e-3 and audio.size > RATE // 2
    assert float(np.sqrt(np.mean(audio.astype(np.float64) ** 2))) > 0.01  # heard, not silence
    _assert_no_voice_left(models / "voices")  # the temporary voice is gone

    r = _cli("--config", config, "say", "Hi.", "--ref", str(ref), "--lang", "en", "-o", str(tmp_path / "x.wav"))
    assert r.returncode == 2 and not (tmp_path / "x.wav").exists()
    assert "Traceback" not in r.stderr, r.stderr  # (the engine's load is logged before it)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "needs the clip's transcript (prompt_text)" in errors[0], r.stderr
