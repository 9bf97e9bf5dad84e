"""The typed configuration: ``config.yaml`` loaded once, at start, into one frozen object, checked key by key.

An unknown or mistyped key, or a value that the object using it would refuse, is a :class:`ConfigError` that names
the dotted key ("synthesis.top_k must be a whole number >= 1, got 0"). The ``synthesis:`` and ``voices:`` defaults
are those of the objects they load into (:class:`synthesis.SynthesisParams`, :class:`synthesis.types.Limits`), written
there once. Relative paths are resolved against the folder of the config file. Secrets (Discord token, API keys)
are never in the file: the file names the environment variable that holds them.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import re
import types
import typing
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bot.downloads import DEFAULT_FAMILY, G2PW_URL, MODEL_SETS, TEXT_BASE_URL
from synthesis import SpeechError, SynthesisParams
from synthesis.cluster.options import ClusterOptions
from synthesis.types import Limits


class ConfigError(SpeechError):
    """The configuration file is missing, malformed or has a wrong key/value."""


MB = 1024 * 1024  # bytes in the config's megabytes
_PARAMS = SynthesisParams()  # the per-request defaults, written once where they are checked (synthesis.types)
_LIMITS = Limits()  # the pipeline's limits, likewise
_CLUSTER = ClusterOptions()  # the Ray Serve replicas' options, likewise
BACKENDS = ("local", "ray")  # synthesis.backend: where the synthesis runs
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# Each section below is a frozen dataclass; ``__post_init__`` checks its values and raises ValueError with a message
# that starts with the field's name, which the loader turns into the dotted key ("synthesis.top_k must be ...").


def _family_file(role: str) -> Any:
    """A ModelsConfig path that defaults to the chosen family's pretrained file under ``models.dir``.

    The loader fills it from ``models.family`` and ``models.dir`` when the key is absent or null; a ModelsConfig
    built in code gets the v2 file unless it names one."""
    def default(values: dict[str, Any]) -> Path:
        family = MODEL_SETS.get(values["family"], MODEL_SETS[DEFAULT_FAMILY])
        return Path(values["dir"]) / getattr(family, role).path

    return field(default=Path("models") / getattr(MODEL_SETS[DEFAULT_FAMILY], role).path,
                 metadata={"default_from": default})


def _family_vocoder(values: dict[str, Any]) -> Path | None:
    """models.vocoder's default: the chosen diffusion family's pretrained vocoder under ``models.dir``, else None."""
    family = MODEL_SETS.get(values["family"])
    vocoder = family.vocoder if family is not None else None
    return Path(values["dir"]) / vocoder if vocoder is not None else None


def _family_base(values: dict[str, Any]) -> Path | None:
    """models.sovits_base's default: the chosen diffusion family's pretrained SoVITS under ``models.dir``, else None."""
    family = MODEL_SETS.get(values["family"])
    return Path(values["dir"]) / family.sovits.path if family is not None and family.vocoder is not None else None


@dataclass(frozen=True)
class ModelsConfig:
    dir: Path = Path("models")
    # the pretrained set `models download` fetches (v2 | v2Pro | v2ProPlus | v4 | v5turbo | v5dev | v3), and where
    # gpt/sovits point by default; auto: the SoVITS file's own family (the v2 set's files by default)
    family: str = DEFAULT_FAMILY
    gpt: Path = _family_file("gpt")
    sovits: Path = _family_file("sovits")
    hubert: Path = Path("models/chinese-hubert-base")
    bert: Path = Path("models/chinese-roberta-wwm-ext-large")
    # v2Pro/v2ProPlus SoVITS only: the speaker-verification model of upstream's pretrained set (unused for v2)
    sv: Path = Path("models/sv/pretrained_eres2netv2w24s4ep4.ckpt")
    # v3/v4/v5 SoVITS only: its vocoder (null: the family's pretrained vocoder.pth under dir; with family auto, the one
    # beside the SoVITS file, as upstream lays them out)
    vocoder: Path | None = field(default=None, metadata={"default_from": _family_vocoder})
    # v3/v4 LoRA SoVITS only: the pretrained SoVITS it was trained on, merged under it at load (null: the family's
    # pretrained SoVITS under dir, which `models download` fetches; with family auto, set it)
    sovits_base: Path | None = field(default=None, metadata={"default_from": _family_base})
    download_base_url: str = "https://huggingface.co/lj1995/GPT-SoVITS/resolve/main"
    # the text front-end's optional files (upstream's English dictionaries, the G2PW polyphone model): fetched by
    # `models download` and read from dir where present; false: neither (the front-end uses its packages' data)
    frontend_assets: bool = True
    text_base_url: str = TEXT_BASE_URL  # upstream's GPT_SoVITS/text folder at the pinned commit, or a mirror
    g2pw_url: str = G2PW_URL  # the G2PWModel.zip archive, or a mirror

    def __post_init__(self) -> None:
        _check_choice("family", self.family, (*MODEL_SETS, "auto"))
        _check_url("download_base_url", self.download_base_url, ("http", "https"))
        _check_url("text_base_url", self.text_base_url, ("http", "https"))
        _check_url("g2pw_url", self.g2pw_url, ("http", "https"))


@dataclass(frozen=True)
class EngineConfig:
    backend: str = "auto"  # auto | torch | onnx | tensorrt (auto: onnx on CPU; see engines.plan)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: str = "auto"  # auto | fp32 | fp16 | bf16 | int8 (auto: fp16 on GPU, int8 on CPU)
    vocoder_precision: str = "auto"  # auto | fp32 | int8 (int8: the onnx engine on a CPU; see engines.vocoder_int8)
    gpt_runner: str = "auto"  # auto | fused | graphs | torch: how the GPT decodes (see engines.plan)
    threads: int = 0  # CPU threads for torch/onnxruntime; 0 = all cores
    max_batch: int = 8  # most sentences decoded together by the GPT
    cuda_graphs: bool = True
    onnx_dir: Path = Path("cache/onnx")
    tensorrt_dir: Path = Path("cache/tensorrt")
    tensorrt_workspace_mb: int = 4096

    def __post_init__(self) -> None:
        _check_choice("backend", self.backend, ("auto", "torch", "onnx", "tensorrt"))
        _check_choice("precision", self.precision, ("auto", "fp32", "fp16", "bf16", "int8"))
        _check_choice("vocoder_precision", self.vocoder_precision, ("auto", "fp32", "int8"))
        _check_choice("gpt_runner", self.gpt_runner, ("auto", "fused", "graphs", "torch"))
        if not (self.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", self.device)):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        _check_at_least("threads", self.threads, 0)
        _check_at_least("max_batch", self.max_batch, 1)
        _check_at_least("tensorrt_workspace_mb", self.tensorrt_workspace_mb, 1)


@dataclass(frozen=True)
class SynthesisConfig:
    """``synthesis:``: the default per-request options and the pipeline's limits, side by side in one mapping.

    Each key's default and check are those of the object it is loaded into: :class:`synthesis.SynthesisParams`
    (:attr:`params`) or :class:`synthesis.types.Limits` (with the ``voices:`` section, :attr:`Config.limits`).
    """

    language: str = _PARAMS.language
    split_method: str = _PARAMS.split_method
    fragment_interval: float = _PARAMS.fragment_interval
    top_k: int = _PARAMS.top_k
    top_p: float = _PARAMS.top_p
    temperature: float = _PARAMS.temperature
    repetition_penalty: float = _PARAMS.repetition_penalty
    speed: float = _PARAMS.speed
    noise_scale: float = _PARAMS.noise_scale
    seed: int = _PARAMS.seed
    queue_size: int = _LIMITS.queue_size  # requests admitted at once (from arrival to the end of their stream)
    deadline_s: float = _LIMITS.deadline_s  # longest wait for one sentence, from when its text arrived and it is due
    stream_pause_s: float = _LIMITS.stream_pause_s
    stream_max_chars: int = _LIMITS.stream_max_chars
    max_text_chars: int = _LIMITS.max_text_chars
    first_chunk_tokens: int = _LIMITS.first_chunk_tokens
    backend: str = "local"  # local: in this process | ray: on Ray Serve replicas (the ``ray:`` section)

    def __post_init__(self) -> None:
        _check_choice("backend", self.backend, BACKENDS)
        self.params  # noqa: B018 - built (and so checked) here, at load, rather than at the first request
        _subset(Limits, self)

    @property
    def params(self) -> SynthesisParams:
        """The server's default per-request options."""
        return _subset(SynthesisParams, self)


@dataclass(frozen=True)
class VoicesConfig:
    dir: Path = Path("data/voices")
    max_upload_mb: float = _LIMITS.max_upload_bytes / MB
    max_upload_s: float = _LIMITS.max_upload_s
    min_speech_s: float = _LIMITS.min_speech_s
    max_speech_s: float = _LIMITS.max_speech_s

    def __post_init__(self) -> None:
        _check_above("max_upload_mb", self.max_upload_mb, 0)
        _subset(Limits, self)


@dataclass(frozen=True)
class CacheConfig:
    dir: Path = Path("data/cache")
    prosody_mb: int = 512
    audio_mb: int = 1024
    reuse_random: bool = True  # serve one stored sample for random-seed requests (off: a fresh draw every time)

    def __post_init__(self) -> None:
        _check_at_least("prosody_mb", self.prosody_mb, 1)
        _check_at_least("audio_mb", self.audio_mb, 1)


@dataclass(frozen=True)
class RayConfig:
    """``ray:``: the synthesis replicas on Ray Serve, used when ``synthesis.backend`` is ``ray``.

    Each key's default and check are those of :class:`synthesis.cluster.options.ClusterOptions` (:attr:`options`).
    """

    address: str = _CLUSTER.address
    app_name: str = _CLUSTER.app_name
    num_replicas: int = _CLUSTER.num_replicas
    autoscaling: bool = _CLUSTER.autoscaling
    min_replicas: int = _CLUSTER.min_replicas
    max_replicas: int = _CLUSTER.max_replicas
    target_queue: float = _CLUSTER.target_queue
    upscale_delay_s: float = _CLUSTER.upscale_delay_s
    downscale_delay_s: float = _CLUSTER.downscale_delay_s
    scale_window_s: float = _CLUSTER.scale_window_s
    drain_timeout_s: float = _CLUSTER.drain_timeout_s
    cpus_per_replica: float = _CLUSTER.cpus_per_replica
    gpus_per_replica: float = _CLUSTER.gpus_per_replica
    max_queued_requests: int = _CLUSTER.max_queued_requests
    ready_timeout_s: float = _CLUSTER.ready_timeout_s
    storage: str = _CLUSTER.storage

    def __post_init__(self) -> None:
        self.options  # noqa: B018 - checked at load

    @property
    def options(self) -> ClusterOptions:
        return _subset(ClusterOptions, self)


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

    def __post_init__(self) -> None:
        _check_env_name("token_env", self.token_env)
        _check_url("api_base", self.api_base, ("http", "https"))
        _check_url("gateway_url", self.gateway_url, ("ws", "wss"))
        _check_at_least("guild_queue_size", self.guild_queue_size, 1)
        _check_at_least("max_message_chars", self.max_message_chars, 1)
        for name in ("idle_disconnect_s", "max_attachment_mb"):
            _check_above(name, getattr(self, name), 0)
        for name in ("alone_disconnect_s", "reconnect_wait_s", "guild_ready_timeout_s"):
            _check_above(name, getattr(self, name), 0, inclusive=True)


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
    # reverse proxies (addresses/CIDRs) whose X-Forwarded-For / Forwarded name the real client
    trusted_proxies: tuple[str, ...] = ()
    voice_aliases: dict[str, str] = field(default_factory=dict)  # client voice name (alloy...) -> stored voice
    default_voice: str = ""  # stored voice for unmapped OpenAI voice names; "" = the first voice by name
    idle_timeout_s: float = 15.0  # an idle keep-alive connection, or one slow to send its request head, is closed
    body_timeout_s: float = 30.0  # a request body must arrive within this
    ws_idle_timeout_s: float = 20.0  # a WebSocket whose client sends nothing this long ends its input
    # the HTTP API's pronunciation dictionary (JSON, synthesis.Lexicon's format; missing = empty), applied to every
    # HTTP request and edited through /pronunciations
    pronunciations: Path = Path("pronunciations.json")
    # folders whose audio files api_v2's ref_audio_path may name (with prompt_text), each encoded once and kept as a
    # voice; empty: ref_audio_path names stored voices only. Nothing outside these folders is ever read.
    reference_dirs: tuple[Path, ...] = ()
    tls_cert: Path | None = None  # PEM certificate (chain) to serve HTTPS/WSS natively; with tls_key
    tls_key: Path | None = None  # its PEM private key

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: set both (PEM certificate and its key) or neither")
        if not self.host.strip():
            raise ValueError("host must be an address to listen on, like 127.0.0.1 or 0.0.0.0, got ''")
        _check_at_least("port", self.port, 0)  # 0: any free port
        if self.port > 65535:
            raise ValueError(f"port must be from 0 to 65535, got {self.port}")
        _check_env_name("token_env", self.token_env)
        _check_at_least("max_body_kb", self.max_body_kb, 1)
        _check_at_least("max_text_chars", self.max_text_chars, 1)
        _check_at_least("rate_limit_per_min", self.rate_limit_per_min, 0)
        _check_choice("rate_limit_key", self.rate_limit_key, RATE_LIMIT_KEYS)
        for origin in self.cors_origins:
            if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
                raise ValueError(f"cors_origins: {origin!r} is not an origin like http://localhost:8000 (no path) "
                                 f"or *")
        for key, example in (("trusted_networks", "192.168.1.0/24"), ("trusted_proxies", "127.0.0.1")):
            for net in getattr(self, key):
                try:
                    ipaddress.ip_network(net, strict=False)
                except ValueError:
                    raise ValueError(f"{key}: {net!r} is not an address or network like {example}") from None
        for host in self.allowed_hosts:
            if not host.strip() or any(c in host for c in "/ "):
                raise ValueError(f"allowed_hosts: {host!r} is not a host name like tts.lan (or *)")
        for name in ("idle_timeout_s", "body_timeout_s", "ws_idle_timeout_s"):
            _check_above(name, getattr(self, name), 0)
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

    def __post_init__(self) -> None:
        _check_url("base_url", self.base_url, ("http", "https"))
        if not self.model.strip():
            raise ValueError("model must name the chat model as the endpoint knows it, got ''")
        _check_env_name("api_key_env", self.api_key_env)
        _check_at_least("memory_messages", self.memory_messages, 0)
        _check_above("timeout_s", self.timeout_s, 0)


@dataclass(frozen=True)
class Config:
    models: ModelsConfig = field(default_factory=ModelsConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    synthesis: SynthesisConfig = field(default_factory=SynthesisConfig)
    voices: VoicesConfig = field(default_factory=VoicesConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    phrases: tuple[str, ...] = ()
    discord: DiscordConfig = field(default_factory=DiscordConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    chat: ChatConfig = field(default_factory=ChatConfig)
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        object.__setattr__(self, "log_level", self.log_level.upper())  # logging knows the names in capitals
        for i, phrase in enumerate(self.phrases):
            if not phrase.strip():
                raise ValueError(f"phrases[{i}] is empty: remove it or write the phrase")
        _check_choice("log_level", self.log_level, LOG_LEVELS)

    @property
    def limits(self) -> Limits:
        """The pipeline's limits, from ``synthesis:`` and ``voices:`` (each checked at load)."""
        v = self.voices
        return _subset(Limits, self.synthesis, max_upload_bytes=int(v.max_upload_mb * MB),
                       max_upload_s=v.max_upload_s, min_speech_s=v.min_speech_s, max_speech_s=v.max_speech_s)

    def secret(self, env_name: str) -> str | None:
        """The value of a secret's environment variable, or None when unset/empty."""
        value = os.environ.get(env_name, "").strip()
        return value or None


_T = typing.TypeVar("_T")


def _subset(cls: type[_T], section: object, **extra: Any) -> _T:
    """``cls`` built from the fields of ``section`` that it shares (its own defaults for the rest)."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    shared = {f.name: getattr(section, f.name) for f in dataclasses.fields(section)  # type: ignore[arg-type]
              if f.name in names}
    return cls(**shared, **extra)


def _check_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{key} must be one of {', '.join(choices)}, got {value!r}")


def _check_at_least(key: str, value: int, lo: int) -> None:
    if value < lo:
        raise ValueError(f"{key} must be >= {lo}, got {value!r}")


def _check_above(key: str, value: float, lo: float, *, inclusive: bool = False) -> None:
    if not (math.isfinite(value) and (value >= lo if inclusive else value > lo)):
        raise ValueError(f"{key} must be a finite number {'>=' if inclusive else 'above'} {lo:g}, got {value!r}")


def _check_url(key: str, value: str, schemes: tuple[str, ...]) -> None:
    parsed = urllib.parse.urlsplit(value)
    if parsed.scheme not in schemes or not parsed.netloc:
        raise ValueError(f"{key} must be a {' or '.join(s + '://' for s in schemes)} URL, got {value!r}")


def _check_env_name(key: str, value: str) -> None:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        raise ValueError(f"{key} must name an environment variable (like DISCORD_TOKEN), got {value!r}")


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and check a config file; raise :class:`ConfigError` naming the bad key."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} not found: pass --config PATH or copy the shipped config.yaml")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {_yaml_problem(e)}") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path} cannot be read: {e}") from e
    return config_from_dict(raw or {}, base_dir=path.resolve().parent)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error in one line: where, and what (PyYAML's own text spans several lines)."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        context = f" ({e.context})" if e.context else ""
        return f"line {mark.line + 1}, column {mark.column + 1}: {e.problem}{context}"
    return " ".join(str(e).split())


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
    derived = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if "default_from" in f.metadata and raw.get(f.name) is None:  # absent or null: follows other keys
            derived.append(f)  # (models.gpt: the pretrained GPT of models.family)
        elif f.name in raw:
            values[f.name] = _coerce(tp, raw[f.name], f"{prefix}{f.name}", base_dir)
        elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
            values[f.name] = _build(tp, {}, f"{prefix}{f.name}.", base_dir)
        elif tp is Path and isinstance(f.default, Path):  # defaults are relative to the config file too
            values[f.name] = base_dir / f.default
    for f in derived:
        everything = {g.name: values.get(g.name, g.default) for g in dataclasses.fields(cls)}
        values[f.name] = f.metadata["default_from"](everything)
    try:
        return cls(**values)
    except ValueError as e:
        raise ConfigError(_dotted(cls, prefix, str(e))) from e


def _dotted(cls: type, prefix: str, message: str) -> str:
    """A section's check message with its key made dotted: "top_k must ..." -> "synthesis.top_k must ..."."""
    first = re.match(r"[A-Za-z_][A-Za-z0-9_]*", message)
    if first and first.group() in {f.name for f in dataclasses.fields(cls)}:
        return prefix + message
    return f"config section {prefix.rstrip('.') or '(top level)'}: {message}"


def _coerce(tp: Any, value: Any, key: str, base_dir: Path) -> Any:
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
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
