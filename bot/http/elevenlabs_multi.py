"""ElevenLabs' multi-context WebSocket: several independent streams ("contexts") on one connection.

``ws://HOST:PORT/v1/text-to-speech/{voice}/multi-stream-input``, with the query parameters, key and output formats
of the single-context door (``bot.http.elevenlabs``). LiveKit's and Pipecat's ElevenLabs classes speak it: one
connection per conversation, one context per reply, a reply cut short by closing its context.

Frames, JSON; ``context_id`` (or ``contextId``) names the context, a frame without one goes to the default context:

- ``{"text": " ", "context_id": "c1", "voice_settings": {...}, "generation_config": {...}}`` opens ``c1``
  (``voice_settings`` and ``generation_config`` only in a context's first frame, read as the single-context door
  reads them: ``speed`` sets its rate, ``style`` as a string names one of the voice's styles, the rest has no
  effect and the context's first message names it in ``"voicebotIgnored"``); any frame with text or ``flush`` for
  an unknown id opens it too;
- ``{"text": "piece ", "context_id": "c1"}`` adds text: each sentence is spoken as soon as it is complete;
- ``{"context_id": "c1", "flush": true}`` (with or without text) speaks what is pending now;
- ``{"text": "", "context_id": "c1"}`` keeps ``c1`` open (its inactivity timer restarts); ``{"text": ""}`` alone
  keeps the connection open;
- ``{"context_id": "c1", "close_context": true}``: no more text for ``c1``; what was flushed is still spoken, text
  not yet flushed is dropped, then ``{"isFinal": true, "contextId": "c1"}``. The id may then open a new context;
- ``{"close_socket": true}``: every context is flushed and spoken, each ends with its ``isFinal``, then the server
  closes normally (1000).

Messages: ``{"audio": base64, "normalizedAlignment": null, "alignment": null, "contextId": "c1"}``; each context's
audio is one continuous stream in ``output_format`` (its own header), interleaved with the other contexts'.
At most :data:`MAX_CONTEXTS` contexts may be open at once (ElevenLabs' limit; a closed context that is still
speaking does not count): one more is refused with ``"error": "max_active_conversations"``. A context that gets no
frame for ``inactivity_timeout`` seconds is flushed and closed; a connection with no open context, nothing left to
say and no frame for that long is closed normally. A failure sends ``{"message", "error", "code", "contextId"}``
and closes the connection with that code (1013 busy, 1008 a bad frame, 1011 a server failure).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from typing import Any

from aiohttp import WSMsgType, web

from bot.http import elevenlabs, guard, ws_session
from bot.http.api_v2 import parse_json_object
from bot.http.responses import METRICS, REQUEST_T0, ApiError, AudioOut, close_quietly, error_for, services_of
from bot.http.ws_session import Run, b64, close_code
from synthesis import SpeechError

log = logging.getLogger(__name__)

MAX_CONTEXTS = 5  # open contexts per connection, ElevenLabs' own limit
FRAME_KEYS = ("text", "context_id", "contextId", "flush", "close_context", "close_socket", "try_trigger_generation",
              "voice_settings", "generation_config", "xi_api_key", "xi-api-key", "authorization",
              "pronunciation_dictionary_locators")
DOOR = "ElevenLabs' multi-stream-input here"
_GLUED = re.compile(r"[.!?][A-Z]")  # a sentence's end, then the next one's first letter


class _ContextLimit(ApiError):
    """A context past :data:`MAX_CONTEXTS` (ElevenLabs' ``max_active_conversations``)."""


class _Context:
    """One context: its text runs, its own encoder, and the task that speaks the runs in order."""

    def __init__(self, session: _MultiSession, context_id: str | None, params: Any, ignored: list[str]) -> None:
        self.session, self.id, self.params = session, context_id, params
        self.ignored = ignored  # its first frame's settings without effect, until its first message names them
        self.out = AudioOut(session.fmt, session.synth.sample_rate, session.rate)
        self.runs: asyncio.Queue[Run | None] = asyncio.Queue()
        self.current: Run | None = None  # the run still taking text (not yet flushed)
        self.closed = False
        self._tail = ""  # the last character of the text so far
        self.last_frame = time.monotonic()
        self._speaking: asyncio.Task[None] | None = None
        self.task = asyncio.create_task(self._speak_all())

    def add(self, text: str) -> None:
        if self.current is None and text.strip():  # whitespace alone starts nothing (the opening " ")
            self.current = Run()
            self.runs.put_nowait(self.current)
        if self.current is not None:
            if _GLUED.match(self._tail + text[:1]):  # Pipecat sends whole sentences with no space between
                text = " " + text
            self.current.put(text)
            self._tail = text[-1:]

    def flush(self) -> None:
        if self.current is not None:
            self.current.end()
            self.current = None

    def close(self, *, drop_pending: bool) -> None:
        """No more text; the run not yet flushed is dropped (close_context) or spoken (close_socket, idle)."""
        if self.closed:
            return
        self.closed = True
        run = self.current
        self.flush()
        if drop_pending and run is not None:
            run.dropped = True
            if self._speaking is not None and self.session.speaking_run.get(self.id) is run:
                self._speaking.cancel()  # stops its synthesis now
        self.runs.put_nowait(None)

    async def _speak_all(self) -> None:
        while (run := await self.runs.get()) is not None:
            if run.dropped:
                continue
            self.session.charge_run()
            self.session.speaking_run[self.id] = run
            self._speaking = asyncio.create_task(self._speak(run))
            try:
                await self._speaking
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not run.dropped or (task is not None and task.cancelling()):
                    raise  # this context's own task was cancelled, not just the dropped run
            finally:
                self._speaking = None
                self.session.speaking_run.pop(self.id, None)
        tail = await self.out.finish()
        if tail and self.out.samples_out:
            await self.session.send_audio(self, tail)
        await self.session.send(self.noted({"isFinal": True, "contextId": self.id}))

    def noted(self, message: dict[str, Any]) -> dict[str, Any]:
        """The message, naming the settings without effect when it is this context's first."""
        message, self.ignored = elevenlabs.noted(message, self.ignored), []
        return message

    async def _speak(self, run: Run) -> None:
        s = self.session
        chunks = s.synth.stream(run.pieces(), s.voice, self.params)
        try:
            async for chunk in chunks:
                await s.send_audio(self, await self.out.encode(chunk.audio))
        finally:
            await close_quietly(chunks)


class _MultiSession:
    """The connection: a reader that routes frames to contexts, one speaking task per context."""

    def __init__(self, request: web.Request, ws: web.WebSocketResponse, voice: Any, params: Any, fmt: str,
                 rate: int, idle_s: float) -> None:
        services = services_of(request)
        self.request, self.ws, self.voice, self.params = request, ws, voice, params
        self.synth = services.synthesizer
        self.fmt, self.rate, self.idle_s = fmt, rate, idle_s
        self.max_chars = services.config.http.max_text_chars
        self.auth_pending = bool(request.get(guard.AUTH_DEFERRED))
        self.open: dict[str | None, _Context] = {}  # contexts still taking text
        self.tasks: set[asyncio.Task[None]] = set()  # every context's speaking task, closed ones included
        self.seen: list[_Context] = []  # every context opened, for the audio total
        self.speaking_run: dict[str | None, Run] = {}
        self.failure: asyncio.Future[tuple[BaseException, str | None]] = asyncio.get_running_loop().create_future()
        self.total_chars = 0
        self.runs = 0
        self.first_audio_at: float | None = None
        self.audio_s = 0.0
        self.last_frame = time.monotonic()
        self._send_lock = asyncio.Lock()

    # ---- frames ----------------------------------------------------------------------------------------------

    async def read(self) -> str:
        """Route client frames until the client leaves ("left"), closes the socket ("close") or idles ("idle")."""
        while True:
            try:
                msg = await self.ws.receive(timeout=self._next_timeout())
            except asyncio.TimeoutError:
                if self._expire():
                    return "idle"
                continue
            if msg.type == WSMsgType.TEXT:
                self.last_frame = time.monotonic()
                if self.apply(parse_json_object(msg.data, "each frame")):
                    return "close"
            elif msg.type == WSMsgType.BINARY:
                raise ApiError(400, "send JSON text frames like {\"text\": \"...\", \"context_id\": \"...\"}, "
                                    "not binary frames")
            else:  # CLOSE, CLOSING, CLOSED, ERROR: the client is gone
                return "left"

    def _next_timeout(self) -> float:
        deadlines = [c.last_frame + self.idle_s for c in self.open.values()] or [self.last_frame + self.idle_s]
        return max(0.05, min(deadlines) - time.monotonic())

    def _expire(self) -> bool:
        """Close contexts idle for ``idle_s``; True when the connection itself has nothing left to do."""
        now = time.monotonic()
        for context in [c for c in self.open.values() if now - c.last_frame >= self.idle_s]:
            log.info("ElevenLabs context %r idle for %.0f s: closing it", context.id, self.idle_s)
            self._close(context, drop_pending=False)
        busy = any(not t.done() for t in self.tasks)
        return not self.open and not busy and now - self.last_frame >= self.idle_s

    def apply(self, message: dict[str, Any]) -> bool:
        """Act on one frame; True for close_socket."""
        unknown = sorted(set(message) - set(FRAME_KEYS))
        if unknown:
            raise ApiError(400, f"unknown field {unknown[0]!r} in a frame: ElevenLabs' multi-stream-input takes "
                                f"{', '.join(FRAME_KEYS)}")
        if self.auth_pending:
            elevenlabs.verify_frame_key(self.request, message)
            self.auth_pending = False
        for flag in ("flush", "close_context", "close_socket", "try_trigger_generation"):
            if flag in message and not isinstance(message[flag], bool):
                raise ApiError(400, f"{flag} must be true or false; got {message[flag]!r}")
        if message.get("close_socket") is True:
            for context in list(self.open.values()):
                self._close(context, drop_pending=False)
            return True
        context_id = message.get("context_id", message.get("contextId"))
        if context_id is not None and (not isinstance(context_id, str) or not context_id or len(context_id) > 256):
            raise ApiError(400, f"context_id must be a non-empty string; got {context_id!r}")
        text = message.get("text")
        if text is not None and not isinstance(text, str):
            raise ApiError(400, f"text must be a string; got {text!r}")
        context = self.open.get(context_id)
        if message.get("close_context") is True:
            if context is not None:
                self._close(context, drop_pending=True)
            return False  # closing an unknown or finished context asks for nothing
        settings = "voice_settings" in message or "generation_config" in message
        if context is None:
            if not text and message.get("flush") is not True:
                if settings:
                    raise ApiError(400, "voice_settings and generation_config come with a context's first text: "
                                        "{\"text\": \" \", \"context_id\": ..., \"voice_settings\": {...}}")
                return False  # a keep-alive for no open context
            context = self._open(context_id, message)
        elif settings:
            raise ApiError(400, f"voice_settings and generation_config may only come in the first frame of context "
                                f"{context_id!r}")
        context.last_frame = time.monotonic()
        if text:
            self.total_chars += len(text)
            if self.total_chars > self.max_chars:
                raise ApiError(400, f"this connection has passed {self.max_chars} characters (http.max_text_chars): "
                                    "open a new connection for more text")
            context.add(text)
        if message.get("flush") is True:
            context.flush()
        return False

    def _open(self, context_id: str | None, message: dict[str, Any]) -> _Context:
        if len(self.open) >= MAX_CONTEXTS:
            raise _ContextLimit(400, f"Maximum simultaneous contexts per WebSocket connection exceeded "
                                     f"({MAX_CONTEXTS}). Please close an existing context before opening a new one.")
        changes, ignored = elevenlabs.settings(self.voice, message.get("voice_settings"),
                                               message.get("generation_config"))
        params = dataclasses.replace(self.params, **changes) if changes else self.params
        context = _Context(self, context_id, params, ignored)
        self.open[context_id] = context
        self.seen.append(context)
        self.tasks.add(context.task)
        context.task.add_done_callback(lambda t: self._ended(t, context_id))
        return context

    def _close(self, context: _Context, *, drop_pending: bool) -> None:
        context.close(drop_pending=drop_pending)
        if self.open.get(context.id) is context:
            del self.open[context.id]

    def _ended(self, task: asyncio.Task[None], context_id: str | None) -> None:
        if not task.cancelled() and task.exception() is not None and not self.failure.done():
            self.failure.set_result((task.exception(), context_id))  # type: ignore[arg-type]

    # ---- messages --------------------------------------------------------------------------------------------

    def charge_run(self) -> None:
        """One rate-limit token per run after the connection's first (the upgrade paid for that one)."""
        if self.runs:
            guard.charge(self.request, "WebSocket run")
        self.runs += 1

    async def send_audio(self, context: _Context, data: bytes) -> None:
        if not data:
            return
        await self.send(context.noted({"audio": b64(data), "normalizedAlignment": None, "alignment": None,
                                       "contextId": context.id}))
        if self.first_audio_at is None:
            self.first_audio_at = time.monotonic()

    async def send(self, message: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.ws.send_json(message)

    # ---- the connection --------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until it ends; report a failure in ElevenLabs' shape, then close."""
        reader = asyncio.create_task(self.read())
        code, reason, context_id = 1000, b"", None
        try:
            done, _ = await asyncio.wait({reader, self.failure}, return_when=asyncio.FIRST_COMPLETED)
            if self.failure.done():
                error, context_id = self.failure.result()
                raise error
            outcome = reader.result()
            if outcome == "left":
                log.info("ElevenLabs multi-context client left; stopping its synthesis")
            elif self.tasks:  # close_socket or idle: let every context finish speaking
                finished = asyncio.ensure_future(asyncio.gather(*self.tasks, return_exceptions=True))
                await asyncio.wait({finished, self.failure}, return_when=asyncio.FIRST_COMPLETED)
                if self.failure.done():
                    error, context_id = self.failure.result()
                    raise error
        except SpeechError as e:
            err = error_for(e)
            code, reason = close_code(err.status), str(err).encode()[:120]
            if err.status >= 500 and err.status != 503:
                log.warning("ElevenLabs multi-context synthesis failed: %s", err)
            await self._report(err.status, str(err), context_id, isinstance(e, _ContextLimit))
        except ConnectionError:
            log.info("ElevenLabs multi-context client went away")
        except Exception as e:  # noqa: BLE001 - reported to the client, logged with its traceback
            log.exception("ElevenLabs multi-context session failed")
            code, reason = ws_session.CLOSE_ERROR, b"internal error"
            await self._report(500, f"internal error ({type(e).__name__}); see the server log", context_id, False)
        finally:
            for task in (reader, *self.tasks):
                task.cancel()
            await asyncio.gather(reader, *self.tasks, return_exceptions=True)
            self._observe()
            if not self.ws.closed:
                await self.ws.close(code=code, message=reason)

    async def _report(self, status: int, message: str, context_id: str | None, limit: bool) -> None:
        kind = "max_active_conversations" if limit else elevenlabs.ERROR_KINDS.get(status, "internal_error")
        if not self.ws.closed:
            try:
                await self.send({"message": message, "error": kind, "code": close_code(status),
                                 "contextId": context_id})
            except (ConnectionError, RuntimeError):
                pass

    def _observe(self) -> None:
        t0 = self.request.get(REQUEST_T0)
        if t0 is None:
            return
        audio_s = sum(c.out.samples_out / c.out.sample_rate for c in self.seen)
        ttfa = self.first_audio_at - t0 if self.first_audio_at is not None else None
        self.request.app[METRICS].observe_audio(ttfa, time.monotonic() - t0, audio_s)



async def _handler(request: web.Request) -> web.WebSocketResponse:
    config = services_of(request).config
    voice, params, fmt, rate, idle = await elevenlabs.upgrade_options(request, DOOR)
    ws = ws_session.websocket(request, config.http.max_body_kb)
    await ws.prepare(request)
    await _MultiSession(request, ws, voice, params, fmt, rate, idle).run()
    return ws


def add_routes(app: web.Application) -> None:
    """Register the WebSocket route."""
    app.router.add_get("/v1/text-to-speech/{voice}/multi-stream-input", _handler, name="elevenlabs:multi_stream_input")
