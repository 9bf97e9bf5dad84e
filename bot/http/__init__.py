"""The local HTTP API: GPT-SoVITS api_v2, SillyTavern, OpenAI speech, the stream-input WebSockets (ours and
ElevenLabs'), metrics.

Every protocol is a thin adapter onto ``Synthesizer.stream``: one pipeline, many doors.
"""

from __future__ import annotations

from bot.http.app import create_app, start_server

__all__ = ["create_app", "start_server"]
