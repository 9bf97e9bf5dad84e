"""The OpenAI door as the ecosystem uses it: streamed WAV and FLAC that every common decoder reads in full, OpenAI's
voice names mapped to stored voices, any model name, ``/v1/audio/models``, and SSE ``done`` with usage."""

from __future__ import annotations

import base64
import json

import aiohttp
import pytest
from tests.bot.test_http_fakes import SENTENCE_S, VOICE_FREQS, Server, decode_everywhere, dominant_freq, start

THREE = "One sentence here. Another one follows! And a third?"
FREQ_TOL = 8.0  # Hz
DURATION_TOL = 0.1  # s


async def speech(session, srv: Server, **body) -> tuple[int, bytes, aiohttp.ClientResponse]:
    async with session.post(srv.url + "/v1/audio/speech", json={"input": THREE, **body}) as r:
        return r.status, await r.read(), r


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus", "aac", "pcm"])
async def test_every_format_reads_in_full_with_every_decoder(server: Server, session, fmt) -> None:
    status, data, r = await speech(session, server, model="tts-1", voice="bob", response_format=fmt)
    assert status == 200, data[:200]
    decoded = decode_everywhere(data, fmt, 24000)
    for name, (x, rate) in decoded.items():
        assert abs(x.size / rate - 3 * SENTENCE_S) < DURATION_TOL, (name, x.size / rate)
        assert abs(dominant_freq(x, rate) - VOICE_FREQS["bob"]) < FREQ_TOL, name
    if fmt == "wav":  # OpenAI's streamed WAV: both sizes 0xFFFFFFFF ("to the end"), streamed
        assert data[4:8] == b"\xff\xff\xff\xff" and data[40:44] == b"\xff\xff\xff\xff"
        assert r.headers.get("Transfer-Encoding") == "chunked" and set(decoded) == {"soundfile", "wave", "pyav"}
    if fmt == "flac":  # STREAMINFO total_samples (36 bits at byte 21) holds the exact length
        total = int.from_bytes(data[21:26], "big") & (2**36 - 1)
        assert total == decoded["soundfile"][0].size


@pytest.mark.parametrize("model", ["", "tts-1", "gpt-4o-mini-tts-2025-12-15", "whatever-you-like"])
async def test_any_model_name_runs_the_loaded_model(server: Server, session, model) -> None:
    status, data, _ = await speech(session, server, model=model, voice="carol", response_format="pcm")
    assert status == 200, data[:200]
    assert server.synth.calls[-1].voice is server.voices["carol"]


@pytest.mark.parametrize("voice", ["alloy", "ash", "Nova", "shimmer"])
async def test_openai_voice_names_speak_in_the_first_voice_by_default(server: Server, session, voice) -> None:
    status, _, _ = await speech(session, server, voice=voice, response_format="pcm")
    assert status == 200
    assert server.synth.calls[-1].voice is server.voices["alice"]  # first by name


async def test_voice_aliases_and_default_voice(tmp_path, session) -> None:
    srv = await start(tmp_path, http={"voice_aliases": {"alloy": "carol", "Narrator": "bob"},
                                      "default_voice": "bob"})
    try:
        for voice, expected in [("alloy", "carol"), ("ALLOY", "carol"), ("narrator", "bob"), ("ash", "bob"),
                                ("alice", "alice")]:
            status, data, _ = await speech(session, srv, voice=voice, response_format="pcm")
            assert status == 200, data
            assert srv.synth.calls[-1].voice is srv.voices[expected], voice
        status, data, _ = await speech(session, srv, voice="not-openai", response_format="pcm")
        assert status == 400 and "http.voice_aliases" in json.loads(data)["error"]["message"]
    finally:
        await srv.close()
    srv = await start(tmp_path, http={"voice_aliases": {"alloy": "ghost"}})
    try:
        status, data, _ = await speech(session, srv, voice="alloy")
        assert status == 400 and "maps 'alloy' to 'ghost', which is not a stored voice" in json.loads(data)["message"]
    finally:
        await srv.close()


async def test_audio_models_and_models(server: Server, session) -> None:
    async with session.get(server.url + "/v1/audio/models") as r:
        models = await r.json()
    async with session.get(server.url + "/v1/models") as r:
        listed = await r.json()
    ids = [m["id"] for m in models["models"]]
    assert ids == [m["id"] for m in listed["data"]] and "tts-1" in ids and "gpt-4o-mini-tts" in ids


@pytest.mark.parametrize("fmt", ["pcm", "flac"])
async def test_sse_done_carries_usage(server: Server, session, fmt) -> None:
    async with session.post(server.url + "/v1/audio/speech", json={
            "input": THREE, "voice": "alice", "response_format": fmt, "stream_format": "sse"}) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
        text = (await r.read()).decode()
    events = [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: ")]
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    # words and punctuation of the input; 25 semantic tokens per second of the 1.5 s of audio
    assert done["usage"] == {"input_tokens": 12, "output_tokens": 38, "total_tokens": 50}
    data = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    x, rate = decode_everywhere(data, fmt, 24000)["soundfile"]
    assert abs(x.size / rate - 3 * SENTENCE_S) < DURATION_TOL


async def test_pydantic_coercion_of_the_body(server: Server, session) -> None:
    status, _, _ = await speech(session, server, voice="bob", speed="1.25", seed="7", response_format="PCM",
                                language="EN")
    assert status == 200
    p = server.synth.calls[-1].params
    assert (p.speed, p.seed, p.language) == (1.25, 7, "en")
    for body, needle in [({"voice": "bob", "seed": -2}, "seed: input should be greater than or equal to -1"),
                         ({"voice": "bob", "speed": "nan"}, "speed: input should be a finite number"),
                         ({"voice": "bob", "language": "xx"}, "language must be one of")]:
        status, data, _ = await speech(session, server, **body)
        assert status == 400 and needle in json.loads(data)["message"], data
