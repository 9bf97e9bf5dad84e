"""ElevenLabs' stream-input dialect with a real WebSocket client: its path, key, output formats (each decoded),
``{"text": ""}`` as the end, ``isFinal``, flush, the inactivity timeout, and unknown parameters refused. It drives
the same ``Synthesizer.stream`` call as our own WebSocket (the fake records it)."""

from __future__ import annotations

import asyncio
import base64

import aiohttp
import pytest
from tests.bot.test_http_fakes import SENTENCE_S, VOICE_FREQS, Server, decode_everywhere, dominant_freq, start

TOKEN_ENV = "VOICEBOT_TEST_ELEVENLABS_TOKEN"
TEXT_FRAMES = [{"text": " "}, {"text": "Hello there. "}, {"text": "How are "}, {"text": "you? "}, {"text": ""}]
FREQ_TOL = 8.0  # Hz
DURATION_TOL = 0.1  # s, codec priming and padding


def path(voice: str = "bob") -> str:
    return f"/v1/text-to-speech/{voice}/stream-input"


async def converse(session, url: str, frames: list[dict], **kwargs) -> tuple[list[dict], int | None]:
    async with session.ws_connect(url, **kwargs) as ws:
        for frame in frames:
            await ws.send_json(frame)
        messages = [msg.json() async for msg in ws if msg.type == aiohttp.WSMsgType.TEXT]
        return messages, ws.close_code


@pytest.mark.parametrize("output_format, fmt, rate", [
    ("mp3_44100_128", "mp3", 44100), ("mp3_22050_32", "mp3", 22050), ("pcm_16000", "pcm", 16000),
    ("pcm_44100", "pcm", 44100), ("ulaw_8000", "ulaw", 8000), ("alaw_8000", "alaw", 8000),
    ("opus_48000_64", "opus", 48000)])
async def test_output_formats_decode_to_the_voice(server: Server, session, output_format, fmt, rate) -> None:
    messages, code = await converse(session, server.url + path("carol") + f"?output_format={output_format}",
                                    TEXT_FRAMES)
    assert code == 1000
    assert messages[-1] == {"isFinal": True}
    audio = messages[:-1]
    assert audio and all(m["isFinal"] is False and m["alignment"] is None for m in audio)
    data = b"".join(base64.b64decode(m["audio"]) for m in audio)
    decoded = decode_everywhere(data, fmt, rate)
    for name, (x, got_rate) in decoded.items():
        assert got_rate == rate, name
        assert abs(x.size / rate - 2 * SENTENCE_S) < DURATION_TOL, (name, x.size / rate)
        assert abs(dominant_freq(x, rate) - VOICE_FREQS["carol"]) < FREQ_TOL, name
    assert "soundfile" in decoded  # every ElevenLabs format but none is soundfile-readable
    call = server.synth.calls[-1]
    assert call.text == "<stream>" and "".join(call.pieces) == "Hello there. How are you? "


async def test_empty_text_ends_the_input_without_a_close_frame(server: Server, session) -> None:
    async with session.ws_connect(server.url + path() + "?output_format=pcm_16000") as ws:
        for frame in TEXT_FRAMES:
            await ws.send_json(frame)
        messages = [await asyncio.wait_for(ws.receive_json(), 5)]
        while "audio" in messages[-1]:
            messages.append(await asyncio.wait_for(ws.receive_json(), 5))
        assert messages[-1] == {"isFinal": True}  # the client sent no close of its own
        closing = await asyncio.wait_for(ws.receive(), 5)
        assert closing.type == aiohttp.WSMsgType.CLOSE and closing.data == 1000


async def test_flush_speaks_the_pending_text_at_once(server: Server, session) -> None:
    async with session.ws_connect(server.url + path() + "?output_format=pcm_16000") as ws:
        await ws.send_json({"text": " "})
        await ws.send_json({"text": "no full stop yet ", "flush": True})
        first = await asyncio.wait_for(ws.receive_json(), 5)  # before any end of input
        assert first["audio"] and first["isFinal"] is False
        await ws.send_json({"text": ""})
        rest = [msg.json() async for msg in ws if msg.type == aiohttp.WSMsgType.TEXT]
    assert rest[-1] == {"isFinal": True} and all(m["audio"] for m in rest[:-1])  # + the resampler's tail


async def test_voice_settings_speed_reaches_the_synthesizer(server: Server, session) -> None:
    frames = [{"text": " ", "voice_settings": {"stability": 0.4, "similarity_boost": 0.9, "speed": 1.15}},
              {"text": "Hello there. "}, {"text": ""}]
    messages, code = await converse(session, server.url + path() + "?output_format=pcm_16000&language_code=en"
                                    "&seed=42", frames)
    assert code == 1000 and messages[-1] == {"isFinal": True}
    params = server.synth.calls[-1].params
    assert (params.speed, params.language, params.seed) == (1.15, "en", 42)


@pytest.mark.parametrize("query, needle", [
    ("output_format=mp3_44100_128&optimise=1", "unknown query parameter 'optimise'"),
    ("output_format=wav_44100", "output_format 'wav_44100' is not available"),
    ("language_code=xx", "language_code 'xx' is not one this model speaks"),
    ("inactivity_timeout=500", "inactivity_timeout must be a number from 1 up to 180"),
])
async def test_unknown_or_bad_parameters_are_refused_before_the_upgrade(server: Server, session, query,
                                                                        needle) -> None:
    async with session.get(server.url + path() + "?" + query) as r:
        assert r.status == 400
        body = await r.json()
    assert needle in body["detail"]["message"]  # ElevenLabs' error shape
    with pytest.raises(aiohttp.WSServerHandshakeError) as e:
        await session.ws_connect(server.url + path() + "?" + query)
    assert e.value.status == 400
    assert server.synth.calls == []


async def test_unknown_voice_and_frame_fields_are_clear_errors(server: Server, session) -> None:
    async with session.get(server.url + path("21m00Tcm4TlvDq8ikWAM")) as r:
        assert r.status == 400 and "http.voice_aliases" in (await r.json())["detail"]["message"]
    messages, code = await converse(session, server.url + path(), [{"text": " ", "voice": "x"}])
    assert code == 1008
    assert messages[-1]["error"] == "invalid_request" and "unknown field 'voice'" in messages[-1]["message"]
    messages, code = await converse(session, server.url + path(),
                                    [{"text": " "}, {"text": "Hi. ", "voice_settings": {"speed": 1.1}}])
    assert code == 1008 and "only come in the first frame" in messages[-1]["message"]


async def test_voice_aliases_map_elevenlabs_voice_ids(tmp_path, session) -> None:
    srv = await start(tmp_path, http={"voice_aliases": {"21m00Tcm4TlvDq8ikWAM": "alice"}})
    try:
        messages, code = await converse(session, srv.url + path("21m00Tcm4TlvDq8ikWAM") + "?output_format=pcm_16000",
                                        TEXT_FRAMES)
        assert code == 1000 and srv.synth.calls[-1].voice is srv.voices["alice"]
    finally:
        await srv.close()


async def test_inactivity_timeout_ends_the_stream(server: Server, session) -> None:
    async with session.ws_connect(server.url + path() + "?output_format=pcm_16000&inactivity_timeout=1") as ws:
        await ws.send_json({"text": " "})
        await ws.send_json({"text": "Left hanging "})  # then silence: no "" and no close
        messages = [msg.json() async for msg in ws if msg.type == aiohttp.WSMsgType.TEXT]
        assert ws.close_code == 1000
    assert messages[-1] == {"isFinal": True}
    assert len(messages) >= 2 and server.synth.calls[-1].sentences_done == 1  # what was pending was spoken


async def test_the_key_in_a_header_query_or_first_frame(tmp_path, session, monkeypatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "xi-secret")
    srv = await start(tmp_path, http={"token_env": TOKEN_ENV})
    try:
        url = srv.url + path() + "?output_format=pcm_16000"
        for kwargs, frames in [({"headers": {"xi-api-key": "xi-secret"}}, TEXT_FRAMES),
                               ({"params": {"xi_api_key": "xi-secret"}}, TEXT_FRAMES),
                               ({}, [{"text": " ", "xi_api_key": "xi-secret"}] + TEXT_FRAMES[1:]),
                               ({}, [{"text": " ", "authorization": "Bearer xi-secret"}] + TEXT_FRAMES[1:])]:
            target = url + ("&" + "&".join(f"{k}={v}" for k, v in kwargs.pop("params").items())
                            if "params" in kwargs else "")
            messages, code = await converse(session, target, frames, **kwargs)
            assert code == 1000 and messages[-1] == {"isFinal": True}, messages[-1:]
        calls = len(srv.synth.calls)
        messages, code = await converse(session, url, [{"text": " ", "xi_api_key": "wrong"}, {"text": "Hi. "}])
        assert code == 1008 and messages[-1]["error"] == "invalid_api_key"
        messages, code = await converse(session, url, [{"text": "Hi. "}])
        assert code == 1008 and "xi_api_key in the first frame" in messages[-1]["message"]
        with pytest.raises(aiohttp.WSServerHandshakeError) as e:
            await session.ws_connect(url, headers={"xi-api-key": "wrong"})
        assert e.value.status == 401
        assert len(srv.synth.calls) == calls  # nothing synthesized without the key
    finally:
        await srv.close()


async def test_without_a_key_nothing_is_revealed(tmp_path, session, monkeypatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "xi-secret")
    srv = await start(tmp_path, http={"token_env": TOKEN_ENV})
    try:
        async with session.get(srv.url + path("nobody")) as r:  # not an upgrade: a plain 401
            assert r.status == 401 and "xi-api-key" in (await r.json())["detail"]["message"]
        with pytest.raises(aiohttp.WSServerHandshakeError) as e:
            await session.ws_connect(srv.url + path("nobody"))
        assert e.value.status == 400
        async with session.get(srv.url + path("nobody"), headers={"xi-api-key": "xi-secret"}) as r:
            message = (await r.json())["detail"]["message"]
        assert r.status == 400 and "available voices: alice, bob, carol" in message  # with the key: the reason
    finally:
        await srv.close()
