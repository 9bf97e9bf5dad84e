"""The HTTP API's doors against a running server, with real clients: api_v2, SillyTavern, OpenAI speech, metrics.

The synthesizer is a fake (tests/bot/test_http_fakes.py): every sentence is 0.5 s of a tone that identifies the
voice, so decoded durations and frequencies prove what came back.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import re

import numpy as np
import pytest
from tests.bot.test_http_fakes import (SENTENCE_S, VOICE_FREQS, Server, decode, decode_everywhere, dominant_freq,
                                       sentence_freqs, start)

from bot.http.responses import IGNORED_HEADER
from synthesis.types import SynthesisParams, VoiceStyle

THREE = "One sentence here. Another one follows! And a third?"
FREQ_TOL = 8.0  # Hz, FFT bin width of a 0.25 s window is 4 Hz
DURATION_TOL = 0.07  # s, codec priming/padding (AAC adds ~1024-2048 samples)


def check_audio(data: bytes, fmt: str, n_sentences: int, voice: str, pcm_rate: int = 32000) -> None:
    """Every decoder that reads ``fmt`` (soundfile, ``wave``, PyAV) finds the sentences in the voice's tone."""
    if fmt == "wav" and data[40:44] == bytes(4):
        # upstream api_v2's streamed header (sizes 0, kept byte for byte on /tts): soundfile and wave see 0 frames,
        # so only readers that go to the end of the body count
        decoded = {"to the end": decode(data, fmt, pcm_rate), "pyav": decode_everywhere(data, fmt)["pyav"]}
    else:
        decoded = decode_everywhere(data, fmt, pcm_rate)
        assert "soundfile" in decoded or fmt == "aac"
    for name, (x, rate) in decoded.items():
        assert abs(x.size / rate - n_sentences * SENTENCE_S) < DURATION_TOL, (name, fmt, x.size / rate)
        if fmt in ("wav", "raw", "pcm", "flac"):  # lossless: the tone is exact per sentence
            for f in sentence_freqs(x, rate, n_sentences):
                assert abs(f - VOICE_FREQS[voice]) < FREQ_TOL, name
        else:
            assert abs(dominant_freq(x, rate) - VOICE_FREQS[voice]) < FREQ_TOL, name


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
                                          split_method="cut1", fragment_interval=0.15, steps=16,
                                          aux_voices=(server.voices["alice"].id,))  # steps: sample_steps


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
    assert p.aux_voices == (server.voices["carol"].id, server.voices["alice"].id)  # in order, as upstream averages
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
        # (bytes received so far, sentences the synthesizer had produced when they arrived): an order, not a clock
        arrivals: list[tuple[int, int]] = []
        got = 0
        async with session.get(srv.url + "/tts", params={"text": text, "text_lang": "en", "ref_audio_path": "bob",
                                                         "media_type": "raw", "streaming_mode": "1"}) as r:
            assert r.status == 200
            async for data in r.content.iter_any():
                got += len(data)
                arrivals.append((got, srv.synth.calls[-1].sentences_done))
        assert srv.synth.calls[-1].finished is not None
        sentence_bytes = int(SENTENCE_S * 32000) * 2
        first_audio = next(done for n, done in arrivals if n > 0)
        assert first_audio < 5, arrivals  # the first sentence was out before the last one was synthesized
        for n, done in arrivals:  # sentence k reached the client before sentence k+3 was made (0.2 s apart)
            assert done <= n // sentence_bytes + 3, (n, done, arrivals)
        assert got == 5 * sentence_bytes

        arrivals.clear()  # one body (mode 0): nothing until the end
        async with session.get(srv.url + "/tts", params={"text": text, "text_lang": "en", "ref_audio_path": "bob",
                                                         "media_type": "raw", "streaming_mode": "0"}) as r:
            async for data in r.content.iter_any():
                arrivals.append((len(data), srv.synth.calls[-1].sentences_done))
                assert srv.synth.calls[-1].finished is not None  # not a byte before the synthesizer was done
        assert arrivals and arrivals[0][1] == 5
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
    ({"text": "Hi.", "text_lang": "en", "top_k": "0"}, "top_k: input should be greater than or equal to 1; got '0'"),
    ({"text": "Hi.", "text_lang": "en", "top_k": "many"}, "top_k: input should be a valid integer"),
    ({"text": "Hi.", "text_lang": "en", "top_p": "0"}, "top_p: input should be greater than 0"),
    ({"text": "Hi.", "text_lang": "en", "temperature": "nan"}, "temperature: input should be a finite number"),
    ({"text": "Hi.", "text_lang": "en", "speed_factor": "9"}, "speed_factor: input should be less than or equal to 4"),
    ({"text": "Hi.", "text_lang": "en", "media_type": "mp4"}, "media_type must be one of wav, raw, ogg, aac"),
    ({"text": "Hi.", "text_lang": "en", "streaming_mode": "7"}, "streaming_mode must be false/true or 0-3"),
    ({"text": "Hi.", "text_lang": "en", "text_split_method": "cut9"}, "text_split_method must be one of"),
    ({"text": "Hi.", "text_lang": "en", "split_bucket": "maybe"}, "split_bucket: input should be a valid boolean"),
    ({"text": "Hi.", "text_lang": "en", "batch_size": "0"}, "batch_size: input should be greater than or equal to 1"),
    ({"text": "Hi.", "text_lang": "en", "fragment_interval": "-1"},
     "fragment_interval: input should be greater than or equal to 0"),
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
        assert r.status == 200
        body = await r.json()
    # upstream clients check message == "success"; the rest says that nothing was loaded
    assert body["message"] == "success" and body["changed"] is False and body["loaded"] == loaded
    assert "nothing was loaded" in body["detail"]
    async with session.get(server.url + "/set_sovits_weights", params={"weights_path": "other.pth"}) as r:
        assert r.status == 501 and "models.sovits" in (await r.json())["message"]


async def test_set_weights_with_the_loaded_name_elsewhere_says_nothing_was_loaded(server: Server, session,
                                                                                  tmp_path) -> None:
    loaded = server.config.models.sovits.name
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / loaded).write_bytes(b"not the loaded weights")
    async with session.post(server.url + "/set_sovits_weights", json={"weights_path": str(evil / loaded)}) as r:
        assert r.status == 501
        message = (await r.json())["message"]
    assert "a different file with the loaded file's name was not loaded" in message and "models.sovits" in message


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
        assert r.status == 400
        message = await r.json()  # a JSON string: SillyTavern shows `await response.json()` as the message
    assert isinstance(message, str) and "available voices" in message


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
    _give_style(server, "bob", "Calm")
    async with session.get(server.url + "/v1/audio/voices") as r:
        voices = await r.json()
    assert [(v["clips"], v["styles"]) for v in voices["voices"]] == [(1, []), (1, ["Calm"]), (1, [])]
    for body, needle in [({"model": "tts-1", "input": "Hi.", "voice": "nobody"}, "voice 'nobody' does not exist"),
                         ({"model": "tts-1", "voice": "bob"}, "input is required"),
                         ({"model": "tts-1", "input": "Hi.", "voice": "bob", "speed": 5},
                          "speed: input should be less than or equal to 4; got 5"),
                         ({"model": "tts-1", "input": "Hi.", "voice": "bob", "speed": "fast"},
                          "speed: input should be a valid number"),
                         ({"model": "tts-1", "input": "Hi.", "voice": "bob", "response_format": "ogg"},
                          "response_format: input should be 'mp3', 'opus', 'aac', 'flac', 'wav' or 'pcm'")]:
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
            await client.audio.speech.create(model="tts-1", voice="nobody", input="Hi.")
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
    assert value('voicebot_synthesis_time_to_first_audio_seconds{quantile="0.5"}') == 0.2
    assert value('voicebot_engine_info{device="cpu",engine="fake",precision="fp32"}') == 1
    assert "# TYPE voicebot_http_time_to_first_audio_seconds histogram" in text
    buckets = [float(v) for v in re.findall(r'^voicebot_http_real_time_factor_bucket\{le="[^"]+"\} (\S+)$', text,
                                            re.M)]
    assert buckets == sorted(buckets)  # cumulative
    assert np.isfinite(buckets).all()


async def test_metrics_have_no_nan_and_speak_openmetrics(server: Server, session) -> None:
    server.synth.metrics = lambda: {"queue_depth": 0, "requests": 0, "ttfa_s": [], "rtf": [float("nan")],
                                    "engine": "fake"}
    async with session.get(server.url + "/metrics") as r:
        text = await r.text()
    assert "NaN" not in text and "quantile=" not in text  # no sample yet: no quantile at all
    assert "voicebot_synthesis_time_to_first_audio_seconds" not in text
    assert re.search(r"^process_resident_memory_bytes \d", text, re.M)  # process metrics come with it
    async with session.get(server.url + "/metrics", headers={"Accept": "application/openmetrics-text"}) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        om = await r.text()
    assert om.rstrip().endswith("# EOF") and "# TYPE voicebot_http_requests counter" in om


async def test_api_v2_takes_what_upstream_takes(server: Server, session) -> None:
    # empty values are "not set" (AstrBot), a path whose stem names a voice is that voice
    query = {"text": THREE, "text_lang": "en", "ref_audio_path": "/home/someone/astrbot/data/bob",
             "aux_ref_audio_paths": "", "top_k": "", "temperature": "", "prompt_lang": "", "media_type": "raw"}
    async with session.get(server.url + "/tts", params=query) as r:
        assert r.status == 200, await r.text()
        data = await r.read()
    check_audio(data, "raw", 3, "bob")
    p = server.synth.calls[-1].params
    assert (p.top_k, p.temperature) == (15, 1.0)  # the config's defaults
    async with session.post(server.url + "/tts", json={"text": THREE, "text_lang": "en",
                                                       "ref_audio_path": "C:\\\\voices\\\\carol.wav",
                                                       "aux_ref_audio_paths": ["", "alice"], "media_type": "raw"}) as r:
        assert r.status == 200
    assert server.synth.calls[-1].voice is server.voices["carol"]
    async with session.get(server.url + "/tts", params={**query, "ref_audio_path": "/home/someone/nobody"}) as r:
        assert r.status == 400 and "available voices" in (await r.json())["message"]


async def test_the_doors_read_voices_through_the_voice_service_off_the_loop(server: Server, session) -> None:
    """No door reaches into the synthesizer's voice store: with that reference gone, api_v2, SillyTavern and OpenAI
    still find their voices and list them, and every store read runs on a worker thread, never the event loop's."""
    import threading

    store = server.synth.voices
    loop_thread = threading.get_ident()
    reads: list[tuple[str, bool]] = []  # (method, ran on the event loop's thread)
    for name in ("get", "find", "list"):
        def spy(*args, _real=getattr(store, name), _name=name, **kwargs):  # type: ignore[no-untyped-def]
            reads.append((_name, threading.get_ident() == loop_thread))
            return _real(*args, **kwargs)

        setattr(store, name, spy)
    server.synth.voices = None  # the fake synthesizer only needs it for voices given by name, which no door sends
    for method, path, body in [("GET", "/tts?text=Hi.&text_lang=en&ref_audio_path=bob", None),
                               ("GET", "/speakers", None), ("GET", "/v1/audio/voices", None),
                               ("POST", "/v1/audio/speech", {"model": "tts-1", "input": "Hi.", "voice": "carol"})]:
        async with session.request(method, server.url + path, json=body) as r:
            assert r.status == 200, (path, await r.text())
            await r.read()
    assert {"find", "list"} <= {name for name, _ in reads} and not any(on_loop for _, on_loop in reads), reads


# ---- named styles chosen per request -----------------------------------------------------------------------------

def _give_style(server: Server, name: str, style: str) -> None:
    """A named style on a fake voice (its own prompt: here the voice's, enough for the door's choice)."""
    v = server.synth.voices.get(server.voices[name].id)
    server.synth.voices._put(dataclasses.replace(v, styles={style.casefold(): VoiceStyle(style, "en", "", v.prompt)}))


@pytest.mark.parametrize(("instructions", "style", "ignored"), [
    ("calm", "Calm", None), ("Style: CALM.", "Calm", None), ("style=calm", "Calm", None),
    ("Speak cheerfully and fast", "", "instructions"), ("excited", "", "instructions"), ("", "", None)])
async def test_openai_instructions_choose_a_style_or_say_they_were_ignored(server: Server, session, instructions,
                                                                          style, ignored) -> None:
    _give_style(server, "alice", "Calm")
    body = {"model": "tts-1", "input": "Hello there.", "voice": "alice", "response_format": "wav",
            "instructions": instructions}
    async with session.post(server.url + "/v1/audio/speech", json=body) as r:
        assert r.status == 200, await r.text()
        assert r.headers.get(IGNORED_HEADER) == ignored
        await r.read()
    assert server.synth.calls[-1].params.style == style


@pytest.mark.parametrize(("style", "status", "chosen", "ignored"), [
    ("calm", 200, "Calm", None), (" CALM ", 200, "Calm", None), (0.3, 200, "", "voice_settings.style"),
    (1, 200, "", "voice_settings.style"), (None, 200, "", None), ("", 200, "", None),
    ("excited", 400, None, None), (1.5, 400, None, None)])
async def test_elevenlabs_style_names_a_style_and_a_number_is_said_to_be_ignored(server: Server, session, style,
                                                                                 status, chosen, ignored) -> None:
    _give_style(server, "bob", "Calm")
    body = {"text": "Hello there.", "voice_settings": {"style": style, "speed": 1.0}}
    async with session.post(server.url + "/v1/text-to-speech/bob/stream?output_format=pcm_16000", json=body) as r:
        text = await r.read()
        assert r.status == status, text
        assert r.headers.get(IGNORED_HEADER) == ignored
    if status == 200:
        assert server.synth.calls[-1].params.style == chosen
    elif style == "excited":
        assert "has no style 'excited' (its styles: Calm)" in text.decode()
