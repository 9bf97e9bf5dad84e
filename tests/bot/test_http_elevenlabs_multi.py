"""ElevenLabs' multi-context WebSocket with a real WebSocket client over the fake synthesizer: contexts interleaved
on one connection (each its own decodable stream, ended by its own isFinal), close_context dropping what was not
flushed, close_socket, keep-alives and the inactivity timeout, the five-context limit, per-context speed, and the
error messages' codes matching the close codes."""

from __future__ import annotations

import asyncio
import base64
from collections import defaultdict

import aiohttp
import pytest
from tests.bot.test_http_fakes import SENTENCE_S, VOICE_FREQS, Server, decode_everywhere, dominant_freq, start

TOKEN_ENV = "VOICEBOT_TEST_ELEVENLABS_MULTI_TOKEN"
FREQ_TOL = 8.0  # Hz
DURATION_TOL = 0.1  # s, codec priming and padding


def path(voice: str = "bob", query: str = "output_format=pcm_16000") -> str:
    return f"/v1/text-to-speech/{voice}/multi-stream-input?{query}"


async def converse(session, url: str, frames: list[dict], **kwargs) -> tuple[list[dict], int | None]:
    async with session.ws_connect(url, **kwargs) as ws:
        for frame in frames:
            await ws.send_json(frame)
        messages = [msg.json() async for msg in ws if msg.type == aiohttp.WSMsgType.TEXT]
        return messages, ws.close_code


def by_context(messages: list[dict]) -> dict[str | None, list[dict]]:
    out: dict[str | None, list[dict]] = defaultdict(list)
    for m in messages:
        out[m.get("contextId")].append(m)
    return out


def audio_of(messages: list[dict]) -> bytes:
    return b"".join(base64.b64decode(m["audio"]) for m in messages if m.get("audio"))


@pytest.mark.parametrize("output_format, fmt, rate", [
    ("pcm_16000", "pcm", 16000), ("mp3_22050_32", "mp3", 22050), ("ulaw_8000", "ulaw", 8000),
    ("opus_48000_64", "opus", 48000)])
async def test_two_contexts_interleave_each_a_whole_stream(server: Server, session, output_format, fmt,
                                                          rate) -> None:
    frames = [{"text": " ", "context_id": "a"}, {"text": " ", "context_id": "b"},
              {"text": "Hello there. How are ", "context_id": "a"}, {"text": "One line. ", "context_id": "b"},
              {"text": "you? ", "context_id": "a", "flush": True}, {"context_id": "b", "flush": True},
              {"context_id": "a", "close_context": True}, {"context_id": "b", "close_context": True},
              {"close_socket": True}]
    messages, code = await converse(session, server.url + path("carol", f"output_format={output_format}"), frames)
    assert code == 1000
    contexts = by_context(messages)
    assert set(contexts) == {"a", "b"}
    for context_id, sentences in (("a", 2), ("b", 1)):
        mine = contexts[context_id]
        assert mine[-1] == {"isFinal": True, "contextId": context_id}
        assert all(m["audio"] and m["alignment"] is None for m in mine[:-1])
        for name, (x, got_rate) in decode_everywhere(audio_of(mine), fmt, rate).items():
            assert got_rate == rate, name
            assert abs(x.size / rate - sentences * SENTENCE_S) < DURATION_TOL, (context_id, name, x.size / rate)
            assert abs(dominant_freq(x, rate) - VOICE_FREQS["carol"]) < FREQ_TOL, name
    spoken = sorted("".join(c.pieces) for c in server.synth.calls)
    assert spoken == ["Hello there. How are you? ", "One line. "]


async def test_close_context_drops_text_not_yet_flushed(tmp_path, session) -> None:
    srv = await start(tmp_path, delay_s=0.2)
    try:
        frames = [{"text": " ", "context_id": "c1"}, {"text": "Kept sentence. ", "context_id": "c1", "flush": True},
                  {"text": "dropped words ", "context_id": "c1"}, {"context_id": "c1", "close_context": True},
                  {"close_socket": True}]
        messages, code = await converse(session, srv.url + path(), frames)
        assert code == 1000 and messages[-1] == {"isFinal": True, "contextId": "c1"}
        x = decode_everywhere(audio_of(messages), "pcm", 16000)["numpy"][0]
        assert abs(x.size / 16000 - SENTENCE_S) < DURATION_TOL  # one sentence, not two
        assert [c.pieces for c in srv.synth.calls if c.sentences_done] == [["Kept sentence. "]]
    finally:
        await srv.close()


async def test_close_context_stops_a_reply_being_spoken_and_a_new_context_follows(tmp_path, session) -> None:
    srv = await start(tmp_path, delay_s=0.3)
    try:
        async with session.ws_connect(srv.url + path()) as ws:
            await ws.send_json({"text": " ", "context_id": "old"})
            await ws.send_json({"text": "First one. Second one. Third one. ", "context_id": "old"})
            first = await asyncio.wait_for(ws.receive_json(), 5)  # the reply is being spoken
            assert first["contextId"] == "old" and first["audio"]
            await ws.send_json({"context_id": "old", "close_context": True})  # barge-in
            await ws.send_json({"text": "New reply. ", "context_id": "new", "flush": True})
            await ws.send_json({"close_socket": True})
            rest = [m.json() async for m in ws if m.type == aiohttp.WSMsgType.TEXT]
            assert ws.close_code == 1000
        contexts = by_context([first] + rest)
        assert contexts["old"][-1] == {"isFinal": True, "contextId": "old"}
        assert contexts["new"][-1] == {"isFinal": True, "contextId": "new"}
        old = srv.synth.calls[0]
        assert old.closed_early and old.sentences_done < 3  # its synthesis stopped
        assert len(audio_of(contexts["new"])) == int(SENTENCE_S * 16000) * 2
    finally:
        await srv.close()


async def test_keep_alives_and_the_inactivity_timeout(server: Server, session) -> None:
    url = server.url + path(query="output_format=pcm_16000&inactivity_timeout=1")
    async with session.ws_connect(url) as ws:
        await ws.send_json({"text": ""})  # a keep-alive before any context opens nothing
        await ws.send_json({"text": " ", "context_id": "c"})
        for _ in range(3):  # 1.5 s of keep-alives: the context stays open
            await asyncio.sleep(0.5)
            await ws.send_json({"text": "", "context_id": "c"})
        assert server.synth.calls == []
        await ws.send_json({"text": "Left hanging ", "context_id": "c"})  # then silence
        messages = [m.json() async for m in ws if m.type == aiohttp.WSMsgType.TEXT]
        assert ws.close_code == 1000
    assert messages[-1] == {"isFinal": True, "contextId": "c"}
    assert server.synth.calls[-1].sentences_done == 1  # the idle context's pending text was spoken


async def test_a_sixth_open_context_is_refused(server: Server, session) -> None:
    frames = [{"text": " ", "context_id": f"c{i}"} for i in range(5)]
    frames += [{"context_id": "c0", "close_context": True}, {"text": " ", "context_id": "c5"},  # 5 open again
               {"text": " ", "context_id": "c6"}]
    messages, code = await converse(session, server.url + path(), frames)
    assert code == 1008
    error = messages[-1]
    assert error["error"] == "max_active_conversations" and error["code"] == 1008
    assert "exceeded (5)" in error["message"]


async def test_each_context_has_its_own_voice_settings(server: Server, session) -> None:
    frames = [{"text": " ", "context_id": "fast", "voice_settings": {"stability": 0.5, "speed": 1.2}},
              {"text": " ", "contextId": "plain"},  # the camelCase spelling
              {"text": "Quick. ", "context_id": "fast", "flush": True},
              {"text": "Normal. ", "contextId": "plain", "flush": True}, {"close_socket": True}]
    messages, code = await converse(session, server.url + path(query="output_format=pcm_16000&seed=7"), frames)
    assert code == 1000
    speeds = {"".join(c.pieces): (c.params.speed, c.params.seed) for c in server.synth.calls}
    assert speeds == {"Quick. ": (1.2, 7), "Normal. ": (1.0, 7)}
    messages, code = await converse(session, server.url + path(),
                                    [{"text": " ", "context_id": "x"},
                                     {"text": "Hi. ", "context_id": "x", "voice_settings": {"speed": 1.1}}])
    assert code == 1008 and "only come in the first frame of context 'x'" in messages[-1]["message"]


@pytest.mark.parametrize("door", ["multi-stream-input", "stream-input"])
async def test_busy_says_the_code_the_socket_closes_with(server: Server, session, door) -> None:
    server.synth.busy = True
    url = server.url + f"/v1/text-to-speech/bob/{door}?output_format=pcm_16000"
    frames = [{"text": " ", "context_id": "c"}, {"text": "Hello there. ", "context_id": "c", "flush": True}]
    if door == "stream-input":
        frames = [{"text": " "}, {"text": "Hello there. ", "flush": True}]
    messages, code = await converse(session, url, frames)
    assert code == 1013
    assert messages[-1]["error"] == "system_busy" and messages[-1]["code"] == 1013
    if door == "multi-stream-input":
        assert messages[-1]["contextId"] == "c"


async def test_the_key_in_the_first_frame_and_unknown_fields(tmp_path, session, monkeypatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "xi-secret")
    srv = await start(tmp_path, http={"token_env": TOKEN_ENV})
    try:
        frames = [{"text": " ", "context_id": "c", "xi-api-key": "xi-secret"},
                  {"text": "Hello there. ", "context_id": "c", "flush": True}, {"close_socket": True}]
        messages, code = await converse(session, srv.url + path(), frames)
        assert code == 1000 and messages[-1] == {"isFinal": True, "contextId": "c"}
        messages, code = await converse(session, srv.url + path(), [{"text": " ", "context_id": "c",
                                                                     "xi_api_key": "wrong"}])
        assert code == 1008 and messages[-1]["error"] == "invalid_api_key"
        messages, code = await converse(session, srv.url + path(), [{"text": " ", "voice": "x"}],
                                        headers={"xi-api-key": "xi-secret"})
        assert code == 1008 and "unknown field 'voice'" in messages[-1]["message"]
    finally:
        await srv.close()


# ---- POST /v1/text-to-speech/{voice}/stream and /v1/text-to-speech/{voice} ------------------------------------

@pytest.mark.parametrize("route", ["/stream", ""])
@pytest.mark.parametrize("output_format, fmt, rate, content_type", [
    ("mp3_44100_128", "mp3", 44100, "audio/mpeg"), ("pcm_24000", "pcm", 24000, "audio/pcm"),
    ("ulaw_8000", "ulaw", 8000, "audio/basic"), ("opus_48000_64", "opus", 48000, "audio/ogg")])
async def test_http_text_to_speech_in_every_format(server: Server, session, route, output_format, fmt, rate,
                                                   content_type) -> None:
    body = {"text": "Hello there. How are you?", "model_id": "eleven_flash_v2_5", "language_code": "en",
            "voice_settings": {"stability": 0.5, "similarity_boost": 0.75, "speed": 1.1}, "seed": 5,
            "previous_text": None, "apply_text_normalization": "auto"}
    url = server.url + f"/v1/text-to-speech/alice{route}"
    async with session.post(url, params={"output_format": output_format, "enable_logging": "true"},
                            json=body) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith(content_type)
        assert (r.headers.get("Transfer-Encoding") == "chunked") == (route == "/stream" or fmt == "ulaw")
        data = await r.read()
    for name, (x, got_rate) in decode_everywhere(data, fmt, rate).items():
        assert got_rate == rate, name
        assert abs(x.size / rate - 2 * SENTENCE_S) < DURATION_TOL, (name, x.size / rate)
        assert abs(dominant_freq(x, rate) - VOICE_FREQS["alice"]) < FREQ_TOL, name
    params = server.synth.calls[-1].params
    assert (params.speed, params.seed, params.language) == (1.1, 5, "en")


@pytest.mark.parametrize("query, body, needle", [
    ({"output_format": "wav_44100"}, {"text": "Hi."}, "output_format 'wav_44100' is not available"),
    ({"optimise": "1"}, {"text": "Hi."}, "unknown query parameter 'optimise'"),
    ({}, {"model_id": "x"}, "text is required"),
    ({}, {"text": "Hi.", "voice_settings": {"speed": 9}}, "voice_settings.speed"),
    ({}, {"text": "Hi.", "voice_settings": {"warmth": 1}}, "voice_settings.warmth"),
    ({}, {"text": "Hi.", "seed": True}, "seed"),
    ({}, {"text": "Hi.", "language_code": "xx"}, "language_code 'xx' is not one this model speaks"),
])
async def test_http_text_to_speech_refusals(server: Server, session, query, body, needle) -> None:
    async with session.post(server.url + "/v1/text-to-speech/bob/stream", params=query, json=body) as r:
        assert r.status == 400
        detail = (await r.json())["detail"]
    assert needle in detail["message"] and detail["status"] == "invalid_request_error"
    assert server.synth.calls == []
