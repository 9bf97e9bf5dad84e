"""OpenAI's speech API: ``POST /v1/audio/speech``, ``GET /v1/models``, ``GET /v1/audio/models``,
``GET /v1/audio/voices``.

A client built for OpenAI's TTS works by pointing its base URL here (its API key is the bearer token, when one is
set). ``model`` may be any name (every name runs the one loaded model; ``/v1/models`` lists what is served).
``voice`` names a stored voice (name or id; also ``{"id": ...}``), or a name mapped by ``http.voice_aliases``;
OpenAI's own voice names (``alloy``, ``ash``, ... the defaults of Open WebUI, LiveKit and Pipecat) that are not
mapped speak in ``http.default_voice`` (default: the first stored voice by name). Audio is always streamed as it
is synthesized, as OpenAI's endpoint does: ``wav`` carries 0xFFFFFFFF sizes as OpenAI's does (read to the end),
``flac`` is sent once complete so its header holds the length, ``pcm`` is 24 kHz signed 16-bit little-endian like
OpenAI's, the other formats carry their rate (32 kHz) in their headers. ``stream_format: "sse"`` sends
``speech.audio.delta`` events (base64 of the encoded bytes) and a final ``speech.audio.done`` with ``usage``.
``instructions`` that name one of the voice's styles ("calm", "style: calm") speak in that style; other
instructions have no effect, and the response says so in ``X-Voicebot-Ignored: instructions``. Extensions:
``language`` (default from config) and ``seed``. ``/v1/audio/voices`` also says, per voice, whether it has a
transcript and which seconds of its upload its reference is (``reference``: ``start_s``, ``end_s``, ``clip_s``,
``left_out_s``, and ``kept``, the line its maker was told when speech was left out), how many clips its timbre
averages (``clips``) and its named ``styles``.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import pydantic
from aiohttp import web

from bot.http.api_v2 import (MAX_SEED, base_params, check_chars, check_text, lookup_voice, make_params,
                             read_json_object, refuse_bool, voice_catalog, voice_names)
from bot.http.responses import (METRICS, ApiError, say_ignored, services_of, stream_audio, validate_body,
                                voices_of)
from synthesis import Voice
from synthesis.styles import style_named
from synthesis.types import LANGUAGES

log = logging.getLogger(__name__)

MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-sovits-v2")  # listed; any name runs the same model
RESPONSE_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
# OpenAI's built-in voices: clients default to them (Open WebUI and Pipecat "alloy", LiveKit "ash")
OPENAI_VOICES = ("alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage",
                 "shimmer", "verse")
PCM_RATE = 24000  # Hz, OpenAI's raw PCM rate
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg; codecs=opus", "aac": "audio/aac", "flac": "audio/flac",
                 "wav": "audio/wav", "pcm": "audio/pcm"}


class _VoiceRef(pydantic.BaseModel):
    id: str


class SpeechRequest(pydantic.BaseModel):
    """The body of ``POST /v1/audio/speech`` (OpenAI's fields, plus ``language`` and ``seed``)."""

    model_config = pydantic.ConfigDict(extra="ignore", str_strip_whitespace=True)

    model: str = "tts-1"
    input: str
    voice: str | _VoiceRef | None = None
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = pydantic.Field(1.0, ge=0.25, le=4.0, allow_inf_nan=False)
    stream_format: Literal["audio", "sse"] = "audio"
    instructions: str = ""
    language: str | None = None
    seed: int | None = pydantic.Field(None, ge=-1, le=MAX_SEED)

    @pydantic.field_validator("speed", "seed", mode="before")
    @classmethod
    def _no_bool(cls, value: Any) -> Any:
        return refuse_bool(value)

    @pydantic.field_validator("response_format", "stream_format", "language", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value


async def _speech(request: web.Request) -> web.StreamResponse:
    services = services_of(request)
    config, synth = services.config, services.synthesizer
    body = validate_body(SpeechRequest, await read_json_object(request))
    text = check_text(check_chars(body.input, "input"), config, name="input")
    voice = await resolve_voice(voices_of(services), config.http, body.voice.id if isinstance(body.voice, _VoiceRef) else body.voice)
    base = base_params(config, services)
    language = body.language or base.language
    if language not in LANGUAGES:
        raise ApiError(400, f"language must be one of {', '.join(LANGUAGES)}; got {body.language!r}")
    style = style_named(voice, body.instructions) if body.instructions.strip() else ""
    if style is None:
        say_ignored(request, "instructions")
    params = make_params(base, speed=body.speed, language=language,
                         seed=base.seed if body.seed is None else body.seed, style=style or "")
    fmt = body.response_format
    chunks = synth.stream(text, voice, params)
    return await stream_audio(request, chunks, fmt, sample_rate=PCM_RATE if fmt == "pcm" else None,
                              content_type=CONTENT_TYPES[fmt], sse=body.stream_format == "sse",
                              wav_size_unknown=True, usage_text=text)


async def resolve_voice(voices: Any, http: Any, value: str | None) -> Voice:
    """A client's voice name -> a stored voice: the name or id itself, then ``http.voice_aliases``, then (for
    OpenAI's built-in names) ``http.default_voice`` or the first stored voice by name; else a 400."""
    if value is None or not value.strip():
        raise ApiError(400, f"voice is required: {await voice_names(voices)}")
    check_chars(value, "voice")
    voice = await lookup_voice(voices, value)
    if voice is not None:
        return voice
    aliases = {k.strip().lower(): v for k, v in http.voice_aliases.items()}
    target = aliases.get(value.strip().lower())
    if target is not None:
        voice = await lookup_voice(voices, target)
        if voice is None:
            raise ApiError(400, f"http.voice_aliases maps {value!r} to {target!r}, which is not a stored voice: "
                                f"fix the alias; {await voice_names(voices)}")
        return voice
    if value.strip().lower() in OPENAI_VOICES:
        if http.default_voice:
            voice = await lookup_voice(voices, http.default_voice)
            if voice is None:
                raise ApiError(400, f"http.default_voice {http.default_voice!r} is not a stored voice: fix it; "
                                    f"{await voice_names(voices)}")
            return voice
        catalog = await voice_catalog(voices)
        if catalog:
            log.debug("OpenAI voice %r -> %s (the first stored voice; set http.default_voice)", value,
                      catalog[0][2].name)
            return catalog[0][2]
    raise ApiError(400, f"voice {value!r} does not exist; {await voice_names(voices)} (or map it in http.voice_aliases)")


def _model_list(request: web.Request) -> list[dict[str, Any]]:
    created = int(request.app[METRICS].started)
    return [{"id": m, "object": "model", "created": created, "owned_by": "voicebot"} for m in MODELS]


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": _model_list(request)})


async def _audio_models(request: web.Request) -> web.Response:
    # Open WebUI's audio router asks for {"models": [{"id": ...}]}
    return web.json_response({"models": _model_list(request)})


async def _voices(request: web.Request) -> web.Response:
    voices = voices_of(services_of(request))
    catalog = await voice_catalog(voices)
    references = await voices.references([v.id for _, _, v in catalog])
    return web.json_response({"voices": [
        {"id": key, "name": display, "language": v.language, "transcript": bool(v.prompt_text),
         "reference": _described(references.get(v.id, {})), "clips": 1 if v.clip_ges is None else len(v.clip_ges),
         "styles": sorted(st.name for st in v.styles.values())} for key, display, v in catalog]})


def _described(reference: dict[str, Any]) -> dict[str, Any]:
    """A voice's reference as the voice list shows it: which seconds of the upload it is, and what was said about
    them (``kept``: why speech was left out and what became of the transcript; "" when only silence was trimmed)."""
    keys = ("start_s", "end_s", "clip_s", "left_out_s", "kept", "warnings")
    return {k: reference[k] for k in keys if k in reference}


def add_routes(app: web.Application) -> None:
    """Register the OpenAI-compatible routes under ``/v1``."""
    app.router.add_post("/v1/audio/speech", _speech, name="openai:speech")
    app.router.add_get("/v1/models", _models, name="openai:models")
    app.router.add_get("/v1/audio/models", _audio_models, name="openai:audio_models")
    app.router.add_get("/v1/audio/voices", _voices, name="openai:voices")
