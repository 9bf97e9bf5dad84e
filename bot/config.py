"""The typed configuration: ``config.yaml`` loaded into one frozen object, checked key by key.

An unknown or mistyped key is an error that names the dotted key and what was expected. Relative paths are
resolved against the folder of the config file. Secrets (Discord token, API keys) are never in the file: the file
names the environment variable that holds them.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from synthesis import SpeechError, SynthesisParams


class ConfigError(SpeechError):
    """The configuration file is missing, malformed or has a wrong key/value."""


@dataclass(frozen=True)
class ModelsConfig:
    dir: Path = Path("models")
    gpt: Path = Path("models/gsv-v2final-pretrained/s1bert25hz-5kh-longer-epoch=12-step=369668.ckpt")
    sovits: Path = Path("models/gsv-v2final-pretrained/s2G2333k.pth")
    hubert: Path = Path("models/chinese-hubert-base")
    bert: Path = Path("models/chinese-roberta-wwm-ext-large")
    # v2Pro/v2ProPlus SoVITS only: the speaker-verification model of upstream's pretrained set (unused for v2)
    sv: Path = Path("models/sv/pretrained_eres2netv2w24s4ep4.ckpt")
    download_base_url: str = "https://huggingface.co/lj1995/GPT-SoVITS/resolve/main"


@dataclass(frozen=True)
class EngineConfig:
    backend: str = "auto"  # auto | torch | onnx | tensorrt (auto: onnx on CPU; see engines.loader.CPU_AUTO_BACKEND)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "auto"  # auto | fp32 | fp16 | bf16 | int8 (auto: fp16 on GPU, int8 on CPU)
    threads: int = 0  # CPU threads for torch/onnxruntime; 0 = all cores
    max_batch: int = 8  # most sentences decoded together by the GPT
    cuda_graphs: bool = True
    onnx_dir: Path = Path("cache/onnx")
    tensorrt_dir: Path = Path("cache/tensorrt")
    tensorrt_workspace_mb: int = 4096


    def __post_init__(self) -> None:
        _check_choice("backend", self.backend, ("auto", "torch", "onnx", "tensorrt"))
        _check_choice("precision", self.precision, ("auto", "fp32", "fp16", "bf16", "int8"))
        if not (self.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", self.device)):
            raise ValueError(f"device: expected auto, cpu, cuda or cuda:N, got {self.device!r}")


def _check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{key}: expected one of {', '.join(choices)}, got {value!r}")


@dataclass(frozen=True)
class SynthesisConfig:
    language: str = "auto"
    split_method: str = "cut5"
    fragment_interval: float = 0.3
    top_k: int = 15
    top_p: float = 1.0
    temperature: float = 1.0
    repetition_penalty: float = 1.35
    speed: float = 1.0
    noise_scale: float = 0.5
    seed: int = -1
    queue_size: int = 64  # requests admitted at once (each from its arrival to the end of its stream); more: busy
    deadline_s: float = 120.0  # longest wait for one sentence, from when its text arrived and it is due to play
    stream_pause_s: float = 1.5
    stream_max_chars: int = 300
    max_text_chars: int = 5000
    first_chunk_tokens: int = 24

    def __post_init__(self) -> None:
        # the per-request defaults: refused here, with the key's name, rather than at the first request
        SynthesisParams(language=self.language, top_k=self.top_k, top_p=self.top_p, temperature=self.temperature,
                        repetition_penalty=self.repetition_penalty, speed=self.speed, noise_scale=self.noise_scale,
                        seed=self.seed, split_method=self.split_method, fragment_interval=self.fragment_interval)
        if self.queue_size < 1:
            raise ValueError(f"queue_size must be at least 1, got {self.queue_size}")
        if not self.deadline_s > 0:
            raise ValueError(f"deadline_s must be above 0 seconds, got {self.deadline_s}")


@dataclass(frozen=True)
class VoicesConfig:
    dir: Path = Path("data/voices")
    max_upload_mb: float = 25.0
    max_upload_s: float = 600.0
    min_speech_s: float = 3.0
    max_speech_s: float = 10.0


@dataclass(frozen=True)
class CacheConfig:
    dir: Path = Path("data/cache")
    prosody_mb: int = 512
    audio_mb: int = 1024
    reuse_random: bool = True  # serve one stored sample for random-seed requests (off: a fresh draw every time)


@dataclass(frozen=True)
class DiscordConfig:
    token_env: str = "DISCORD_TOKEN"
    api_base: str = "https://discord.com/api/v10"
    gateway_url: str = "wss://gateway.discord.gg/"
    database: Path = Path("data/voicebot.sqlite3")
    guild_queue_size: int = 20
    idle_disconnect_s: float = 600.0
    max_attachment_mb: float = 25.0
    max_message_chars: int = 2000
    alone_disconnect_s: float = 10.0  # leave the voice channel after being alone in it (no humans) this long
    reconnect_wait_s: float = 5.0  # let discord.py restore a dropped voice connection this long before rejoining
    ca_file: Path | None = None  # extra CA bundle (PEM) trusted for TLS to Discord or a proxy, besides the system CAs
    guild_ready_timeout_s: float = 2.0  # wait for GUILD_CREATEs after READY before on_ready (tests use ~0.05)


@dataclass(frozen=True)
class HttpConfig:
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 9880
    token_env: str = "VOICEBOT_API_TOKEN"
    max_body_kb: int = 256
    max_text_chars: int = 5000
    rate_limit_per_min: int = 120
    # browser origins allowed to call the API (CORS); SillyTavern's UI runs at :8000; "*" allows any site
    cors_origins: tuple[str, ...] = ("http://localhost:8000", "http://127.0.0.1:8000")
    rate_limit_key: str = "address"  # what shares one rate-limit bucket: address | token | none (one for all)
    trusted_networks: tuple[str, ...] = ()  # client addresses/CIDRs that need no token (e.g. 192.168.1.0/24)
    allowed_hosts: tuple[str, ...] = ()  # Host names served besides localhost and IP literals ("*" = any)
    voice_aliases: dict[str, str] = field(default_factory=dict)  # client voice name (alloy...) -> stored voice
    default_voice: str = ""  # stored voice for unmapped OpenAI voice names; "" = the first voice by name
    idle_timeout_s: float = 15.0  # an idle keep-alive connection, or one slow to send its request head, is closed
    body_timeout_s: float = 30.0  # a request body must arrive within this
    ws_idle_timeout_s: float = 20.0  # a WebSocket whose client sends nothing this long ends its input

    def __post_init__(self) -> None:
        if self.rate_limit_key not in RATE_LIMIT_KEYS:
            raise ValueError(f"rate_limit_key must be one of {', '.join(RATE_LIMIT_KEYS)}, "
                             f"got {self.rate_limit_key!r}")
        for net in self.trusted_networks:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ValueError(f"trusted_networks: {net!r} is not an address or network like 192.168.1.0/24"
                                 ) from None
        for name in ("idle_timeout_s", "body_timeout_s", "ws_idle_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be above 0 seconds, got {getattr(self, name)!r}")
        for key, value in self.voice_aliases.items():
            if not key.strip() or not value.strip():
                raise ValueError(f"voice_aliases: {key!r}: {value!r} needs a client name and a stored voice name")


RATE_LIMIT_KEYS = ("address", "token", "none")


@dataclass(frozen=True)
class ChatConfig:
    enabled: bool = False
    base_url: str = "http://127.0.0.1:11434/v1"
    model: str = "llama3.1"
    api_key_env: str = "OPENAI_API_KEY"
    system_prompt: str = "You are a friendly voice assistant in a Discord server. Answer briefly."
    memory_messages: int = 20
    timeout_s: float = 60.0


@dataclass(frozen=True)
class Config:
    models: ModelsConfig = field(default_factory=ModelsConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    synthesis: SynthesisConfig = field(default_factory=SynthesisConfig)
    voices: VoicesConfig = field(default_factory=VoicesConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    phrases: tuple[str, ...] = ()
    discord: DiscordConfig = field(default_factory=DiscordConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    chat: ChatConfig = field(default_factory=ChatConfig)
    log_level: str = "INFO"

    def secret(self, env_name: str) -> str | None:
        """The value of a secret's environment variable, or None when unset/empty."""
        value = os.environ.get(env_name, "").strip()
        return value or None


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and check a config file; raise :class:`ConfigError` naming the bad key."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} not found: pass --config PATH or copy the shipped config.yaml")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from e
    return config_from_dict(raw or {}, base_dir=path.resolve().parent)


def config_from_dict(raw: dict[str, Any], base_dir: Path | None = None) -> Config:
    return _build(Config, raw, "", base_dir or Path.cwd())


def _build(cls: type, raw: Any, prefix: str, base_dir: Path) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'the config'}: expected a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in names:
            raise ConfigError(f"unknown config key {prefix}{key!s}: expected one of {', '.join(sorted(names))}")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if f.name in raw:
            values[f.name] = _coerce(tp, raw[f.name], f"{prefix}{f.name}", base_dir)
        elif dataclasses.is_dataclass(tp):
            values[f.name] = _build(tp, {}, f"{prefix}{f.name}.", base_dir)
        elif tp is Path:  # defaults are relative to the config file too
            values[f.name] = base_dir / f.default
    try:
        return cls(**values)
    except ValueError as e:
        raise ConfigError(f"config section {prefix.rstrip('.') or '(top level)'}: {e}") from e


def _coerce(tp: Any, value: Any, key: str, base_dir: Path) -> Any:
    if dataclasses.is_dataclass(tp):
        return _build(tp, value if value is not None else {}, key + ".", base_dir)
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, key, base_dir)
    if origin is dict:  # a mapping of strings (http.voice_aliases)
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key}: expected a mapping, got {value!r}")
        k_tp, v_tp = typing.get_args(tp)
        return {_coerce(k_tp, k, f"{key}.{k}", base_dir): _coerce(v_tp, v, f"{key}.{k}", base_dir)
                for k, v in value.items()}
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(f"config key {key}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp)[:1]
        return tuple(_coerce(item, v, f"{key}[{i}]", base_dir) for i, v in enumerate(value))
    if tp is Path:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"config key {key}: expected a path (string), got {value!r}")
        p = Path(os.path.expanduser(value))
        return p if p.is_absolute() else (base_dir / p)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key {key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key {key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key {key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"config key {key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"config key {key}: unsupported type {tp!r}")  # pragma: no cover - programming error
