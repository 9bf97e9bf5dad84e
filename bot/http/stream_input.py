"""``/v1/tts/stream-input``: a WebSocket that speaks text while a chat model is still writing it.

Open ``ws://HOST:PORT/v1/tts/stream-input?voice=NAME`` with optional query parameters: ``format`` (pcm, the
default: s16le mono; or wav, mp3, ogg, opus, flac, aac as one continuous stream), ``sample_rate`` (Hz, default the
model's 32000), and the synthesis options ``language``, ``top_k``, ``top_p``, ``temperature``,
``repetition_penalty``, ``speed``, ``seed``, ``split_method``, ``fragment_interval``, ``noise_scale``. Bad or
unknown parameters are refused with a JSON 400 before the upgrade. With a token set, send it as
``Authorization: Bearer`` or, for browsers, as ``?token=``; a browser page must be in ``http.cors_origins``.

Client -> server, JSON text frames, each field optional and applied in this order:
``{"text": "piece"}`` (any split, mid-word included), ``{"flush": true}`` (speak everything pending now, even an
unfinished sentence), ``{"close": true}`` (no more text: finish speaking, then the server closes).

Server -> client, JSON text frames:
``{"type": "ready", "voice", "format", "sample_rate"}`` once; ``{"type": "audio", "index", "chunk", "sentence",
"audio"}`` as soon as each piece is synthesized: ``index`` is the sentence's 0-based number in the session,
``chunk`` the piece's number within it (the first sentence usually comes in two pieces, an early chunk and the
rest, so speech starts sooner; the encoder's last bytes come as one more chunk of the last sentence), ``audio`` base64
of this piece of the one continuous stream (the format's header in the first); ``{"type": "done", "sentences",
"chunks", "audio_s"}`` after the last audio, then a normal close; ``{"type": "error", "message", "status"}`` then a
close on failure (busy: status 503, close code 1013 "try again later", with ``retry_after_s``). Closing the socket
early stops the synthesis. A client silent for ``http.ws_idle_timeout_s`` has its input ended (what is pending is
spoken, then the session closes).

Each run of text up to a flush or the end goes to the synthesizer as one streamed request (its splitter decides
when a sentence is complete, and a pause in the text speaks what is pending); the runs are spoken in order.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from bot.http import ws_session
from bot.http.api_v2 import (MAX_SEED, ParamReader, base_params, lookup_voice, make_params, parse_json_object,
                             voice_names)
from bot.http.guard import QUERY_CREDENTIALS
from bot.http.responses import RETRY_AFTER_BUSY_S, ApiError, AudioOut, services_of, voices_of
from bot.http.ws_session import Input, Piece, Session, b64
from engines.base import SAMPLE_RATE
from synthesis.types import LANGUAGES, SPLIT_METHODS

log = logging.getLogger(__name__)

FORMATS = ("pcm", "wav", "mp3", "ogg", "opus", "flac", "aac")
PARAMETERS = ("voice", "format", "sample_rate", "language", "top_k", "top_p", "temperature", "repetition_penalty",
              "speed", "seed", "split_method", "fragment_interval", "noise_scale") + QUERY_CREDENTIALS
FRAME_KEYS = ("text", "flush", "close")


class StreamInputDialect:
    """This project's own frames and messages (the module docstring)."""

    def __init__(self, voice_name: str, fmt: str, sample_rate: int) -> None:
        self._ready = {"type": "ready", "voice": voice_name, "format": fmt, "sample_rate": sample_rate}

    def parse(self, data: str) -> Input:
        message = parse_json_object(data, "each frame")
        unknown = sorted(set(message) - set(FRAME_KEYS))
        if unknown:
            raise ApiError(400, f"unknown field {unknown[0]!r} in a frame: send text, flush or close")
        text = message.get("text")
        if text is not None and not isinstance(text, str):
            raise ApiError(400, f"text must be a string; got {text!r}")
        return Input(text or "", message.get("flush") is True, message.get("close") is True)

    def ready(self) -> dict[str, Any]:
        return self._ready

    def audio(self, piece: Piece) -> dict[str, Any]:
        return {"type": "audio", "index": piece.index, "chunk": piece.chunk, "sentence": piece.sentence,
                "audio": b64(piece.data)}

    def done(self, sentences: int, chunks: int, audio_s: float) -> dict[str, Any]:
        return {"type": "done", "sentences": sentences, "chunks": chunks, "audio_s": audio_s}

    def error(self, status: int, message: str) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "error", "message": message, "status": status}
        if status == 503:
            out["retry_after_s"] = RETRY_AFTER_BUSY_S
        return out


def refuse_unknown(query: Any, known: tuple[str, ...], door: str) -> None:
    """A 400 for the first query parameter ``door`` does not take (a silently ignored option misleads)."""
    for name in query:
        if name not in known:
            raise ApiError(400, f"unknown query parameter {name!r}: {door} takes {', '.join(known)}")


async def _options(request: web.Request) -> tuple[Any, Any, str, int | None]:
    """Voice, SynthesisParams, format and output rate from the query string (400 before the upgrade)."""
    services = services_of(request)
    config = services.config
    refuse_unknown(request.query, PARAMETERS, "/v1/tts/stream-input")
    r = ParamReader(request.query)
    voices = voices_of(services)
    key = r.string("voice", hint=f"pass ?voice=NAME; {await voice_names(voices)}")
    fmt = r.string("format", "pcm", choices=FORMATS, lower=True)
    rate_raw = r.raw("sample_rate")
    rate = r.integer("sample_rate", SAMPLE_RATE, lo=8000, hi=48000) if rate_raw is not None else None
    base = base_params(config, services)
    params = make_params(
        base,
        language=r.string("language", base.language, choices=LANGUAGES, lower=True),
        top_k=r.integer("top_k", base.top_k, lo=1),
        top_p=r.number("top_p", base.top_p, lo=0.0, hi=1.0, lo_open=True),
        temperature=r.number("temperature", base.temperature, lo=0.0),
        repetition_penalty=r.number("repetition_penalty", base.repetition_penalty, lo=0.0, lo_open=True),
        speed=r.number("speed", base.speed, lo=0.25, hi=4.0),
        seed=r.integer("seed", base.seed, lo=-1, hi=MAX_SEED),
        split_method=r.string("split_method", base.split_method, choices=SPLIT_METHODS, lower=True),
        fragment_interval=r.number("fragment_interval", base.fragment_interval, lo=0.0, hi=5.0),
        noise_scale=r.number("noise_scale", base.noise_scale, lo=0.0, hi=10.0),
    )
    voice = await lookup_voice(voices, key)
    if voice is None:
        raise ApiError(400, f"voice {key!r} does not exist; {await voice_names(voices)}")
    return voice, params, fmt, rate


async def _handler(request: web.Request) -> web.WebSocketResponse:
    services = services_of(request)
    voice, params, fmt, rate = await _options(request)
    config = services.config
    ws = ws_session.websocket(request, config.http.max_body_kb)
    await ws.prepare(request)
    out = AudioOut(fmt, services.synthesizer.sample_rate, rate, wav_size_unknown=True)
    dialect = StreamInputDialect(voice.name, fmt, out.sample_rate)
    session = Session(request, ws, dialect, services.synthesizer, voice, params, out,
                      max_chars=config.http.max_text_chars, idle_s=config.http.ws_idle_timeout_s)
    await ws.send_json(dialect.ready())
    await ws_session.run_session(request, session)
    return ws


def add_routes(app: web.Application) -> None:
    """Register the WebSocket route."""
    app.router.add_get("/v1/tts/stream-input", _handler, name="stream_input:ws")
