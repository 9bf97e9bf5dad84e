"""The process: CLI, config, the discord.py client, per-guild speakers, the SQLite store, HTTP API, chat client.

This is the surface the cogs use: the client and the services it carries, the speech service with the refusals a
command answers, the chat client, and the settings tables. Every name loads on first use (module ``__getattr__``),
so ``import bot.config`` (the CLI, the HTTP server, the tests) does not import discord.py.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bot.chat import ChatClient, ChatError
    from bot.client import VoiceBot
    from bot.config import config_from_dict
    from bot.http import start_server
    from bot.pronunciations import PronunciationFile, Pronunciations, explain_phonemes, format_explanation
    from bot.services import Services, build_synthesizer
    from bot.speaker import NotInVoice
    from bot.speech import NoVoice, SpeechService
    from bot.store import GUILD_SETTINGS, USER_SETTINGS, SettingDef, setting_def

__all__ = [
    # the client and the services injected into it
    "VoiceBot", "Services",
    # speaking in a guild, and the refusals a command turns into a reply
    "SpeechService", "NoVoice", "NotInVoice",
    # the chat model
    "ChatClient", "ChatError",
    # the guild and user settings /settings and /set work with
    "GUILD_SETTINGS", "USER_SETTINGS", "SettingDef", "setting_def",
    # pronunciation dictionaries (guild and user in the store, the HTTP API's file) and what will be said
    "Pronunciations", "PronunciationFile", "explain_phonemes", "format_explanation",
    # the process's parts built from a config, for the tools beside it (the benchmarks): a config from a dict, the
    # synthesizer, the HTTP API on a port
    "config_from_dict", "build_synthesizer", "start_server",
]

_LAZY = {  # name -> the module that defines it, imported on first use
    "VoiceBot": "bot.client", "Services": "bot.services",
    "SpeechService": "bot.speech", "NoVoice": "bot.speech", "NotInVoice": "bot.speaker",
    "ChatClient": "bot.chat", "ChatError": "bot.chat",
    "config_from_dict": "bot.config", "build_synthesizer": "bot.services", "start_server": "bot.http",
    "GUILD_SETTINGS": "bot.store", "USER_SETTINGS": "bot.store", "SettingDef": "bot.store", "setting_def": "bot.store",
    "Pronunciations": "bot.pronunciations", "PronunciationFile": "bot.pronunciations",
    "explain_phonemes": "bot.pronunciations", "format_explanation": "bot.pronunciations",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
