"""Building the long-lived services once, from the config, for every entry point (bot, HTTP API, CLI)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.config import Config
from bot.voice_service import VoiceService
from engines import load_engine
from synthesis import DeviceWorker, Limits, SynthesisCache, SynthesisParams, Synthesizer, VoiceStore

if TYPE_CHECKING:
    from bot.chat import ChatClient
    from bot.speech import SpeechService
    from bot.store import Store

log = logging.getLogger(__name__)

MB = 1024 * 1024  # bytes


@dataclass
class Services:
    config: Config
    synthesizer: Synthesizer
    store: "Store | None" = None
    speech: "SpeechService | None" = None
    chat: "ChatClient | None" = None  # only when config.chat.enabled
    voices: VoiceService | None = None  # a voice's life (create, share, delete, forget-me); with the store

    def __post_init__(self) -> None:
        if self.voices is None and self.store is not None:
            self.voices = VoiceService(self.store, self.synthesizer, phrases=self.config.phrases)


def default_params(config: Config) -> SynthesisParams:
    s = config.synthesis
    return SynthesisParams(language=s.language, top_k=s.top_k, top_p=s.top_p, temperature=s.temperature,
                           repetition_penalty=s.repetition_penalty, speed=s.speed, noise_scale=s.noise_scale,
                           seed=s.seed, split_method=s.split_method, fragment_interval=s.fragment_interval)


def build_synthesizer(config: Config) -> Synthesizer:
    """Load the engine (models from config), start its device worker, open the voice store and caches."""
    engine = load_engine(config.engine, config.models)
    cache = SynthesisCache(config.cache.dir, config.cache.prosody_mb * MB, config.cache.audio_mb * MB,
                           reuse_random=config.cache.reuse_random)
    voices = VoiceStore(config.voices.dir, cache=cache)
    s, v = config.synthesis, config.voices
    limits = Limits(queue_size=s.queue_size, deadline_s=s.deadline_s, stream_pause_s=s.stream_pause_s,
                    stream_max_chars=s.stream_max_chars, max_text_chars=s.max_text_chars,
                    first_chunk_tokens=s.first_chunk_tokens,
                    max_upload_bytes=int(v.max_upload_mb * MB), max_upload_s=v.max_upload_s,
                    min_speech_s=v.min_speech_s, max_speech_s=v.max_speech_s)
    worker = DeviceWorker(engine)  # its threads own the engine from here on
    return Synthesizer(worker, voices, cache, defaults=default_params(config), limits=limits)
