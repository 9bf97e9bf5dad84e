"""The aiohttp application: routes of every protocol, and the middlewares every request passes.

Outermost first: errors in each protocol's JSON shape and request metrics; the browser, credential and Host checks
(``bot.http.guard``); body-size and per-client rate limits. Every refusal says what to fix. ``/healthz`` needs no
token and is not rate limited. Idle keep-alive connections, and connections slow to send their request head
(slowloris), are closed after ``http.idle_timeout_s``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import re
import ssl
import time
import uuid
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from bot.config import ConfigError
from bot.http import (api_v2, elevenlabs, elevenlabs_multi, elevenlabs_rest, guard, openai_speech, pronunciations,
                      sillytavern, stream_input, voice_upload)
from bot.http.metrics import HttpMetrics
from bot.http.responses import (METRICS, REQUEST_T0, SERVICES, ApiError, error_for, ignored_header, json_error,
                                protocol_of, services_of)
from bot.http.tls import server_context
from synthesis import SpeechError

if TYPE_CHECKING:
    from bot.services import Services

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # a client's X-Request-Id that is echoed back
ENDPOINTS = ("/tts, /speakers, /v1/audio/speech, /v1/audio/models, /v1/audio/voices, /v1/models, "
             "/v1/tts/stream-input, /v1/text-to-speech/{voice}[/stream, /stream-input, /multi-stream-input], "
             "/pronunciations, /phonemes, /voices, /v1/voices/add, /healthz or /metrics")


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure as a JSON error in the protocol's shape; every request counted by protocol and status."""
    request[REQUEST_T0] = time.monotonic()
    protocol = protocol_of(request)
    try:
        response = await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        response = json_error(e.status, _http_message(e, request), headers=_allow_header(e), protocol=protocol)
    except SpeechError as e:
        err = error_for(e)
        _log_refusal(request, err)
        response = json_error(err.status, str(err), headers=err.headers, protocol=protocol)
    except asyncio.CancelledError:
        request.app[METRICS].observe_request(protocol, 499)  # nginx's "client closed request"
        raise
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        response = json_error(500, "internal error; see the server log", protocol=protocol)
    request.app[METRICS].observe_request(protocol, response.status)
    log.debug("%s %s -> %s", request.method, request.path, response.status)  # no query: it may hold a token
    return response


def _log_refusal(request: web.Request, err: ApiError) -> None:
    """Only a failure of this server is an ERROR; 501 (a client probing upstream's endpoints), 503 (busy) and
    504 are part of normal operation."""
    if err.status == 500:
        log.error("%s %s failed: %s", request.method, request.path, err)
    elif err.status == 504:
        log.warning("%s %s: %s", request.method, request.path, err)
    elif err.status >= 500:
        log.info("%s %s -> %s: %s", request.method, request.path, err.status, err)


def _allow_header(e: web.HTTPException) -> dict[str, str] | None:
    allow = e.headers.get("Allow")
    return {"Allow": allow} if allow else None


def _http_message(e: web.HTTPException, request: web.Request) -> str:
    """Messages for aiohttp's own refusals that say what to do."""
    if e.status == 404:
        return f"no endpoint {request.path}: use {ENDPOINTS}"
    if e.status == 405:
        return f"{request.method} is not allowed on {request.path}; allowed: {e.headers.get('Allow', '?')}"
    if e.status == 413:
        limit = request.app[SERVICES].config.http.max_body_kb
        return f"the request body is larger than {limit} KiB (http.max_body_kb): send less"
    return e.text or e.reason


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Browser origins and preflights, credentials, Host (``bot.http.guard``)."""
    preflight = guard.check_browser(request)
    if preflight is not None:
        return preflight
    guard.check_credentials(request)
    return await handler(request)


@web.middleware
async def _limits(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The declared body size and the per-client request rate."""
    config = services_of(request).config.http
    if getattr(request.match_info.route, "name", None) in voice_upload.UPLOAD_ROUTES:  # an audio file: its own limit
        limit = voice_upload.body_limit(services_of(request).config)
        if request.content_length is not None and request.content_length > limit:
            raise ApiError(413, f"the upload is {request.content_length} bytes; the limit is {limit} bytes "
                                "(voices.max_upload_mb and the form around it): send a shorter clip")
    elif request.content_length is not None and request.content_length > config.max_body_kb * 1024:
        raise ApiError(413, f"the request body is {request.content_length} bytes; the limit is "
                            f"{config.max_body_kb} KiB (http.max_body_kb): send less")
    if request.path not in guard.OPEN_PATHS:
        guard.charge(request)
    return await handler(request)


async def _cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Let allowed browser pages read responses (set before headers leave, streamed responses included)."""
    origin = request.headers.get("Origin")
    if origin and guard.origin_allowed(request, origin) and "Access-Control-Allow-Origin" not in response.headers:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Vary"] = "Origin"


async def _ignored(request: web.Request, response: web.StreamResponse) -> None:
    """Say which request fields had no effect (``X-Voicebot-Ignored``: OpenAI ``instructions`` that name no style,
    an ElevenLabs ``style`` number)."""
    ignored_header(request, response)


async def _request_id(request: web.Request, response: web.StreamResponse) -> None:
    """Every response names its request: the client's own ``X-Request-Id`` when it is a plain token, else a new
    one (LiveKit warns on every answer without it)."""
    given = request.headers.get("X-Request-Id", "")
    response.headers["X-Request-Id"] = given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex


class _QuietBadRequests(logging.Filter):
    """aiohttp logs a malformed request (a bad request line, header or chunk) with a traceback: one line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError) and getattr(error, "code", 400) < 500:
            what = (str(error.message).strip().splitlines() or [type(error).__name__])[0]
            record.msg, record.args, record.exc_info, record.exc_text = "malformed request refused: %s", (what,), \
                None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


async def _metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[METRICS].render(request.headers.get("Accept", ""))
    return web.Response(body=body, headers={"Content-Type": content_type})


async def _healthz(request: web.Request) -> web.Response:
    synth = services_of(request).synthesizer
    return web.json_response({
        "status": "ok", "engine": synth.engine_name, "device": synth.device, "precision": synth.precision,
        "queue_depth": synth.metrics().get("queue_depth", 0),
        "uptime_s": round(time.time() - request.app[METRICS].started, 3)})


def create_app(services: Services) -> web.Application:
    """The HTTP API for ``services`` (config, synthesizer): every protocol on one aiohttp app.

    The bearer token is read once, here, from the environment variable named by ``http.token_env``.
    """
    config = services.config
    app = web.Application(middlewares=[_errors, _guard, _limits], client_max_size=config.http.max_body_kb * 1024)
    app[SERVICES] = services
    app[METRICS] = HttpMetrics(lambda: services.synthesizer.metrics())  # read at each scrape
    guard.setup(app, config.secret(config.http.token_env))
    app.on_response_prepare.append(_cors_headers)
    app.on_response_prepare.append(_request_id)
    app.on_response_prepare.append(_ignored)
    api_v2.add_routes(app, config)
    sillytavern.add_routes(app)
    openai_speech.add_routes(app)
    stream_input.add_routes(app)
    elevenlabs.add_routes(app)
    elevenlabs_multi.add_routes(app)
    elevenlabs_rest.add_routes(app)
    pronunciations.add_routes(app, services)
    voice_upload.add_routes(app)
    app.router.add_get("/metrics", _metrics, name="meta:metrics")
    app.router.add_get("/healthz", _healthz, name="meta:healthz")
    return app


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(config: Any, host: str | None = None) -> None:
    """Raise :class:`ConfigError` when the API would listen beyond loopback without a token (``serve`` calls this
    before loading any model, so the refusal comes at once)."""
    bind: str = host or config.http.host
    if not is_loopback(bind) and config.secret(config.http.token_env) is None:
        raise ConfigError(f"the HTTP API would listen on {bind}, which other machines can reach, without a token: "
                          f"set the environment variable {config.http.token_env} (http.token_env) to a long random "
                          "secret, or bind to 127.0.0.1 (http.host / --host)")


def check_start(config: Any, host: str | None = None) -> ssl.SSLContext | None:
    """Everything about serving that can be refused before any model loads (``serve`` calls it first): the bind
    (:func:`check_bind`), the TLS files and the reference folders. Returns the TLS context (None: plain HTTP).

    Raises :class:`ConfigError` with one line naming the key.
    """
    check_bind(config, host)
    for folder in config.http.reference_dirs:
        if not os.path.isdir(folder):
            raise ConfigError(f"http.reference_dirs: {folder} is not a folder: create it, or remove it from the list")
    return server_context(config.http)


async def start_server(services: Services, host: str | None = None, port: int | None = None) -> web.AppRunner:
    """Start the API on ``host:port`` (default ``http.host``/``http.port``); returns the runner to ``cleanup()``.

    Raises :class:`ConfigError` when asked to listen beyond loopback without a token, or when the TLS files or
    reference folders are unusable (:func:`check_start`).
    """
    config = services.config
    host = host or config.http.host
    port = config.http.port if port is None else port
    tls = check_start(config, host)
    app = create_app(services)
    if not any(isinstance(f, _QuietBadRequests) for f in logging.getLogger("aiohttp.server").filters):
        logging.getLogger("aiohttp.server").addFilter(_QuietBadRequests())
    # keepalive_timeout also runs from the connection's start until a whole request head has arrived
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           keepalive_timeout=config.http.idle_timeout_s)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror or e}): pick another port "
                          "(http.port / --port) or stop what uses it") from e
    scheme = "https" if tls is not None else "http"
    addresses = ", ".join(f"{scheme}://{a[0]}:{a[1]}" if isinstance(a, tuple) else str(a) for a in runner.addresses)
    log.info("HTTP API listening on %s (token %s)", addresses,
             "required" if app[guard.TOKEN] else "not required: loopback only")
    return runner
