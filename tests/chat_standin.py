"""A local OpenAI-compatible chat model for tests: ``POST /v1/chat/completions`` streamed over SSE, slowly.

One class for every layer that talks to a chat model (the client, the ``/ask`` cog, the end-to-end bot). ``mode``
picks a behaviour: ``ok`` streams ``pieces`` one every ``delay_s``; ``short`` answers ``"Reply N."`` (N counts
requests); ``empty`` sends no content; ``404`` is a JSON error naming the model; ``not-json`` and ``no-choices``
send a malformed event; ``stall`` writes ``stall_piece`` and then nothing until :meth:`close` (or 5 s).

:meth:`pace` makes a test decide when each further piece goes out (:meth:`allow`), so that "the first words were
used while the model was still writing" is a fact of the order of events, not of how fast the machine is.
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
    of its end (``None`` until then); ``sent`` counts the current reply's content pieces written so far and
    ``stalling`` is true while a ``stall`` reply holds its connection open."""

    def __init__(self, pieces: list[str], delay_s: float, stall_piece: str = "Hmm") -> None:
        self.pieces = list(pieces)
        self.delay_s = delay_s
        self.stall_piece = stall_piece
        self.mode = "ok"
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.first_piece_at: float | None = None
        self.finished_at: float | None = None
        self.sent = 0
        self.stalling = False
        self._credits: asyncio.Semaphore | None = None  # set by pace(): one per piece after the first
        self.url = ""  # base URL, ``http://127.0.0.1:PORT/v1``
        self._release = asyncio.Event()
        self._runner: web.AppRunner | None = None

    @property
    def finished(self) -> bool:
        """The current reply's last piece has been written."""
        return self.finished_at is not None

    def pace(self) -> None:
        """From now on write a reply's first piece at once and each further one only when :meth:`allow` lets it."""
        self._credits = asyncio.Semaphore(0)

    def allow(self, pieces: int = 1) -> None:
        """Let ``pieces`` more pieces out (after :meth:`pace`)."""
        assert self._credits is not None, "call pace() first"
        for _ in range(pieces):
            self._credits.release()

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
        self.sent = 0
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
            self.stalling = True
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._release.wait(), STALL_S)
            finally:
                self.stalling = False
            return resp
        reply = {"ok": self.pieces, "short": [f"Reply {len(self.requests)}."], "empty": []}[self.mode]
        for piece in reply:
            await asyncio.sleep(self.delay_s)
            if self._credits is not None and self.sent > 0:
                await self._credit(self._credits)
            self.sent += 1  # counted before the write yields, so a reader never sees a piece the count lacks
            await resp.write(self._event(body, {"content": piece}))
            if self.first_piece_at is None:
                self.first_piece_at = time.monotonic()
        await resp.write(self._event(body, {}, "stop"))
        self.finished_at = time.monotonic()
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def _credit(self, credits: asyncio.Semaphore) -> None:
        """Wait for one allowed piece, or for close() (a paced reply never holds the server's shutdown up)."""
        take = asyncio.ensure_future(credits.acquire())
        closing = asyncio.ensure_future(self._release.wait())
        await asyncio.wait({take, closing}, return_when=asyncio.FIRST_COMPLETED)
        closing.cancel()
        if not take.done():
            take.cancel()

    @staticmethod
    def _event(body: dict[str, Any], delta: dict[str, Any], finish: str | None = None) -> bytes:
        chunk = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": int(time.time()),
                 "model": body.get("model", ""), "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"
