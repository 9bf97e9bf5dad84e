"""Who may call the API, and how often: Host and Origin checks, credentials, trusted networks, rate limits.

Three things are checked before any handler runs, in this order:

1. the browser boundary: a CORS preflight is answered here; a page whose ``Origin`` is not in ``http.cors_origins``
   (or a cross-site browser request without one) is refused, WebSocket upgrades included;
2. credentials, when ``http.token_env`` names a set variable: ``Authorization: Bearer``, ElevenLabs' ``xi-api-key``
   header, or ``?token=`` / ``?xi_api_key=`` for clients that can only set a URL. Clients in
   ``http.trusted_networks`` need none. Wrong tokens are themselves rate limited per address;
3. DNS rebinding: a request served without a token must name this server in ``Host`` (an IP literal, localhost, or
   one of ``http.allowed_hosts``), so a page on ``attacker.example`` that re-points its name at 127.0.0.1 is refused.

Then the per-client token bucket (``http.rate_limit_per_min``, keyed by ``http.rate_limit_key``).

"The client" is the connection's peer address, or, when that peer is one of ``http.trusted_proxies``, the address
the proxy chain names (``Forwarded: for=``, else ``X-Forwarded-For``), read from the right: each trusted hop vouches
for the one to its left, and the first address that is not a trusted proxy is the client. A peer that is not a
trusted proxy cannot name anyone: its headers are ignored. Rate limits, ``http.trusted_networks`` and the
wrong-token lockout all use this address.

The lockout: after :data:`AUTH_FAILURES_PER_MIN` wrong tokens in a minute from one client, every credential from
it is refused with 429 until the bucket refills (one more try every 6 s), the right one included: admitting the
right token during a lockout would tell a guesser which guess was right, which is what the lockout exists to
prevent. Other clients, each behind a trusted proxy included, are not affected.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import time
from typing import Any, Callable

from aiohttp import web

from bot.http.responses import SERVICES, ApiError, services_of

TOKEN: web.AppKey[str | None] = web.AppKey("voicebot_token")
LIMITER: web.AppKey[RateLimiter] = web.AppKey("voicebot_limiter")
AUTH_FAILURES: web.AppKey[RateLimiter] = web.AppKey("voicebot_auth_failures")
CLIENT_KEY: Any = web.RequestKey("voicebot_client", str) if hasattr(web, "RequestKey") else "voicebot_client"
OPEN_PATHS = ("/healthz",)  # no token, no rate limit, no Host check
CORS_MAX_AGE_S = 600  # how long a browser may cache a preflight answer
LIMITER_SWEEP = 1024  # forget idle clients once this many are tracked
AUTH_FAILURES_PER_MIN = 10  # wrong tokens tolerated per address and minute before 429
QUERY_CREDENTIALS = ("token", "xi_api_key")  # query parameters that carry the token (not synthesis options)
# WebSocket routes whose clients may send the key in their first frame instead (browsers cannot set headers)
FIRST_MESSAGE_AUTH = ("elevenlabs:stream_input", "elevenlabs:multi_stream_input")
AUTH_DEFERRED: Any = web.RequestKey("voicebot_auth_deferred", bool) if hasattr(web, "RequestKey") \
    else "voicebot_auth_deferred"
CLIENT_ADDRESS: Any = web.RequestKey("voicebot_client_address", str) if hasattr(web, "RequestKey") \
    else "voicebot_client_address"
MAX_FORWARDED_HOPS = 32  # proxy-chain entries read at most (a longer chain is someone padding the header)


class RateLimiter:
    """A token bucket per client key: ``per_min`` requests a minute, bursts up to ``per_min``."""

    def __init__(self, per_min: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_min = per_min
        self.clock = clock  # seconds, monotonic (tests set a fake one)
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last refill, monotonic s)

    def _level(self, key: str, now: float) -> float:
        tokens, last = self._buckets.get(key, (float(self.per_min), now))
        return min(float(self.per_min), tokens + (now - last) * self.per_min / 60.0)

    def wait(self, key: str, now: float | None = None) -> float:
        """Seconds until ``key`` may spend a token (0 when it may now); spends nothing."""
        if self.per_min <= 0:
            return 0.0
        now = self.clock() if now is None else now
        tokens = self._level(key, now)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) * 60.0 / self.per_min

    def take(self, key: str, now: float | None = None) -> float:
        """Spend one token; return 0 when allowed, else the seconds until the next token."""
        if self.per_min <= 0:
            return 0.0
        now = self.clock() if now is None else now
        tokens = self._level(key, now)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) * 60.0 / self.per_min
        self._buckets[key] = (tokens - 1.0, now)
        if len(self._buckets) > LIMITER_SWEEP:
            self._sweep(now)
        return 0.0

    def _sweep(self, now: float) -> None:
        """Drop clients whose bucket has refilled (they would start full anyway)."""
        full_after = 60.0
        self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < full_after}


def setup(app: web.Application, token: str | None) -> None:
    """Store the token and the limiters on ``app`` (called by ``create_app``)."""
    config = app[SERVICES].config.http
    app[TOKEN] = token
    app[LIMITER] = RateLimiter(config.rate_limit_per_min)
    app[AUTH_FAILURES] = RateLimiter(AUTH_FAILURES_PER_MIN)


def origin_allowed(request: web.Request, origin: str) -> bool:
    allowed = services_of(request).config.http.cors_origins
    return "*" in allowed or origin in allowed


def check_browser(request: web.Request) -> web.Response | None:
    """Answer a CORS preflight; refuse pages from origins not in ``http.cors_origins`` (None: go on)."""
    origin = request.headers.get("Origin")
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
        if not origin or not origin_allowed(request, origin):
            raise ApiError(403, f"origin {origin or '(none)'} may not call this API: add it to http.cors_origins")
        return web.Response(status=204, headers={
            "Access-Control-Allow-Origin": origin, "Vary": "Origin",
            "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
            "Access-Control-Allow-Headers": request.headers.get("Access-Control-Request-Headers",
                                                                "Authorization, Content-Type"),
            "Access-Control-Max-Age": str(CORS_MAX_AGE_S)})
    if origin is not None and not origin_allowed(request, origin):
        # A WebSocket has no preflight: without this, any page the operator opens could speak in a stored voice.
        raise ApiError(403, f"origin {origin} may not call this API: add it to http.cors_origins")
    fetch_site = request.headers.get("Sec-Fetch-Site", "")
    if origin is None and fetch_site in ("cross-site", "same-site") \
            and request.headers.get("Sec-Fetch-Mode") != "navigate" \
            and "*" not in services_of(request).config.http.cors_origins:
        # An <audio src> or <img> on a foreign page sends no Origin, but browsers mark it cross-site.
        raise ApiError(403, "a page on another site may not call this API: add its origin to http.cors_origins")
    return None


def given_token(request: web.Request) -> str:
    """The credential the client sent, from the first place that has one ("" when none)."""
    header = request.headers.get("Authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:].strip()
    for name in ("xi-api-key", "X-Api-Key"):
        if request.headers.get(name):
            return request.headers[name].strip()
    for name in QUERY_CREDENTIALS:
        if request.query.get(name):
            return request.query[name].strip()
    return ""


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An IP address from a peer name or a proxy-chain entry (``[v6]:port``, ``v4:port``, quotes), else None."""
    text = text.strip().strip('"')
    if text.startswith("["):
        text = text[1:text.find("]")] if "]" in text else ""
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _in(address: ipaddress.IPv4Address | ipaddress.IPv6Address, networks: tuple[str, ...]) -> bool:
    return any(address in ipaddress.ip_network(n, strict=False) for n in networks)


def _proxy_chain(request: web.Request) -> list[str]:
    """The client addresses proxies reported, oldest first: ``Forwarded``'s ``for=``, else ``X-Forwarded-For``."""
    if request.headers.get("Forwarded"):
        return [element.get("for", "") for element in request.forwarded]  # aiohttp's RFC 7239 parser
    hops: list[str] = []
    for header in request.headers.getall("X-Forwarded-For", []):  # several lines make one list (RFC 9110)
        hops.extend(header.split(","))
    return hops


def client_address(request: web.Request) -> str:
    """The client's address: the peer's, or the one trusted proxies name (the module docstring)."""
    peer = request.remote or "?"
    proxies = services_of(request).config.http.trusted_proxies
    address = _address(peer)
    if not proxies or address is None or not _in(address, proxies):
        return peer
    client = address
    for hop in reversed(_proxy_chain(request)[-MAX_FORWARDED_HOPS:]):
        named = _address(hop)
        if named is None:  # "unknown" or an obfuscated name: the trusted hop itself is the best we know
            break
        client = named
        if not _in(named, proxies):
            break
    return str(client)


def client_of(request: web.Request) -> str:
    """The client's address, worked out once per request."""
    address = request.get(CLIENT_ADDRESS)
    if address is None:
        address = request[CLIENT_ADDRESS] = client_address(request)
    return address


def is_trusted(request: web.Request) -> bool:
    """True when the client's address is in ``http.trusted_networks``."""
    networks = services_of(request).config.http.trusted_networks
    address = _address(client_of(request))
    return bool(networks) and address is not None and _in(address, networks)


def check_credentials(request: web.Request) -> None:
    """Admit the request or raise 401/429; remember the client's rate-limit key on the request.

    On a :data:`FIRST_MESSAGE_AUTH` route without a credential the check is deferred: ``request[AUTH_DEFERRED]``
    is set and the handler must call :func:`verify_token` with the first frame's key.
    """
    token = request.app[TOKEN]
    given = given_token(request)
    request[CLIENT_KEY] = _client_key(request, given)
    if request.path in OPEN_PATHS:
        return
    if token is None or is_trusted(request):
        check_host(request)
        return
    env = services_of(request).config.http.token_env
    if not given and getattr(request.match_info.route, "name", None) in FIRST_MESSAGE_AUTH:
        request[AUTH_DEFERRED] = True  # the handler checks the first frame's key before anything else
        return
    if not given:
        raise ApiError(401, "this API needs a token: send 'Authorization: Bearer <token>' (or ?token=<token> in the "
                            f"URL) with the value of the server's {env} environment variable, or add this client's "
                            "address to http.trusted_networks", headers={"WWW-Authenticate": "Bearer"})
    verify_token(request, given)


def verify_token(request: web.Request, given: str) -> None:
    """Compare ``given`` with the server's token, rate limiting wrong ones per address; raise 401/429."""
    token = request.app[TOKEN]
    if token is None:
        return
    env = services_of(request).config.http.token_env
    address = client_of(request)
    failures = request.app[AUTH_FAILURES]
    wait = failures.wait(address)
    if wait > 0:
        raise ApiError(429, f"too many wrong tokens from {address}: retry in {wait:.0f} s with the right one",
                       headers={"Retry-After": str(max(1, math.ceil(wait)))})
    if not hmac.compare_digest(given.encode(), token.encode()):
        failures.take(address)
        raise ApiError(401, f"the token is wrong: send the value of the server's {env} environment variable",
                       headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})


def check_host(request: web.Request) -> None:
    """Refuse a ``Host`` that does not name this server (DNS rebinding), for requests served without a token."""
    host = request.headers.get("Host")
    if not host:
        return  # HTTP/1.0 without Host: no name to rebind
    if host.startswith("["):  # [::1]:9880
        name = host[1:host.find("]")]
    elif host.count(":") == 1:  # name:port or v4:port
        name = host.split(":", 1)[0]
    else:
        name = host
    name = name.rstrip(".").lower()
    try:
        ipaddress.ip_address(name)
        return  # an IP literal cannot be re-pointed by DNS
    except ValueError:
        pass
    allowed = [h.lower().rstrip(".") for h in services_of(request).config.http.allowed_hosts]
    if name == "localhost" or name.endswith(".localhost") or "*" in allowed or name in allowed:
        return
    raise ApiError(403, f"Host {host!r} is not a name of this server (a page may be re-pointing its own name at "
                        "it): add the name to http.allowed_hosts if you serve it under that name")


def _client_key(request: web.Request, given: str) -> str:
    kind = services_of(request).config.http.rate_limit_key
    if kind == "none":
        return "*"
    if kind == "token" and given:
        return "token:" + hashlib.blake2b(given.encode(), digest_size=8).hexdigest()
    return client_of(request)


def charge(request: web.Request, what: str = "request") -> None:
    """Spend one rate-limit token of the request's client, or raise 429 (also used per WebSocket run)."""
    config = services_of(request).config.http
    key = request.get(CLIENT_KEY) or client_of(request)
    wait = request.app[LIMITER].take(key)
    if wait > 0:
        who = "everyone" if key == "*" else ("this token" if key.startswith("token:") else key)
        raise ApiError(429, f"too many {what}s from {who}: the limit is {config.rate_limit_per_min} a minute "
                            f"(http.rate_limit_per_min); retry in {wait:.1f} s",
                       headers={"Retry-After": str(max(1, math.ceil(wait)))})
