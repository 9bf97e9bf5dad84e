"""The process: CLI, config, the discord.py client, per-guild speakers, the SQLite store, HTTP API, chat client.

The face is what the cogs need: the client and the services it carries, and what they name from the layers below (the
error root, a voice, the refusals and checks of voice names and languages), so that a cog imports ``bot`` and nothing
under it. The rest is imported from the module that owns it: :mod:`bot.speech` (speaking in a guild),
:mod:`bot.autoread` (which messages are read aloud), :mod:`bot.chat`, :mod:`bot.store` (the settings tables),
:mod:`bot.pronunciations`, :mod:`bot.config`, :mod:`bot.services`, :mod:`bot.http`. Every name loads on first use,
so ``import bot.config`` (the CLI, the HTTP server, the tests) does not import discord.py or the voice store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engines.lazy import lazy_face

if TYPE_CHECKING:
    from bot.client import VoiceBot
    from bot.services import Services
    from synthesis import SpeechError, Voice
    from synthesis.text import speakable_languages
    from synthesis.types import VoiceNotFound
    from synthesis.voices import VoiceError, check_name

__all__ = [
    # the client and the services injected into it
    "VoiceBot", "Services",
    # what a cog names from below: the error root, a voice, no such voice, a voice that cannot be stored as asked, a
    # voice name's check, the languages this build can read
    "SpeechError", "Voice", "VoiceNotFound", "VoiceError", "check_name", "speakable_languages",
]

__getattr__, __dir__ = lazy_face(__name__, __all__, {
    "bot.client": ["VoiceBot"], "bot.services": ["Services"], "synthesis": ["SpeechError", "Voice"],
    "synthesis.types": ["VoiceNotFound"], "synthesis.voices": ["VoiceError", "check_name"],
    "synthesis.text": ["speakable_languages"]})
