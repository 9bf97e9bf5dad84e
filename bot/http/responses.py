"""What every front-end sends back: JSON errors, and audio (one body, or streamed as it is synthesized).

Audio leaves in the order the synthesizer yields it. A streamed response is started (status and headers sent) only
when the first chunk exists, so an error the synthesizer raises up front (busy queue, unknown voice, bad text) still
becomes a JSON error with the right status; after that, an error can only cut the stream short, and it is logged.
Closing the response (client gone, error) closes the synthesizer's iterator, which stops the model work.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from typing import TYPE_CHECKING, Any, AsyncIterator

import numpy as np
from aiohttp import web

from bot.http.metrics import HttpMetrics
from engines.base import EngineError, SpeechError
from synthesis.audio import StreamEncoder, StreamResampler, encode_audio, resample
from synthesis.types import AudioChunk, AudioInputError, BusyError, DeadlineError, VoiceNotFound

if TYPE_CHECKING:
    from bot.services import Services

log = logging.getLogger(__name__)

SERVICES: web.AppKey[Any] = web.AppKey("voicebot_services")
METRICS: web.AppKey[HttpMetrics] = web.AppKey("voicebot_metrics", HttpMetrics)
# request storage: time.monotonic() at arrival (typed keys from aiohttp 3.12; a plain string before)
REQUEST_T0: Any = web.RequestKey("voicebot_t0", float) if hasattr(web, "RequestKey") else "voicebot_t0"
RETRY_AFTER_BUSY_S = 2  # seconds a client is told to wait when the queue is full
CHEAP_FORMATS = ("wav", "raw", "pcm")  # encoded inline; the others in a worker thread

# Content types by format name (api_v2 uses "audio/<media_type>", as upstream does).
CONTENT_TYPES = {
    "wav": "audio/wav", "raw": "audio/raw", "pcm": "audio/pcm", "ogg": "audio/ogg", "opus": "audio/ogg",
    "mp3": "audio/mpeg", "aac": "audio/aac", "flac": "audio/flac",
}


class ApiError(SpeechError):
    """A request the API refuses: ``status`` is the HTTP status, the message says what to fix."""

    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


def services_of(request: web.Request) -> Services:
    """The process's services, as stored on the app by ``create_app``."""
    return request.app[SERVICES]


def error_body(status: int, message: str) -> dict[str, Any]:
    """One JSON error shape for every protocol: api_v2's top-level ``message`` and OpenAI's ``error`` object."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 401:
        kind = "authentication_error"
    elif status == 429:
        kind = "rate_limit_error"
    return {"message": message, "error": {"message": message, "type": kind, "code": status}}


def json_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(status, message), status=status, headers=headers)


def error_for(exc: SpeechError) -> ApiError:
    """The HTTP status and headers for an error raised by the synthesis layer."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, BusyError):
        return ApiError(503, str(exc), headers={"Retry-After": str(RETRY_AFTER_BUSY_S)})
    if isinstance(exc, DeadlineError):
        return ApiError(504, str(exc))
    if isinstance(exc, EngineError):
        return ApiError(500, f"the speech engine failed: {exc}")
    if isinstance(exc, (VoiceNotFound, AudioInputError)):
        return ApiError(400, str(exc))
    return ApiError(400, str(exc))  # text and parameter errors from the front-end


class AudioOut:
    """Float chunks at the synthesizer's rate -> encoded bytes in one format, optionally resampled.

    ``encode`` may run in a worker thread (compressed formats); calls must not overlap, which sequential awaits
    guarantee.
    """

    def __init__(self, fmt: str, sample_rate_in: int, sample_rate_out: int | None = None) -> None:
        self.fmt = fmt
        self.sample_rate = sample_rate_out or sample_rate_in
        self._resampler = StreamResampler(sample_rate_in, self.sample_rate) if self.sample_rate != sample_rate_in \
            else None
        self._encoder = StreamEncoder(fmt, self.sample_rate)
        self._started = False
        self.samples_out = 0  # samples encoded so far, at the output rate

    async def encode(self, audio: np.ndarray) -> bytes:
        """The bytes for one chunk (``[N]`` float32), preceded by the stream header on the first call."""
        if self._resampler is not None:
            audio = self._resampler.process(audio)
        self.samples_out += int(audio.size)
        head = b""
        if not self._started:
            self._started = True
            head = self._encoder.header()
        if self.fmt in CHEAP_FORMATS:
            return head + self._encoder.encode(audio)
        return head + await asyncio.to_thread(self._encoder.encode, audio)

    async def finish(self) -> bytes:
        """Flush the resampler and the encoder: the stream's last bytes."""
        tail = b""
        if self._resampler is not None:
            rest = self._resampler.process(np.zeros(0, np.float32), last=True)
            if rest.size:
                self.samples_out += int(rest.size)
                tail = self._encoder.encode(rest) if self.fmt in CHEAP_FORMATS \
                    else await asyncio.to_thread(self._encoder.encode, rest)
        head = b"" if self._started else self._encoder.header()
        self._started = True
        end = self._encoder.finish() if self.fmt in CHEAP_FORMATS else await asyncio.to_thread(self._encoder.finish)
        return head + tail + end


async def first_chunk(chunks: AsyncIterator[AudioChunk]) -> AudioChunk:
    """Wait for the first chunk; raise :class:`ApiError` 400 when the text has nothing to speak."""
    try:
        return await anext(chunks)
    except StopAsyncIteration:
        raise ApiError(400, "the text has nothing to speak (only punctuation or spaces?): send words") from None


async def close_quietly(chunks: AsyncIterator[AudioChunk]) -> None:
    """Close the synthesizer's iterator (stops its model work); never raises."""
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:  # noqa: BLE001 - closing must not mask the response's own outcome
            log.debug("closing the synthesis stream failed", exc_info=True)


async def whole_audio(request: web.Request, chunks: AsyncIterator[AudioChunk], fmt: str, *,
                      sample_rate: int | None = None, content_type: str | None = None) -> web.Response:
    """Synthesize everything, then answer with one complete audio file (exact length in the header).

    Parameters
    ----------
    chunks: the synthesizer's stream (closed here in every case).
    fmt: a ``synthesis.audio`` format name (wav, raw, pcm, ogg, opus, mp3, aac, flac).
    sample_rate: output rate in Hz; default: the synthesizer's (32 kHz).
    """
    try:
        first = await first_chunk(chunks)
        parts = [first.audio]
        async for chunk in chunks:
            parts.append(chunk.audio)
    finally:
        await close_quietly(chunks)
    audio = np.concatenate(parts).astype(np.float32, copy=False)  # [N] float32 @ first.sample_rate
    rate = sample_rate or first.sample_rate
    if rate != first.sample_rate:
        audio = resample(audio, first.sample_rate, rate)
    body = await asyncio.to_thread(encode_audio, audio, rate, fmt)
    wall = time.monotonic() - request.get(REQUEST_T0, time.monotonic())
    request.app[METRICS].observe_audio(wall, wall, audio.size / rate)
    return web.Response(body=body, headers={"Content-Type": content_type or CONTENT_TYPES[fmt],
                                            "Cache-Control": "no-store"})


async def stream_audio(request: web.Request, chunks: AsyncIterator[AudioChunk], fmt: str, *,
                       sample_rate: int | None = None, content_type: str | None = None,
                       sse: bool = False) -> web.StreamResponse:
    """Answer with audio as it is synthesized: chunked transfer, one write per chunk.

    The first write carries the format's header (a WAV header with an unknown length, an Ogg header...) and the first
    sentence. With ``sse`` the body is OpenAI's speech event stream instead: ``speech.audio.delta`` events with the
    encoded bytes in base64, then ``speech.audio.done``.
    """
    t0 = request.get(REQUEST_T0, time.monotonic())
    metrics = request.app[METRICS]
    try:
        first = await first_chunk(chunks)
    except BaseException:
        await close_quietly(chunks)
        raise
    out = AudioOut(fmt, first.sample_rate, sample_rate)
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream" if sse else (content_type or CONTENT_TYPES[fmt]),
        "Cache-Control": "no-store", "X-Accel-Buffering": "no"})
    response.enable_chunked_encoding()
    ttfa: float | None = None
    complete = False
    try:
        await response.prepare(request)
        chunk: AudioChunk | None = first
        while chunk is not None:
            data = await out.encode(chunk.audio)
            await response.write(_sse_delta(data) if sse else data)
            if ttfa is None:
                ttfa = time.monotonic() - t0
            chunk = await anext(chunks, None)
        tail = await out.finish()
        if sse:
            await response.write((_sse_delta(tail) if tail else b"") + _sse_event({"type": "speech.audio.done"}))
        elif tail:
            await response.write(tail)
        await response.write_eof()
        complete = True
    except asyncio.CancelledError:
        log.info("a %s stream was cancelled after %.2f s of audio", fmt, out.samples_out / out.sample_rate)
        raise
    except ConnectionError:
        log.info("client went away during a %s stream after %.2f s of audio", fmt, out.samples_out / out.sample_rate)
    except Exception as e:  # the status line is gone: all we can do is end the stream visibly
        log.error("synthesis failed mid-stream (%s): %s", type(e).__name__, e, exc_info=not isinstance(e, SpeechError))
        if sse:
            message = str(e) if isinstance(e, SpeechError) else "internal error; see the server log"
            await _try_write(response, _sse_event({"type": "error", "error": error_body(500, message)["error"]}))
        if request.transport is not None:
            request.transport.close()  # no terminating chunk: the client sees a truncated body
    finally:
        await close_quietly(chunks)
        if not complete:
            metrics.aborted_streams += 1
        metrics.observe_audio(ttfa, time.monotonic() - t0, out.samples_out / out.sample_rate)
    return response


def _sse_event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _sse_delta(data: bytes) -> bytes:
    return _sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})


async def _try_write(response: web.StreamResponse, data: bytes) -> None:
    try:
        await response.write(data)
    except Exception:  # noqa: BLE001 - best effort on a failing stream
        pass
