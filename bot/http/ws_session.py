"""One text-in, audio-out WebSocket session, whatever its dialect: the machinery both WebSocket doors share.

A reader turns client frames into *runs* of text (each run ends at a flush or at the end of input) and a speaker
hands each run to ``Synthesizer.stream`` as an async iterator, in order, sending each audio chunk as it comes.
The dialect (our ``/v1/tts/stream-input``, or ElevenLabs' stream-input) only parses frames and shapes messages.

Bounds, per connection: ``http.max_text_chars`` characters in all; one rate-limit token per run after the first
(the upgrade paid for the first), so a connection that flushes every sentence spends like separate requests; and an
idle timeout: when the client sends nothing for ``idle_s`` while its input is open (and no audio went out in that
time), its input is taken as ended, what is pending is spoken, and the session closes normally.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping, Protocol

from aiohttp import WSMsgType, web

from bot.http import guard
from bot.http.responses import METRICS, REQUEST_T0, ApiError, AudioOut, error_for
from synthesis import SpeechError
from synthesis.types import SpeechSynthesizer

log = logging.getLogger(__name__)

HEARTBEAT_S = 30.0  # WebSocket ping interval
CLOSE_TIMEOUT_S = 5.0  # seconds to wait for the client's close handshake
CLOSE_POLICY = 1008  # WebSocket close code: the client broke the protocol
CLOSE_ERROR = 1011  # WebSocket close code: synthesis failed
CLOSE_BUSY = 1013  # WebSocket close code: try again later


@dataclass(frozen=True)
class Input:
    """What one client frame asks for, applied in this order: text, flush, end of input."""

    text: str = ""
    flush: bool = False
    end: bool = False
    # SynthesisParams fields for the runs not yet started (ElevenLabs' voice_settings: speed, a named style)
    changes: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Piece:
    """One audio message's worth: encoded bytes of ``sentence`` (0-based ``index`` over the session), ``chunk``-th
    piece of that sentence (the first sentence may come in two: an early chunk, then the rest)."""

    data: bytes
    sentence: str
    index: int
    chunk: int


class Dialect(Protocol):
    """How one WebSocket protocol reads frames and writes messages."""

    def parse(self, data: str) -> Input:
        """A client text frame -> what it asks for; raises :class:`ApiError` for a bad frame."""
        ...

    def ready(self) -> dict[str, Any] | None:
        """The message sent once after the upgrade, or None."""
        ...

    def audio(self, piece: Piece) -> dict[str, Any]:
        ...

    def done(self, sentences: int, chunks: int, audio_s: float) -> dict[str, Any]:
        ...

    def error(self, status: int, message: str) -> dict[str, Any]:
        ...


class Run:
    """The text of one run (up to a flush or the end), handed to the synthesizer as an async iterator."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.dropped = False  # its speech is no longer wanted (ElevenLabs' close_context before a flush)

    def put(self, piece: str) -> None:
        self._queue.put_nowait(piece)

    def end(self) -> None:
        self._queue.put_nowait(None)

    async def pieces(self) -> AsyncIterator[str]:
        while (piece := await self._queue.get()) is not None:
            yield piece


class Session:
    """One connection: a reader turning frames into runs, a speaker turning runs into audio messages."""

    def __init__(self, request: web.Request, ws: web.WebSocketResponse, dialect: Dialect, synth: SpeechSynthesizer,
                 voice: Any, params: Any, out: AudioOut, *, max_chars: int, idle_s: float) -> None:
        self.request, self.ws, self.dialect = request, ws, dialect
        self.synth, self.voice, self.params, self.out = synth, voice, params, out
        self.max_chars, self.idle_s = max_chars, idle_s
        self.runs: asyncio.Queue[Run | None] = asyncio.Queue()
        self.current: Run | None = None
        self.closed_input = False
        self.total_chars = 0
        self.sentences = 0
        self.chunks = 0
        self.first_audio_at: float | None = None
        self._last_activity = time.monotonic()

    # ---- reading ---------------------------------------------------------------------------------------------

    async def read(self) -> None:
        """Consume client frames until the socket closes; raises ApiError on a protocol violation."""
        while True:
            timeout = None
            if not self.closed_input:
                timeout = max(0.05, self._last_activity + self.idle_s - time.monotonic())
            try:
                msg = await self.ws.receive(timeout=timeout)
            except asyncio.TimeoutError:
                if time.monotonic() - self._last_activity >= self.idle_s:
                    log.info("WebSocket client idle for %.0f s: ending its input", self.idle_s)
                    self.apply(Input(end=True))
                continue
            if msg.type == WSMsgType.TEXT:
                self._last_activity = time.monotonic()
                self.apply(self.dialect.parse(msg.data))
            elif msg.type == WSMsgType.BINARY:
                raise ApiError(400, "send JSON text frames like {\"text\": \"...\"}, not binary frames")
            elif msg.type == WSMsgType.ERROR:
                log.info("WebSocket connection error: %s", self.ws.exception())
                return
            elif msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                return

    def apply(self, message: Input) -> None:
        if message.changes:
            self.params = dataclasses.replace(self.params, **message.changes)
        text = message.text
        if text:
            if self.closed_input:
                raise ApiError(400, "text arrived after the end of input: open a new connection for more text")
            self.total_chars += len(text)
            if self.total_chars > self.max_chars:
                raise ApiError(400, f"this stream has passed {self.max_chars} characters (http.max_text_chars): "
                                    "open a new connection for more text")
            if self.current is None and text.strip():  # whitespace alone starts nothing (ElevenLabs' " ")
                self.current = Run()
                self.runs.put_nowait(self.current)
            if self.current is not None:
                self.current.put(text)
        if message.flush and self.current is not None:
            self.current.end()
            self.current = None
        if message.end and not self.closed_input:
            if self.current is not None:
                self.current.end()
                self.current = None
            self.closed_input = True
            self.runs.put_nowait(None)

    # ---- speaking --------------------------------------------------------------------------------------------

    async def speak(self) -> None:
        """Synthesize the runs in order and send their audio; then the dialect's ``done``."""
        runs = 0
        last: Piece | None = None
        while (run := await self.runs.get()) is not None:
            if runs:
                guard.charge(self.request, "WebSocket run")  # the per-connection budget
            runs += 1
            base, previous = self.sentences, -1
            chunks = self.synth.stream(run.pieces(), self.voice, self.params)
            try:
                async for chunk in chunks:
                    data = await self.out.encode(chunk.audio)
                    if chunk.index != previous:  # a new sentence
                        previous = chunk.index
                        self.sentences = base + chunk.index + 1
                        last = Piece(data, chunk.sentence, base + chunk.index, 0)
                    else:
                        assert last is not None
                        last = Piece(data, chunk.sentence, last.index, last.chunk + 1)
                    await self._send_audio(last)
            finally:
                await chunks.aclose()
        tail = await self.out.finish()
        if tail:
            last = Piece(tail, last.sentence, last.index, last.chunk + 1) if last is not None \
                else Piece(tail, "", 0, 0)
            await self._send_audio(last)
        await self.ws.send_json(self.dialect.done(self.sentences, self.chunks,
                                                  round(self.out.samples_out / self.out.sample_rate, 4)))

    async def _send_audio(self, piece: Piece) -> None:
        await self.ws.send_json(self.dialect.audio(piece))
        self.chunks += 1
        self._last_activity = time.monotonic()  # a client listening to a long answer is not idle
        if self.first_audio_at is None:
            self.first_audio_at = time.monotonic()


def close_code(status: int) -> int:
    """The WebSocket close code for an HTTP-style status: busy 1013, the client's fault 1008, else 1011."""
    if status in (429, 503):
        return CLOSE_BUSY
    return CLOSE_POLICY if status < 500 else CLOSE_ERROR


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def websocket(request: web.Request, max_msg_kb: int) -> web.WebSocketResponse:
    return web.WebSocketResponse(heartbeat=HEARTBEAT_S, max_msg_size=max_msg_kb * 1024, timeout=CLOSE_TIMEOUT_S)


async def run_session(request: web.Request, session: Session) -> None:
    """Run reader and speaker until either ends; report any failure in the dialect's shape, then close."""
    ws, dialect = session.ws, session.dialect
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
            log.info("WebSocket client left before the end; stopping its synthesis")
    except SpeechError as e:
        err = error_for(e)
        code = close_code(err.status)
        if err.status >= 500 and err.status != 503:
            log.warning("WebSocket synthesis failed: %s", err)
        message = str(err).encode()[:120]
        await _send(ws, dialect.error(err.status, str(err)))
    except ConnectionError:
        log.info("WebSocket client went away")
    except Exception as e:  # noqa: BLE001 - reported to the client, logged with its traceback
        log.exception("WebSocket session failed")
        code, message = CLOSE_ERROR, b"internal error"
        await _send(ws, dialect.error(500, f"internal error ({type(e).__name__}); see the server log"))
    finally:
        for task in (reader, speaker):
            task.cancel()
        await asyncio.gather(reader, speaker, return_exceptions=True)
        t0 = request.get(REQUEST_T0)
        if t0 is not None:
            ttfa = session.first_audio_at - t0 if session.first_audio_at is not None else None
            request.app[METRICS].observe_audio(ttfa, time.monotonic() - t0,
                                               session.out.samples_out / session.out.sample_rate)
        if not ws.closed:
            await ws.close(code=code, message=message)


async def _send(ws: web.WebSocketResponse, obj: dict[str, Any]) -> None:
    if not ws.closed:
        try:
            await ws.send_json(obj)
        except (ConnectionError, RuntimeError):
            pass
