"""``/v1/tts/stream-input``: a WebSocket that speaks text while a chat model is still writing it.

Open ``ws://HOST:PORT/v1/tts/stream-input?voice=NAME`` with optional query parameters: ``format`` (pcm, the
default: s16le mono; or wav, mp3, ogg, opus, flac, aac as one continuous stream), ``sample_rate`` (Hz, default the
model's 32000), and the synthesis options ``language``, ``top_k``, ``top_p``, ``temperature``,
``repetition_penalty``, ``speed``, ``seed``, ``split_method``, ``fragment_interval``, ``noise_scale``. Bad
parameters are refused with a JSON 400 before the upgrade. With a token set, send it as ``Authorization: Bearer``
or, for browsers, as ``?token=``.

Client -> server, JSON text frames, each field optional and applied in this order:
``{"text": "piece"}`` (any split, mid-word included), ``{"flush": true}`` (speak everything pending now, even an
unfinished sentence), ``{"close": true}`` (no more text: finish speaking, then the server closes).

Server -> client, JSON text frames:
``{"type": "ready", "voice", "format", "sample_rate"}`` once; ``{"type": "audio", "index", "sentence", "audio"}``
per sentence as soon as it is synthesized (``audio``: base64 of this piece of the stream, the format's header
included in the first); ``{"type": "done", "sentences", "audio_s"}`` after the last audio, then a normal close;
``{"type": "error", "message"}`` then a close on failure. Closing the socket early stops the synthesis.

Each run of text up to a flush goes to the synthesizer as one streamed request (its splitter decides when a
sentence is complete, and a pause in the text speaks what is pending); the runs are spoken in order.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from typing import Any, AsyncIterator

from aiohttp import WSMsgType, web

from bot.http.api_v2 import MAX_SEED, ParamReader, base_params, lookup_voice, make_params, voice_names
from bot.http.responses import METRICS, REQUEST_T0, ApiError, AudioOut, error_for, services_of
from engines.base import SAMPLE_RATE, SpeechError
from synthesis.types import LANGUAGES, SPLIT_METHODS

log = logging.getLogger(__name__)

FORMATS = ("pcm", "wav", "mp3", "ogg", "opus", "flac", "aac")
HEARTBEAT_S = 30.0  # WebSocket ping interval
CLOSE_TIMEOUT_S = 5.0  # seconds to wait for the client's close handshake
CLOSE_POLICY = 1008  # WebSocket close code: the client broke the protocol
CLOSE_ERROR = 1011  # WebSocket close code: synthesis failed
CLOSE_BUSY = 1013  # WebSocket close code: try again later


class _Run:
    """The text of one run (up to a flush or the end), handed to the synthesizer as an async iterator."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.chars = 0

    def put(self, piece: str) -> None:
        self.chars += len(piece)
        self._queue.put_nowait(piece)

    def end(self) -> None:
        self._queue.put_nowait(None)

    async def pieces(self) -> AsyncIterator[str]:
        while (piece := await self._queue.get()) is not None:
            yield piece


class _Session:
    """One connection: a reader turning messages into runs, a speaker turning runs into audio messages."""

    def __init__(self, ws: web.WebSocketResponse, synth: Any, voice: Any, params: Any, out: AudioOut,
                 max_chars: int) -> None:
        self.ws, self.synth, self.voice, self.params, self.out = ws, synth, voice, params, out
        self.max_chars = max_chars
        self.runs: asyncio.Queue[_Run | None] = asyncio.Queue()
        self.current: _Run | None = None
        self.closed_input = False
        self.total_chars = 0
        self.sentences = 0
        self.first_audio_at: float | None = None

    async def read(self) -> None:
        """Consume client messages until the socket closes; raises ApiError on a protocol violation."""
        async for msg in self.ws:
            if msg.type == WSMsgType.TEXT:
                self._apply(_parse(msg.data))
            elif msg.type == WSMsgType.BINARY:
                raise ApiError(400, "send JSON text frames like {\"text\": \"...\"}, not binary frames")
            elif msg.type == WSMsgType.ERROR:
                log.info("stream-input connection error: %s", self.ws.exception())
                return

    def _apply(self, message: dict[str, Any]) -> None:
        text = message.get("text")
        if text is not None and not isinstance(text, str):
            raise ApiError(400, f"text must be a string; got {text!r}")
        if text:
            if self.closed_input:
                raise ApiError(400, "text arrived after close: open a new connection for more text")
            self.total_chars += len(text)
            if self.total_chars > self.max_chars:
                raise ApiError(400, f"this stream has passed {self.max_chars} characters (http.max_text_chars): "
                                    "open a new connection for more text")
            if self.current is None:
                self.current = _Run()
                self.runs.put_nowait(self.current)
            self.current.put(text)
        if message.get("flush") is True and self.current is not None:
            self.current.end()
            self.current = None
        if message.get("close") is True and not self.closed_input:
            if self.current is not None:
                self.current.end()
                self.current = None
            self.closed_input = True
            self.runs.put_nowait(None)

    async def speak(self) -> None:
        """Synthesize the runs in order and send their audio; then ``done``."""
        index = 0
        while (run := await self.runs.get()) is not None:
            chunks = self.synth.stream(run.pieces(), self.voice, self.params)
            try:
                async for chunk in chunks:
                    data = await self.out.encode(chunk.audio)
                    await self.ws.send_json({"type": "audio", "index": index, "sentence": chunk.sentence,
                                             "audio": base64.b64encode(data).decode("ascii")})
                    if self.first_audio_at is None:
                        self.first_audio_at = time.monotonic()
                    index += 1
            finally:
                await chunks.aclose()
        tail = await self.out.finish()
        if tail:
            await self.ws.send_json({"type": "audio", "index": index, "sentence": "",
                                     "audio": base64.b64encode(tail).decode("ascii")})
        self.sentences = index
        await self.ws.send_json({"type": "done", "sentences": index,
                                 "audio_s": round(self.out.samples_out / self.out.sample_rate, 4)})


def _parse(data: str) -> dict[str, Any]:
    """A client frame as a JSON object, or a 400 ApiError."""
    try:
        message = json.loads(data)
    except ValueError:
        raise ApiError(400, "each frame must be a JSON object like {\"text\": \"...\"}") from None
    if not isinstance(message, dict):
        raise ApiError(400, "each frame must be a JSON object like {\"text\": \"...\"}")
    return message


def _options(request: web.Request) -> tuple[Any, Any, str, int | None]:
    """Voice, SynthesisParams, format and output rate from the query string (400 before the upgrade)."""
    services = services_of(request)
    config, synth = services.config, services.synthesizer
    r = ParamReader(request.query)
    key = r.string("voice", hint=f"pass ?voice=NAME; {voice_names(synth)}")
    fmt = r.string("format", "pcm", choices=FORMATS, lower=True)
    rate_raw = r.raw("sample_rate")
    rate = r.integer("sample_rate", SAMPLE_RATE, lo=8000, hi=48000) if rate_raw is not None else None
    base = base_params(config)
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
    voice = lookup_voice(synth, key)
    if voice is None:
        raise ApiError(400, f"voice {key!r} does not exist; {voice_names(synth)}")
    return voice, params, fmt, rate


async def _handler(request: web.Request) -> web.WebSocketResponse:
    services = services_of(request)
    voice, params, fmt, rate = _options(request)
    config = services.config
    ws = web.WebSocketResponse(heartbeat=HEARTBEAT_S, max_msg_size=config.http.max_body_kb * 1024,
                               timeout=CLOSE_TIMEOUT_S)
    await ws.prepare(request)
    out = AudioOut(fmt, SAMPLE_RATE, rate)
    session = _Session(ws, services.synthesizer, voice, params, out, config.http.max_text_chars)
    await ws.send_json({"type": "ready", "voice": voice.name, "format": fmt, "sample_rate": out.sample_rate})
    reader = asyncio.create_task(session.read())
    speaker = asyncio.create_task(session.speak())
    code, message = 1000, b""
    try:
        done, _ = await asyncio.wait({reader, speaker}, return_when=asyncio.FIRST_COMPLETED)
        if speaker in done:
            speaker.result()  # raises the synthesis error, if any
        elif reader.exception() is not None:
            raise reader.exception()  # type: ignore[misc]
        else:  # the client closed the socket before the end: stop the synthesis
            log.info("stream-input client left before the end; stopping its synthesis")
    except ApiError as e:
        code, message = CLOSE_POLICY, str(e).encode()[:120]
        await _send_error(ws, str(e))
    except SpeechError as e:
        err = error_for(e)
        code = CLOSE_BUSY if err.status == 503 else CLOSE_ERROR
        message = str(e).encode()[:120]
        await _send_error(ws, str(e))
    except ConnectionError:
        log.info("stream-input client went away")
    except Exception as e:  # noqa: BLE001 - reported to the client, logged with its traceback
        log.exception("stream-input failed")
        code, message = CLOSE_ERROR, b"internal error"
        await _send_error(ws, f"internal error ({type(e).__name__}); see the server log")
    finally:
        for task in (reader, speaker):
            task.cancel()
        await asyncio.gather(reader, speaker, return_exceptions=True)
        t0 = request.get(REQUEST_T0)
        if t0 is not None:
            ttfa = session.first_audio_at - t0 if session.first_audio_at is not None else None
            request.app[METRICS].observe_audio(ttfa, time.monotonic() - t0, out.samples_out / out.sample_rate)
        if not ws.closed:
            await ws.close(code=code, message=message)
    return ws


async def _send_error(ws: web.WebSocketResponse, message: str) -> None:
    if not ws.closed:
        try:
            await ws.send_json({"type": "error", "message": message})
        except (ConnectionError, RuntimeError):
            pass


def add_routes(app: web.Application) -> None:
    """Register the WebSocket route."""
    app.router.add_get("/v1/tts/stream-input", _handler, name="stream_input:ws")
