"""Slash commands, context menus and listeners: parse, check permissions, reply, one call into ``bot/``.

``EXTENSIONS`` lists the discord.py extensions :class:`bot.client.VoiceBot` loads, in order.
"""

from __future__ import annotations

__all__ = ("EXTENSIONS",)

EXTENSIONS: tuple[str, ...] = (
    "cogs.speech",  # /join /leave /say /skip /clear, auto-read, "Speak with my voice"
    "cogs.voices",  # /voice ..., /forget-me
    "cogs.settings",  # /settings, /set guild, /set user
    "cogs.phrases",  # /phrases add|list|remove
    "cogs.pronounce",  # /pronounce add|remove|list|check|export|import
    "cogs.chat",  # /ask prompt|reset, answering mentions (chat model)
    "cogs.blocks",  # /block add|remove|list
    "cogs.stats",  # /stats
    "cogs.help",  # /help
)
