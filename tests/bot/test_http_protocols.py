"""The HTTP API's doors against a running server, with real clients: api_v2, SillyTavern, OpenAI speech, metrics.

The synthesizer is a fake (tests/bot/test_http_fakes.py): every sentence is 0.5 s of a tone that identifies the
voice, so decoded durations and frequencies prove what came back.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time

import aiohttp
import numpy as np
import pytest
from tests.bot.test_http_fakes import (SENTENCE_S, VOICE_FREQS, Server, decode, dominant_freq, sentence_freqs,
                                       start)

from synthesis.types import SynthesisParams

THREE = "One sentence here. Another one follows! And a third?"
FREQ_TOL = 8.0  # Hz, FFT bin width of a 0.25 s window is 4 Hz
DURATION_TOL = 0.07  # s, codec priming/padding (AAC adds ~1024-2048 samples)


@pytest.fixture
async def server(tmp_path):
    srv = await start(tmp_path)
    yield srv
    await srv.close()


@pytest.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s


def check_audio(data: bytes, fmt: str, n_sentences: int, voice: str, pcm_rate: int = 32000) -> None:
    x, rate = decode(data, fmt, pcm_rate)
    assert abs(x.size / rate - n_sentences * SENTENCE_S) < DURATION_TOL, (fmt, x.size / rate)
    if fmt in ("wav", "raw", "pcm", "flac"):  # lossless: the tone is exact per sentence
        for f in sentence_freqs(x, rate, n_sentences):
            assert abs(f - VOICE_FREQS[voice]) < FREQ_TOL
    else:
        assert abs(dominant_freq(x, rate) - VOICE_FREQS[voice]) < FREQ_TOL


# ---- api_v2 ------------------------------------------------------------------------------------------------------

async def test_tts_get_every_parameter_reaches_the_synthesizer(server: Server, session) -> None:
    query = {
        "text": THREE, "text_lang": "EN", "ref_audio_path": "bob", "aux_ref_audio_paths": "alice",
        "prompt_text": "ignored", "prompt_lang": "zh", "top_k": "7", "top_p": "0.8", "temperature": "0.7",
        "text_split_method": "cut1", "batch_size": "4", "batch_threshold": "0.5", "split_bucket": "false",
        "speed_factor": "1.25", "fragment_interval": "0.15", "seed": "1234", "media_type": "wav",
        "streaming_mode": "false", "parallel_infer": "false", "repetition_penalty": "1.2", "sample_steps": "16",
        "super_sampling": "true", "overlap_length": "3", "min_chunk_length": "20", "noise_scale": "0.3",
    }
    async with session.get(server.url + "/tts", params=query) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"] == "audio/wav"
        body = await r.read()
    check_audio(body, "wav", 3, "bob")
    assert int.from_bytes(body[40:44], "little") == len(body) - 44  # one body: exact length in the header
    call = server.synth.calls[-1]
    assert call.text == THREE and call.voice is server.voices["bob"]
    assert call.params == SynthesisParams(language="en", top_k=7, top_p=0.8, temperature=0.7,
                                          repetition_penalty=1.2, speed=1.25, noise_scale=0.3, seed=1234,
                                          split_method="cut1", fragment_interval=0.15)


async def test_tts_post_json_types_and_defaults(server: Server, session) -> None:
    body = {"text": THREE, "text_lang": "zh", "ref_audio_path": "carol", "prompt_lang": "en", "top_k": 3,
            "temperature": 1.5, "seed": 7, "aux_ref_audio_paths": ["carol", "alice"], "streaming_mode": True,
            "media_type": "raw"}
    async with session.post(server.url + "/tts", json=body) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"] == "audio/raw"
        data = await r.read()
    check_audio(data, "raw", 3, "carol")
    p = server.synth.calls[-1].params
    assert (p.language, p.top_k, p.temperature, p.seed) == ("zh", 3, 1.5, 7)
    # everything not sent: the config's defaults, which are upstream's
    assert (p.top_p, p.repetition_penalty, p.speed, p.split_method, p.fragment_interval) == (1.0, 1.35, 1.0,
                                                                                          "cut5", 0.3)


@pytest.mark.parametrize("media_type", ["wav", "raw", "ogg", "aac"])
@pytest.mark.parametrize("mode", ["0", "1", "2", "3", "true"])
async def test_tts_media_types_decode_to_expected_duration(server: Server, session, media_type, mode) -> None:
    query = {"text": THREE, "text_lang": "en", "ref_audio_path": "alice", "media_type": media_type,
             "streaming_mode": mode}
    async with session.get(server.url + "/tts", params=query) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"] == f"audio/{media_type}"
        assert (r.headers.get("Transfer-Encoding") == "chunked") == (mode != "0")
        data = await r.read()
    check_audio(data, media_type, 3, "alice")
    if media_type == "wav" and mode != "0":  # streamed WAV: header first, length unknown (0, as upstream)
        assert data[:4] == b"RIFF" and int.from_bytes(data[40:44], "little") == 0


async def test_streaming_chunks_arrive_before_synthesis_ends(tmp_path, session) -> None:
    delay = 0.2  # s of "synthesis" per sentence
    srv = await start(tmp_path, delay_s=delay)
    try:
        text = " ".join(f"Sentence number {i}." for i in range(5))
        arrivals: list[tuple[float, int]] = []
        async with session.get(srv.url + "/tts", params={"text": text, "text_lang": "en", "ref_audio_path": "bob",
                                                         "media_type": "raw", "streaming_mode": "1"}) as r:
            assert r.status == 200
            async for data in r.content.iter_any():
                arrivals.append((time.monotonic(), len(data)))
        end = srv.synth.calls[-1].finished
        assert end is not None
        assert arrivals[0][0] < end - 3 * delay  # the first sentence is out ~4 delays before the fifth is done
        got = 0
        sentence_bytes = int(SENTENCE_S * 32000) * 2
        for t, n in arrivals:  # sentence k is on the wire before sentence k+2 could have been synthesized
            got += n
            if got >= sentence_bytes and got < 5 * sentence_bytes:
                k = got // sentence_bytes
                assert t < srv.synth.calls[-1].started + (k + 2) * delay
        assert got == 5 * sentence_bytes

        arrivals.clear()  # one body (mode 0): nothing until the end
        async with session.get(srv.url + "/tts", params={"text": text, "text_lang": "en", "ref_audio_path": "bob",
                                                         "media_type": "raw", "streaming_mode": "0"}) as r:
            async for data in r.content.iter_any():
                arrivals.append((time.monotonic(), len(data)))
        end = srv.synth.calls[-1].finished
        assert end is not None and arrivals[0][0] >= end
    finally:
        await srv.close()


async def test_concurrent_requests_with_different_voices_never_mix(tmp_path, session) -> None:
    srv = await start(tmp_path, delay_s=0.05)
    try:
        text = "First part. Second part. Third part. Fourth part."

        async def api_v2(voice: str) -> tuple[str, bytes, str]:
            q = {"text": text, "text_lang": "en", "ref_audio_path": voice, "media_type": "wav", "streaming_mode": "1"}
            async with session.get(srv.url + "/tts", params=q) as r:
                return voice, await r.read(), "wav"

        async def openai(voice: str) -> tuple[str, bytes, str]:
            body = {"model": "tts-1", "input": text, "voice": voice, "response_format": "pcm"}
            async with session.post(srv.url + "/v1/audio/speech", json=body) as r:
                return voice, await r.read(), "pcm"

        async def tavern(voice: str) -> tuple[str, bytes, str]:
            body = {"text": text, "ref_audio_path": f"./参考音频/{voice}.wav", "text_lang": "en", "prompt_lang": "en",
                    "media_type": "wav", "streaming_mode": "true"}
            async with session.post(srv.url + "/", json=body) as r:
                return voice, await r.read(), "wav"

        jobs = [door(v) for _ in range(2) for door in (api_v2, openai, tavern) for v in VOICE_FREQS]
        results = await asyncio.gather(*jobs)
        assert len(results) == 18
        for voice, data, fmt in results:
            x, rate = decode(data, fmt, pcm_rate=24000)
            assert abs(x.size / rate - 4 * SENTENCE_S) < DURATION_TOL
            for f in sentence_freqs(x, rate, 4):
                assert abs(f - VOICE_FREQS[voice]) < FREQ_TOL, (voice, f)
    finally:
        await srv.close()


@pytest.mark.parametrize("query, needle", [
    ({"text_lang": "en"}, "text is required"),
    ({"text": "Hi.", "text_lang": "xx"}, "text_lang must be one of"),
    ({"text": "Hi.", "text_lang": "en", "top_k": "0"}, "top_k must be an integer >= 1"),
    ({"text": "Hi.", "text_lang": "en", "top_k": "many"}, "top_k must be an integer"),
    ({"text": "Hi.", "text_lang": "en", "top_p": "0"}, "top_p must be a number above 0"),
    ({"text": "Hi.", "text_lang": "en", "temperature": "nan"}, "temperature must be a number"),
    ({"text": "Hi.", "text_lang": "en", "speed_factor": "9"}, "speed_factor must be a number from 0.25 up to 4"),
    ({"text": "Hi.", "text_lang": "en", "media_type": "mp4"}, "media_type must be one of wav, raw, ogg, aac"),
    ({"text": "Hi.", "text_lang": "en", "streaming_mode": "7"}, "streaming_mode must be false/true or 0-3"),
    ({"text": "Hi.", "text_lang": "en", "text_split_method": "cut9"}, "text_split_method must be one of"),
    ({"text": "Hi.", "text_lang": "en", "split_bucket": "maybe"}, "split_bucket must be true or false"),
    ({"text": "Hi.", "text_lang": "en", "batch_size": "0"}, "batch_size must be an integer from 1"),
    ({"text": "Hi.", "text_lang": "en", "fragment_interval": "-1"}, "fragment_interval must be a number from 0"),
    ({"text": "Hi.", "text_lang": "en", "ref_audio_path": "nobody"}, "available voices: alice, bob, carol"),
    ({"text": "   ", "text_lang": "en"}, "text is empty"),
    ({"text": "x" * 5001, "text_lang": "en"}, "the limit is 5000 (http.max_text_chars)"),
])
async def test_bad_parameter_values_are_refused_with_400(server: Server, session, query, needle) -> None:
    query = {"ref_audio_path": "alice", **query}
    async with session.get(server.url + "/tts", params=query) as r:
        assert r.status == 400
        body = await r.json()
    assert needle in body["message"], body
    assert body["error"]["message"] == body["message"]
    assert server.synth.calls == []


async def test_errors_from_the_synthesizer_and_the_router(server: Server, session) -> None:
    server.synth.busy = True
    async with session.get(server.url + "/tts", params={"text": "Hi.", "text_lang": "en",
                                                        "ref_audio_path": "alice", "streaming_mode": "1"}) as r:
        assert r.status == 503 and r.headers["Retry-After"] == "2"
        assert "queue is full" in (await r.json())["message"]
    server.synth.busy = False
    async with session.get(server.url + "/tts", params={"text": "...", "text_lang": "en",
                                                        "ref_audio_path": "alice"}) as r:
        assert r.status == 400 and "nothing to speak" in (await r.json())["message"]
    async with session.post(server.url + "/tts", data=b"{not json") as r:
        assert r.status == 400 and "not valid JSON" in (await r.json())["message"]
    async with session.post(server.url + "/tts", json=["a list"]) as r:
        assert r.status == 400 and "must be a JSON object" in (await r.json())["message"]
    async with session.get(server.url + "/nope") as r:
        assert r.status == 404 and "/v1/audio/speech" in (await r.json())["message"]
    async with session.delete(server.url + "/tts") as r:
        assert r.status == 405 and "DELETE is not allowed" in (await r.json())["message"]


async def test_control_endpoints(server: Server, session) -> None:
    async with session.get(server.url + "/control", params={"command": "restart"}) as r:
        assert r.status == 501 and "service manager" in (await r.json())["message"]
    async with session.get(server.url + "/control", params={"command": "explode"}) as r:
        assert r.status == 400 and "command must be one of restart, exit" in (await r.json())["message"]
    async with session.get(server.url + "/set_refer_audio", params={"refer_audio_path": "x.wav"}) as r:
        assert r.status == 501 and "ref_audio_path" in (await r.json())["message"]
    loaded = server.config.models.gpt.name
    async with session.get(server.url + "/set_gpt_weights",
                           params={"weights_path": f"GPT_SoVITS/pretrained_models/{loaded}"}) as r:
        assert r.status == 200 and await r.json() == {"message": "success"}
    async with session.get(server.url + "/set_sovits_weights", params={"weights_path": "other.pth"}) as r:
        assert r.status == 501 and "models.sovits" in (await r.json())["message"]


# ---- SillyTavern -------------------------------------------------------------------------------------------------

async def test_sillytavern_speakers_and_generation(server: Server, session) -> None:
    async with session.get(server.url + "/speakers") as r:
        assert r.status == 200
        speakers = await r.json()
    assert speakers == [{"name": n, "voice_id": n} for n in ("alice", "bob", "carol")]
    # exactly what the GPT-SoVITS-V2 provider posts
    body = {"text": THREE, "prompt_text": "carol", "ref_audio_path": "./参考音频/carol.wav", "text_lang": "zh",
            "prompt_lang": "zh", "text_split_method": "cut5", "batch_size": 1, "media_type": "ogg",
            "streaming_mode": "true"}
    async with session.post(server.url + "/", json=body) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"] == "audio/ogg" and r.headers["Transfer-Encoding"] == "chunked"
        data = await r.read()
    check_audio(data, "ogg", 3, "carol")
    call = server.synth.calls[-1]
    assert call.voice is server.voices["carol"] and call.params.language == "zh"
    body.update(ref_audio_path="./参考音频/nobody.wav")
    async with session.post(server.url + "/", json=body) as r:
        assert r.status == 400 and "available voices" in (await r.json())["message"]


# ---- OpenAI speech -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt, ctype", [("mp3", "audio/mpeg"), ("opus", "audio/ogg; codecs=opus"),
                                        ("aac", "audio/aac"), ("flac", "audio/flac"), ("wav", "audio/wav"),
                                        ("pcm", "audio/pcm")])
async def test_openai_speech_formats(server: Server, session, fmt, ctype) -> None:
    body = {"model": "tts-1", "input": THREE, "voice": "bob", "response_format": fmt, "speed": 1.5}
    async with session.post(server.url + "/v1/audio/speech", json=body) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"] == ctype
        data = await r.read()
    check_audio(data, fmt, 3, "bob", pcm_rate=24000)  # OpenAI's pcm is 24 kHz
    p = server.synth.calls[-1].params
    assert p.speed == 1.5 and server.synth.calls[-1].text == THREE


async def test_openai_sse_stream(server: Server, session) -> None:
    body = {"model": "gpt-4o-mini-tts", "input": THREE, "voice": {"id": "alice"}, "response_format": "pcm",
            "stream_format": "sse", "instructions": "cheerful"}
    async with session.post(server.url + "/v1/audio/speech", json=body) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
        text = (await r.read()).decode()
    events = [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["speech.audio.delta"] * (len(events) - 1) + ["speech.audio.done"]
    assert len(events) >= 4  # one delta per sentence at least
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    check_audio(pcm, "pcm", 3, "alice", pcm_rate=24000)


async def test_openai_models_voices_and_errors(server: Server, session) -> None:
    async with session.get(server.url + "/v1/models") as r:
        models = await r.json()
    assert models["object"] == "list" and "tts-1" in [m["id"] for m in models["data"]]
    async with session.get(server.url + "/v1/audio/voices") as r:
        voices = await r.json()
    assert [v["id"] for v in voices["voices"]] == ["alice", "bob", "carol"]
    for body, needle in [({"model": "tts-1", "input": "Hi.", "voice": "alloy"}, "voice 'alloy' does not exist"),
                         ({"model": "tts-2", "input": "Hi.", "voice": "bob"}, "model must be one of"),
                         ({"model": "tts-1", "voice": "bob"}, "input is required"),
                         ({"model": "tts-1", "input": "Hi.", "voice": "bob", "speed": 5}, "speed must be a number"),
                         ({"model": "tts-1", "input": "Hi.", "voice": "bob", "response_format": "ogg"},
                          "response_format must be one of")]:
        async with session.post(server.url + "/v1/audio/speech", json=body) as r:
            assert r.status == 400
            err = await r.json()
        assert needle in err["error"]["message"] and err["error"]["type"] == "invalid_request_error"


async def test_the_openai_python_client_works_against_the_server(server: Server) -> None:
    import openai

    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    try:
        async with client.audio.speech.with_streaming_response.create(
                model="tts-1", voice="carol", input=THREE, response_format="wav") as response:
            data = await response.read()
        check_audio(data, "wav", 3, "carol")
        with pytest.raises(openai.BadRequestError, match="does not exist"):
            await client.audio.speech.create(model="tts-1", voice="nova", input="Hi.")
    finally:
        await client.close()


# ---- metrics and health ------------------------------------------------------------------------------------------

async def test_metrics_and_healthz(server: Server, session) -> None:
    for _ in range(2):
        async with session.get(server.url + "/tts", params={"text": "Hi there.", "text_lang": "en",
                                                            "ref_audio_path": "alice", "streaming_mode": "1"}) as r:
            await r.read()
    async with session.post(server.url + "/v1/audio/speech", json={"input": "Hi.", "voice": "bob"}) as r:
        await r.read()
    async with session.get(server.url + "/tts", params={"text": "Hi.", "text_lang": "xx"}) as r:
        assert r.status == 400
    async with session.get(server.url + "/healthz") as r:
        health = await r.json()
    assert health["status"] == "ok" and health["engine"] == "fake" and health["queue_depth"] == 3
    async with session.get(server.url + "/metrics") as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = await r.text()

    def value(series: str) -> float:
        m = re.search("^" + re.escape(series) + r" (\S+)$", text, re.M)
        assert m, series
        return float(m.group(1))

    assert value('voicebot_http_requests_total{protocol="api_v2",status="200"}') == 2
    assert value('voicebot_http_requests_total{protocol="api_v2",status="400"}') == 1
    assert value('voicebot_http_requests_total{protocol="openai",status="200"}') == 1
    assert value("voicebot_http_time_to_first_audio_seconds_count") == 3
    assert value('voicebot_http_time_to_first_audio_seconds_bucket{le="+Inf"}') == 3
    assert value("voicebot_http_real_time_factor_count") == 3
    assert value("voicebot_http_audio_seconds_total") == pytest.approx(3 * SENTENCE_S, abs=0.01)
    assert value("voicebot_synthesis_queue_depth") == 3
    assert value("voicebot_synthesis_prosody_hit_ratio") == 0.25
    assert value("voicebot_synthesis_prosody_hits_total") == 2
    assert value('voicebot_synthesis_ttfa_s_recent{quantile="0.5"}') == 0.2
    assert value('voicebot_engine_info{device="cpu",engine="fake",precision="fp32"}') == 1
    assert "# TYPE voicebot_http_time_to_first_audio_seconds histogram" in text
    buckets = [float(v) for v in re.findall(r'^voicebot_http_real_time_factor_bucket\{le="[^"]+"\} (\S+)$', text,
                                            re.M)]
    assert buckets == sorted(buckets)  # cumulative
    assert np.isfinite(buckets).all()
