"""The HTTP doors over a tiny v4 model (and v5turbo for the sampler options): audio at the model's 48 kHz where the
client asks for none, at the rate a client asks for otherwise, measured by decoding the bytes; api_v2's
``sample_steps``/``cfg_rate`` reach the sampler, and a step count v5 does not take is a 400 in one line."""

from __future__ import annotations

import dataclasses
import wave
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from bot.http import start_server
from bot.services import Services, build_synthesizer, default_params
from synthesis.audio import resample
from synthesis.pipeline import Synthesizer
from synthesis.types import SynthesisParams, Voice, to_pcm16
from tests.bot.test_http_fakes import av_samples, pcm_samples, wav_samples
from tests.synthesis.test_v4v5_product import CONSENT, _family_config

pytestmark = pytest.mark.asyncio(loop_scope="module")

RATE = 48000  # Hz, v4 and v5 output
SEED = 1234
TEXT = "The weather is nice today."
MIN_CORRELATION = 0.98  # a resampled body against the model's audio resampled by soxr: the same signal


@dataclass
class Server:
    url: str
    config: Any
    synth: Synthesizer
    voice: Voice

    def params(self) -> SynthesisParams:
        return dataclasses.replace(default_params(self.config), language="en", seed=SEED)

    async def reference(self) -> np.ndarray:
        """``[N]`` float32 @ 48 kHz: what the synthesizer speaks for ``TEXT`` (the door's request cached it)."""
        audio, chunks = await self.synth.synthesize(TEXT, self.voice, self.params())
        assert {c.sample_rate for c in chunks} == {RATE}
        return audio


async def _server(root: Path, family: str) -> AsyncIterator[Server]:
    config = _family_config(root / family, root / f"data-{family}", family)
    config = dataclasses.replace(config, http=dataclasses.replace(
        config.http, token_env="VOICEBOT_TEST_V4V5_HTTP_NO_TOKEN", rate_limit_per_min=0))
    synth = build_synthesizer(config)
    voice, _ = await synth.voicing.create("alice", _clip(), "alice.wav", transcript="Hello, this is my voice.",
                                          language="en", consent=CONSENT)
    runner = await start_server(Services(config, synth), "127.0.0.1", 0)
    try:
        yield Server(f"http://127.0.0.1:{runner.addresses[0][1]}", config, synth, voice)
    finally:
        await runner.cleanup()
        await synth.close()


def _clip() -> bytes:
    from tests.audio_samples import speech_like_wav

    return speech_like_wav(4.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def v4(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    async for server in _server(tmp_path_factory.mktemp("v4v5-http"), "v4"):
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def v5(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Server]:
    async for server in _server(tmp_path_factory.mktemp("v4v5-http"), "v5turbo"):
        yield server


async def fetch(method: str, url: str, status: int = 200, **kwargs: Any) -> tuple[aiohttp.ClientResponse, bytes]:
    async with aiohttp.ClientSession() as session:
        async with session.request(method, url, **kwargs) as r:
            body = await r.read()
            assert r.status == status, body[:500]
            return r, body


def _heard(x: np.ndarray) -> None:
    assert np.all(np.isfinite(x)) and float(np.sqrt(np.mean(x.astype(np.float64) ** 2))) > 0.01, "silent"


def _same_signal(got: np.ndarray, reference: np.ndarray, rate: int) -> None:
    """``got`` at ``rate`` is the 48 kHz reference resampled: its length within 1 ms, its waveform correlated."""
    want = resample(reference, RATE, rate)
    assert abs(got.size - want.size) <= rate // 1000, (got.size, want.size)
    n = min(got.size, want.size)
    assert float(np.corrcoef(got[:n], want[:n])[0, 1]) > MIN_CORRELATION


@pytest.mark.parametrize("mode", [0, 1])
async def test_api_v2_wav_is_48k_the_models_own_samples(v4: Server, mode: int) -> None:
    values = {"text": TEXT, "text_lang": "en", "ref_audio_path": "alice", "seed": SEED, "media_type": "wav",
              "streaming_mode": mode}
    _, body = await fetch("POST", v4.url + "/tts", json=values)
    assert int.from_bytes(body[24:28], "little") == RATE  # the header's sample rate
    x, rate = wav_samples(body)
    assert rate == RATE
    _heard(x)
    reference = to_pcm16(await v4.reference())
    assert np.array_equal(np.round(x * 32768.0).astype(np.int16), reference)
    if mode == 0:  # a whole body: `wave` reads it with its exact header
        with wave.open(io.BytesIO(body)) as w:
            assert (w.getframerate(), w.getnframes()) == (RATE, reference.size)


async def test_openai_pcm_is_24k_and_wav_the_models_48k(v4: Server) -> None:
    reference = await v4.reference()
    request = {"model": "tts-1", "input": TEXT, "voice": "alice", "language": "en", "seed": SEED}
    _, body = await fetch("POST", v4.url + "/v1/audio/speech", json={**request, "response_format": "pcm"})
    pcm = pcm_samples(body)  # OpenAI's pcm: s16le at 24 kHz
    _heard(pcm)
    _same_signal(pcm, reference, 24000)
    _, body = await fetch("POST", v4.url + "/v1/audio/speech", json={**request, "response_format": "wav"})
    x, rate = wav_samples(body)
    assert rate == RATE and x.size == reference.size


@pytest.mark.parametrize(("output_format", "rate"), [("pcm_16000", 16000), ("pcm_44100", 44100),
                                                     ("mp3_22050_32", 22050)])
async def test_elevenlabs_gets_the_rate_it_asks_for(v4: Server, output_format: str, rate: int) -> None:
    reference = await v4.reference()
    _, body = await fetch("POST", v4.url + "/v1/text-to-speech/alice/stream",
                          params={"output_format": output_format}, json={"text": TEXT, "seed": SEED,
                                                                         "language_code": "en"})
    if output_format.startswith("pcm"):
        x = pcm_samples(body)
        _heard(x)
        _same_signal(x, reference, rate)
    else:
        x, got_rate = av_samples(body)
        assert got_rate == rate
        _heard(x)
        # (an mp3 stream carries its encoder's delay: the length within two frames)
        assert abs(x.size - reference.size * rate / RATE) <= 2 * 1152


async def test_api_v2_sample_steps_reach_the_v5_sampler(v5: Server) -> None:
    values = {"text": TEXT, "text_lang": "en", "ref_audio_path": "alice", "seed": SEED, "media_type": "raw"}
    _, four = await fetch("POST", v5.url + "/tts", json=values)
    _, eight = await fetch("POST", v5.url + "/tts", json={**values, "sample_steps": 8, "cfg_rate": 0.5})
    a, b = pcm_samples(four), pcm_samples(eight)
    _heard(a)
    _heard(b)
    assert a.size == b.size and float(np.abs(a - b).max()) > 1e-3  # another sample of the same length
    assert np.array_equal(np.round(a * 32768.0).astype(np.int16), to_pcm16(await v5.reference()))
    r, body = await fetch("POST", v5.url + "/tts", status=400, json={**values, "sample_steps": 5})
    message = body.decode()
    assert "v5turbo samples in 4, 8, 16, 32 steps, not 5" in message and "\n" not in message.strip()
    r, body = await fetch("POST", v5.url + "/tts", status=400, json={**values, "cfg_rate": 3})
    assert "cfg_rate" in body.decode()
