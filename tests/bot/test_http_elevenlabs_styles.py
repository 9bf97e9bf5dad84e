"""ElevenLabs' ``voice_settings`` on all three ElevenLabs doors (the stream-input and multi-stream-input WebSockets,
the HTTP text-to-speech routes), read by one rule: ``style`` as a string names one of the voice's stored styles
(case-insensitive; an unknown name is refused, naming the styles it has), ``speed`` sets the rate, and every other
setting is accepted without effect and said to be: in ``X-Voicebot-Ignored`` over HTTP, in the ``voicebotIgnored``
field of a WebSocket's first message (of a context's first, on the multi-context door), which clients ignore."""

from __future__ import annotations

import dataclasses

import aiohttp
import pytest
from tests.bot.test_http_fakes import Server

from bot.http.elevenlabs import IGNORED_FIELD
from bot.http.responses import IGNORED_HEADER
from synthesis.types import VoiceStyle

QUERY = "output_format=pcm_16000"


def _give_styles(server: Server, name: str, *styles: str) -> None:
    """Named styles on a fake voice (each its own prompt: here the voice's, enough for the door's choice)."""
    v = server.synth.voices.get(server.voices[name].id)
    server.synth.voices._put(dataclasses.replace(
        v, styles={s.casefold(): VoiceStyle(s, "en", "", v.prompt) for s in styles}))


async def _single(session, server: Server, settings: dict) -> tuple[list[dict], int | None]:
    url = server.url + f"/v1/text-to-speech/bob/stream-input?{QUERY}"
    async with session.ws_connect(url) as ws:
        for frame in ({"text": " ", "voice_settings": settings}, {"text": "Hello there. "}, {"text": ""}):
            await ws.send_json(frame)
        return [m.json() async for m in ws if m.type == aiohttp.WSMsgType.TEXT], ws.close_code


async def _multi(session, server: Server, frames: list[dict]) -> tuple[list[dict], int | None]:
    url = server.url + f"/v1/text-to-speech/bob/multi-stream-input?{QUERY}"
    async with session.ws_connect(url) as ws:
        for frame in frames:
            await ws.send_json(frame)
        return [m.json() async for m in ws if m.type == aiohttp.WSMsgType.TEXT], ws.close_code


def _context_frames(settings: dict) -> list[dict]:
    return [{"text": " ", "context_id": "c", "voice_settings": settings},
            {"text": "Hello there. ", "context_id": "c", "flush": True}, {"close_socket": True}]


@pytest.mark.parametrize(("settings", "chosen", "ignored"), [
    ({"style": "calm"}, "Calm", None),
    ({"style": " EXCITED ", "speed": 1.2}, "Excited", None),
    ({"style": ""}, "", None),
    ({"style": 0.3}, "", ["voice_settings.style"]),
    ({"stability": 0.4, "similarity_boost": 0.9, "style": 0, "use_speaker_boost": True, "speed": 1.1}, "",
     ["voice_settings.stability", "voice_settings.similarity_boost", "voice_settings.style",
      "voice_settings.use_speaker_boost"]),
    ({"speed": 1.1}, "", None),
])
@pytest.mark.parametrize("door", ["stream-input", "multi-stream-input"])
async def test_websocket_style_by_name_and_the_settings_without_effect_in_the_first_message(
        server: Server, session, door, settings, chosen, ignored) -> None:
    _give_styles(server, "bob", "Calm", "Excited")
    if door == "stream-input":
        messages, code = await _single(session, server, settings)
    else:
        messages, code = await _multi(session, server, _context_frames(settings))
    assert code == 1000, messages
    assert "audio" in messages[0] and len(messages) >= 2
    assert messages[0].get(IGNORED_FIELD) == ignored
    assert all(IGNORED_FIELD not in m for m in messages[1:])  # said once, in the first message
    (call,) = server.synth.calls
    assert call.params.style == chosen
    assert call.params.speed == settings.get("speed", 1.0)


@pytest.mark.parametrize("door", ["stream-input", "multi-stream-input"])
async def test_websocket_unknown_style_is_one_error_frame_naming_the_styles(server: Server, session, door) -> None:
    _give_styles(server, "bob", "Calm", "Excited")
    if door == "stream-input":
        messages, code = await _single(session, server, {"style": "sleepy"})
    else:
        messages, code = await _multi(session, server, _context_frames({"style": "sleepy"}))
    assert code == 1008
    (error,) = messages
    assert error["error"] == "invalid_request" and error["code"] == 1008
    assert "has no style 'sleepy' (its styles: Calm, Excited)" in error["message"]
    assert "\n" not in error["message"] and server.synth.calls == []


@pytest.mark.parametrize("door", ["stream-input", "multi-stream-input"])
@pytest.mark.parametrize(("settings", "needle"), [({"style": 1.5}, "style"), ({"style": True}, "style"),
                                                  ({"style": ["calm"]}, "style")])
async def test_websocket_style_that_is_neither_a_name_nor_a_number_0_to_1_is_refused(
        server: Server, session, door, settings, needle) -> None:
    if door == "stream-input":
        messages, code = await _single(session, server, settings)
    else:
        messages, code = await _multi(session, server, _context_frames(settings))
    assert code == 1008 and needle in messages[-1]["message"] and server.synth.calls == []


async def test_multi_context_each_context_its_own_style_and_its_own_first_message(server: Server, session) -> None:
    _give_styles(server, "bob", "Calm")
    frames = [{"text": " ", "context_id": "calm", "voice_settings": {"style": "calm"}},
              {"text": " ", "context_id": "plain", "voice_settings": {"style": 0.5}},
              {"text": "Slowly. ", "context_id": "calm", "flush": True},
              {"text": "Normally. ", "context_id": "plain", "flush": True}, {"close_socket": True}]
    messages, code = await _multi(session, server, frames)
    assert code == 1000
    styles = {"".join(c.pieces): c.params.style for c in server.synth.calls}
    assert styles == {"Slowly. ": "Calm", "Normally. ": ""}
    firsts = {}
    for m in messages:
        firsts.setdefault(m["contextId"], m)
    assert IGNORED_FIELD not in firsts["calm"]
    assert firsts["plain"][IGNORED_FIELD] == ["voice_settings.style"]
    assert sum(IGNORED_FIELD in m for m in messages) == 1


async def test_http_door_says_every_setting_without_effect_in_its_header(server: Server, session) -> None:
    _give_styles(server, "bob", "Calm")
    body = {"text": "Hello there.", "voice_settings": {"stability": 0.5, "similarity_boost": 0.75, "style": "calm",
                                                      "use_speaker_boost": False, "speed": 1.1}}
    async with session.post(server.url + f"/v1/text-to-speech/bob/stream?{QUERY}", json=body) as r:
        assert r.status == 200, await r.text()
        assert r.headers.get(IGNORED_HEADER) == ("voice_settings.stability, voice_settings.similarity_boost, "
                                                 "voice_settings.use_speaker_boost")
        await r.read()
    assert (server.synth.calls[-1].params.style, server.synth.calls[-1].params.speed) == ("Calm", 1.1)
