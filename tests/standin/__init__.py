"""A local Discord stand-in for end-to-end tests: an unmodified discord.py client logs in to it."""

from __future__ import annotations

from .server import GuildLayout, Standin, StandinError
from .voice_udp import RtpPacket, VoiceRecording

__all__ = ["GuildLayout", "RtpPacket", "Standin", "StandinError", "VoiceRecording"]
