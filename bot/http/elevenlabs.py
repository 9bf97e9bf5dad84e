"""ElevenLabs' stream-input WebSocket, as a second dialect on the same session and pipeline.

``ws://HOST:PORT/v1/text-to-speech/{voice}/stream-input?output_format=...``: ``{voice}`` is a stored voice's name
or id, or a name mapped by ``http.voice_aliases`` (map the ElevenLabs voice ids a client has built in). The key
goes in the ``xi-api-key`` header, ``?xi_api_key=``, or (browsers) the first frame's ``xi_api_key`` or
``authorization: "Bearer ..."``.

Query parameters: ``output_format`` (``mp3_22050_32``, ``mp3_44100_{32,64,96,128,192}`` as MPEG audio,
``pcm_{8000,16000,22050,24000,44100,48000}`` as raw s16le, ``ulaw_8000``/``alaw_8000`` as raw G.711,
``opus_48000_{32,64,96,128,192}`` as Ogg Opus; default ``mp3_44100_128``; the bitrate part is accepted and the
encoder's own bitrate is used), ``inactivity_timeout`` (1-180 s, default ``http.ws_idle_timeout_s``),
``language_code`` (one this model speaks: en, zh, ja, ko, yue), ``seed``; and, accepted without effect,
``model_id``, ``sync_alignment``, ``auto_mode``, ``apply_text_normalization``, ``enable_logging``,
``enable_ssml_parsing``, ``optimize_streaming_latency``. Any other parameter is refused with a 400.

Frames: ``{"text": " ", "voice_settings": {...}, "generation_config": {...}, "xi_api_key": ...}`` first (the
single space opens the stream), then ``{"text": "piece "}``, with ``"flush": true`` to speak what is pending now
(``try_trigger_generation`` is accepted: sentences are spoken as soon as they are complete anyway), and
``{"text": ""}`` for the end of input. ``voice_settings`` (first frame only), read as the HTTP ElevenLabs door
reads them (:func:`settings_effect`): ``speed`` sets the rate; ``style`` as a string names one of the voice's stored
styles (``"calm"``, case-insensitive; a name it has none of is an error naming the styles it has); ElevenLabs' own
numeric ``style``, ``stability``, ``similarity_boost`` and ``use_speaker_boost`` (and ``generation_config``'s
``chunk_length_schedule``) are checked and have no effect here. Messages:
``{"audio": base64, "isFinal": false, "normalizedAlignment": null, "alignment": null}`` per piece, then
``{"isFinal": true}`` and a normal close; ``{"message", "error", "code"}`` then a close on failure. The first
message after a first frame with settings that had no effect names them in ``"voicebotIgnored"`` (a list such as
``["voice_settings.style"]``), a field ElevenLabs' clients do not read; it is absent when every setting took effect.
"""

from __future__ import annotations

from typing import Any, Mapping

from aiohttp import web

from bot.http import guard, ws_session
from bot.http.api_v2 import MAX_SEED, ParamReader, base_params, make_params, parse_json_object, voices_of
from bot.http.openai_speech import resolve_voice
from bot.http.responses import ApiError, AudioOut, services_of
from bot.http.stream_input import refuse_unknown
from bot.http.ws_session import Input, Piece, Session, b64
from synthesis import Voice
from synthesis.styles import with_style
from synthesis.types import LANGUAGES, VoiceNotFound

DEFAULT_FORMAT = "mp3_44100_128"  # ElevenLabs' default
# output_format -> (synthesis.audio / G.711 format, sample rate Hz)
OUTPUT_FORMATS: dict[str, tuple[str, int]] = {
    "mp3_22050_32": ("mp3", 22050),
    **{f"mp3_44100_{kbps}": ("mp3", 44100) for kbps in (32, 64, 96, 128, 192)},
    **{f"pcm_{rate}": ("pcm", rate) for rate in (8000, 16000, 22050, 24000, 44100, 48000)},
    "ulaw_8000": ("ulaw", 8000),
    "alaw_8000": ("alaw", 8000),
    **{f"opus_48000_{kbps}": ("opus", 48000) for kbps in (32, 64, 96, 128, 192)},
}
IGNORED = ("model_id", "sync_alignment", "auto_mode", "apply_text_normalization", "apply_language_text_normalization",
           "enable_logging", "enable_ssml_parsing", "optimize_streaming_latency")
PARAMETERS = ("output_format", "inactivity_timeout", "language_code", "seed") + IGNORED + guard.QUERY_CREDENTIALS
FRAME_KEYS = ("text", "flush", "try_trigger_generation", "voice_settings", "generation_config", "xi_api_key",
              "xi-api-key", "authorization", "pronunciation_dictionary_locators")
VOICE_SETTINGS = ("stability", "similarity_boost", "style", "use_speaker_boost", "speed")
IGNORED_FIELD = "voicebotIgnored"  # in a WebSocket door's first message: the settings that had no effect
MAX_INACTIVITY_S = 180  # ElevenLabs' own bound on inactivity_timeout
# HTTP-style status -> the "error" of ElevenLabs' WebSocket error messages
ERROR_KINDS = {400: "invalid_request", 401: "invalid_api_key", 429: "rate_limited", 503: "system_busy",
               504: "timeout"}
_LANGUAGE_CODES = {"en": "en", "zh": "zh", "ja": "ja", "ko": "ko", "yue": "yue", "cmn": "zh"}


class ElevenLabsDialect:
    """ElevenLabs' frames and messages (the module docstring)."""

    def __init__(self, request: web.Request, voice: Voice) -> None:
        self._request = request
        self._voice = voice
        self._auth_pending = bool(request.get(guard.AUTH_DEFERRED))
        self._first = True
        self._ignored: list[str] = []  # the first frame's settings without effect, until a message names them

    def parse(self, data: str) -> Input:
        message = parse_json_object(data, "each frame")
        unknown = sorted(set(message) - set(FRAME_KEYS))
        if unknown:
            raise ApiError(400, f"unknown field {unknown[0]!r} in a frame: ElevenLabs' stream-input takes "
                                f"{', '.join(FRAME_KEYS)}")
        first, self._first = self._first, False
        if self._auth_pending:
            verify_frame_key(self._request, message)
            self._auth_pending = False
        changes: dict[str, Any] = {}
        if "voice_settings" in message or "generation_config" in message:
            if not first:
                raise ApiError(400, "voice_settings and generation_config may only come in the first frame")
            changes, self._ignored = settings(self._voice, message.get("voice_settings"),
                                              message.get("generation_config"))
        text = message.get("text")
        if text is None and first:
            raise ApiError(400, "the first frame must have text (a single space opens the stream): "
                                "{\"text\": \" \"}")
        if text is not None and not isinstance(text, str):
            raise ApiError(400, f"text must be a string; got {text!r}")
        for flag in ("flush", "try_trigger_generation"):
            if flag in message and not isinstance(message[flag], bool):
                raise ApiError(400, f"{flag} must be true or false; got {message[flag]!r}")
        return Input(text or "", flush=message.get("flush") is True, end=text == "", changes=changes)

    def ready(self) -> None:
        return None

    def audio(self, piece: Piece) -> dict[str, Any]:
        return self._noted({"audio": b64(piece.data), "isFinal": False, "normalizedAlignment": None,
                            "alignment": None})

    def done(self, sentences: int, chunks: int, audio_s: float) -> dict[str, Any]:
        return self._noted({"isFinal": True})

    def _noted(self, message: dict[str, Any]) -> dict[str, Any]:
        """The message, naming the settings without effect when it is the first to go out after them."""
        message, self._ignored = noted(message, self._ignored), []
        return message

    def error(self, status: int, message: str) -> dict[str, Any]:
        kind = ERROR_KINDS.get(status, "internal_error")
        return {"message": message, "error": kind, "code": ws_session.close_code(status)}  # the code it closes with


def verify_frame_key(request: web.Request, message: dict[str, Any]) -> None:
    """Check the key a browser sends in its first frame (``xi_api_key``, ``xi-api-key`` or ``authorization``)."""
    key = message.get("xi_api_key") or message.get("xi-api-key") or message.get("authorization") or ""
    key = key[7:].strip() if isinstance(key, str) and key[:7].lower() == "bearer " else key
    if not isinstance(key, str) or not key:
        raise ApiError(401, "this API needs a key: send the xi-api-key header, or xi_api_key in the first frame")
    guard.verify_token(request, key)


def settings(voice: Voice, voice_settings: Any, generation_config: Any) -> tuple[dict[str, Any], list[str]]:
    """Check a WebSocket's first-frame settings (a 400 for a bad one): (the SynthesisParams fields they change,
    the settings accepted without effect), as :func:`settings_effect` says."""
    checked: dict[str, Any] = {}
    if voice_settings is not None:
        if not isinstance(voice_settings, dict):
            raise ApiError(400, f"voice_settings must be an object; got {voice_settings!r}")
        unknown = sorted(set(voice_settings) - set(VOICE_SETTINGS))
        if unknown:
            raise ApiError(400, f"unknown voice setting {unknown[0]!r}: use {', '.join(VOICE_SETTINGS)}")
        r = ParamReader(voice_settings)
        given = {name for name in VOICE_SETTINGS if voice_settings.get(name) is not None}
        for name in ("stability", "similarity_boost"):
            if name in given:
                checked[name] = r.number(name, 0.5, lo=0.0, hi=1.0)
        if isinstance(voice_settings.get("style"), str):
            checked["style"] = voice_settings["style"]
        elif "style" in given:
            if isinstance(voice_settings["style"], bool) or not isinstance(voice_settings["style"], (int, float)):
                raise ApiError(400, f"voice_settings.style is a number from 0 to 1, or the name of one of the "
                                    f"voice's styles; got {voice_settings['style']!r}")
            checked["style"] = r.number("style", 0.5, lo=0.0, hi=1.0)
        if "use_speaker_boost" in given:
            checked["use_speaker_boost"] = r.boolean("use_speaker_boost", True)
        if "speed" in given:
            checked["speed"] = r.number("speed", 1.0, lo=0.25, hi=4.0)
    schedule = None
    if generation_config is not None:
        schedule = generation_config.get("chunk_length_schedule") if isinstance(generation_config, dict) else None
        if not isinstance(generation_config, dict) or set(generation_config) - {"chunk_length_schedule"} \
                or not (schedule is None or (isinstance(schedule, list)
                                             and all(isinstance(x, (int, float)) for x in schedule))):
            raise ApiError(400, "generation_config takes chunk_length_schedule, a list of numbers")
    changes, ignored = settings_effect(voice, checked)
    if schedule is not None:  # sentences are spoken as soon as they are complete, whatever the schedule
        ignored.append("generation_config.chunk_length_schedule")
    return changes, ignored


def settings_effect(voice: Voice, checked: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """What checked ElevenLabs ``voice_settings`` do here, one rule for every ElevenLabs door.

    Parameters
    ----------
    voice: the voice the request speaks with (its stored styles).
    checked: the settings sent, each valid (None: not sent).

    Returns
    -------
    The SynthesisParams fields they change (``speed``; ``style``, the stored name of the voice's style that a
    string ``style`` names, case-insensitive; "" keeps the main clip), and the settings accepted without effect, as
    ``"voice_settings.<name>"`` in :data:`VOICE_SETTINGS` order (a numeric ``style``, ``stability``,
    ``similarity_boost``, ``use_speaker_boost``).

    Raises
    ------
    ApiError
        400: the voice has no style of that name; the message names the styles it has.
    """
    changes: dict[str, Any] = {}
    ignored: list[str] = []
    for name in VOICE_SETTINGS:
        value = checked.get(name)
        if value is None:
            continue
        if name == "speed":
            changes["speed"] = float(value)
        elif name == "style" and isinstance(value, str):
            if value.strip():
                changes["style"] = _stored_style(voice, value.strip())
        else:
            ignored.append(f"voice_settings.{name}")
    return changes, ignored


def _stored_style(voice: Voice, name: str) -> str:
    """The stored name of the voice's style ``name`` (case-insensitive), or a 400 naming the styles it has."""
    try:
        return voice.styles[with_style(voice, name).style].name
    except VoiceNotFound as e:
        raise ApiError(400, str(e)) from None


def noted(message: dict[str, Any], ignored: list[str]) -> dict[str, Any]:
    """A WebSocket message naming ``ignored`` in :data:`IGNORED_FIELD` (unchanged when there are none)."""
    if ignored:
        message[IGNORED_FIELD] = list(ignored)
    return message


def output_format(value: str | None) -> tuple[str, int]:
    """ElevenLabs' ``output_format`` (None: the default) -> (encoder format, sample rate Hz), or a 400."""
    name = (value or DEFAULT_FORMAT).strip().lower()
    if name not in OUTPUT_FORMATS:
        raise ApiError(400, f"output_format {name!r} is not available: use one of {', '.join(OUTPUT_FORMATS)}")
    return OUTPUT_FORMATS[name]


def language_of(code: str | None, default: str) -> str:
    """ElevenLabs' ``language_code`` (None: ``default``) -> one of this model's languages, or a 400."""
    if code is None:
        return default
    language = _LANGUAGE_CODES.get(code.strip().lower(), "")
    if language not in LANGUAGES:
        raise ApiError(400, f"language_code {code!r} is not one this model speaks: use one of "
                            f"{', '.join(_LANGUAGE_CODES)}")
    return language


async def options(request: web.Request, door: str) -> tuple[Any, Any, str, int, float]:
    """Voice, SynthesisParams, format, rate and idle timeout from the path and query (400 before the upgrade)."""
    services = services_of(request)
    config = services.config
    refuse_unknown(request.query, PARAMETERS, door)
    r = ParamReader(request.query)
    fmt, rate = output_format(r.string("output_format", None))
    idle = r.number("inactivity_timeout", config.http.ws_idle_timeout_s, lo=1.0, hi=MAX_INACTIVITY_S)
    base = base_params(config, services)
    language = language_of(r.string("language_code", None), base.language)
    params = make_params(base, language=language, seed=r.integer("seed", base.seed, lo=-1, hi=MAX_SEED))
    for flag in ("sync_alignment", "enable_logging", "enable_ssml_parsing", "auto_mode",
                 "apply_language_text_normalization"):
        r.boolean(flag, False)
    voice = await resolve_voice(voices_of(services), config.http, request.match_info["voice"])
    return voice, params, fmt, rate, idle


async def upgrade_options(request: web.Request, door: str) -> tuple[Any, Any, str, int, float]:
    """:func:`options`, revealing nothing (voice names, the reason) before a deferred key is checked."""
    if not request.get(guard.AUTH_DEFERRED):
        return await options(request, door)
    if not web.WebSocketResponse().can_prepare(request).ok:
        raise ApiError(401, "this API needs a key: send the xi-api-key header")
    try:
        return await options(request, door)
    except ApiError as e:
        raise ApiError(e.status, "this request is not valid; send the key in the xi-api-key header to see why"
                       ) from None


async def _handler(request: web.Request) -> web.WebSocketResponse:
    services = services_of(request)
    voice, params, fmt, rate, idle = await upgrade_options(request, "ElevenLabs' stream-input here")
    config = services.config
    ws = ws_session.websocket(request, config.http.max_body_kb)
    await ws.prepare(request)
    out = AudioOut(fmt, services.synthesizer.sample_rate, rate)
    session = Session(request, ws, ElevenLabsDialect(request, voice), services.synthesizer, voice, params, out,
                      max_chars=config.http.max_text_chars, idle_s=idle)
    await ws_session.run_session(request, session)
    return ws


def add_routes(app: web.Application) -> None:
    """Register the WebSocket route."""
    app.router.add_get("/v1/text-to-speech/{voice}/stream-input", _handler, name="elevenlabs:stream_input")

