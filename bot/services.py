"""Building the long-lived services once, from the config, for every entry point (bot, HTTP API, CLI)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.config import MB, Config
from bot.voice_service import VoiceService
from engines import load_engine
from synthesis import DeviceWorker, SynthesisCache, SynthesisParams, Synthesizer, VoiceStore

if TYPE_CHECKING:
    from bot.chat import ChatClient
    from bot.speech import SpeechService
    from bot.store import Store

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
    """Load the engine (models from config), start its device worker, open the voice store and caches."""
    engine = load_engine(config.engine, config.models)
    cache = SynthesisCache(config.cache.dir, config.cache.prosody_mb * MB, config.cache.audio_mb * MB,
                           reuse_random=config.cache.reuse_random)
    voices = VoiceStore(config.voices.dir, cache=cache)
    worker = DeviceWorker(engine)  # its threads own the engine from here on
    return Synthesizer(worker, voices, cache, defaults=config.synthesis.params, limits=config.limits)
