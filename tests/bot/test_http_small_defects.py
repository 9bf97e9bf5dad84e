"""Small defects of issue 35 at the HTTP doors: JSON true/false is not a number, every response carries
``X-Request-Id``, error bodies keep CJK text as written, and malformed requests are refused without a traceback."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest
from tests.bot.test_http_fakes import Server


@pytest.mark.parametrize("path, body, field", [
    ("/tts", {"text": "Hi.", "text_lang": "en", "ref_audio_path": "alice", "speed_factor": True}, "speed_factor"),
    ("/tts", {"text": "Hi.", "text_lang": "en", "ref_audio_path": "alice", "top_k": False}, "top_k"),
    ("/v1/audio/speech", {"input": "Hi.", "voice": "alice", "speed": True}, "speed"),
    ("/v1/text-to-speech/alice/stream", {"text": "Hi.", "voice_settings": {"speed": True}}, "voice_settings.speed"),
])
async def test_true_is_not_a_number(server: Server, session, path, body, field) -> None:
    async with session.post(server.url + path, json=body) as r:
        assert r.status == 400
        text = await r.text()
    assert f"{field}: " in text and "not true or false" in text
    assert server.synth.calls == []


async def test_every_response_has_a_request_id(server: Server, session) -> None:
    seen = set()
    for method, path in [("GET", "/healthz"), ("GET", "/nowhere"), ("GET", "/tts?text_lang=en"),
                         ("POST", "/v1/audio/speech")]:
        async with session.request(method, server.url + path, json={"input": "Hi.", "voice": "bob"}) as r:
            request_id = r.headers["X-Request-Id"]
            assert re.fullmatch(r"[0-9a-f]{32}", request_id), (path, request_id)
            seen.add(request_id)
    assert len(seen) == 4
    async with session.get(server.url + "/healthz", headers={"X-Request-Id": "lk-abc.123"}) as r:
        assert r.headers["X-Request-Id"] == "lk-abc.123"  # the client's own id comes back
    async with session.get(server.url + "/healthz", headers={"X-Request-Id": "a b<script>"}) as r:
        assert re.fullmatch(r"[0-9a-f]{32}", r.headers["X-Request-Id"])  # not echoed: a new one
    async with session.ws_connect(server.url + "/v1/text-to-speech/bob/multi-stream-input") as ws:
        assert re.fullmatch(r"[0-9a-f]{32}", ws._response.headers["X-Request-Id"])


async def test_error_bodies_keep_cjk_text_as_written(server: Server, session) -> None:
    async with session.get(server.url + "/tts", params={"text": "你好。", "text_lang": "zh",
                                                        "ref_audio_path": "不存在的声音"}) as r:
        assert r.status == 400 and r.charset == "utf-8"
        raw = await r.read()
    assert "不存在的声音".encode() in raw and b"\\u" not in raw


MALFORMED = [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nNo colon here\r\n\r\n",
    b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    b"POST /tts HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"POST /tts HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
    b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n",
]


@pytest.mark.parametrize("raw", MALFORMED, ids=range(len(MALFORMED)))
async def test_malformed_requests_are_refused_without_a_traceback(server: Server, raw, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    host, port = server.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(raw)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(4096), 5)
    writer.close()
    assert re.match(rb"HTTP/1\.[01] 400 ", answer), answer[:80]
    server_records = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert server_records and all(r.exc_info is None and r.levelno <= logging.INFO for r in server_records)
    assert all(r.getMessage().startswith("malformed request refused: ") and "\n" not in r.getMessage()
               for r in server_records)


def test_serve_beyond_loopback_without_a_token_is_refused_before_any_model_loads(tmp_path, capsys,
                                                                                  monkeypatch) -> None:
    from bot.__main__ import main

    monkeypatch.delenv("VOICEBOT_API_TOKEN", raising=False)
    config = tmp_path / "c.yaml"  # models that do not exist: loading them would be a different error
    config.write_text(f"models:\n  dir: {tmp_path}/m\n  gpt: {tmp_path}/m/g.ckpt\n")
    assert main(["--config", str(config), "serve", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "without a token" in err and "VOICEBOT_API_TOKEN" in err
