"""A small reverse proxy for the HTTP tests (no tests here): HTTP and WebSocket, optionally over TLS, adding
``X-Forwarded-For``/``X-Forwarded-Proto`` as nginx's ``proxy_add_x_forwarded_for`` does. It records what clients
send (request line, headers, JSON bodies, WebSocket text frames), which is how the frames of real client libraries
in ``tests/data/http_clients/`` were captured.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade", "host", "content-length", "sec-websocket-key",
              "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-protocol"}
KEPT_HEADERS = ("xi-api-key", "authorization", "content-type", "accept", "user-agent")  # recorded, not secrets


@dataclass
class Exchange:
    """One client request as the proxy saw it."""

    method: str
    path: str
    query: list[tuple[str, str]]
    headers: dict[str, str]
    body: Any = None
    frames: list[Any] = field(default_factory=list)
    status: int = 0


class ReverseProxy:
    """Forward every request to ``upstream`` (``http://127.0.0.1:PORT``), recording it in :attr:`exchanges`."""

    def __init__(self, upstream: str, *, ssl_context: ssl.SSLContext | None = None,
                 forwarded_for: str | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        self.ssl_context = ssl_context
        self.forwarded_for = forwarded_for  # pretend clients come from this address (None: the real peer)
        self.exchanges: list[Exchange] = []
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> ReverseProxy:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.ssl_context)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"{'https' if self.ssl_context else 'http'}://localhost:{port}"
        self._session = aiohttp.ClientSession(auto_decompress=False)
        return self

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def _forward_headers(self, request: web.Request) -> dict[str, str]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        peer = self.forwarded_for or request.remote or ""
        prior = request.headers.get("X-Forwarded-For")
        headers["X-Forwarded-For"] = f"{prior}, {peer}" if prior else peer
        headers["X-Forwarded-Proto"] = "https" if self.ssl_context else "http"
        return headers

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        exchange = Exchange(request.method, request.path, list(request.query.items()),
                            {k.lower(): v for k, v in request.headers.items() if k.lower() in KEPT_HEADERS})
        self.exchanges.append(exchange)
        target = self.upstream + request.rel_url.path_qs
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self._websocket(request, target, exchange)
        body = await request.read()
        if body and request.content_type == "application/json":
            exchange.body = json.loads(body)
        assert self._session is not None
        async with self._session.request(request.method, target, headers=self._forward_headers(request),
                                         data=body or None) as upstream:
            exchange.status = upstream.status
            response = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP})
            await response.prepare(request)
            async for data in upstream.content.iter_any():
                await response.write(data)
            await response.write_eof()
            return response

    async def _websocket(self, request: web.Request, target: str, exchange: Exchange) -> web.StreamResponse:
        assert self._session is not None
        try:
            upstream = await self._session.ws_connect(target, headers=self._forward_headers(request))
        except aiohttp.WSServerHandshakeError as e:
            exchange.status = e.status
            return web.Response(status=e.status, text=e.message)
        exchange.status = 101
        client = web.WebSocketResponse()
        await client.prepare(request)

        async def client_to_upstream() -> None:
            async for msg in client:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    exchange.frames.append(json.loads(msg.data))
                    await upstream.send_str(msg.data)
            await upstream.close()

        async def upstream_to_client() -> None:
            async for msg in upstream:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    await client.send_str(msg.data)
            await client.close(code=upstream.close_code or 1000)

        tasks = [asyncio.create_task(client_to_upstream()), asyncio.create_task(upstream_to_client())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0.05)  # let the other direction deliver its close
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await upstream.close()
        return client
