"""What every front-end sends back: JSON errors, and audio (one body, or streamed as it is synthesized).

Audio leaves in the order the synthesizer yields it. A streamed response is started (status and headers sent) only
when the first chunk exists, so an error the synthesizer raises up front (busy queue, unknown voice, bad text) still
becomes a JSON error with the right status; after that, an error can only cut the stream short, and it is logged.
Closing the response (client gone, error) closes the synthesizer's iterator, which stops the model work. FLAC is
the one format sent only once complete: its header must hold the length for common decoders to read it.
Encoders are PyAV's (``synthesis.audio``, and PyAV's G.711 codecs for the raw telephony formats).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, TypeVar

import av
import numpy as np
import pydantic
from aiohttp import web

from bot.http.metrics import HttpMetrics
from engines import EngineError
from synthesis import SpeechError
from synthesis.audio import StreamEncoder, StreamResampler, encode_audio, resample
from synthesis.types import AudioChunk, AudioInputError, BusyError, DeadlineError, VoiceNotFound, to_pcm16

if TYPE_CHECKING:
    from bot.services import Services
    from bot.voice_service import VoiceService

log = logging.getLogger(__name__)
_Model = TypeVar("_Model", bound=pydantic.BaseModel)

SERVICES: web.AppKey[Any] = web.AppKey("voicebot_services")
METRICS: web.AppKey[HttpMetrics] = web.AppKey("voicebot_metrics", HttpMetrics)
# request storage: time.monotonic() at arrival (typed keys from aiohttp 3.12; a plain string before)
REQUEST_T0: Any = web.RequestKey("voicebot_t0", float) if hasattr(web, "RequestKey") else "voicebot_t0"
RETRY_AFTER_BUSY_S = 2  # seconds a client is told to wait when the queue is full
SEMANTIC_HZ = 25  # GPT-SoVITS v2 semantic tokens per second of speech
_TOKENS = re.compile(r"\w+|[^\w\s]")  # words and punctuation marks: the usage's input tokens
CHEAP_FORMATS = ("wav", "raw", "pcm", "ulaw", "alaw")  # encoded inline; the others in a worker thread

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


def voices_of(services: Services) -> VoiceService:
    """The voice service the API reads voices through (every :class:`~bot.services.Services` has one)."""
    voices = services.voices
    assert voices is not None, "Services builds its voice service"
    return voices


def protocol_of(request: web.Request) -> str:
    """The protocol a request belongs to, from its route's name (``api_v2:tts_get`` -> ``api_v2``)."""
    name = getattr(request.match_info.route, "name", None) or ""
    return name.split(":", 1)[0] if ":" in name else "unknown"


def error_body(status: int, message: str, protocol: str = "") -> Any:
    """The JSON error in the shape the protocol's clients display.

    api_v2 (upstream's top-level ``message``) and OpenAI (an ``error`` object) share one body; SillyTavern shows
    ``await response.json()`` as text, so it gets the message as a JSON string; ElevenLabs clients read
    ``detail.message``.
    """
    if protocol == "sillytavern":
        return message
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 401:
        kind = "authentication_error"
    elif status == 429:
        kind = "rate_limit_error"
    if protocol == "elevenlabs":
        status_name = {401: "invalid_api_key", 429: "too_many_concurrent_requests", 503: "system_busy"}
        return {"detail": {"status": status_name.get(status, kind), "message": message}}
    return {"message": message, "error": {"message": message, "type": kind, "code": status}}


def json_error(status: int, message: str, headers: dict[str, str] | None = None,
               protocol: str = "") -> web.Response:
    # UTF-8 as written: a Chinese, Japanese or Korean message stays readable (json.dumps would escape it)
    return web.json_response(error_body(status, message, protocol), status=status, headers=headers,
                             dumps=_utf8_json)


def _utf8_json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def error_for(exc: SpeechError) -> ApiError:
    """The HTTP status and headers for an error raised by the synthesis layer."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, BusyError):  # refused at once, so the client can retry elsewhere or later
        return ApiError(503, f"{exc} (retry after {RETRY_AFTER_BUSY_S} s)",
                        headers={"Retry-After": str(RETRY_AFTER_BUSY_S)})
    if isinstance(exc, DeadlineError):
        return ApiError(504, str(exc))
    if isinstance(exc, EngineError):
        return ApiError(500, f"the speech engine failed: {exc}")
    if isinstance(exc, (VoiceNotFound, AudioInputError)):
        return ApiError(400, str(exc))
    return ApiError(400, str(exc))  # text and parameter errors from the front-end


UNKNOWN_SIZE = b"\xff\xff\xff\xff"  # RIFF/data size of a streamed WAV, as OpenAI writes it: "read to the end"


class _G711:
    """Raw G.711 (mu-law or A-law) bytes from PyAV's encoder; no container, as telephony clients expect."""

    def __init__(self, fmt: str, sample_rate: int) -> None:
        self._codec: Any = av.CodecContext.create("pcm_mulaw" if fmt == "ulaw" else "pcm_alaw", "w")
        self._codec.sample_rate = sample_rate
        self._codec.format = "s16"
        self._codec.layout = "mono"
        self._rate = sample_rate

    def header(self) -> bytes:
        return b""

    def encode(self, audio: np.ndarray) -> bytes:
        if audio.size == 0:
            return b""
        pcm = to_pcm16(audio)[None, :]  # [1, N] s16
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
        frame.sample_rate = self._rate
        return b"".join(bytes(p) for p in self._codec.encode(frame))

    def finish(self) -> bytes:
        return b"".join(bytes(p) for p in self._codec.encode(None))


class AudioOut:
    """Float chunks at the synthesizer's rate -> encoded bytes in one format, optionally resampled.

    ``fmt`` is a ``synthesis.audio`` format name, or ``ulaw``/``alaw`` (raw G.711). With ``wav_size_unknown``
    a streamed WAV header carries 0xFFFFFFFF sizes (OpenAI's convention, which soundfile and ``wave`` read to the
    end) instead of upstream api_v2's 0. ``encode`` may run in a worker thread (compressed formats); calls must
    not overlap, which sequential awaits guarantee.
    """

    def __init__(self, fmt: str, sample_rate_in: int, sample_rate_out: int | None = None, *,
                 wav_size_unknown: bool = False) -> None:
        self.fmt = fmt
        self.sample_rate = sample_rate_out or sample_rate_in
        self._resampler = StreamResampler(sample_rate_in, self.sample_rate) if self.sample_rate != sample_rate_in \
            else None
        self._encoder: Any = _G711(fmt, self.sample_rate) if fmt in ("ulaw", "alaw") \
            else StreamEncoder(fmt, self.sample_rate)
        self._wav_size_unknown = wav_size_unknown and fmt == "wav"
        self._started = False
        self.samples_out = 0  # samples encoded so far, at the output rate

    def _header(self) -> bytes:
        head = self._encoder.header()
        if self._wav_size_unknown and head[:4] == b"RIFF" and head[36:40] == b"data":
            head = head[:4] + UNKNOWN_SIZE + head[8:40] + UNKNOWN_SIZE + head[44:]
        return head

    async def encode(self, audio: np.ndarray) -> bytes:
        """The bytes for one chunk (``[N]`` float32), preceded by the stream header on the first call."""
        if self._resampler is not None:
            audio = self._resampler.process(audio)
        self.samples_out += int(audio.size)
        head = b""
        if not self._started:
            self._started = True
            head = self._header()
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
        head = b"" if self._started else self._header()
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


async def _whole(chunks: AsyncIterator[AudioChunk], fmt: str, sample_rate: int | None) -> tuple[bytes, float]:
    """Synthesize everything, then encode one complete file: (bytes, audio seconds)."""
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
    return body, audio.size / rate


async def whole_audio(request: web.Request, chunks: AsyncIterator[AudioChunk], fmt: str, *,
                      sample_rate: int | None = None, content_type: str | None = None) -> web.Response:
    """Synthesize everything, then answer with one complete audio file (exact length in the header).

    Parameters
    ----------
    chunks: the synthesizer's stream (closed here in every case).
    fmt: a ``synthesis.audio`` format name (wav, raw, pcm, ogg, opus, mp3, aac, flac).
    sample_rate: output rate in Hz; default: the synthesizer's (32 kHz).
    """
    body, audio_s = await _whole(chunks, fmt, sample_rate)
    wall = time.monotonic() - request.get(REQUEST_T0, time.monotonic())
    request.app[METRICS].observe_audio(wall, wall, audio_s)
    return web.Response(body=body, headers={"Content-Type": content_type or CONTENT_TYPES[fmt],
                                            "Cache-Control": "no-store"})


def speech_usage(text: str, audio_s: float) -> dict[str, int]:
    """OpenAI's ``usage`` for a speech response: input tokens are the text's words and punctuation marks (there
    is no text tokenizer here), output tokens the model's 25 Hz semantic tokens the audio's length represents."""
    input_tokens = len(_TOKENS.findall(text))
    output_tokens = round(audio_s * SEMANTIC_HZ)
    return {"input_tokens": input_tokens, "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens}


IGNORED_HEADER = "X-Voicebot-Ignored"  # request fields accepted without effect, comma-separated
_IGNORED = "voicebot_ignored"  # where a handler notes them on the request


def say_ignored(request: web.Request, field: str) -> None:
    """Note that a request field had no effect: the response says so in :data:`IGNORED_HEADER`."""
    request.setdefault(_IGNORED, []).append(field)


def ignored_header(request: web.Request, response: web.StreamResponse) -> None:
    """Set :data:`IGNORED_HEADER` on a response (its headers not sent yet) from what the handler noted."""
    fields = request.get(_IGNORED)
    if fields:
        response.headers[IGNORED_HEADER] = ", ".join(fields)


async def stream_audio(request: web.Request, chunks: AsyncIterator[AudioChunk], fmt: str, *,
                       sample_rate: int | None = None, content_type: str | None = None,
                       sse: bool = False, wav_size_unknown: bool = False,
                       usage_text: str | None = None,
                       wrap: Callable[[bytes], bytes] | None = None) -> web.StreamResponse:
    """Answer with audio as it is synthesized: chunked transfer, one write per chunk.

    The first write carries the format's header (a WAV header with an unknown length, an Ogg header...) and the first
    sentence. FLAC is the exception: its STREAMINFO must hold the total length for common decoders (soundfile
    refuses a FLAC with 0 there), so it is sent once complete. With ``sse`` the body is OpenAI's speech event
    stream instead: ``speech.audio.delta`` events with the encoded bytes in base64, then ``speech.audio.done``
    (with ``usage`` for ``usage_text``). ``wrap`` turns each piece of encoded audio into what is written instead
    (ElevenLabs' JSON lines).
    """
    t0 = request.get(REQUEST_T0, time.monotonic())
    metrics = request.app[METRICS]
    if fmt == "flac":
        return await _whole_streamed(request, chunks, sample_rate, content_type, sse, usage_text)
    try:
        first = await first_chunk(chunks)
    except BaseException:
        await close_quietly(chunks)
        raise
    out = AudioOut(fmt, first.sample_rate, sample_rate, wav_size_unknown=wav_size_unknown)
    response = _stream_response(fmt, content_type, sse)
    ttfa: float | None = None
    complete = False
    try:
        await response.prepare(request)
        chunk: AudioChunk | None = first
        while chunk is not None:
            data = await out.encode(chunk.audio)
            await response.write(_sse_delta(data) if sse else wrap(data) if wrap else data)
            if ttfa is None:
                ttfa = time.monotonic() - t0
            chunk = await anext(chunks, None)
        tail = await out.finish()
        if sse:
            done = _sse_done(usage_text, out.samples_out / out.sample_rate)
            await response.write((_sse_delta(tail) if tail else b"") + done)
        elif tail:
            await response.write(wrap(tail) if wrap else tail)
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
            metrics.aborted_streams.inc()
        metrics.observe_audio(ttfa, time.monotonic() - t0, out.samples_out / out.sample_rate)
    return response


def _stream_response(fmt: str, content_type: str | None, sse: bool) -> web.StreamResponse:
    response = web.StreamResponse(headers={
        "Content-Type": "text/event-stream" if sse else (content_type or CONTENT_TYPES[fmt]),
        "Cache-Control": "no-store", "X-Accel-Buffering": "no"})
    response.enable_chunked_encoding()
    return response


async def _whole_streamed(request: web.Request, chunks: AsyncIterator[AudioChunk], sample_rate: int | None,
                          content_type: str | None, sse: bool, usage_text: str | None) -> web.StreamResponse:
    """A stream request for a format that must know its length up front (FLAC): one body, or one SSE delta."""
    if not sse:
        return await whole_audio(request, chunks, "flac", sample_rate=sample_rate, content_type=content_type)
    t0 = request.get(REQUEST_T0, time.monotonic())
    body, audio_s = await _whole(chunks, "flac", sample_rate)
    response = _stream_response("flac", content_type, sse)
    await response.prepare(request)
    await response.write(_sse_delta(body) + _sse_done(usage_text, audio_s))
    await response.write_eof()
    wall = time.monotonic() - t0
    request.app[METRICS].observe_audio(wall, wall, audio_s)
    return response


def _sse_done(usage_text: str | None, audio_s: float) -> bytes:
    event: dict[str, Any] = {"type": "speech.audio.done"}
    if usage_text is not None:
        event["usage"] = speech_usage(usage_text, audio_s)
    return _sse_event(event)


def _sse_event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _sse_delta(data: bytes) -> bytes:
    return _sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})


async def _try_write(response: web.StreamResponse, data: bytes) -> None:
    try:
        await response.write(data)
    except Exception:  # noqa: BLE001 - best effort on a failing stream
        pass


def validate_body(model: type[_Model], data: Any) -> _Model:
    """``data`` as a pydantic ``model`` (lax coercion: ``"1.5"``, ``"true"``); a 400 naming the first bad field."""
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as e:
        raise ApiError(400, pydantic_message(e)) from None


def pydantic_message(e: pydantic.ValidationError) -> str:
    """The first validation error as one line: ``speed: input should be less than or equal to 4; got 5``."""
    err = e.errors(include_url=False)[0]
    name = ".".join(str(x) for x in err["loc"]) or "the body"
    if err["type"] == "missing":
        return f"{name} is required"
    msg = err["msg"]
    msg = msg[0].lower() + msg[1:] if msg else "is not valid"
    return f"{name}: {msg}; got {err.get('input')!r}"[:400]
