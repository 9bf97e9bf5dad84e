"""The text front-end's error type."""

from __future__ import annotations

from engines import SpeechError


class TextError(SpeechError):
    """Text cannot be turned into phones (empty, or a language we cannot handle); the message says what to do."""
