"""The aiohttp application: routes of every protocol, and the middlewares every request passes.

Outermost first: JSON errors and request metrics; CORS preflight and bearer-token auth; body-size and per-client
rate limits. Every refusal is a JSON body whose ``message`` says what to fix. ``/healthz`` needs no token and is
not rate limited.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import math
import time
from typing import TYPE_CHECKING, Awaitable, Callable

from aiohttp import web

from bot.config import ConfigError
from bot.http import api_v2, openai_speech, sillytavern, stream_input
from bot.http.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from bot.http.metrics import HttpMetrics
from bot.http.responses import METRICS, REQUEST_T0, SERVICES, ApiError, error_for, json_error, services_of
from engines.base import SpeechError

if TYPE_CHECKING:
    from bot.services import Services

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TOKEN: web.AppKey[str | None] = web.AppKey("voicebot_token")
LIMITER: web.AppKey[RateLimiter] = web.AppKey("voicebot_limiter")
ORIGINS: web.AppKey[tuple[str, ...]] = web.AppKey("voicebot_origins")
OPEN_PATHS = ("/healthz",)  # no token, no rate limit
WS_PATHS = ("/v1/tts/stream-input",)  # browsers cannot set headers on a WebSocket: ?token= accepted here
CORS_MAX_AGE_S = 600  # how long a browser may cache a preflight answer
LIMITER_SWEEP = 1024  # forget idle clients once this many are tracked


class RateLimiter:
    """A token bucket per client address: ``per_min`` requests a minute, bursts up to ``per_min``."""

    def __init__(self, per_min: int) -> None:
        self.per_min = per_min
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, last refill, monotonic s)

    def take(self, client: str, now: float | None = None) -> float:
        """Spend one token; return 0 when allowed, else the seconds until the next token."""
        if self.per_min <= 0:
            return 0.0
        now = time.monotonic() if now is None else now
        rate = self.per_min / 60.0  # tokens per second
        tokens, last = self._buckets.get(client, (float(self.per_min), now))
        tokens = min(float(self.per_min), tokens + (now - last) * rate)
        if tokens < 1.0:
            self._buckets[client] = (tokens, now)
            return (1.0 - tokens) / rate
        self._buckets[client] = (tokens - 1.0, now)
        if len(self._buckets) > LIMITER_SWEEP:
            self._sweep(now)
        return 0.0

    def _sweep(self, now: float) -> None:
        """Drop clients whose bucket has refilled (they would start full anyway)."""
        full_after = 60.0
        self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < full_after}


def _protocol(request: web.Request) -> str:
    """The protocol a request belongs to, from its route's name (``api_v2:tts_get`` -> ``api_v2``)."""
    route = request.match_info.route
    name = getattr(route, "name", None) or ""
    return name.split(":", 1)[0] if ":" in name else "unknown"


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure as a JSON error; every request counted by protocol and status."""
    request[REQUEST_T0] = time.monotonic()
    try:
        response = await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        response = json_error(e.status, _http_message(e, request), headers=_retry_headers(e))
    except SpeechError as e:
        err = error_for(e)
        if err.status >= 500:
            log.error("%s %s failed: %s", request.method, request.path, e)
        response = json_error(err.status, str(err), headers=err.headers)
    except asyncio.CancelledError:
        request.app[METRICS].observe_request(_protocol(request), 499)  # nginx's "client closed request"
        raise
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        response = json_error(500, "internal error; see the server log")
    request.app[METRICS].observe_request(_protocol(request), response.status)
    log.debug("%s %s -> %s", request.method, request.path, response.status)  # no query: it may hold a token
    return response


def _retry_headers(e: web.HTTPException) -> dict[str, str] | None:
    allow = e.headers.get("Allow")
    return {"Allow": allow} if allow else None


def _http_message(e: web.HTTPException, request: web.Request) -> str:
    """Messages for aiohttp's own refusals that say what to do."""
    if e.status == 404:
        return (f"no endpoint {request.path}: use /tts, /speakers, /v1/audio/speech, /v1/tts/stream-input, "
                "/v1/models, /v1/audio/voices, /healthz or /metrics")
    if e.status == 405:
        return f"{request.method} is not allowed on {request.path}; allowed: {e.headers.get('Allow', '?')}"
    if e.status == 413:
        limit = request.app[SERVICES].config.http.max_body_kb
        return f"the request body is larger than {limit} KiB (http.max_body_kb): send less"
    return e.text or e.reason


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """CORS preflights, then the bearer token (when one is set)."""
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
        return _preflight(request)
    token = request.app[TOKEN]
    if token is None or request.path in OPEN_PATHS:
        return await handler(request)
    given = ""
    header = request.headers.get("Authorization", "")
    if header[:7].lower() == "bearer ":
        given = header[7:].strip()
    elif request.path in WS_PATHS:
        given = request.query.get("token", "")
    if not given:
        raise ApiError(401, "this API needs a token: send the header 'Authorization: Bearer <token>' with the value "
                            f"of the server's {services_of(request).config.http.token_env} environment variable",
                       headers={"WWW-Authenticate": "Bearer"})
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise ApiError(401, "the token is wrong: send the value of the server's "
                            f"{services_of(request).config.http.token_env} environment variable",
                       headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
    return await handler(request)


@web.middleware
async def _limits(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The declared body size and the per-client request rate."""
    config = services_of(request).config.http
    if request.content_length is not None and request.content_length > config.max_body_kb * 1024:
        raise ApiError(413, f"the request body is {request.content_length} bytes; the limit is "
                            f"{config.max_body_kb} KiB (http.max_body_kb): send less")
    if request.path not in OPEN_PATHS:
        wait = request.app[LIMITER].take(request.remote or "?")
        if wait > 0:
            raise ApiError(429, f"too many requests from {request.remote}: the limit is {config.rate_limit_per_min} "
                                f"a minute (http.rate_limit_per_min); retry in {wait:.1f} s",
                           headers={"Retry-After": str(max(1, math.ceil(wait)))})
    return await handler(request)


def _origin_allowed(app: web.Application, origin: str) -> bool:
    allowed = app[ORIGINS]
    return "*" in allowed or origin in allowed


def _preflight(request: web.Request) -> web.Response:
    """Answer a browser's CORS preflight (no token needed: browsers never send one on it)."""
    origin = request.headers.get("Origin", "")
    if not origin or not _origin_allowed(request.app, origin):
        raise ApiError(403, f"origin {origin or '(none)'} may not call this API: add it to http.cors_origins")
    return web.Response(status=204, headers={
        "Access-Control-Allow-Origin": origin, "Vary": "Origin",
        "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
        "Access-Control-Allow-Headers": request.headers.get("Access-Control-Request-Headers",
                                                            "Authorization, Content-Type"),
        "Access-Control-Max-Age": str(CORS_MAX_AGE_S)})


async def _cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Let allowed browser pages read responses (set before headers leave, streamed responses included)."""
    origin = request.headers.get("Origin")
    if origin and _origin_allowed(request.app, origin) and "Access-Control-Allow-Origin" not in response.headers:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Vary"] = "Origin"


async def _metrics(request: web.Request) -> web.Response:
    text = request.app[METRICS].render(services_of(request).synthesizer.metrics())
    return web.Response(body=text.encode(), headers={"Content-Type": METRICS_CONTENT_TYPE})


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
    app = web.Application(middlewares=[_errors, _auth, _limits], client_max_size=config.http.max_body_kb * 1024)
    app[SERVICES] = services
    app[METRICS] = HttpMetrics()
    app[TOKEN] = config.secret(config.http.token_env)
    app[LIMITER] = RateLimiter(config.http.rate_limit_per_min)
    app[ORIGINS] = tuple(config.http.cors_origins)
    app.on_response_prepare.append(_cors_headers)
    api_v2.add_routes(app, config)
    sillytavern.add_routes(app)
    openai_speech.add_routes(app)
    stream_input.add_routes(app)
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


async def start_server(services: Services, host: str | None = None, port: int | None = None) -> web.AppRunner:
    """Start the API on ``host:port`` (default ``http.host``/``http.port``); returns the runner to ``cleanup()``.

    Raises :class:`ConfigError` when asked to listen beyond loopback without a token.
    """
    config = services.config
    host = host or config.http.host
    port = config.http.port if port is None else port
    if not is_loopback(host) and config.secret(config.http.token_env) is None:
        raise ConfigError(f"the HTTP API would listen on {host}, which other machines can reach, without a token: "
                          f"set the environment variable {config.http.token_env} (http.token_env) to a long random "
                          "secret, or bind to 127.0.0.1 (http.host / --host)")
    app = create_app(services)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror or e}): pick another port "
                          "(http.port / --port) or stop what uses it") from e
    addresses = ", ".join(f"http://{a[0]}:{a[1]}" if isinstance(a, tuple) else str(a) for a in runner.addresses)
    log.info("HTTP API listening on %s (token %s)", addresses,
             "required" if app[TOKEN] else "not required: loopback only")
    return runner
