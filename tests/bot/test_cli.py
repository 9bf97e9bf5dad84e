"""The command line with the tiny models: say (with --timings --json), voices add/list/delete, phrases, run checks."""

from __future__ import annotations

import http.server
import json
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import soundfile as sf

from tests.audio_samples import speech_like_wav

ROOT = Path(__file__).resolve().parents[2]
# shaped like a bot token (user id . timestamp . signature), accepted by no one: Discord is asked and refuses it
SHAPED_TOKEN = "MTAwMDAwMDAwMDAwMDAwOTAx.GxQ3aB.abcdefghijklmnopqrstuvwxyz0"


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "bot", *args], capture_output=True, text=True, cwd=ROOT,
                          env=full_env, timeout=timeout)


def _assert_no_voice_left(root: Path) -> None:
    """Nothing of any voice in the voice folder: no file but the voice database, and no row in that."""
    from tests.synthesis.test_voices import files_under

    assert files_under(root) == []
    if (root / "voices.sqlite3").exists():
        conn = sqlite3.connect(root / "voices.sqlite3")
        try:
            assert conn.execute("SELECT COUNT(*) FROM voices").fetchone() == (0,)
        finally:
            conn.close()


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
    _assert_no_voice_left(tmp_path / "voices")  # the temporary voice is gone


def test_voices_add_list_say_delete(tiny_models: Path, tmp_path: Path):
    cfg = _config(tiny_models, tmp_path)
    clip = tmp_path / "me.wav"
    clip.write_bytes(speech_like_wav(5.0, seed=2))
    r = _cli("--config", str(cfg), "voices", "add", "me", str(clip), "--text", "This is my voice.", "--lang", "en")
    assert r.returncode == 0, r.stderr
    assert "voice 'me' created" in r.stdout
    assert " of the 5.0 s clip, with its transcript\n" in r.stdout  # only silence trimmed: the transcript is kept
    r = _cli("--config", str(cfg), "voices", "list")
    assert r.returncode == 0 and r.stdout.startswith("me ")
    assert "'This is my voice.'" in r.stdout and "of the 5.0 s clip\n" in r.stdout
    r = _cli("--config", str(cfg), "say", "Hello!", "--voice", "me", "-o", str(tmp_path / "o.wav"), "--timings",
             "--json", "--lang", "en")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["sentences"][0]["prosody_hit"] is True  # precomputed when the voice was added
    r = _cli("--config", str(cfg), "voices", "delete", "me")
    assert r.returncode == 0 and "deleted voice 'me'" in r.stdout
    _assert_no_voice_left(tmp_path / "voices")


def test_voices_add_says_which_seconds_were_kept_and_drops_a_transcript_that_does_not_fit(tiny_models: Path,
                                                                                          tmp_path: Path):
    cfg = _config(tiny_models, tmp_path)
    clip = tmp_path / "long.wav"
    clip.write_bytes(speech_like_wav(25.0, seed=2))  # 25 s of speech: at most 10 s are kept
    r = _cli("--config", str(cfg), "voices", "add", "long", str(clip), "--text", "All the words of 25 seconds.",
             "--lang", "en")
    assert r.returncode == 0, r.stderr
    (created,) = [line for line in r.stdout.splitlines() if line.startswith("voice 'long' created")]
    assert created.endswith(" of the 25.0 s clip, speech left out, reference-free (no transcript)"), created
    (kept,) = [line for line in r.stderr.splitlines() if line.startswith("warning: the voice uses seconds ")]
    assert kept.endswith(", so its transcript was not stored and the voice is reference-free; to keep a transcript, "
                         "send only the seconds you want, with the words said in them"), kept
    assert ("to keep a transcript: cut long.wav to the seconds it uses, run `python -m bot voices delete long`, then "
            'add it again with --text "the words said in them"') in r.stderr.splitlines()
    r = _cli("--config", str(cfg), "voices", "list")
    assert r.returncode == 0 and "reference-free" in r.stdout and "of the 25.0 s clip, speech left out" in r.stdout


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
    r = _cli("--config", str(cfg), "run", env={"DISCORD_TOKEN": SHAPED_TOKEN})
    assert r.returncode != 0
    assert "models download" in r.stderr.strip().splitlines()[-1]


def test_unknown_config_key_is_one_clear_line(tmp_path: Path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("engine:\n  devce: cpu\n")
    r = _cli("--config", str(cfg), "voices", "list")
    assert r.returncode == 2 and "unknown config key engine.devce" in r.stderr


# ---- issue 16: one-line errors, checked before the models load (9), uploads checked before reading (8) ----------

def _one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr[-2000:]  # no traceback
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_command_line_mistakes_are_one_line_before_any_model_loads(tmp_path: Path):
    # the model files do not exist: a command that got as far as loading them would say so instead
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"models:\n  dir: {tmp_path}/m\n  gpt: {tmp_path}/m/g.ckpt\nvoices:\n  dir: {tmp_path}/voices\n")
    clip = tmp_path / "clip.wav"
    clip.write_bytes(speech_like_wav())
    (tmp_path / "folder").mkdir()
    (tmp_path / "zero.wav").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "fifo.wav")
    c = ("--config", str(cfg))
    out = ("-o", str(tmp_path / "o.wav"))
    _one_line_error(_cli(*c, "say", "Hi.", *out), "--voice", "--ref")
    _one_line_error(_cli(*c, "say", "Hi.", "--ref", str(tmp_path / "missing.wav"), *out), "no file", "missing.wav")
    _one_line_error(_cli(*c, "say", "Hi.", "--voice", "x", "--lang", "xx", *out), "--lang", "'xx'", "en")
    _one_line_error(_cli(*c, "say", "Hi.", "--voice", "nobody", *out), "no voice named 'nobody'")
    _one_line_error(_cli(*c, "voices", "add", "X", str(tmp_path / "missing.wav")), "no file")
    _one_line_error(_cli(*c, "voices", "add", "X", str(tmp_path / "folder")), "is a folder")
    _one_line_error(_cli(*c, "voices", "add", "X", str(tmp_path / "zero.wav"), timeout=60), "not a regular file")
    _one_line_error(_cli(*c, "voices", "add", "X", str(tmp_path / "fifo.wav"), timeout=60), "not a regular file")
    _one_line_error(_cli(*c, "voices", "add", "X", str(clip), "--lang", "xx"), "--lang", "'xx'")
    for name in ("j.doe", "O'Brien"):  # names the store refuses, refused before the clip is read
        _one_line_error(_cli(*c, "voices", "add", name, str(clip)), "not allowed", name)
    assert not (tmp_path / "voices").exists() or _assert_no_voice_left(tmp_path / "voices") is None


class _Discord401(threading.Thread):
    """A local HTTP server that answers 401, as Discord does to a wrong bot token."""

    def __init__(self) -> None:
        super().__init__(daemon=True)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"message": "401: Unauthorized", "code": 0}')

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v10"

    def run(self) -> None:
        self.server.serve_forever()


def test_a_wrong_or_unreachable_token_is_one_line(tiny_models: Path, tmp_path: Path):
    discord = _Discord401()
    discord.start()
    try:
        for api_base, needle in ((discord.url, "Discord refused the token in DISCORD_TOKEN"),
                                 ("http://127.0.0.1:1/api/v10", "cannot reach Discord")):
            cfg = _config(tiny_models, tmp_path)
            cfg.write_text(cfg.read_text().replace("discord:\n", f"discord:\n  api_base: {api_base}\n"))
            for command in ("check-token", "run"):
                _one_line_error(_cli("--config", str(cfg), command, env={"DISCORD_TOKEN": SHAPED_TOKEN},
                                     timeout=120),
                                needle)
    finally:
        discord.server.shutdown()


def test_voices_delete_removes_the_database_rows_that_name_the_voice(tiny_models: Path, tmp_path: Path):
    """Also with a bot running beside it (issue 16, 5): its cache, open in another process, keeps nothing after."""
    import asyncio

    import numpy as np

    from bot.store import Store
    from synthesis.cache import SynthesisCache
    from synthesis.voices import VoiceStore
    from tests.synthesis.test_voices import SAMPLING, create

    cfg = _config(tiny_models, tmp_path)
    from bot.config import load_config

    config = load_config(cfg)
    voice = create(VoiceStore(tmp_path / "voices"), "Alice")
    database = tmp_path / "voicebot.sqlite3"  # discord.database, relative to the config file
    words = "I-AGREE-TO-BE-CLONED-5c1e"
    running = SynthesisCache(config.cache.dir, 1 << 22, 1 << 22)  # the bot's, open throughout...
    VoiceStore(tmp_path / "voices", cache=running)  # ...and bound to its voice store, as build_synthesizer does
    key = running.prosody_key("model-a", voice.id, 1, "in flight", "en", SAMPLING)
    running.put_tokens(key, np.arange(20), voice.id)

    async def fill() -> None:
        async with Store(database) as store:
            await store.set_nickname(1, 42, words)
            await store.share_voice(voice.id, 1, 42)
            await store.set_user_setting(7, "voice", voice.id)
            await store.set_guild_setting(1, "default_voice", voice.id)

    asyncio.run(fill())
    r = _cli("--config", str(cfg), "voices", "delete", "Alice")
    assert r.returncode == 0, r.stderr
    assert "3 database row(s)" in r.stdout
    conn = sqlite3.connect(database)
    try:
        for table in ("voice_shares", "user_settings", "guild_settings", "voice_journal"):
            assert conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone() == (0,), table
    finally:
        conn.close()
    blob = b"".join(p.read_bytes() for p in tmp_path.glob("voicebot.sqlite3*"))
    assert voice.id.encode() not in blob and words.encode() in blob  # the voice's rows went, nothing else
    # the running bot's request that was in flight finishes: its writes for the voice are refused, and the
    # entry it had written before the delete is gone
    running.put_tokens(running.prosody_key("model-a", voice.id, 1, "late", "en", SAMPLING), np.arange(20), voice.id)
    assert running.stats()["prosody"]["entries"] == 0 and running.is_retired(voice.id)
    running.close()
    _assert_no_voice_left(tmp_path / "voices")


def test_voices_extra_clips_and_styles(tiny_models: Path, tmp_path: Path):
    cfg = _config(tiny_models, tmp_path)
    clips = {}
    for name, (f0, seed) in {"me": (140.0, 2), "more": (200.0, 5), "calm": (120.0, 9)}.items():
        clips[name] = tmp_path / f"{name}.wav"
        clips[name].write_bytes(speech_like_wav(5.0, f0=f0, seed=seed))
    bad = tmp_path / "noise.wav"
    bad.write_bytes(b"RIFF not a wav file")
    r = _cli("--config", str(cfg), "voices", "add", "me", str(clips["me"]), "--text", "This is my voice.",
             "--lang", "en", "--extra", str(clips["more"]), str(bad))
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1] == (
        "error: 'noise.wav' is not audio we can read; send wav/flac/mp3/ogg/opus/m4a/webm")
    _assert_no_voice_left(tmp_path / "voices")  # the voice is not kept without the clips asked for
    r = _cli("--config", str(cfg), "voices", "add", "me", str(clips["me"]), "--text", "This is my voice.",
             "--lang", "en", "--extra", str(clips["more"]))
    assert r.returncode == 0, r.stderr
    assert "1 extra clip(s) averaged into its timbre" in r.stdout
    r = _cli("--config", str(cfg), "voices", "add-style", "me", "calm", str(clips["calm"]), "--text",
             "I am calm today.", "--lang", "en")
    assert r.returncode == 0, r.stderr
    assert "style 'calm' stored with voice 'me' (now version 3)" in r.stdout
    r = _cli("--config", str(cfg), "voices", "list")
    assert r.returncode == 0 and "+1 clip(s)  styles: calm" in r.stdout
    # the operator's consent is stored with the extra clip and with the style, as with the voice
    from synthesis.voices import VoiceStore

    store = VoiceStore(tmp_path / "voices")
    meta = store.meta(store.find("me").id)
    store.close()
    for record in (meta["reference"]["extras"][0]["consent"], meta["styles"]["calm"]["consent"]):
        assert record["user_id"] == 0 and record["text"] == meta["consent"]["text"]
        assert record["at"] >= meta["created"][:19]  # recorded when the clip was added, after the voice
    r = _cli("--config", str(cfg), "say", "Hello!", "--voice", "me", "--style", "excited", "-o",
             str(tmp_path / "o.wav"), "--lang", "en")
    assert r.returncode != 0 and "has no style 'excited' (its styles: calm)" in r.stderr
    r = _cli("--config", str(cfg), "voices", "remove-style", "me", "calm")
    assert r.returncode == 0, r.stderr
    store = VoiceStore(tmp_path / "voices")
    assert store.meta(store.find("me").id)["styles"] == {}
    store.close()
    r = _cli("--config", str(cfg), "voices", "delete", "me")
    assert r.returncode == 0, r.stderr
    _assert_no_voice_left(tmp_path / "voices")
