"""The stream-input WebSocket with a real WebSocket client: text fed piece by piece (split mid-word, with delays)
is spoken sentence by sentence while it is still being written; flush, close, errors, early disconnect."""

from __future__ import annotations

import asyncio
import base64

import aiohttp
import numpy as np
import pytest
from tests.bot.test_http_fakes import (SENTENCE_S, VOICE_FREQS, Server, pcm_samples, sentence_freqs, start,
                                       wav_samples)

TEXT = "The first sentence is here. Then comes the second one! Is this the third? And the last."
FREQ_TOL = 8.0  # Hz


@pytest.fixture
async def server(tmp_path):
    srv = await start(tmp_path, delay_s=0.05)
    yield srv
    await srv.close()


def pieces(text: str, size: int = 7) -> list[str]:
    """Fixed-size pieces: most of them end mid-word."""
    return [text[i:i + size] for i in range(0, len(text), size)]


async def collect(ws: aiohttp.ClientWebSocketResponse, received: list[tuple[int, dict]],
                  sent: list[str], first_audio: asyncio.Event | None = None) -> None:
    """Record each message with the number of text pieces sent when it arrived."""
    async for msg in ws:
        if msg.type == aiohttp.WSMsgType.TEXT:
            m = msg.json()
            received.append((len(sent), m))
            if first_audio is not None and m["type"] == "audio":
                first_audio.set()


async def test_first_audio_arrives_before_the_last_piece_is_sent(server: Server, session) -> None:
    received: list[tuple[int, dict]] = []
    sent: list[str] = []
    first_audio = asyncio.Event()
    async with session.ws_connect(server.url + "/v1/tts/stream-input?voice=carol&speed=1.1&language=en") as ws:
        reader = asyncio.create_task(collect(ws, received, sent, first_audio))
        parts = pieces(TEXT)
        head = next(i for i in range(len(parts)) if "".join(parts[:i]).count(".") >= 1) + 1
        for part in parts[:head]:  # the first sentence and the start of the second
            sent.append(part)
            await ws.send_json({"text": part})
        # A chat model still writing: the rest waits until the first sentence is heard (a server that speaks only
        # at the end of the input never gets here; the wait is a hang guard, not a speed verdict).
        await asyncio.wait_for(first_audio.wait(), 30)
        for part in parts[head:]:
            sent.append(part)
            await ws.send_json({"text": part})
        await ws.send_json({"close": True})
        await asyncio.wait_for(reader, 30)
    kinds = [m["type"] for _, m in received]
    assert kinds == ["ready"] + ["audio"] * 4 + ["done"]
    assert received[0][1] == {"type": "ready", "voice": "carol", "format": "pcm", "sample_rate": 32000}
    audio = [(n, m) for n, m in received if m["type"] == "audio"]
    assert audio[0][0] < len(pieces(TEXT))  # spoken while the text was still being written
    assert [m["sentence"] for _, m in audio] == ["The first sentence is here.", "Then comes the second one!",
                                                 "Is this the third?", "And the last."]
    assert [(m["index"], m["chunk"]) for _, m in audio] == [(0, 0), (1, 0), (2, 0), (3, 0)]
    pcm = b"".join(base64.b64decode(m["audio"]) for _, m in audio)
    x = pcm_samples(pcm)
    assert x.size == 4 * int(SENTENCE_S * 32000)
    assert all(abs(f - VOICE_FREQS["carol"]) < FREQ_TOL for f in sentence_freqs(x, 32000, 4))
    done = received[-1][1]
    assert done["sentences"] == 4 and done["audio_s"] == pytest.approx(4 * SENTENCE_S)
    call = server.synth.calls[-1]
    assert call.text == "<stream>" and "".join(call.pieces) == TEXT  # pieces forwarded untouched
    assert call.params.speed == 1.1 and call.params.language == "en"


async def test_flush_speaks_an_unfinished_sentence_now(server: Server, session) -> None:
    async with session.ws_connect(server.url + "/v1/tts/stream-input?voice=bob&format=wav&sample_rate=16000") as ws:
        assert (await ws.receive_json())["sample_rate"] == 16000
        await ws.send_json({"text": "Hello there, how are"})
        await ws.send_json({"text": " you", "flush": True})
        first = await asyncio.wait_for(ws.receive_json(), 5)  # arrives without a close or a terminator
        assert first["type"] == "audio" and first["sentence"] == "Hello there, how are you"
        await ws.send_json({"text": "Second run.", "close": True})
        rest = []
        async for msg in ws:
            rest.append(msg.json())
    assert [m["type"] for m in rest] == ["audio", "audio", "done"]  # second run, then the encoder's tail
    assert rest[0]["sentence"] == "Second run." and (rest[0]["index"], rest[0]["chunk"]) == (1, 0)
    assert (rest[1]["index"], rest[1]["chunk"]) == (1, 1)  # the resampler's tail: one more piece of the last
    assert rest[2]["sentences"] == 2 and rest[2]["chunks"] == 3
    data = b"".join(base64.b64decode(m["audio"]) for m in [first] + rest[:-1])
    assert data[4:8] == data[40:44] == b"\xff\xff\xff\xff"  # sizes unknown: read to the end
    x, rate = wav_samples(data)  # one continuous WAV stream, resampled to 16 kHz
    assert rate == 16000 and abs(x.size / rate - 2 * SENTENCE_S) < 0.01
    assert all(abs(f - VOICE_FREQS["bob"]) < FREQ_TOL for f in sentence_freqs(x, rate, 2))
    assert len(server.synth.calls) == 2  # one synthesizer stream per run


async def test_bad_options_are_refused_before_the_upgrade(server: Server, session) -> None:
    for query, needle in [("voice=nobody", "available voices"), ("", "voice is required"),
                          ("voice=bob&format=mp4", "format must be one of"), ("voice=bob&top_k=0", "top_k")]:
        with pytest.raises(aiohttp.WSServerHandshakeError) as e:
            await session.ws_connect(server.url + "/v1/tts/stream-input?" + query)
        assert e.value.status == 400, query
        async with session.get(server.url + "/v1/tts/stream-input?" + query) as r:  # the same, without upgrade
            assert r.status == 400 and needle in (await r.json())["message"]
    async with session.get(server.url + "/v1/tts/stream-input?voice=bob&speed=9") as r:
        assert r.status == 400 and "speed must be a number from 0.25 up to 4" in (await r.json())["message"]


async def test_protocol_errors_close_with_a_message(server: Server, session) -> None:
    async with session.ws_connect(server.url + "/v1/tts/stream-input?voice=alice") as ws:
        await ws.receive_json()
        await ws.send_bytes(b"\x00\x01")
        err = await ws.receive_json()
        assert err["type"] == "error" and "JSON text frames" in err["message"]
        msg = await ws.receive()
        assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1008
    async with session.ws_connect(server.url + "/v1/tts/stream-input?voice=alice") as ws:
        await ws.receive_json()
        await ws.send_str("not json")
        assert "each frame is not valid JSON" in (await ws.receive_json())["message"]
    async with session.ws_connect(server.url + "/v1/tts/stream-input?voice=alice") as ws:
        await ws.receive_json()
        await ws.send_json({"text": 5})
        assert "text must be a string" in (await ws.receive_json())["message"]


async def test_busy_synthesizer_closes_with_try_again_later(server: Server, session) -> None:
    server.synth.busy = True
    async with session.ws_connect(server.url + "/v1/tts/stream-input?voice=alice") as ws:
        await ws.receive_json()
        await ws.send_json({"text": "Hello.", "close": True})
        err = await ws.receive_json()
        assert err["type"] == "error" and "queue is full" in err["message"]
        assert err["status"] == 503 and err["retry_after_s"] == 2
        msg = await ws.receive()
        assert msg.type == aiohttp.WSMsgType.CLOSE and msg.data == 1013


async def test_closing_the_socket_early_stops_the_synthesis(tmp_path, session) -> None:
    srv = await start(tmp_path, delay_s=0.3)
    try:
        async with session.ws_connect(srv.url + "/v1/tts/stream-input?voice=alice") as ws:
            await ws.receive_json()
            await ws.send_json({"text": " ".join(f"Sentence {i}." for i in range(20)), "close": True})
            first = await asyncio.wait_for(ws.receive_json(), 5)
            assert first["type"] == "audio"
        for _ in range(40):
            if srv.synth.calls[-1].finished is not None:
                break
            await asyncio.sleep(0.05)
        call = srv.synth.calls[-1]
        assert call.closed_early and call.sentences_done <= 3
    finally:
        await srv.close()


async def test_text_limit_per_connection(tmp_path, session) -> None:
    srv = await start(tmp_path, http={"max_text_chars": 50})
    try:
        async with session.ws_connect(srv.url + "/v1/tts/stream-input?voice=alice") as ws:
            await ws.receive_json()
            await ws.send_json({"text": "x" * 30})
            await ws.send_json({"text": "y" * 30})
            msgs = []
            async for msg in ws:
                msgs.append(msg.json())
        assert msgs[-1]["type"] == "error" and "passed 50 characters" in msgs[-1]["message"]
        assert np.all([m["type"] != "done" for m in msgs])
    finally:
        await srv.close()


async def test_chunks_of_one_sentence_share_its_index(server: Server, session) -> None:
    server.synth.early_chunk = True  # as the pipeline does: an early chunk of the first sentence, then the rest
    async with session.ws_connect(server.url + "/v1/tts/stream-input?voice=alice") as ws:
        await ws.receive_json()
        await ws.send_json({"text": TEXT, "close": True})
        messages = [msg.json() async for msg in ws]
    audio = [m for m in messages if m["type"] == "audio"]
    assert [(m["index"], m["chunk"]) for m in audio] == [(0, 0), (0, 1), (1, 0), (2, 0), (3, 0)]
    assert audio[0]["sentence"] == audio[1]["sentence"] == "The first sentence is here."
    done = messages[-1]
    assert done["type"] == "done" and done["sentences"] == 4 and done["chunks"] == 5
    x = pcm_samples(b"".join(base64.b64decode(m["audio"]) for m in audio))
    assert x.size == 4 * int(SENTENCE_S * 32000)  # the two pieces make the whole first sentence


async def test_unknown_query_parameters_and_frame_fields_are_refused(server: Server, session) -> None:
    async with session.get(server.url + "/v1/tts/stream-input?voice=bob&output_format=mp3_44100_128") as r:
        assert r.status == 400
        assert "unknown query parameter 'output_format'" in (await r.json())["message"]
    async with session.ws_connect(server.url + "/v1/tts/stream-input?voice=bob") as ws:
        await ws.receive_json()
        await ws.send_json({"text": "Hi.", "isFinal": True})
        err = await ws.receive_json()
    assert err["type"] == "error" and "unknown field 'isFinal'" in err["message"] and err["status"] == 400
    assert server.synth.calls == []
