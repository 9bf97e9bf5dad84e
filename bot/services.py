"""Building the long-lived services once, from the config, for every entry point (bot, HTTP API, CLI)."""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.config import MB, Config
from bot.voice_service import VoiceService
from engines import load_engine
from synthesis import DeviceWorker, SynthesisCache, SynthesisParams, Synthesizer, VoiceStore, connect_cluster

if TYPE_CHECKING:
    from bot.chat import ChatClient
    from bot.speech import SpeechService
    from bot.store import Store
    from synthesis import RemoteSynthesizer

log = logging.getLogger(__name__)


@dataclass
class Services:
    config: Config
    synthesizer: Synthesizer
    store: "Store | None" = None
    speech: "SpeechService | None" = None
    chat: "ChatClient | None" = None  # only when config.chat.enabled
    voices: VoiceService | None = None  # a voice's life (create, share, delete, forget-me); with the store

    def __post_init__(self) -> None:
        if self.voices is None:  # without a store (the HTTP API alone) it only reads voices
            self.voices = VoiceService(self.store, self.synthesizer, phrases=self.config.phrases)


def default_params(config: Config) -> SynthesisParams:
    """The server's default per-request options (config ``synthesis:``, checked at load)."""
    return config.synthesis.params


def build_synthesizer(config: Config) -> Synthesizer:
    """Load the engine (models from config), start its device worker, open the voice store and caches.

    With ``synthesis.backend: ray`` the engine runs on Ray Serve replicas instead (each replica builds its own
    local synthesizer with :func:`build_local_synthesizer`), and this returns the client that stands in for it:
    :class:`synthesis.RemoteSynthesizer`, with the same surface.
    """
    if config.synthesis.backend == "ray":
        return connect_replicas(config)  # type: ignore[return-value]
    return build_local_synthesizer(config)


def connect_replicas(config: Config) -> RemoteSynthesizer:
    """Attach to (or deploy) the synthesis replicas of ``config.ray`` and return their client."""
    options = config.ray.options
    replica_config = config
    if config.engine.threads == 0:  # "every core" means the replica's share of the node's cores
        threads = max(1, int(options.cpus_per_replica))
        replica_config = dataclasses.replace(config, engine=dataclasses.replace(config.engine, threads=threads))
    cache = SynthesisCache(config.cache.dir, config.cache.prosody_mb * MB, config.cache.audio_mb * MB,
                           reuse_random=config.cache.reuse_random)
    voices = VoiceStore(config.voices.dir, cache=cache)
    return connect_cluster(functools.partial(build_local_synthesizer, replica_config), options, voices=voices, cache=cache,
                   defaults=config.synthesis.params, limits=config.limits)


def build_local_synthesizer(config: Config) -> Synthesizer:
    """The engine, its device worker, the voice store and the caches, in this process."""
    engine = load_engine(config.engine, config.models)
    cache = SynthesisCache(config.cache.dir, config.cache.prosody_mb * MB, config.cache.audio_mb * MB,
                           reuse_random=config.cache.reuse_random)
    voices = VoiceStore(config.voices.dir, cache=cache)
    worker = DeviceWorker(engine)  # its threads own the engine from here on
    return Synthesizer(worker, voices, cache, defaults=config.synthesis.params, limits=config.limits)
