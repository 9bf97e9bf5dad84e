"""ElevenLabs' text-to-speech over plain HTTP: ``POST /v1/text-to-speech/{voice}/stream``,
``/v1/text-to-speech/{voice}/stream/with-timestamps`` and ``/v1/text-to-speech/{voice}`` (LiveKit's
``synthesize()``, Pipecat's ``ElevenLabsHttpTTSService``, the official SDK's ``text_to_speech.stream`` and
``convert``).

``{voice}`` as in the WebSocket doors (a stored voice's name or id, or an ``http.voice_aliases`` entry); the key in
``xi-api-key``. Query: ``output_format`` (the WebSocket doors' formats, default ``mp3_44100_128``), and, accepted
without effect, ``enable_logging`` and ``optimize_streaming_latency``; any other parameter is a 400. Body (JSON):
``text`` (required), ``language_code``, ``seed``, ``voice_settings``, read by the WebSocket doors' one rule
(``bot.http.elevenlabs.settings_effect``: ``speed`` sets the rate; ``style`` as a string names one of the voice's
styles, e.g. ``"calm"``, a 400 when it has none so named; ElevenLabs' own numeric ``style``, ``stability``,
``similarity_boost`` and ``use_speaker_boost`` are checked, have no effect and are named in
``X-Voicebot-Ignored``, e.g. ``voice_settings.style``); ElevenLabs' other fields
(``model_id``, ``previous_text``, ``pronunciation_dictionary_locators``...) are accepted without effect.
``/stream`` sends the audio as it is synthesized (chunked); ``/stream/with-timestamps`` sends it as JSON lines
``{"audio_base64", "alignment": null, "normalized_alignment": null}`` (no character timings are computed); the
plain route answers once complete. Errors come as
ElevenLabs' ``{"detail": {"status", "message"}}``.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pydantic
from aiohttp import web

from bot.http import elevenlabs
from bot.http.api_v2 import (MAX_SEED, base_params, check_chars, check_text, make_params, read_json_object,
                             refuse_bool)
from bot.http.guard import QUERY_CREDENTIALS
from bot.http.openai_speech import resolve_voice
from bot.http.responses import say_ignored, services_of, stream_audio, validate_body, voices_of, whole_audio
from bot.http.stream_input import refuse_unknown

PARAMETERS = ("output_format", "enable_logging", "optimize_streaming_latency") + QUERY_CREDENTIALS
# encoder format -> the Content-Type ElevenLabs answers with
CONTENT_TYPES = {"mp3": "audio/mpeg", "pcm": "audio/pcm", "ulaw": "audio/basic", "alaw": "audio/x-alaw-basic",
                 "opus": "audio/ogg; codecs=opus"}
G711 = ("ulaw", "alaw")
_Unit = pydantic.Field(None, ge=0.0, le=1.0, allow_inf_nan=False)


class _VoiceSettings(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    @pydantic.field_validator("stability", "similarity_boost", "style", "speed", mode="before")
    @classmethod
    def _no_bool(cls, value: Any) -> Any:
        return refuse_bool(value)

    @pydantic.field_validator("style")
    @classmethod
    def _unit_or_name(cls, value: float | str | None) -> float | str | None:
        if isinstance(value, float) and not 0.0 <= value <= 1.0:
            raise ValueError("style is a number from 0 to 1, or the name of one of the voice's styles")
        return value

    stability: float | None = _Unit
    similarity_boost: float | None = _Unit
    style: float | str | None = None  # a number 0-1 (ElevenLabs'), or the name of one of the voice's styles
    use_speaker_boost: bool | None = None
    speed: float | None = pydantic.Field(None, ge=0.25, le=4.0, allow_inf_nan=False)


class SpeechBody(pydantic.BaseModel):
    """The fields of ElevenLabs' text-to-speech body that change what is said or how."""

    model_config = pydantic.ConfigDict(extra="ignore")

    text: str
    language_code: str | None = None
    seed: int | None = pydantic.Field(None, ge=-1, le=MAX_SEED)
    voice_settings: _VoiceSettings | None = None

    @pydantic.field_validator("seed", mode="before")
    @classmethod
    def _no_bool(cls, value: Any) -> Any:
        return refuse_bool(value)


def _timestamp_line(data: bytes) -> bytes:
    """One line of ``/stream/with-timestamps``: the audio in base64; no alignment is computed here."""
    line = {"audio_base64": base64.b64encode(data).decode("ascii"), "alignment": None, "normalized_alignment": None}
    return json.dumps(line).encode() + b"\n"


async def _speech(request: web.Request, *, streamed: bool, timestamps: bool = False) -> web.StreamResponse:
    services = services_of(request)
    config = services.config
    refuse_unknown(request.query, PARAMETERS, "ElevenLabs' text-to-speech here")
    fmt, rate = elevenlabs.output_format(request.query.get("output_format"))
    body = validate_body(SpeechBody, await read_json_object(request))
    text = check_text(check_chars(body.text, "text"), config)
    base = base_params(config, services)
    changes: dict[str, Any] = {"language": elevenlabs.language_of(body.language_code, base.language)}
    if body.seed is not None:
        changes["seed"] = body.seed
    voice = await resolve_voice(voices_of(services), config.http, request.match_info["voice"])
    if body.voice_settings is not None:
        chosen, ignored = elevenlabs.settings_effect(voice, body.voice_settings.model_dump())
        changes.update(chosen)
        for name in ignored:
            say_ignored(request, name)
    params = make_params(base, **changes)
    chunks = services.synthesizer.stream(text, voice, params)
    if timestamps:
        return await stream_audio(request, chunks, fmt, sample_rate=rate, content_type="application/json",
                                  wrap=_timestamp_line)
    if streamed or fmt in G711:  # G.711 has no file encoder: its bytes are the same streamed or whole
        return await stream_audio(request, chunks, fmt, sample_rate=rate, content_type=CONTENT_TYPES[fmt])
    return await whole_audio(request, chunks, fmt, sample_rate=rate, content_type=CONTENT_TYPES[fmt])


async def _stream(request: web.Request) -> web.StreamResponse:
    return await _speech(request, streamed=True)


async def _convert(request: web.Request) -> web.StreamResponse:
    return await _speech(request, streamed=False)


async def _stream_with_timestamps(request: web.Request) -> web.StreamResponse:
    return await _speech(request, streamed=True, timestamps=True)


def add_routes(app: web.Application) -> None:
    """Register the POST routes."""
    app.router.add_post("/v1/text-to-speech/{voice}/stream", _stream, name="elevenlabs:stream")
    app.router.add_post("/v1/text-to-speech/{voice}/stream/with-timestamps", _stream_with_timestamps,
                        name="elevenlabs:stream_with_timestamps")
    app.router.add_post("/v1/text-to-speech/{voice}", _convert, name="elevenlabs:convert")
