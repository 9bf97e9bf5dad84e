"""The typed config: the shipped file loads; wrong keys and values are errors that name the dotted key."""

from __future__ import annotations

from pathlib import Path

import dataclasses
import typing

import pytest
import yaml

from bot.config import Config, ConfigError, config_from_dict, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_config_loads_with_defaults():
    cfg = load_config(ROOT / "config.yaml")
    assert cfg.engine.backend == "auto" and cfg.synthesis.split_method == "cut5"
    assert cfg.http.host == "127.0.0.1" and cfg.http.port == 9880
    assert cfg.models.gpt.is_absolute() and cfg.models.gpt.parent.parent == ROOT / "models"
    assert "Hello!" in cfg.phrases
    assert cfg.chat.enabled is False


def test_shipped_values_are_the_defaults():
    """config.yaml says "the values below are the defaults": it must not drift from the objects' own defaults."""
    shipped, defaults = load_config(ROOT / "config.yaml"), config_from_dict({}, base_dir=ROOT)
    assert dataclasses.replace(shipped, phrases=()) == defaults
    assert shipped.synthesis.params.top_k == 15 and shipped.limits.queue_size == 64


def test_every_shipped_key_is_commented():
    for n, line in enumerate((ROOT / "config.yaml").read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped and not stripped.startswith(("#", "-")) and not stripped.endswith(":"):
            assert "#" in line, f"config.yaml line {n} has no comment: {line}"


@pytest.mark.parametrize(("raw", "message"), [
    ({"engine": {"backnd": "torch"}}, "unknown config key engine.backnd"),
    ({"synthesis": {"top_k": "fifteen"}}, "synthesis.top_k: expected an integer"),
    ({"http": {"enabled": "yes"}}, "http.enabled: expected true or false"),
    ({"engine": {"backend": "cuda"}}, "engine.backend must be one of auto, torch, onnx, tensorrt"),
    ({"phrases": "hello"}, "phrases: expected a list"),
    ({"discord": {"token": "abc"}}, "unknown config key discord.token"),
    ({"voices": ["x"]}, "voices: expected a mapping"),
])
def test_bad_keys_and_values_name_the_dotted_key(raw, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        config_from_dict(raw)


def test_relative_paths_follow_the_config_file(tmp_path: Path):
    (tmp_path / "c.yaml").write_text("voices:\n  dir: v\n")
    cfg = load_config(tmp_path / "c.yaml")
    assert cfg.voices.dir == tmp_path / "v"
    assert cfg.cache.dir == tmp_path / "data" / "cache"  # defaults too


def test_missing_and_malformed_files(tmp_path: Path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("engine: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")


def test_token_comes_only_from_the_environment(monkeypatch):
    cfg = config_from_dict({})
    monkeypatch.delenv("DISCORD_TOKEN", raising=False)
    assert cfg.secret(cfg.discord.token_env) is None
    monkeypatch.setenv("DISCORD_TOKEN", " abc ")
    assert cfg.secret(cfg.discord.token_env) == "abc"


# Issue 14, 4: every section's bad values are refused at load, each naming its dotted key.
BAD_VALUES = {
    "models": [
        ({"family": "v6"}, "models.family must be one of v2, v2Pro, v2ProPlus, v4, v5turbo, v5dev, v3, auto, got 'v6'"),
        ({"download_base_url": "ftp://mirror/x"}, "models.download_base_url must be a http:// or https:// URL"),
    ],
    "engine": [
        ({"device": "gpu"}, "engine.device must be auto, cpu, cuda or cuda:N, got 'gpu'"),
        ({"precision": "fp8"}, "engine.precision must be one of auto, fp32, fp16, bf16, int8"),
        ({"threads": -1}, "engine.threads must be >= 0, got -1"),
        ({"max_batch": 0}, "engine.max_batch must be >= 1, got 0"),
        ({"tensorrt_workspace_mb": 0}, "engine.tensorrt_workspace_mb must be >= 1, got 0"),
    ],
    "synthesis": [
        ({"language": "fr"}, "synthesis.language must be one of auto, auto_yue, en, zh"),
        ({"split_method": "cut9"}, "synthesis.split_method must be one of cut0"),
        ({"top_k": 0}, "synthesis.top_k must be a whole number >= 1, got 0"),
        ({"top_p": 0}, "synthesis.top_p must be a finite number in (0, 1], got 0.0"),
        ({"temperature": 1.0e+308}, "synthesis.temperature must be a finite number in [0, 100]"),
        ({"repetition_penalty": float("nan")}, "synthesis.repetition_penalty must be a finite number"),
        ({"speed": 5}, "synthesis.speed must be a finite number from 0.25 to 4, got 5.0"),
        ({"noise_scale": -0.1}, "synthesis.noise_scale must be a finite number from 0 to 10"),
        ({"fragment_interval": 6}, "synthesis.fragment_interval must be a finite number from 0 to 5"),
        ({"seed": -2}, "synthesis.seed must be a whole number from -1"),
        ({"queue_size": 0}, "synthesis.queue_size must be a whole number >= 1, got 0"),
        ({"deadline_s": 0}, "synthesis.deadline_s must be a finite number above 0, got 0.0"),
        ({"stream_pause_s": -1}, "synthesis.stream_pause_s must be a finite number above 0"),
        ({"stream_max_chars": 0}, "synthesis.stream_max_chars must be a whole number >= 1"),
        ({"max_text_chars": 0}, "synthesis.max_text_chars must be a whole number >= 1"),
        ({"first_chunk_tokens": -1}, "synthesis.first_chunk_tokens must be a whole number >= 0"),
        ({"backend": "remote"}, "synthesis.backend must be one of local, ray, got 'remote'"),
    ],
    "ray": [
        ({"address": ""}, "ray.address must be auto, local or a cluster address"),
        ({"app_name": "voice bot"}, "ray.app_name must be letters, digits, - or _, got 'voice bot'"),
        ({"num_replicas": 0}, "ray.num_replicas must be a whole number >= 1, got 0"),
        ({"min_replicas": 3, "max_replicas": 2}, "ray.max_replicas must be >= min_replicas (3), got 2"),
        ({"target_queue": 0}, "ray.target_queue must be a finite number above 0, got 0.0"),
        ({"cpus_per_replica": 0}, "ray.cpus_per_replica must be a finite number above 0, got 0.0"),
        ({"gpus_per_replica": -1}, "ray.gpus_per_replica must be a finite number >= 0, got -1.0"),
        ({"max_queued_requests": 0}, "ray.max_queued_requests must be a whole number >= 1, got 0"),
        ({"ready_timeout_s": float("inf")}, "ray.ready_timeout_s must be a finite number above 0"),
        ({"storage": "nfs"}, "ray.storage must be one of shared, served, got 'nfs'"),
    ],
    "voices": [
        ({"max_upload_mb": 0}, "voices.max_upload_mb must be a finite number above 0"),
        ({"max_upload_s": 0}, "voices.max_upload_s must be a finite number above 0"),
        ({"min_speech_s": 0}, "voices.min_speech_s must be a finite number above 0"),
        ({"min_speech_s": 12}, "voices.max_speech_s must be >= min_speech_s (12), got 10"),
    ],
    "cache": [
        ({"prosody_mb": 0}, "cache.prosody_mb must be >= 1, got 0"),
        ({"audio_mb": -5}, "cache.audio_mb must be >= 1, got -5"),
    ],
    "discord": [
        ({"token_env": "my token"}, "discord.token_env must name an environment variable"),
        ({"api_base": "discord.com/api"}, "discord.api_base must be a http:// or https:// URL"),
        ({"gateway_url": "https://gateway.discord.gg/"}, "discord.gateway_url must be a ws:// or wss:// URL"),
        ({"guild_queue_size": 0}, "discord.guild_queue_size must be >= 1, got 0"),
        ({"idle_disconnect_s": 0}, "discord.idle_disconnect_s must be a finite number above 0"),
        ({"max_message_chars": 0}, "discord.max_message_chars must be >= 1"),
        ({"alone_disconnect_s": -1}, "discord.alone_disconnect_s must be a finite number >= 0"),
    ],
    "http": [
        ({"port": 70000}, "http.port must be from 0 to 65535, got 70000"),
        ({"port": -1}, "http.port must be >= 0, got -1"),
        ({"host": " "}, "http.host must be an address to listen on"),
        ({"max_body_kb": 0}, "http.max_body_kb must be >= 1"),
        ({"rate_limit_per_min": -1}, "http.rate_limit_per_min must be >= 0"),
        ({"cors_origins": ["localhost:8000/ui"]}, "http.cors_origins: 'localhost:8000/ui' is not an origin"),
        ({"allowed_hosts": ["a b"]}, "http.allowed_hosts: 'a b' is not a host name"),
        ({"body_timeout_s": 0}, "http.body_timeout_s must be a finite number above 0"),
    ],
    "chat": [
        ({"base_url": "localhost:11434"}, "chat.base_url must be a http:// or https:// URL"),
        ({"model": ""}, "chat.model must name the chat model"),
        ({"memory_messages": -1}, "chat.memory_messages must be >= 0"),
        ({"timeout_s": 0}, "chat.timeout_s must be a finite number above 0"),
    ],
}


@pytest.mark.parametrize(("section", "value", "message"),
                         [(section, value, message) for section, rows in BAD_VALUES.items() for value, message in rows])
def test_bad_values_of_every_section_are_refused_at_load_naming_the_key(tmp_path: Path, section: str, value: dict,
                                                                        message: str) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({section: value}))
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert message in str(e.value)
    assert str(e.value).startswith(f"{section}.")  # the dotted key first, on one line
    assert "\n" not in str(e.value)


def test_every_section_has_bad_values_tested() -> None:
    hints = typing.get_type_hints(Config)
    sections = {f.name for f in dataclasses.fields(Config) if dataclasses.is_dataclass(hints[f.name])}
    assert sections == set(BAD_VALUES)


@pytest.mark.parametrize(("raw", "message"), [
    ({"log_level": "LOUD"}, "log_level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got 'LOUD'"),
    ({"phrases": ["Hello!", " "]}, "phrases[1] is empty"),
])
def test_bad_top_level_values_are_refused(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict(raw)
    assert str(e.value).startswith(message)


def test_log_level_is_accepted_in_any_case() -> None:
    assert config_from_dict({"log_level": "debug"}).log_level == "DEBUG"


def test_defaults_are_the_objects_own() -> None:
    """The synthesis and voices sections default to what SynthesisParams and Limits default to (written once)."""
    from synthesis import SynthesisParams
    from synthesis.types import Limits

    cfg = config_from_dict({})
    assert cfg.synthesis.params == SynthesisParams()
    assert cfg.limits == Limits()
    assert (SynthesisParams().top_k, SynthesisParams().repetition_penalty) == (15, 1.35)  # upstream's
    assert (Limits().queue_size, Limits().max_upload_bytes) == (64, 25 * 1024 * 1024)


def test_values_reach_the_objects_that_use_them() -> None:
    cfg = config_from_dict({"synthesis": {"top_k": 5, "language": "en", "queue_size": 3, "first_chunk_tokens": 0},
                            "voices": {"max_upload_mb": 2.5, "min_speech_s": 2.0, "max_speech_s": 8.0}})
    assert cfg.synthesis.params.top_k == 5 and cfg.synthesis.params.language == "en"
    lim = cfg.limits
    assert (lim.queue_size, lim.first_chunk_tokens) == (3, 0)
    assert (lim.max_upload_bytes, lim.min_speech_s, lim.max_speech_s) == (int(2.5 * 1024 * 1024), 2.0, 8.0)


def test_model_paths_follow_the_family(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("models:\n  family: v2ProPlus\n")
    m = load_config(tmp_path / "c.yaml").models
    assert m.gpt == tmp_path / "models" / "s1v3.ckpt"
    assert m.sovits == tmp_path / "models" / "v2Pro" / "s2Gv2ProPlus.pth"
    assert m.sv == tmp_path / "models" / "sv" / "pretrained_eres2netv2w24s4ep4.ckpt"
    (tmp_path / "c.yaml").write_text("models:\n  family: v2Pro\n  dir: m\n  sovits: mine/voice_e8.pth\n  gpt: null\n")
    m = load_config(tmp_path / "c.yaml").models
    assert m.gpt == tmp_path / "m" / "s1v3.ckpt" and m.sovits == tmp_path / "mine" / "voice_e8.pth"
    m = config_from_dict({}, base_dir=tmp_path).models
    assert m.family == "v2" and m.sovits == tmp_path / "models" / "gsv-v2final-pretrained" / "s2G2333k.pth"


@pytest.mark.parametrize(("raw", "needle"), [
    ("synthesis:\n  top_k: 0\n", "synthesis.top_k must be a whole number >= 1, got 0"),
    ("synthesis:\n  language: fr\n", "synthesis.language must be one of"),
    ("log_level: LOUD\n", "log_level must be one of"),
    ("http:\n  port: 99999\n", "http.port must be from 0 to 65535"),
    ("engine: [1, 2]\n", "engine: expected a mapping"),
    ("engine: [unclosed\n", "is not valid YAML: line 2, column 1: expected ',' or ']'"),
    ("engine:\n  backend: torch\n   device: cpu\n", "is not valid YAML: line 3, column 10: mapping values"),
])
def test_cli_says_a_config_error_in_one_line(tmp_path: Path, raw: str, needle: str) -> None:
    """`python -m bot --config bad.yaml run` prints one line naming the key (no traceback), exit status 2."""
    import subprocess
    import sys

    (tmp_path / "bad.yaml").write_text(raw)
    r = subprocess.run([sys.executable, "-m", "bot", "--config", str(tmp_path / "bad.yaml"), "run"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "DISCORD_TOKEN": "x"})
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr
    assert needle in lines[0]


def test_cache_reuse_random_reaches_the_cache(tiny_config) -> None:
    import asyncio
    import dataclasses

    from bot.services import build_synthesizer

    cfg = dataclasses.replace(tiny_config, cache=dataclasses.replace(tiny_config.cache, reuse_random=False))
    synth = build_synthesizer(cfg)
    try:
        assert synth.cache.store.reuse_random is False and not synth.cache.cacheable({"seed": -1, "top_k": 15})
    finally:
        synth.worker.close()
        asyncio.run(synth.cache.close())
