"""The typed config: the shipped file loads; wrong keys and values are errors that name the dotted key."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import ConfigError, config_from_dict, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_config_loads_with_defaults():
    cfg = load_config(ROOT / "config.yaml")
    assert cfg.engine.backend == "auto" and cfg.synthesis.split_method == "cut5"
    assert cfg.http.host == "127.0.0.1" and cfg.http.port == 9880
    assert cfg.models.gpt.is_absolute() and cfg.models.gpt.parent.parent == ROOT / "models"
    assert "Hello!" in cfg.phrases
    assert cfg.chat.enabled is False


def test_every_shipped_key_is_commented():
    for n, line in enumerate((ROOT / "config.yaml").read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped and not stripped.startswith(("#", "-")) and not stripped.endswith(":"):
            assert "#" in line, f"config.yaml line {n} has no comment: {line}"


@pytest.mark.parametrize(("raw", "message"), [
    ({"engine": {"backnd": "torch"}}, "unknown config key engine.backnd"),
    ({"synthesis": {"top_k": "fifteen"}}, "synthesis.top_k: expected an integer"),
    ({"http": {"enabled": "yes"}}, "http.enabled: expected true or false"),
    ({"engine": {"backend": "cuda"}}, "backend: expected one of auto, torch, onnx, tensorrt"),
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


@pytest.mark.parametrize("raw, message", [
    ("synthesis:\n  temperature: 1.0e+308\n", "synthesis: temperature must be a finite number"),
    ("synthesis:\n  repetition_penalty: .nan\n", "synthesis: repetition_penalty must be a finite number"),
    ("synthesis:\n  queue_size: 0\n", "synthesis: queue_size must be at least 1"),
    ("synthesis:\n  deadline_s: 0\n", "synthesis: deadline_s must be above 0"),
])
def test_bad_synthesis_defaults_are_refused_at_load(tmp_path: Path, raw: str, message: str) -> None:
    """Issue 16, 4: a default no request could use is a config error naming the key, not a failure later."""
    p = tmp_path / "c.yaml"
    p.write_text(raw)
    with pytest.raises(ConfigError, match=message):
        load_config(p)


def test_cache_reuse_random_reaches_the_cache(tiny_config) -> None:
    import dataclasses

    from bot.services import build_synthesizer

    cfg = dataclasses.replace(tiny_config, cache=dataclasses.replace(tiny_config.cache, reuse_random=False))
    synth = build_synthesizer(cfg)
    try:
        assert synth.cache.reuse_random is False and not synth.cache.cacheable({"seed": -1, "top_k": 15})
    finally:
        synth.worker.close()
        synth.cache.close()
