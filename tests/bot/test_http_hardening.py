"""Bad input and hostile clients against a running server (issue 16 items 1, 3, 6, 7): every bad value is a 400
that names the field, never a 500; foreign Hosts and Origins are refused; wrong tokens are rate limited; slow or
idle connections are closed; a busy synthesizer is a 503 with Retry-After on every door."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest
from tests.bot.test_http_fakes import Server, start

TOKEN_ENV = "VOICEBOT_TEST_HARDENING_TOKEN"
LONG = "n" * 300  # longer than any file name a file system takes (ENAMETOOLONG)
BAD_STRINGS = {"nul": "a\x00b", "surrogate": "\ud800x", "long name": LONG, "long path": f"/{LONG}/{LONG}/x.wav"}
DEEP = "[" * 50_000 + "]" * 50_000  # RecursionError in json.loads


async def _status_and_message(r: aiohttp.ClientResponse) -> tuple[int, str]:
    body = await r.json()
    return r.status, body if isinstance(body, str) else body["message"]


# ---- no 500s -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", BAD_STRINGS)
async def test_bad_paths_are_400_on_every_field(server: Server, session, kind) -> None:
    bad = BAD_STRINGS[kind]
    hi = {"text": "Hi.", "text_lang": "en"}
    requests = [
        ("/tts", {**hi, "ref_audio_path": bad}, "ref_audio_path"),
        ("/tts", {**hi, "ref_audio_path": "bob", "aux_ref_audio_paths": [bad]}, "aux_ref_audio_paths"),
        ("/", {**hi, "ref_audio_path": bad}, "ref_audio_path"),
        ("/set_gpt_weights", {"weights_path": bad}, "weights_path" if kind in ("nul", "surrogate") else "gpt"),
        ("/set_sovits_weights", {"weights_path": bad}, "weights_path" if kind in ("nul", "surrogate") else "sovits"),
    ]
    for path, body, needle in requests:
        async with session.post(server.url + path, data=json.dumps(body)) as r:
            status, message = await _status_and_message(r)
        assert status in (400, 501), (path, kind, status, message)
        assert needle in message, (path, kind, message)
    # the same in a query string (percent-encoded NUL, as in the curl)
    async with session.get(server.url + "/tts?text=Hi&text_lang=en&ref_audio_path=%00") as r:
        status, message = await _status_and_message(r)
    assert status == 400 and "NUL byte" in message
    assert server.synth.calls == []


@pytest.mark.parametrize("path", ["/tts", "/", "/v1/audio/speech"])
async def test_deeply_nested_json_is_400(server: Server, session, path) -> None:
    async with session.post(server.url + path, data=DEEP) as r:
        status, message = await _status_and_message(r)
    assert status == 400 and "nested too deeply" in message


async def test_deeply_nested_websocket_frame_is_a_clear_error(server: Server, session) -> None:
    async with session.ws_connect(server.url + "/v1/tts/stream-input?voice=bob") as ws:
        await ws.receive_json()
        await ws.send_str("[" * 50_000 + "]" * 50_000)
        err = await ws.receive_json()
        assert err["type"] == "error" and "nested too deeply" in err["message"]


async def test_a_lone_surrogate_in_the_text_is_400(server: Server, session) -> None:
    for path, body in [("/tts", {"text": "Hi \ud800.", "text_lang": "en", "ref_audio_path": "bob"}),
                       ("/v1/audio/speech", {"input": "Hi \ud800.", "voice": "bob"})]:
        async with session.post(server.url + path, data=json.dumps(body)) as r:
            status, message = await _status_and_message(r)
        field = "text" if path == "/tts" else "input"
        assert status == 400 and message.startswith(field), message
        assert "unpaired surrogate" in message or "unicode" in message
    assert server.synth.calls == []


# ---- exposure: Host, Origin, tokens ------------------------------------------------------------------------------

async def test_foreign_host_is_refused_without_a_token(server: Server, session) -> None:
    for path in ("/speakers", "/tts?text=Hi.&text_lang=en&ref_audio_path=bob"):
        async with session.get(server.url + path, headers={"Host": "attacker.example"}) as r:
            status, message = await _status_and_message(r)
        assert status == 403 and "http.allowed_hosts" in message
    for host in ("127.0.0.1:9880", "localhost:9880", "[::1]:9880", "192.168.1.20"):
        async with session.get(server.url + "/speakers", headers={"Host": host}) as r:
            assert r.status == 200, host
    assert server.synth.calls == []


async def test_allowed_hosts_and_a_token_admit_other_names(tmp_path, session, monkeypatch) -> None:
    srv = await start(tmp_path, http={"allowed_hosts": ["tts.lan"]})
    try:
        async with session.get(srv.url + "/speakers", headers={"Host": "tts.lan:9880"}) as r:
            assert r.status == 200
    finally:
        await srv.close()
    monkeypatch.setenv(TOKEN_ENV, "t0ken")
    srv = await start(tmp_path, http={"token_env": TOKEN_ENV})
    try:  # with a token the attacker's page cannot authenticate anyway: any name
        async with session.get(srv.url + "/speakers", headers={"Host": "tts.example", "Authorization": "Bearer t0ken"}
                               ) as r:
            assert r.status == 200
    finally:
        await srv.close()


async def test_websocket_from_a_foreign_origin_is_refused(server: Server, session) -> None:
    for path in ("/v1/tts/stream-input?voice=bob", "/v1/text-to-speech/bob/stream-input"):
        with pytest.raises(aiohttp.WSServerHandshakeError) as e:
            await session.ws_connect(server.url + path, headers={"Origin": "https://evil.example"})
        assert e.value.status == 403
        async with session.ws_connect(server.url + path, headers={"Origin": "http://localhost:8000"}) as ws:
            await ws.close()
    async with session.get(server.url + "/tts?text=Hi.&text_lang=en&ref_audio_path=bob",
                           headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}) as r:
        assert r.status == 403  # an <audio src> on a foreign page
    assert server.synth.calls == []


async def test_wrong_tokens_are_rate_limited(tmp_path, session, monkeypatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "right")
    srv = await start(tmp_path, http={"token_env": TOKEN_ENV, "rate_limit_per_min": 0})
    try:
        statuses = []
        for i in range(30):
            async with session.get(srv.url + "/speakers", headers={"Authorization": f"Bearer wrong{i}"}) as r:
                statuses.append(r.status)
                if r.status == 429:
                    assert int(r.headers["Retry-After"]) >= 1
        assert statuses == [401] * 10 + [429] * 20
        async with session.get(srv.url + "/speakers", headers={"Authorization": "Bearer right"}) as r:
            assert r.status == 429  # even the right token waits: the address is guessing
    finally:
        await srv.close()


async def test_trusted_networks_need_no_token(tmp_path, session, monkeypatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "right")
    srv = await start(tmp_path, http={"token_env": TOKEN_ENV, "trusted_networks": ["127.0.0.0/8"]})
    try:
        async with session.get(srv.url + "/speakers") as r:
            assert r.status == 200  # SillyTavern cannot send a token
    finally:
        await srv.close()
    srv = await start(tmp_path, http={"token_env": TOKEN_ENV, "trusted_networks": ["10.0.0.0/8"]})
    try:
        async with session.get(srv.url + "/speakers") as r:
            assert r.status == 401
            assert "http.trusted_networks" in await r.json()  # SillyTavern's shape: a JSON string
        async with session.post(srv.url + "/v1/audio/speech", json={"input": "Hi.", "voice": "bob"}) as r:
            err = await r.json()
        assert r.status == 401 and err["error"]["type"] == "authentication_error"  # OpenAI's shape
        with pytest.raises(aiohttp.WSServerHandshakeError) as e:
            await session.ws_connect(srv.url + "/v1/tts/stream-input?voice=bob")
        assert e.value.status == 401
    finally:
        await srv.close()


# ---- rate limit keys ---------------------------------------------------------------------------------------------

async def _models_status(url: str, token: str, local: str = "127.0.0.1") -> int:
    connector = aiohttp.TCPConnector(local_addr=(local, 0))  # 127.0.0.2 is another address of the loopback
    async with aiohttp.ClientSession(connector=connector) as s:
        async with s.get(url + "/v1/models", headers={"Authorization": f"Bearer {token}"}) as r:
            return r.status


@pytest.mark.parametrize("key, expected", [
    ("address", [200, 200, 429, 429, 200]),  # everyone behind one address shares it; another address does not
    ("token", [200, 200, 200, 200, 429]),  # each token has its own bucket, wherever it comes from
    ("none", [200, 200, 429, 429, 429]),  # one bucket for the whole server
])
async def test_rate_limit_key(tmp_path, key, expected) -> None:
    srv = await start(tmp_path, http={"rate_limit_per_min": 2, "rate_limit_key": key})
    try:
        statuses = [await _models_status(srv.url, token) for token in ("a", "b", "a", "b")]
        statuses.append(await _models_status(srv.url, "a", local="127.0.0.2"))
        assert statuses == expected
    finally:
        await srv.close()


# ---- timeouts and budgets ----------------------------------------------------------------------------------------

async def _closed_by_server(port: int, send: bytes, wait_s: float) -> bool:
    """Open a raw TCP connection, send ``send``, and report whether the server closed it within ``wait_s``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if send:
            writer.write(send)
            await writer.drain()
        try:
            data = await asyncio.wait_for(reader.read(), wait_s)  # EOF when the server closes
        except asyncio.TimeoutError:
            return False
        return data == b"" or data.startswith(b"HTTP/1.1 4")
    finally:
        writer.close()


async def test_slow_and_idle_connections_are_closed(tmp_path) -> None:
    srv = await start(tmp_path, http={"idle_timeout_s": 0.3})
    try:
        port = srv.runner.addresses[0][1]
        # slowloris: a request head that never ends; and a connection that sends nothing at all
        results = await asyncio.gather(_closed_by_server(port, b"GET /speakers HTTP/1.1\r\nHost: x", 10.0),
                                       _closed_by_server(port, b"", 10.0))
        assert results == [True, True]
    finally:
        await srv.close()
    srv = await start(tmp_path, http={"idle_timeout_s": 60.0})
    try:  # the same connection stays open while the timeout has not passed
        port = srv.runner.addresses[0][1]
        assert await _closed_by_server(port, b"GET /speakers HTTP/1.1\r\nHost: x", 0.5) is False
    finally:
        await srv.close()


async def test_a_slow_request_body_is_408(tmp_path) -> None:
    srv = await start(tmp_path, http={"body_timeout_s": 0.3})
    try:
        port = srv.runner.addresses[0][1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /tts HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"text\":")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n"), 10.0)
        writer.close()
        assert head.startswith(b"HTTP/1.1 408")
        assert srv.synth.calls == []
    finally:
        await srv.close()


async def test_idle_websocket_ends_its_input_and_closes(tmp_path, session) -> None:
    srv = await start(tmp_path, http={"ws_idle_timeout_s": 0.3})
    try:
        async with session.ws_connect(srv.url + "/v1/tts/stream-input?voice=bob") as ws:
            await ws.receive_json()
            await ws.send_json({"text": "Spoken after the pause"})  # no end of sentence, no close
            messages = [msg.json() async for msg in ws if msg.type == aiohttp.WSMsgType.TEXT]
            assert ws.close_code == 1000
        assert [m["type"] for m in messages] == ["audio", "done"]
        assert messages[0]["sentence"] == "Spoken after the pause" and messages[1]["sentences"] == 1
        async with session.ws_connect(srv.url + "/v1/tts/stream-input?voice=bob") as ws:
            await ws.receive_json()  # nothing sent at all: closed, nothing spoken
            messages = [msg.json() async for msg in ws if msg.type == aiohttp.WSMsgType.TEXT]
        assert messages == [{"type": "done", "sentences": 0, "chunks": 0, "audio_s": 0.0}]
    finally:
        await srv.close()


async def test_websocket_runs_spend_the_rate_limit(tmp_path, session) -> None:
    srv = await start(tmp_path, http={"rate_limit_per_min": 3})
    try:
        async with session.ws_connect(srv.url + "/v1/tts/stream-input?voice=bob") as ws:  # the upgrade: 1 token
            await ws.receive_json()
            for i in range(6):  # a flush per sentence: each run after the first spends a token
                await ws.send_json({"text": f"Sentence {i}.", "flush": True})
            messages = [msg.json() async for msg in ws if msg.type == aiohttp.WSMsgType.TEXT]
            assert ws.close_code == 1013
        audio = [m for m in messages if m["type"] == "audio"]
        assert len(audio) == 3 and messages[-1]["type"] == "error" and messages[-1]["status"] == 429
        assert "http.rate_limit_per_min" in messages[-1]["message"]
        assert len(srv.synth.calls) == 3
    finally:
        await srv.close()


# ---- busy --------------------------------------------------------------------------------------------------------

async def test_busy_is_503_with_retry_after_on_every_door(server: Server, session, caplog) -> None:
    server.synth.busy = True
    hi = "Hello there."
    doors = [
        ("GET", "/tts", {"params": {"text": hi, "text_lang": "en", "ref_audio_path": "bob"}}),
        ("GET", "/tts", {"params": {"text": hi, "text_lang": "en", "ref_audio_path": "bob", "streaming_mode": "1"}}),
        ("POST", "/", {"json": {"text": hi, "ref_audio_path": "./参考音频/bob.wav", "streaming_mode": "true"}}),
        ("POST", "/v1/audio/speech", {"json": {"input": hi, "voice": "bob"}}),
        ("POST", "/v1/audio/speech", {"json": {"input": hi, "voice": "bob", "response_format": "flac"}}),
        ("POST", "/v1/audio/speech", {"json": {"input": hi, "voice": "bob", "stream_format": "sse"}}),
    ]
    with caplog.at_level(logging.INFO, logger="bot.http"):
        for method, path, kwargs in doors:
            async with session.request(method, server.url + path, **kwargs) as r:
                assert r.status == 503, path
                assert r.headers["Retry-After"] == "2"
                body = await r.json()
            message = body if isinstance(body, str) else body["message"]
            assert "queue is full" in message and "retry after 2 s" in message
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # busy is not a server failure
    for path in ("/v1/tts/stream-input?voice=bob", "/v1/text-to-speech/bob/stream-input?output_format=pcm_16000"):
        async with session.ws_connect(server.url + path) as ws:
            frames = [{"text": "Hello.", "close": True}] if "tts/stream" in path else [{"text": " "},
                                                                                      {"text": "Hello."},
                                                                                      {"text": ""}]
            for frame in frames:
                await ws.send_json(frame)
            messages = [msg.json() async for msg in ws if msg.type == aiohttp.WSMsgType.TEXT]
            assert ws.close_code == 1013, path
        err = messages[-1]
        assert "queue is full" in err["message"]
        assert err.get("retry_after_s") == 2 or err.get("error") == "system_busy"


async def test_501_is_not_logged_as_an_error(server: Server, session, caplog) -> None:
    with caplog.at_level(logging.DEBUG, logger="bot.http"):
        for _ in range(3):
            async with session.get(server.url + "/set_gpt_weights", params={"weights_path": "other.ckpt"}) as r:
                assert r.status == 501
            async with session.get(server.url + "/control", params={"command": "restart"}) as r:
                assert r.status == 501
    assert [r for r in caplog.records if "501" in r.getMessage()]  # said, at INFO
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("http, needle", [
    ({"rate_limit_key": "user"}, "rate_limit_key must be one of address, token, none"),
    ({"trusted_networks": ["192.168.1.0/33"]}, "trusted_networks: '192.168.1.0/33' is not an address or network"),
    ({"idle_timeout_s": 0}, "http.idle_timeout_s must be a finite number above 0"),
    ({"voice_aliases": ["alloy"]}, "http.voice_aliases: expected a mapping"),
    ({"voice_aliases": {"alloy": ""}}, "voice_aliases: 'alloy': '' needs a client name and a stored voice name"),
])
def test_http_config_errors_name_the_key(http, needle) -> None:
    from bot.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError) as e:
        config_from_dict({"http": http})
    assert needle in str(e.value)
