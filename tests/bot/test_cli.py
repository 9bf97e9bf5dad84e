"""The command line with the tiny models: say (with --timings --json), voices add/list/delete, phrases, run checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import soundfile as sf

from tests.audio_samples import speech_like_wav

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "bot", *args], capture_output=True, text=True, cwd=ROOT,
                          env=full_env, timeout=timeout)


def _config(tiny_models: Path, tmp_path: Path) -> Path:
    text = (tiny_models / "config.yaml").read_text()
    text = text.replace("dir: voices", f"dir: {tmp_path / 'voices'}").replace("dir: cache", f"dir: {tmp_path / 'cache'}")
    text = text.replace("models:\n  dir: .", f"models:\n  dir: {tiny_models}")
    for key in ("gpt", "sovits", "hubert", "bert"):
        lines = []
        for line in text.splitlines():
            if line.startswith(f"  {key}: ") and not line.split(": ", 1)[1].startswith("/"):
                line = f"  {key}: {tiny_models / line.split(': ', 1)[1]}"
            lines.append(line)
        text = "\n".join(lines) + "\n"
    out = tmp_path / "config.yaml"
    out.write_text(text + 'phrases: ["Hello!", "Thank you!"]\n')
    return out


def test_say_with_a_reference_writes_32k_wav_and_timings_json(tiny_models: Path, tmp_path: Path):
    cfg = _config(tiny_models, tmp_path)
    ref = tmp_path / "ref.wav"
    ref.write_bytes(speech_like_wav(4.0))
    out = tmp_path / "out.wav"
    r = _cli("--config", str(cfg), "say", "Hello there. How are you today?", "--ref", str(ref), "--ref-text",
             "This is my voice.", "--lang", "en", "-o", str(out), "--timings", "--json", "--seed", "3")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)  # exactly one JSON object on stdout
    assert set(report) >= {"ttfa_s", "total_s", "audio_s", "sentences"}
    assert [s["text"] for s in report["sentences"]] == ["Hello there.", "How are you today?"]
    for s in report["sentences"]:
        assert set(s) == {"text", "gpt_s", "sovits_s", "prosody_hit", "audio_hit"}
        assert s["gpt_s"] > 0 and s["sovits_s"] > 0 and s["prosody_hit"] is False
    audio, sr = sf.read(out)
    assert sr == 32000 and abs(len(audio) / sr - report["audio_s"]) < 1e-3
    assert not any((tmp_path / "voices").iterdir())  # the temporary voice is gone


def test_voices_add_list_say_delete(tiny_models: Path, tmp_path: Path):
    cfg = _config(tiny_models, tmp_path)
    clip = tmp_path / "me.wav"
    clip.write_bytes(speech_like_wav(5.0, seed=2))
    r = _cli("--config", str(cfg), "voices", "add", "me", str(clip), "--text", "This is my voice.", "--lang", "en")
    assert r.returncode == 0, r.stderr
    assert "voice 'me' created" in r.stdout
    r = _cli("--config", str(cfg), "voices", "list")
    assert r.returncode == 0 and r.stdout.startswith("me ")
    r = _cli("--config", str(cfg), "say", "Hello!", "--voice", "me", "-o", str(tmp_path / "o.wav"), "--timings",
             "--json", "--lang", "en")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["sentences"][0]["prosody_hit"] is True  # precomputed when the voice was added
    r = _cli("--config", str(cfg), "voices", "delete", "me")
    assert r.returncode == 0 and "deleted voice 'me'" in r.stdout
    assert not any((tmp_path / "voices").iterdir())


def test_bad_clip_is_refused_with_its_reason(tiny_models: Path, tmp_path: Path):
    cfg = _config(tiny_models, tmp_path)
    junk = tmp_path / "junk.mp3"
    junk.write_bytes(os.urandom(4000))
    r = _cli("--config", str(cfg), "voices", "add", "x", str(junk))
    assert r.returncode == 2
    assert "not audio we can read" in r.stderr


def test_run_without_a_token_says_what_to_do(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != "DISCORD_TOKEN"}
    r = subprocess.run([sys.executable, "-m", "bot", "--config", str(ROOT / "config.yaml"), "run"],
                       capture_output=True, text=True, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert r.returncode != 0
    assert r.stderr.strip().count("\n") == 0 and "DISCORD_TOKEN" in r.stderr


def test_run_without_models_says_to_download(tmp_path: Path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"models:\n  dir: {tmp_path}/m\n  gpt: {tmp_path}/m/g.ckpt\n")
    r = _cli("--config", str(cfg), "run", env={"DISCORD_TOKEN": "x"})
    assert r.returncode != 0
    assert "models download" in r.stderr.strip().splitlines()[-1]


def test_unknown_config_key_is_one_clear_line(tmp_path: Path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("engine:\n  devce: cpu\n")
    r = _cli("--config", str(cfg), "voices", "list")
    assert r.returncode == 2 and "unknown config key engine.devce" in r.stderr
