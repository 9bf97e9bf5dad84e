"""Building the long-lived services once, from the config, for every entry point (bot, HTTP API, CLI)."""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bot.config import MB, Config, ModelsConfig
from bot.downloads import G2PW_DIR, TEXT_DIR, english_installed, g2pw_installed
from bot.pronunciations import PronunciationFile
from bot.voice_service import VoiceService
from engines import load_engine
from synthesis import SpeechBackend, SynthesisParams, Synthesizer, connect_cluster
from synthesis.cache import SynthesisCache
from synthesis.cache_lane import CacheLane, SpeechCache
from synthesis.scheduler import DeviceWorker
from synthesis.text import configure_frontend
from synthesis.voices import VoiceStore

if TYPE_CHECKING:
    from bot.chat import ChatClient
    from bot.speech import SpeechService
    from bot.store import Store
    from synthesis.cluster.client import RemoteSynthesizer

log = logging.getLogger(__name__)


@dataclass
class Services:
    config: Config
    synthesizer: SpeechBackend  # local (the engine here) or remote (Ray Serve replicas): the bot sees no difference
    store: "Store | None" = None
    speech: "SpeechService | None" = None
    chat: "ChatClient | None" = None  # only when config.chat.enabled
    voices: VoiceService | None = None  # a voice's life (create, share, delete, forget-me); with the store
    pronunciations: PronunciationFile | None = None  # the HTTP API's dictionary (http.pronunciations)

    def __post_init__(self) -> None:
        if self.pronunciations is None:
            self.pronunciations = PronunciationFile(self.config.http.pronunciations)
        if self.voices is None:  # without a store (the HTTP API alone) it only reads voices
            self.voices = VoiceService(self.store, self.synthesizer, phrases=self.config.phrases)


def default_params(config: Config) -> SynthesisParams:
    """The server's default per-request options (config ``synthesis:``, checked at load)."""
    return config.synthesis.params


def build_synthesizer(config: Config) -> SpeechBackend:
    """Load the engine (models from config), start its device worker, open the voice store and caches.

    With ``synthesis.backend: ray`` the engine runs on Ray Serve replicas instead (each replica builds its own
    local synthesizer with :func:`build_local_synthesizer`), and this returns the client that stands in for it:
    :class:`synthesis.cluster.client.RemoteSynthesizer`, with the same surface (:class:`synthesis.SpeechBackend`).
    """
    if config.synthesis.backend == "ray":
        return connect_replicas(config)
    return build_local_synthesizer(config)


def connect_replicas(config: Config, replicas: Config | None = None) -> RemoteSynthesizer:
    """Attach to (or deploy) the synthesis replicas of ``config.ray`` and return their client.

    ``replicas``: the config the replicas build from, when not ``config`` (with ``ray.storage: served`` they never
    open its ``voices.dir`` and ``cache.dir``, as on a machine without them).
    """
    configure_text_files(config.models)  # this process reads text too (voices' transcripts, `phonemes`)
    options = config.ray.options
    replica_config = replicas or config
    if replica_config.engine.threads == 0:  # "every core" means the replica's share of the node's cores
        threads = max(1, int(options.cpus_per_replica))
        replica_config = dataclasses.replace(replica_config,
                                             engine=dataclasses.replace(replica_config.engine, threads=threads))
    return connect_cluster(functools.partial(build_local_synthesizer, replica_config),
                           functools.partial(open_stores, config), options, defaults=config.synthesis.params,
                           limits=config.limits)


def open_stores(config: Config) -> tuple[VoiceStore, SynthesisCache]:
    """The voice store of ``voices.dir`` and the caches of ``cache.dir``, opened in this process."""
    cache = SynthesisCache(config.cache.dir, config.cache.prosody_mb * MB, config.cache.audio_mb * MB,
                           reuse_random=config.cache.reuse_random)
    return VoiceStore(config.voices.dir, cache=cache), cache


def build_local_synthesizer(config: Config, stores: tuple[VoiceStore, SpeechCache] | None = None) -> Synthesizer:
    """The engine and its device worker in this process, around ``stores`` (default: :func:`open_stores`, its caches
    on a thread of their own; a Ray replica passes its own, see ``synthesis.cluster``)."""
    configure_text_files(config.models)  # here, so that a Ray replica's process configures its own front-end
    engine = load_engine(config.engine, config.models)
    if stores is None:
        voices, storage = open_stores(config)
        stores = voices, CacheLane(storage)
    voices, cache = stores
    worker = DeviceWorker(engine)  # its threads own the engine from here on
    return Synthesizer(worker, voices, cache, defaults=config.synthesis.params, limits=config.limits)


def configure_text_files(models: ModelsConfig) -> None:
    """Point this process's text front-end at the optional files ``models download`` put under ``models.dir``.

    Each part is used where it is complete and ``models.frontend_assets`` is on; else it falls back to its
    environment variable, else to the data of the front-end's packages (speech never needs these files).
    """
    english, g2pw = models.dir / TEXT_DIR, models.dir / G2PW_DIR
    use_english = models.frontend_assets and english_installed(english)
    use_g2pw = models.frontend_assets and g2pw_installed(g2pw)
    configure_frontend(english if use_english else None, g2pw if use_g2pw else None, models.bert)
    off = "off (models.frontend_assets)" if not models.frontend_assets else "not installed"
    log.info("text front-end: upstream's English dictionaries %s, G2PW %s", "used" if use_english else off,
             "used" if use_g2pw else off)
