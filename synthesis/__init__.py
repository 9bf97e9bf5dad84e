"""The synthesis pipeline, numpy at its edges: text and audio in, 32 kHz float32 chunks out, one sentence at a time.

This is the surface the bot uses. The types and errors load with the package; the pipeline, the caches, the voice
store and the audio helpers load on first use (module ``__getattr__``), so that a module that only needs a type
(the config, the store) does not pay for the text front-end, PyAV and diskcache.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from engines import SAMPLE_RATE, EngineError, SpeechError
from synthesis.backend import SpeechBackend, VoiceMaker
from synthesis.types import (
    LANGUAGES,
    SPLIT_METHODS,
    AudioChunk,
    AudioInputError,
    AudioStream,
    BusyError,
    DeadlineError,
    Limits,
    SpeechSynthesizer,
    SynthesisParams,
    Voice,
    VoiceNotFound,
    to_pcm16,
)

if TYPE_CHECKING:
    from synthesis.audio import StreamEncoder, StreamResampler, encode_audio, read_upload_file, resample
    from synthesis.cache import SynthesisCache
    from synthesis.pipeline import Synthesizer
    from synthesis.cluster.client import RemoteSynthesizer, connect_cluster
    from synthesis.cluster.options import ClusterOptions
    from synthesis.scheduler import DeviceWorker
    from synthesis.text import (Lexicon, LexiconError, check_speakable, configure_frontend, explain_text, make_entry,
                                speakable_languages, text_to_phonemes)
    from synthesis.styles import style_named, with_style
    from synthesis.voices import VoiceError, VoiceStore, check_name

__all__ = [
    # the pipeline and what it is built from (bot/services.py wires them); a voice name's check, before any work
    "Synthesizer", "Limits", "DeviceWorker", "SynthesisCache", "VoiceStore", "check_name",
    # the same surface on Ray Serve replicas (synthesis.cluster; ray itself is imported only when one connects)
    "RemoteSynthesizer", "ClusterOptions", "connect_cluster",
    # what crosses the surface: per-call options, a voice, a chunk of audio and a request's stream of them
    "SynthesisParams", "Voice", "AudioChunk", "AudioStream", "LANGUAGES", "SPLIT_METHODS", "SAMPLE_RATE",
    # what the bot is typed against: a synthesizer whole (local or remote), its voice work, its speech alone
    "SpeechBackend", "VoiceMaker", "SpeechSynthesizer",
    # errors: the root, and the ones a front-end answers differently (busy, late, no such voice, a voice that
    # cannot be stored as asked, a bad upload)
    "SpeechError", "EngineError", "BusyError", "DeadlineError", "VoiceNotFound", "VoiceError", "AudioInputError",
    # audio at the edges: an upload read from disk (size checked first), resampling and encoding for Discord and
    # the HTTP formats
    "read_upload_file", "resample", "StreamResampler", "encode_audio", "StreamEncoder", "to_pcm16",
    # the text front-end on its own (text -> phone ids), which the benchmark times as part of the first audio
    "text_to_phonemes",
    # pronunciation dictionaries (guild, user, HTTP API) and the report of what will be said
    "Lexicon", "LexiconError", "make_entry", "explain_text",
    # the languages this build can read (packages found), checked before consent, downloads and model loads
    "speakable_languages", "check_speakable",
    # where the front-end finds upstream's optional files (dictionaries, G2PW), set from the config at start
    "configure_frontend",
    # a voice's named styles: one chosen by name (refused naming the styles it has), or found in free text
    "with_style", "style_named",
]

_LAZY = {  # name -> the module that defines it, imported on first use
    "Synthesizer": "synthesis.pipeline",
    "RemoteSynthesizer": "synthesis.cluster.client", "connect_cluster": "synthesis.cluster.client",
    "ClusterOptions": "synthesis.cluster.options",
    "DeviceWorker": "synthesis.scheduler",
    "SynthesisCache": "synthesis.cache", "VoiceStore": "synthesis.voices", "check_name": "synthesis.voices",
    "VoiceError": "synthesis.voices",
    "read_upload_file": "synthesis.audio", "resample": "synthesis.audio", "StreamResampler": "synthesis.audio",
    "encode_audio": "synthesis.audio", "StreamEncoder": "synthesis.audio",
    "text_to_phonemes": "synthesis.text",
    "Lexicon": "synthesis.text", "LexiconError": "synthesis.text", "make_entry": "synthesis.text",
    "explain_text": "synthesis.text", "speakable_languages": "synthesis.text", "check_speakable": "synthesis.text",
    "configure_frontend": "synthesis.text",
    "with_style": "synthesis.styles", "style_named": "synthesis.styles",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
