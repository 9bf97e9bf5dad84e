"""OpenAI's speech API: ``POST /v1/audio/speech``, ``GET /v1/models``, ``GET /v1/audio/voices``.

A client built for OpenAI's TTS works by pointing its base URL here (its API key is the bearer token, when one is
set). ``voice`` names a stored voice (name or id; also ``{"id": ...}``). Audio is always streamed as it is
synthesized, as OpenAI's endpoint does; ``pcm`` is 24 kHz signed 16-bit little-endian like OpenAI's, the other
formats carry their rate (32 kHz) in their headers. ``stream_format: "sse"`` sends ``speech.audio.delta`` events
(base64 of the encoded bytes) and a final ``speech.audio.done``. ``instructions`` is accepted and has no effect
(the voice's own reference sets the style). Extensions: ``language`` (default from config) and ``seed``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bot.http.api_v2 import (MAX_SEED, ParamReader, base_params, check_text, lookup_voice, make_params,
                             read_json_object, voice_catalog, voice_names)
from bot.http.responses import METRICS, ApiError, services_of, stream_audio
from synthesis.types import LANGUAGES

MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-sovits-v2")  # all run the same loaded model
RESPONSE_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
PCM_RATE = 24000  # Hz, OpenAI's raw PCM rate
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg; codecs=opus", "aac": "audio/aac", "flac": "audio/flac",
                 "wav": "audio/wav", "pcm": "audio/pcm"}


async def _speech(request: web.Request) -> web.StreamResponse:
    services = services_of(request)
    config, synth = services.config, services.synthesizer
    r = ParamReader(await read_json_object(request))
    r.string("model", MODELS[0], choices=MODELS)
    text = check_text(r.string("input", hint="the text to speak"), config, name="input")
    voice = _voice(synth, r.raw("voice"))
    fmt = r.string("response_format", "mp3", choices=RESPONSE_FORMATS, lower=True)
    sse = r.string("stream_format", "audio", choices=("audio", "sse"), lower=True) == "sse"
    r.string("instructions", "")
    base = base_params(config)
    params = make_params(base, speed=r.number("speed", 1.0, lo=0.25, hi=4.0),
                         language=r.string("language", base.language, choices=LANGUAGES, lower=True),
                         seed=r.integer("seed", base.seed, lo=-1, hi=MAX_SEED))
    chunks = synth.stream(text, voice, params)
    return await stream_audio(request, chunks, fmt, sample_rate=PCM_RATE if fmt == "pcm" else None,
                              content_type=CONTENT_TYPES[fmt], sse=sse)


def _voice(synth: Any, value: Any) -> Any:
    """``voice`` (a name/id string, or an object with ``id``) -> a stored voice, else 400."""
    if isinstance(value, dict):
        value = value.get("id")
    if value is None:
        raise ApiError(400, f"voice is required: {voice_names(synth)}")
    if not isinstance(value, str):
        raise ApiError(400, f"voice must be a voice name; got {value!r}")
    voice = lookup_voice(synth, value)
    if voice is None:
        raise ApiError(400, f"voice {value!r} does not exist; {voice_names(synth)}")
    return voice


async def _models(request: web.Request) -> web.Response:
    created = int(request.app[METRICS].started)
    return web.json_response({"object": "list", "data": [
        {"id": m, "object": "model", "created": created, "owned_by": "voicebot"} for m in MODELS]})


async def _voices(request: web.Request) -> web.Response:
    synth = services_of(request).synthesizer
    return web.json_response({"voices": [
        {"id": key, "name": display, "language": v.language} for key, display, v in voice_catalog(synth)]})


def add_routes(app: web.Application) -> None:
    """Register the OpenAI-compatible routes under ``/v1``."""
    app.router.add_post("/v1/audio/speech", _speech, name="openai:speech")
    app.router.add_get("/v1/models", _models, name="openai:models")
    app.router.add_get("/v1/audio/voices", _voices, name="openai:voices")
