"""The HTTP API over the real pipeline: every door against a running server with the tiny real models.

The server's synthesizer and a second, independent one (its own caches, the same stored voices) both run the tiny
random-weight models. Seeded requests must come back exactly as the second one synthesizes the same text and seed
directly: lossless formats sample for sample, compressed ones to the same duration within one codec frame (after
the encoder delay, for the formats whose stream cannot say how long that delay is) and with the same loudness
contour. Two requests for different voices at once must each equal their solo run.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
from tests.audio_samples import speech_like_wav
from tests.bot.test_http_fakes import decode

from bot.config import load_config
from bot.http import start_server
from bot.services import Services, build_synthesizer, default_params
from synthesis.audio import resample
from synthesis.pipeline import Synthesizer
from synthesis.types import SynthesisParams, Voice, to_pcm16

pytestmark = pytest.mark.asyncio(loop_scope="module")

RATE = 32000  # Hz, the synthesizer's output rate
SEED = 1234
TEXT = "The weather is nice today. We should go for a walk."
CONCURRENT_TEXT = "Good morning to all of you. The train leaves at noon."
STREAM_TEXT = "The first sentence is here. Then comes the second one! Is this the third? And the last."
CONSENT = {"user_id": 1, "text": "this is my own voice"}
VOICES = {"alice": (140.0, 0), "bob": (230.0, 1)}  # name -> (f0 Hz, seed) of the synthetic reference clip
PCM_RATE = 24000  # Hz, OpenAI's pcm
ENVELOPE_S = 0.02  # s, window of the loudness contour compared for compressed formats
MIN_ENVELOPE_CORR = 0.95  # lossy codecs keep the loudness contour (speech vs the silences between sentences)
# Compressed formats: (encoder delay the decoder cannot remove, in output samples; one frame, in samples) at the
# decoded rate. Ogg Opus signals its pre-skip, so nothing is left; ADTS AAC (1024 priming samples) and an mp3 sent
# as it is encoded (no seekable LAME header: 576 encoder + 529 decoder samples) keep theirs.
CODEC_FRAMES = {"ogg": (0, 960), "opus": (0, 960), "aac": (1024, 1024), "mp3": (576 + 529, 1152)}


@dataclass
class Env:
    url: str
    config: Any
    server_synth: Synthesizer
    reference_synth: Synthesizer
    voices: dict[str, Voice]  # as stored by the server's synthesizer
    runner: Any
    _references: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)

    def params(self) -> SynthesisParams:
        return dataclasses.replace(default_params(self.config), language="en", seed=SEED)

    async def reference(self, text: str, voice: str) -> np.ndarray:
        """``[N]`` int16: the same text, voice and seed synthesized directly by the independent synthesizer."""
        key = (text, voice)
        if key not in self._references:
            v = self.reference_synth.voices.get(self.voices[voice].id)
            audio, _ = await self.reference_synth.synthesize(text, v, self.params())
            self._references[key] = to_pcm16(audio)
        return self._references[key]


def _config(tiny_models: Path, data: Path, cache_name: str):
    cfg = load_config(tiny_models / "config.yaml")
    return dataclasses.replace(
        cfg,
        voices=dataclasses.replace(cfg.voices, dir=data / "voices"),
        cache=dataclasses.replace(cfg.cache, dir=data / cache_name),
        discord=dataclasses.replace(cfg.discord, database=data / "voicebot.sqlite3"),
        http=dataclasses.replace(cfg.http, token_env="VOICEBOT_TEST_HTTP_REAL_NO_TOKEN", rate_limit_per_min=0),
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory):
    data = tmp_path_factory.mktemp("http-real")
    config = _config(tiny_models, data, "cache")
    server_synth = build_synthesizer(config)
    reference_synth = build_synthesizer(_config(tiny_models, data, "reference-cache"))
    voices = {}
    for name, (f0, seed) in VOICES.items():
        voices[name], _ = await server_synth.voicing.create(
            name, speech_like_wav(4.0, f0, seed), f"{name}.wav", transcript="Hello, this is my voice.",
            language="en", consent=CONSENT)
    runner = await start_server(Services(config, server_synth), "127.0.0.1", 0)
    port = runner.addresses[0][1]
    yield Env(f"http://127.0.0.1:{port}", config, server_synth, reference_synth, voices, runner)
    await runner.cleanup()
    await server_synth.close()
    await reference_synth.close()


async def fetch(method: str, url: str, **kwargs: Any) -> tuple[aiohttp.ClientResponse, bytes]:
    async with aiohttp.ClientSession() as session:
        async with session.request(method, url, **kwargs) as r:
            body = await r.read()
            assert r.status == 200, body[:500]
            return r, body


def assert_same_pcm(data: bytes, fmt: str, reference: np.ndarray) -> None:
    """A lossless body (wav or raw s16le @ 32 kHz) holds exactly the reference samples."""
    x, rate = decode(data, fmt, RATE)
    assert rate == RATE
    got = np.round(x * 32768.0).astype(np.int16)
    assert got.size == reference.size, (got.size, reference.size)
    assert np.array_equal(got, reference)


def _envelope(x: np.ndarray, rate: int) -> np.ndarray:
    """RMS per ``ENVELOPE_S`` window."""
    n = int(rate * ENVELOPE_S)
    frames = x[: x.size // n * n].astype(np.float64).reshape(-1, n)
    return np.sqrt((frames**2).mean(axis=1))


def assert_same_audio(data: bytes, fmt: str, reference: np.ndarray) -> None:
    """A compressed body decodes to the reference's duration within one codec frame, with its loudness contour."""
    x, rate = decode(data, fmt)
    delay, frame = CODEC_FRAMES[fmt]
    expected = reference.size * rate / RATE  # samples at the decoded rate
    extra = x.size - expected - delay
    assert -frame <= extra <= frame, (fmt, x.size, expected, delay)
    ref = reference.astype(np.float32) / 32768.0
    if rate != RATE:
        ref = resample(ref, RATE, rate)
    got = x[delay: delay + ref.size]
    a, b = _envelope(got, rate), _envelope(ref, rate)
    n = min(a.size, b.size)
    assert np.corrcoef(a[:n], b[:n])[0, 1] > MIN_ENVELOPE_CORR


def check_body(data: bytes, fmt: str, reference: np.ndarray) -> None:
    if fmt in ("wav", "raw"):
        assert_same_pcm(data, fmt, reference)
    else:
        assert_same_audio(data, fmt, reference)


# ---- api_v2 ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("media_type", ["wav", "raw", "ogg", "aac"])
async def test_api_v2_tts_returns_what_the_synthesizer_makes(env: Env, method: str, mode: int,
                                                             media_type: str) -> None:
    values = {"text": TEXT, "text_lang": "en", "ref_audio_path": "alice", "seed": SEED, "media_type": media_type,
              "streaming_mode": mode}
    if method == "GET":
        r, body = await fetch("GET", env.url + "/tts", params={k: str(v) for k, v in values.items()})
    else:
        r, body = await fetch("POST", env.url + "/tts", json=values)
    assert r.headers["Content-Type"] == f"audio/{media_type}"
    assert (r.headers.get("Transfer-Encoding") == "chunked") == (mode == 1)
    if media_type == "wav":  # one body: the exact data length; streamed: 0, as upstream sends
        data_len = int.from_bytes(body[40:44], "little")
        assert data_len == (len(body) - 44 if mode == 0 else 0)
    check_body(body, media_type, await env.reference(TEXT, "alice"))


async def test_api_v2_aux_ref_audio_paths_average_the_clips_as_the_engine_does(env: Env) -> None:
    values = {"text": TEXT, "text_lang": "en", "ref_audio_path": "alice", "aux_ref_audio_paths": ["bob"],
              "seed": SEED, "media_type": "raw"}
    _, body = await fetch("POST", env.url + "/tts", json=values)
    got = decode(body, "raw", RATE)[0]
    # the reference: alice's prompt with the ge of the engine's own two-reference encode (alice's clip, bob's)
    ref = env.reference_synth
    alice = ref.voices.get(env.voices["alice"].id)
    clips = [ref.voices.load_clip(env.voices[name].id) for name in ("alice", "bob")]
    _, ge = ref.engine.encode_reference(None, clips)
    fused = dataclasses.replace(alice, prompt=dataclasses.replace(alice.prompt, ge=ge), timbre="engine's own")
    want, _ = await ref.synthesize(TEXT, fused, env.params())
    assert got.size == want.size
    assert np.abs(got - want).max() < 1e-3  # (the mean of clips one by one vs one call: float32 sums)
    plain = decode(await _body(env, {**values, "aux_ref_audio_paths": []}), "raw", RATE)[0]
    assert np.abs(plain - got).max() > 1e-2  # bob's timbre is in it


async def _body(env: Env, values: dict[str, Any]) -> bytes:
    return (await fetch("POST", env.url + "/tts", json=values))[1]


# ---- SillyTavern -------------------------------------------------------------------------------------------------

async def test_sillytavern_generation(env: Env) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(env.url + "/speakers") as r:
            speakers = await r.json()
    assert {"name": "alice", "voice_id": "alice"} in speakers and {"name": "bob", "voice_id": "bob"} in speakers
    # the provider's request: the voice as a file under its reference folder, streaming as the string "true"
    body = {"text": TEXT, "text_lang": "en", "ref_audio_path": "./参考音频/bob.wav", "prompt_text": "bob",
            "prompt_lang": "en", "streaming_mode": "true", "media_type": "wav", "seed": SEED}
    r, data = await fetch("POST", env.url + "/", json=body)
    assert r.headers["Content-Type"] == "audio/wav" and r.headers.get("Transfer-Encoding") == "chunked"
    check_body(data, "wav", await env.reference(TEXT, "bob"))


# ---- OpenAI speech -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "pcm"])
async def test_openai_speech_formats(env: Env, fmt: str) -> None:
    body = {"model": "tts-1", "input": TEXT, "voice": "alice", "response_format": fmt, "language": "en",
            "seed": SEED}
    r, data = await fetch("POST", env.url + "/v1/audio/speech", json=body)
    reference = await env.reference(TEXT, "alice")
    if fmt == "wav":
        assert_same_pcm(data, "wav", reference)
    elif fmt == "pcm":  # 24 kHz s16le: the reference resampled
        x, _ = decode(data, "pcm")
        expected = resample(reference.astype(np.float32) / 32768.0, RATE, PCM_RATE)
        assert abs(x.size - reference.size * PCM_RATE / RATE) <= 2, (x.size, reference.size)
        n = min(x.size, expected.size)
        assert np.abs(x[:n] - expected[:n]).max() < 0.01
    else:
        assert_same_audio(data, fmt, reference)


# ---- the stream-input WebSocket ----------------------------------------------------------------------------------

async def test_stream_input_speaks_before_the_text_is_complete(env: Env) -> None:
    piece_len = 6  # a chat model's pieces, ending mid-word
    pieces = [STREAM_TEXT[i:i + piece_len] for i in range(0, len(STREAM_TEXT), piece_len)]
    received: list[tuple[int, dict[str, Any]]] = []  # (text pieces sent when it arrived, message)
    sent = 0
    first_audio = asyncio.Event()

    async def collect(ws: aiohttp.ClientWebSocketResponse) -> None:
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                m = msg.json()
                received.append((sent, m))
                if m["type"] == "audio":
                    first_audio.set()

    url = env.url + f"/v1/tts/stream-input?voice=bob&language=en&seed={SEED}"
    head = next(i for i in range(len(pieces)) if "".join(pieces[:i]).count(".") >= 1) + 1
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        reader = asyncio.create_task(collect(ws))
        for piece in pieces[:head]:  # the first sentence and the start of the second
            sent += 1
            await ws.send_json({"text": piece})
        # the rest waits until the first sentence is heard: a server that speaks only once the input is complete
        # never gets past this (the wait is a hang guard, not a speed verdict)
        await asyncio.wait_for(first_audio.wait(), 120)
        for piece in pieces[head:]:
            sent += 1
            await ws.send_json({"text": piece})
        await ws.send_json({"close": True})
        await asyncio.wait_for(reader, 120)
    audio = [(n, m) for n, m in received if m["type"] == "audio"]
    assert [m["type"] for _, m in received] == ["ready"] + ["audio"] * 4 + ["done"]
    assert audio[0][0] < len(pieces)  # the first sentence was heard while the text was still being written
    assert [m["sentence"] for _, m in audio] == ["The first sentence is here.", "Then comes the second one!",
                                                 "Is this the third?", "And the last."]
    pcm = b"".join(base64.b64decode(m["audio"]) for _, m in audio)
    reference = await env.reference(STREAM_TEXT, "bob")
    assert np.array_equal(np.frombuffer(pcm, "<i2"), reference)
    assert received[-1][1]["audio_s"] == pytest.approx(reference.size / RATE, abs=1e-4)


# ---- concurrency -------------------------------------------------------------------------------------------------

async def test_two_concurrent_voices_equal_their_solo_runs(env: Env) -> None:
    before = env.server_synth.metrics()
    peak = 0
    stop = asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, int(env.server_synth.metrics()["inflight"]))  # type: ignore[call-overload]
            await asyncio.sleep(0.005)

    async def speak(voice: str) -> bytes:
        body = {"text": CONCURRENT_TEXT, "text_lang": "en", "ref_audio_path": voice, "seed": SEED,
                "media_type": "wav", "streaming_mode": 1}
        return (await fetch("POST", env.url + "/tts", json=body))[1]

    watcher = asyncio.create_task(watch())
    alice, bob = await asyncio.gather(speak("alice"), speak("bob"))
    stop.set()
    await watcher
    after = env.server_synth.metrics()
    assert peak == 2  # both requests were in the pipeline at once
    assert after["prosody_misses"] - before["prosody_misses"] == 4  # 2 voices x 2 sentences, all through the GPT
    solo_alice = await env.reference(CONCURRENT_TEXT, "alice")
    solo_bob = await env.reference(CONCURRENT_TEXT, "bob")
    assert_same_pcm(alice, "wav", solo_alice)
    assert_same_pcm(bob, "wav", solo_bob)
    n = min(solo_alice.size, solo_bob.size)
    assert not np.array_equal(solo_alice[:n], solo_bob[:n])  # the voices really differ


# ---- admission ---------------------------------------------------------------------------------------------------

async def test_a_full_synthesizer_answers_busy_at_once_on_every_door(env: Env) -> None:
    """Two open WebSocket runs hold the two places the synthesizer admits; every other door is then refused with
    503 + Retry-After (the WebSocket with a busy error and close code 1013), and served again once they close."""
    limits = env.server_synth.limits
    env.server_synth.limits = dataclasses.replace(limits, queue_size=2)
    try:
        async with aiohttp.ClientSession() as session:
            holders = []
            for name in ("alice", "bob"):
                ws = await session.ws_connect(env.url + f"/v1/tts/stream-input?voice={name}&language=en")
                await ws.receive_json()  # ready
                await ws.send_json({"text": "Hello there. "})  # the run stays open: more text may come
                assert (await asyncio.wait_for(ws.receive_json(), 60))["type"] == "audio"
                holders.append(ws)
            doors = [("GET", "/tts", {"params": {"text": TEXT, "text_lang": "en", "ref_audio_path": "alice",
                                                 "streaming_mode": "1"}}),
                     ("POST", "/", {"json": {"text": TEXT, "ref_audio_path": "./参考音频/bob.wav"}}),
                     ("POST", "/v1/audio/speech", {"json": {"input": TEXT, "voice": "alice"}})]
            for method, path, kwargs in doors:
                async with session.request(method, env.url + path, **kwargs) as r:
                    assert r.status == 503, (path, await r.text())
                    assert r.headers["Retry-After"] == "2"
            async with session.ws_connect(env.url + "/v1/tts/stream-input?voice=alice") as ws:
                await ws.receive_json()
                await ws.send_json({"text": "Hello.", "close": True})
                err = await asyncio.wait_for(ws.receive_json(), 60)
                assert err["type"] == "error" and err["status"] == 503 and err["retry_after_s"] == 2
                assert (await ws.receive()).data == 1013
            for ws in holders:
                await ws.close()
            statuses = []
            for _ in range(100):  # the server notices the closes and releases both places
                async with session.get(env.url + "/tts", params={"text": "Hi there.", "text_lang": "en",
                                                                 "ref_audio_path": "alice", "media_type": "raw"}) as r:
                    statuses.append(r.status)
                    body = await r.read()
                if r.status != 503:
                    break
                await asyncio.sleep(0.05)
            assert statuses[-1] == 200 and len(body) > 0, statuses
    finally:
        env.server_synth.limits = limits


async def test_the_voice_list_says_which_seconds_each_voice_uses_and_whether_it_has_its_transcript(env: Env) -> None:
    """/v1/audio/voices describes each stored reference: a 4 s clip kept whole with its transcript; a 25 s clip
    whose kept 10 s left speech out, stored without its transcript, with the line its maker was told."""
    long, warnings = await env.server_synth.voicing.create(
        "longclip", speech_like_wav(25.0, 150.0, 4), "longclip.wav", transcript="Twenty five seconds of words.",
        language="en", consent=CONSENT)
    try:
        _, body = await fetch("GET", env.url + "/v1/audio/voices")
        described = {v["id"]: v for v in json.loads(body)["voices"]}
    finally:
        await env.server_synth.voicing.delete(long.id)
    alice = described["alice"]
    assert alice["transcript"] is True and alice["reference"]["clip_s"] == 4.0 and alice["reference"]["kept"] == ""
    assert (alice["clips"], alice["styles"]) == (1, [])
    assert alice["reference"]["left_out_s"] == 0.0 and 0.0 <= alice["reference"]["start_s"] <= 0.3
    entry = described["longclip"]
    assert entry["transcript"] is False and entry["reference"]["clip_s"] == 25.0
    assert entry["reference"]["kept"] == warnings[0] and entry["reference"]["left_out_s"] >= 12.0
    assert entry["reference"]["kept"].startswith(f"the voice uses seconds {entry['reference']['start_s']:.1f}-")
