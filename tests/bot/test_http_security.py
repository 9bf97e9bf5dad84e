"""What the HTTP API refuses, against a running server: paths outside the voices folder, oversized bodies, missing
or wrong tokens, too many requests, foreign browser origins, non-loopback binds without a token. And a client that
leaves mid-stream stops the synthesis."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from tests.bot.test_http_fakes import Server, start

from bot.config import ConfigError

TOKEN_ENV = "VOICEBOT_TEST_TOKEN"


async def tts(session, srv: Server, ref: str) -> tuple[int, dict | bytes]:
    async with session.get(srv.url + "/tts", params={"text": "Hello.", "text_lang": "en",
                                                     "ref_audio_path": ref}) as r:
        return r.status, (await r.json() if r.content_type == "application/json" else await r.read())


async def test_ref_audio_path_inside_the_voices_folder_is_accepted(server: Server, session) -> None:
    bob = server.voices["bob"]
    for ref in (str(server.root / bob.id / "clip.flac"), f"{bob.id}/clip.flac", str(server.root / bob.id),
                bob.id, "bob"):
        status, body = await tts(session, server, ref)
        assert status == 200, (ref, body)
        assert server.synth.calls[-1].voice is bob


async def test_path_traversal_and_foreign_paths_are_refused(server: Server, session, tmp_path) -> None:
    bob = server.voices["bob"]
    outside = tmp_path / "secret.wav"
    outside.write_bytes(b"RIFF")
    (server.root / bob.id / "escape.wav").symlink_to(outside)  # a link inside pointing out
    (server.root / "linkdir").symlink_to(tmp_path)  # a folder link pointing out
    (server.root / "stray").mkdir()
    (server.root / "stray" / "clip.wav").write_bytes(b"RIFF")  # inside, but not a stored voice
    cases = {
        "../secret.wav": "may not contain '..'",
        f"{bob.id}/../../secret.wav": "may not contain '..'",
        "..\\secret.wav": "may not contain '..'",
        str(outside): "neither a stored voice nor a file inside the voices folder",
        "/etc/passwd": "neither a stored voice nor a file inside the voices folder",
        f"{bob.id}/escape.wav": "neither a stored voice nor a file inside the voices folder",
        "linkdir/secret.wav": "neither a stored voice nor a file inside the voices folder",
        "stray/clip.wav": "not a stored voice's file",
        f"{bob.id}/missing.wav": "no such voice or file",
        "~/x.wav": "neither a stored voice nor a file inside the voices folder",
    }
    for ref, needle in cases.items():
        status, body = await tts(session, server, ref)
        assert status == 400, (ref, body)
        assert needle in body["message"], (ref, body)
    async with session.post(server.url + "/tts", json={"text": "Hi.", "text_lang": "en", "ref_audio_path": "bob",
                                                       "aux_ref_audio_paths": ["bob", "../secret.wav"]}) as r:
        assert r.status == 400 and "aux_ref_audio_paths may not contain '..'" in (await r.json())["message"]
    assert server.synth.calls == []


async def test_oversized_bodies_are_refused_with_413(tmp_path, session) -> None:
    srv = await start(tmp_path, http={"max_body_kb": 4})
    try:
        big = {"text": "word " * 2000, "text_lang": "en", "ref_audio_path": "bob"}
        async with session.post(srv.url + "/tts", json=big) as r:
            assert r.status == 413
            assert "the limit is 4 KiB (http.max_body_kb)" in (await r.json())["message"]

        async def chunked():  # no Content-Length: caught while reading
            for _ in range(10):
                yield b"x" * 1024

        async with session.post(srv.url + "/v1/audio/speech", data=chunked()) as r:
            assert r.status == 413
            assert "larger than 4 KiB (http.max_body_kb)" in (await r.json())["message"]
        assert srv.synth.calls == []
    finally:
        await srv.close()


async def test_token_is_required_when_set(tmp_path, session, monkeypatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "s3cret-token")
    srv = await start(tmp_path, http={"token_env": TOKEN_ENV})
    try:
        q = {"text": "Hi.", "text_lang": "en", "ref_audio_path": "bob"}
        async with session.get(srv.url + "/tts", params=q) as r:
            assert r.status == 401 and r.headers["WWW-Authenticate"] == "Bearer"
            assert f"value of the server's {TOKEN_ENV} environment variable" in (await r.json())["message"]
        async with session.get(srv.url + "/tts", params=q, headers={"Authorization": "Bearer wrong"}) as r:
            assert r.status == 401 and "the token is wrong" in (await r.json())["message"]
        async with session.get(srv.url + "/tts", params={**q, "token": "s3cret-token"}) as r:
            assert r.status == 200  # for clients that can only set a URL
        async with session.get(srv.url + "/tts", params=q, headers={"Authorization": "Bearer s3cret-token"}) as r:
            assert r.status == 200
        async with session.get(srv.url + "/metrics") as r:
            assert r.status == 401
        async with session.get(srv.url + "/healthz") as r:
            assert r.status == 200
        with pytest.raises(aiohttp.WSServerHandshakeError) as e:
            await session.ws_connect(srv.url + "/v1/tts/stream-input?voice=bob")
        assert e.value.status == 401
        async with session.ws_connect(srv.url + "/v1/tts/stream-input?voice=bob&token=s3cret-token") as ws:
            assert (await ws.receive_json())["type"] == "ready"
        assert len(srv.synth.calls) == 2
    finally:
        await srv.close()


async def test_non_loopback_bind_needs_a_token(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(ConfigError, match=f"set the environment variable {TOKEN_ENV}"):
        await start(tmp_path, http={"token_env": TOKEN_ENV}, host="0.0.0.0")
    monkeypatch.setenv(TOKEN_ENV, "t")
    srv = await start(tmp_path, http={"token_env": TOKEN_ENV}, host="0.0.0.0")
    await srv.close()


async def test_rate_limit_per_client(tmp_path, session) -> None:
    srv = await start(tmp_path, http={"rate_limit_per_min": 3})
    try:
        statuses = []
        for _ in range(4):
            async with session.get(srv.url + "/v1/models") as r:
                statuses.append(r.status)
                if r.status == 429:
                    assert int(r.headers["Retry-After"]) == 20  # one request per 20 s
                    assert "the limit is 3 a minute (http.rate_limit_per_min)" in (await r.json())["message"]
        assert statuses == [200, 200, 200, 429]
        async with session.get(srv.url + "/healthz") as r:
            assert r.status == 200  # health checks are never limited
    finally:
        await srv.close()


async def test_cors_for_allowed_browser_origins_only(server: Server, session) -> None:
    pre = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    async with session.options(server.url + "/", headers={**pre, "Origin": "http://localhost:8000"}) as r:
        assert r.status == 204
        assert r.headers["Access-Control-Allow-Origin"] == "http://localhost:8000"
        assert "POST" in r.headers["Access-Control-Allow-Methods"]
    async with session.options(server.url + "/", headers={**pre, "Origin": "https://evil.example"}) as r:
        assert r.status == 403 and "http.cors_origins" in (await r.json())["message"]
    async with session.get(server.url + "/speakers", headers={"Origin": "http://127.0.0.1:8000"}) as r:
        assert r.headers["Access-Control-Allow-Origin"] == "http://127.0.0.1:8000"
    async with session.get(server.url + "/speakers", headers={"Origin": "https://evil.example"}) as r:
        assert "Access-Control-Allow-Origin" not in r.headers


async def test_client_leaving_mid_stream_stops_the_synthesis(tmp_path) -> None:
    srv = await start(tmp_path, delay_s=0.2)
    try:
        text = " ".join(f"Sentence {i}." for i in range(20))
        q = {"text": text, "text_lang": "en", "ref_audio_path": "alice", "media_type": "raw", "streaming_mode": "1"}
        async with aiohttp.ClientSession() as s:
            r = await s.get(srv.url + "/tts", params=q)
            assert r.status == 200
            await r.content.readany()
            r.close()  # drop the connection after the first audio
        for _ in range(50):
            call = srv.synth.calls[-1]
            if call.finished is not None:
                break
            await asyncio.sleep(0.05)
        call = srv.synth.calls[-1]
        assert call.finished is not None and call.closed_early
        assert call.sentences_done <= 3  # 20 sentences would take 4 s
    finally:
        await srv.close()

