"""The chat-model client against the local OpenAI-compatible stand-in that streams slowly over SSE."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from bot.chat import ChatClient, ChatError
from bot.config import ChatConfig
from tests.chat_standin import ChatStandIn

WORDS = ["Hel", "lo", " there", ",", " friend", "."]
PIECE_DELAY_S = 0.02  # seconds between streamed pieces


@pytest.fixture
async def standin():
    s = await ChatStandIn(WORDS, PIECE_DELAY_S).start()
    yield s
    await s.close()


def client_for(url: str, **kw: Any) -> ChatClient:
    cfg = ChatConfig(enabled=True, base_url=url, model="tiny", api_key_env="VOICEBOT_TEST_CHAT_KEY",
                     system_prompt="Be brief.", **{"memory_messages": 4, "timeout_s": 1.0, **kw})
    return ChatClient(cfg)


async def test_reply_streams_piece_by_piece(standin: ChatStandIn, monkeypatch) -> None:
    monkeypatch.setenv("VOICEBOT_TEST_CHAT_KEY", "sk-test")
    chat = client_for(standin.url)
    standin.pace()  # the stand-in writes piece k+1 only once the client has handed piece k over
    got: list[tuple[int, str]] = []

    async def read() -> None:
        async for piece in chat.stream_reply(1, "Hi!"):
            got.append((standin.sent, piece))
            standin.allow()

    await asyncio.wait_for(read(), 10)  # a client that waited for the whole reply would never get it: no hang
    await chat.close()
    assert [p for _, p in got] == WORDS
    # each piece was handed over while it was the last one the server had written: piece by piece, not buffered
    assert [n for n, _ in got] == list(range(1, len(WORDS) + 1))
    assert standin.auth == ["Bearer sk-test"]
    assert standin.requests[0]["stream"] is True and standin.requests[0]["model"] == "tiny"
    assert standin.requests[0]["messages"] == [{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Hi!"}]


async def test_memory_is_per_channel_bounded_and_resettable(standin: ChatStandIn) -> None:
    standin.mode = "short"
    chat = client_for(standin.url)
    for i in range(1, 4):
        assert "".join([p async for p in chat.stream_reply(7, f"Question {i}")]) == f"Reply {i}."
    # memory_messages=4: the last two exchanges, oldest first, whole exchanges only
    assert standin.requests[-1]["messages"][1:] == [
        {"role": "user", "content": "Question 1"}, {"role": "assistant", "content": "Reply 1."},
        {"role": "user", "content": "Question 2"}, {"role": "assistant", "content": "Reply 2."},
        {"role": "user", "content": "Question 3"}]
    assert [m["content"] for m in chat.history(7)] == ["Question 2", "Reply 2.", "Question 3", "Reply 3."]
    _ = [p async for p in chat.stream_reply(8, "Other channel")]
    assert standin.requests[-1]["messages"][1:] == [{"role": "user", "content": "Other channel"}]
    chat.reset(7)
    assert chat.history(7) == []
    _ = [p async for p in chat.stream_reply(7, "Fresh start")]
    assert standin.requests[-1]["messages"][1:] == [{"role": "user", "content": "Fresh start"}]
    await chat.close()


async def test_reply_cut_short_is_remembered_as_read(standin: ChatStandIn) -> None:
    chat = client_for(standin.url)
    stream = chat.stream_reply(3, "Talk")
    assert [await anext(stream), await anext(stream)] == WORDS[:2]
    await stream.aclose()
    assert chat.history(3) == [{"role": "user", "content": "Talk"}, {"role": "assistant", "content": "Hello"}]
    await chat.close()


async def test_server_down_is_a_clear_error() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    chat = client_for(f"http://127.0.0.1:{port}/v1")
    with pytest.raises(ChatError, match=r"cannot reach the chat model at .*is the server running"):
        _ = [p async for p in chat.stream_reply(1, "Hi")]
    assert chat.history(1) == []
    await chat.close()


async def test_slow_server_times_out(standin: ChatStandIn) -> None:
    standin.mode = "stall"
    chat = client_for(standin.url, timeout_s=0.4)
    got: list[str] = []
    with pytest.raises(ChatError, match=r"sent nothing for 0.4 s \(chat.timeout_s\)"):
        async for piece in chat.stream_reply(1, "Hi"):
            got.append(piece)
    # the client gave up on its own, while the server still held the reply open (it would for 5 s)
    assert got == ["Hmm"] and standin.stalling
    await chat.close()


@pytest.mark.parametrize("mode, needle", [
    ("not-json", "not an OpenAI-compatible chat stream"),
    ("404", r"answered HTTP 404 \(model 'tiny' not found\): check chat.model"),
    ("empty", "sent an empty reply"),
])
async def test_bad_answers_are_clear_errors(standin: ChatStandIn, mode: str, needle: str) -> None:
    standin.mode = mode
    chat = client_for(standin.url)
    with pytest.raises(ChatError, match=needle):
        _ = [p async for p in chat.stream_reply(1, "Hi")]
    assert chat.history(1) == []
    await chat.close()
