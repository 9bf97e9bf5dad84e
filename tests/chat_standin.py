"""A local OpenAI-compatible chat model for tests: ``POST /v1/chat/completions`` streamed over SSE, slowly.

One class for every layer that talks to a chat model (the client, the ``/ask`` cog, the end-to-end bot). ``mode``
picks a behaviour: ``ok`` streams ``pieces`` one every ``delay_s``; ``short`` answers ``"Reply N."`` (N counts
requests); ``empty`` sends no content; ``404`` is a JSON error naming the model; ``not-json`` and ``no-choices``
send a malformed event; ``stall`` writes ``stall_piece`` and then nothing until :meth:`close` (or 5 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from aiohttp import web

__all__ = ["ChatStandIn"]

STALL_S = 5.0  # longest a stalled reply holds its connection open


class ChatStandIn:
    """The stand-in server. ``requests`` holds each request body and ``auth`` each Authorization header;
    ``first_piece_at`` / ``finished_at`` are the ``time.monotonic()`` of the current reply's first content piece and
    of its end (``None`` until then)."""

    def __init__(self, pieces: list[str], delay_s: float, stall_piece: str = "Hmm") -> None:
        self.pieces = list(pieces)
        self.delay_s = delay_s
        self.stall_piece = stall_piece
        self.mode = "ok"
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.first_piece_at: float | None = None
        self.finished_at: float | None = None
        self.url = ""  # base URL, ``http://127.0.0.1:PORT/v1``
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None

    @property
    def finished(self) -> bool:
        """The current reply's last piece has been written."""
        return self.finished_at is not None

    async def start(self) -> ChatStandIn:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completions)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"
        return self

    async def close(self) -> None:
        self._release.set()  # ends a stalled reply
        if self._runner is not None:
            await self._runner.cleanup()

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.auth.append(request.headers.get("Authorization"))
        self.first_piece_at = self.finished_at = None
        if self.mode == "404":
            return web.json_response({"error": {"message": f"model '{body['model']}' not found"}}, status=404)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        if self.mode in ("not-json", "no-choices"):
            bad = b"<html>not json</html>" if self.mode == "not-json" else b'{"oops": 1}'
            await resp.write(b"data: " + bad + b"\n\n")
            return resp
        await resp.write(self._event(body, {"role": "assistant", "content": ""}))  # role first, as OpenAI sends
        if self.mode == "stall":
            await resp.write(self._event(body, {"content": self.stall_piece}))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._release.wait(), STALL_S)
            return resp
        reply = {"ok": self.pieces, "short": [f"Reply {len(self.requests)}."], "empty": []}[self.mode]
        for piece in reply:
            await asyncio.sleep(self.delay_s)
            await resp.write(self._event(body, {"content": piece}))
            if self.first_piece_at is None:
                self.first_piece_at = time.monotonic()
        await resp.write(self._event(body, {}, "stop"))
        self.finished_at = time.monotonic()
        await resp.write(b"data: [DONE]\n\n")
        return resp

    @staticmethod
    def _event(body: dict[str, Any], delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": int(time.time()),
                 "model": body.get("model", ""), "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"
