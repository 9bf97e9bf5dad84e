"""Real clients' requests, replayed from their recorded shapes (tests/data/http_clients/*.json), against a running
server; every audio answer is decoded by soundfile, ``wave`` and PyAV wherever each can read the format, and each
decoder must find the same length and the voice's tone.

The synthesizer is the fake of tests/bot/test_http_fakes.py: each sentence is 0.5 s of a tone naming the voice.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from tests.bot.test_http_fakes import SENTENCE_S, VOICE_FREQS, Server, decode_everywhere, dominant_freq

CLIENTS = Path(__file__).parents[1] / "data" / "http_clients"
FREQ_TOL = 8.0  # Hz
# s: codec priming and padding that a decoder may keep (mp3 without a LAME header: ~1105 samples at 44.1 kHz and
# up to a frame of padding; AAC 1024-2048 samples)
DURATION_TOL = 0.1


def _cases() -> list[Any]:
    return [pytest.param(path, id=path.stem) for path in sorted(CLIENTS.glob("*.json"))]


def check_decoded(data: bytes, expect: dict[str, Any]) -> None:
    """Every decoder that reads the format finds ``sentences`` x 0.5 s of the voice's tone."""
    decoded = decode_everywhere(data, expect["format"], expect.get("pcm_rate", 32000))
    assert decoded, expect
    want_s = expect["sentences"] * SENTENCE_S
    for name, (x, rate) in decoded.items():
        assert abs(x.size / rate - want_s) < DURATION_TOL, (name, expect["format"], x.size / rate)
        middle = x[int(0.1 * rate): int((want_s - 0.1) * rate)]
        assert abs(dominant_freq(middle, rate) - VOICE_FREQS[expect["voice"]]) < FREQ_TOL, (name, expect)
    if expect["format"] == "wav":
        assert {"soundfile", "wave", "pyav"} <= set(decoded)
    elif expect["format"] in ("flac", "mp3", "ogg", "opus"):
        assert {"soundfile", "pyav"} <= set(decoded)


async def _http_step(session: aiohttp.ClientSession, srv: Server, step: dict[str, Any]) -> None:
    expect = step["expect"]
    query = [(k, v) for k, vs in step.get("query", {}).items() for v in (vs if isinstance(vs, list) else [vs])]
    async with session.request(step["method"], srv.url + step["path"], params=query, json=step.get("json"),
                               headers=step.get("headers")) as r:
        body = await r.read()
        assert r.status == expect["status"], (step["path"], body[:300])
    if "json_lines" in expect:  # ElevenLabs' /stream/with-timestamps: the audio is a field of each line
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        body = b"".join(base64.b64decode(line[expect["json_lines"]]) for line in lines)
    if "format" in expect:
        check_decoded(body, expect)
    if "json_keys" in expect:
        assert set(expect["json_keys"]) <= set(json.loads(body))
    if "json_list_keys" in expect:
        items = json.loads(body)
        assert items and all(set(expect["json_list_keys"]) <= set(item) for item in items)


async def _ws_step(session: aiohttp.ClientSession, srv: Server, step: dict[str, Any]) -> None:
    expect = step["expect"]
    url = srv.url + step["ws"]
    if step["ws"].endswith("/multi-stream-input"):
        return await _multi_context_step(session, url, step)
    async with session.ws_connect(url, params=step.get("query"), headers=step.get("headers")) as ws:
        for frame in step["frames"]:
            await ws.send_json(frame)
        messages = [msg.json() async for msg in ws if msg.type == aiohttp.WSMsgType.TEXT]
        assert ws.close_code == 1000, messages[-1:]
    audio = [m for m in messages if m.get("audio")]
    assert messages[-1] == {"isFinal": True} and all(m["isFinal"] is False for m in audio)
    check_decoded(b"".join(base64.b64decode(m["audio"]) for m in audio), expect)


async def _multi_context_step(session: aiohttp.ClientSession, url: str, step: dict[str, Any]) -> None:
    """ElevenLabs' multi-context door, as LiveKit and Pipecat read it: audio and then ``isFinal`` per context
    (``contextId``); the connection stays open for the next context unless the client sent ``close_socket``."""
    contexts = {f.get("context_id", f.get("contextId")) for f in step["frames"]} - {None}
    async with session.ws_connect(url, params=step.get("query"), headers=step.get("headers")) as ws:
        for frame in step["frames"]:
            await ws.send_json(frame)
        messages: list[dict[str, Any]] = []
        while {m["contextId"] for m in messages if m.get("isFinal")} != contexts:
            messages.append(await ws.receive_json(timeout=10))
        if any(f.get("close_socket") for f in step["frames"]):
            assert (await ws.receive(timeout=10)).type == aiohttp.WSMsgType.CLOSE
            assert ws.close_code == 1000
    assert all(m["contextId"] in contexts and "error" not in m for m in messages)
    for context in contexts:
        audio = [m["audio"] for m in messages if m["contextId"] == context and m.get("audio")]
        check_decoded(b"".join(base64.b64decode(a) for a in audio), step["expect"])


@pytest.mark.parametrize("path", _cases())
async def test_recorded_client_works_unchanged(server: Server, path: Path) -> None:
    client = json.loads(path.read_text(encoding="utf-8"))
    async with aiohttp.ClientSession() as session:
        for step in client["steps"]:
            if "ws" in step:
                await _ws_step(session, server, step)
            else:
                await _http_step(session, server, step)
    assert server.synth.calls, client["client"]


def test_every_client_file_is_well_formed() -> None:
    files = sorted(CLIENTS.glob("*.json"))
    assert len(files) >= 8
    for path in files:
        client = json.loads(path.read_text(encoding="utf-8"))
        assert {"client", "source", "steps"} <= set(client), path.name
        for step in client["steps"]:
            assert ("ws" in step) != ("method" in step), (path.name, step)
            assert "status" in step["expect"], (path.name, step)
            if "format" in step["expect"]:
                assert step["expect"]["voice"] in VOICE_FREQS and step["expect"]["sentences"] > 0
