"""The official ``elevenlabs`` SDK, unchanged, against this server behind a local TLS reverse proxy.

The SDK always upgrades its realtime socket to ``wss://``, so the server is reached as it would be in production:
through a TLS-terminating proxy (tests/bot/http_proxy.py, certificates from ``trustme``) that adds
``X-Forwarded-For``. The SDK trusts the test CA through ``SSL_CERT_FILE`` (its WebSocket) and its own httpx client.
"""

from __future__ import annotations

import asyncio
import ssl

import httpx
import pytest
import trustme
from tests.bot.http_proxy import ReverseProxy
from tests.bot.test_http_fakes import SENTENCE_S, VOICE_FREQS, Server, dominant_freq, pcm_samples

elevenlabs = pytest.importorskip("elevenlabs", reason="the official ElevenLabs SDK is a dev dependency")
from elevenlabs.client import AsyncElevenLabs, ElevenLabs  # noqa: E402

FREQ_TOL = 8.0  # Hz
DURATION_TOL = 0.1  # s
TEXT = "Hello there. How are you?"


@pytest.fixture
async def tls_proxy(server: Server, tmp_path, monkeypatch):
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(server_context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))  # read by ssl.create_default_context() in the SDK's socket
    proxy = await ReverseProxy(server.url, ssl_context=server_context).start()
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    yield proxy, client_context
    await proxy.close()


def check_pcm(data: bytes, rate: int, voice: str) -> None:
    x = pcm_samples(data)
    assert abs(x.size / rate - 2 * SENTENCE_S) < DURATION_TOL, x.size / rate
    assert abs(dominant_freq(x, rate) - VOICE_FREQS[voice]) < FREQ_TOL


async def test_sdk_realtime_websocket_through_wss(tls_proxy, server: Server) -> None:
    proxy, _ = tls_proxy
    client = ElevenLabs(api_key="any-key", base_url=proxy.url)
    assert proxy.url.startswith("https://")

    def speak() -> bytes:
        pieces = iter(["Hello there. ", "How are ", "you?"])
        return b"".join(client.text_to_speech.convert_realtime("carol", text=pieces, output_format="pcm_16000"))

    data = await asyncio.to_thread(speak)
    check_pcm(data, 16000, "carol")
    assert [e.path for e in proxy.exchanges] == ["/v1/text-to-speech/carol/stream-input"]
    assert proxy.exchanges[0].frames[0]["generation_config"] == {"chunk_length_schedule": [50]}


async def test_sdk_http_stream_and_convert_through_https(tls_proxy, server: Server) -> None:
    proxy, context = tls_proxy
    async with httpx.AsyncClient(verify=context) as http:
        client = AsyncElevenLabs(api_key="any-key", base_url=proxy.url, httpx_client=http)
        streamed = b"".join([c async for c in client.text_to_speech.stream(
            "alice", text=TEXT, model_id="eleven_flash_v2_5", output_format="pcm_24000",
            voice_settings=elevenlabs.VoiceSettings(stability=0.5, similarity_boost=0.75, speed=1.1))])
        whole = b"".join([c async for c in client.text_to_speech.convert("bob", text=TEXT,
                                                                           output_format="pcm_22050")])
    check_pcm(streamed, 24000, "alice")
    check_pcm(whole, 22050, "bob")
    assert [(e.method, e.path, e.status) for e in proxy.exchanges] == [
        ("POST", "/v1/text-to-speech/alice/stream", 200), ("POST", "/v1/text-to-speech/bob", 200)]
    assert server.synth.calls[0].params.speed == 1.1
