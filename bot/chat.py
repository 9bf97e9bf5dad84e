"""The chat-model client: replies from any OpenAI-compatible endpoint (Ollama, llama.cpp, vLLM, OpenAI), streamed.

``stream_reply`` yields the reply as the model writes it, so speech can start before the reply is finished; each
channel keeps a bounded memory of its recent exchanges. Whatever goes wrong (server down, too slow, an answer that
is not a chat stream) becomes one :class:`ChatError` whose message says what to check.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any, AsyncGenerator, cast

import openai

from bot.config import ChatConfig
from synthesis import SpeechError

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

log = logging.getLogger(__name__)

NO_KEY = "not-needed"  # sent when no API key is configured (local servers ignore it; the client requires one)


class ChatError(SpeechError):
    """The chat model could not answer; the message says what to check."""


class ChatClient:
    """Streamed replies with per-channel memory.

    Parameters
    ----------
    config: the ``chat:`` section (endpoint, model, system prompt, memory size, timeout).
    api_key: overrides the key read from the environment variable named by ``config.api_key_env``.
    """

    def __init__(self, config: ChatConfig, *, api_key: str | None = None) -> None:
        self.config = config
        key = api_key or os.environ.get(config.api_key_env, "").strip() or NO_KEY
        # timeout: connect and the wait for each piece; retries would double the wait on a dead server
        self._client = openai.AsyncOpenAI(base_url=config.base_url, api_key=key, timeout=config.timeout_s,
                                          max_retries=0)
        self._memory: dict[int, list[dict[str, str]]] = {}  # channel id -> alternating user/assistant messages

    async def close(self) -> None:
        """Close the HTTP connection pool."""
        await self._client.close()

    def history(self, channel_id: int) -> list[dict[str, str]]:
        """A copy of what the channel's memory holds (oldest first, without the system prompt)."""
        return [dict(m) for m in self._memory.get(channel_id, [])]

    def reset(self, channel_id: int) -> None:
        """Forget the channel's conversation."""
        self._memory.pop(channel_id, None)

    async def stream_reply(self, channel_id: int, user_text: str) -> AsyncGenerator[str, None]:
        """Ask the model; yield the reply in pieces as they arrive (any split, mid-word included).

        The exchange is remembered for the channel once the reply ends; a reply the caller stops reading early is
        remembered as far as it was read. Raises :class:`ChatError` when the model is down, sends nothing for
        ``timeout_s``, answers an error status, or sends something that is not a chat completion stream.
        """
        cfg = self.config
        past = self._memory.get(channel_id, [])
        messages = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
        messages += past + [{"role": "user", "content": user_text}]
        reply: list[str] = []
        stream: Any = None
        try:
            try:
                stream = await asyncio.wait_for(
                    self._client.chat.completions.create(  # system/user/assistant messages with text content
                        model=cfg.model, messages=cast("list[ChatCompletionMessageParam]", messages), stream=True),
                    cfg.timeout_s)
                while True:
                    chunk = await asyncio.wait_for(anext(stream, None), cfg.timeout_s)
                    if chunk is None:
                        break
                    piece = _content(chunk, cfg.base_url)
                    if piece:
                        reply.append(piece)
                        yield piece
            except (openai.OpenAIError, TimeoutError, ValueError, TypeError, AttributeError) as e:
                raise self._error(e) from e
            if not "".join(reply).strip():
                raise ChatError(f"the chat model at {cfg.base_url} sent an empty reply: check chat.model "
                                f"({cfg.model!r}) and the server's log")
        finally:
            if stream is not None:
                await _close(stream)
            if reply:
                self._remember(channel_id, user_text, "".join(reply))

    def _remember(self, channel_id: int, user_text: str, reply: str) -> None:
        """Append one exchange; drop the oldest exchanges beyond ``memory_messages``."""
        memory = self._memory.setdefault(channel_id, [])
        memory += [{"role": "user", "content": user_text}, {"role": "assistant", "content": reply}]
        limit = max(0, self.config.memory_messages)
        while len(memory) > limit:
            del memory[:2]  # whole exchanges, so the memory never starts with an answer
        if not memory:
            self._memory.pop(channel_id, None)

    def _error(self, e: BaseException) -> ChatError:
        """A ChatError that names what to check."""
        cfg = self.config
        where = f"the chat model at {cfg.base_url}"
        if isinstance(e, (TimeoutError, openai.APITimeoutError)):
            return ChatError(f"{where} sent nothing for {cfg.timeout_s:g} s (chat.timeout_s): it may be busy or "
                             "still loading the model; try again, or raise chat.timeout_s")
        if isinstance(e, openai.APIConnectionError):
            return ChatError(f"cannot reach {where}: is the server running, and is chat.base_url right?")
        if isinstance(e, openai.APIStatusError):
            detail = _status_detail(e)
            hint = {401: "check the API key in the environment variable named by chat.api_key_env",
                    403: "check the API key in the environment variable named by chat.api_key_env",
                    404: f"check chat.model ({cfg.model!r}) and chat.base_url (it usually ends in /v1)",
                    429: "it is rate limiting us; wait a moment"}.get(e.status_code, "see the server's log")
            return ChatError(f"{where} answered HTTP {e.status_code} ({detail}): {hint}")
        log.warning("chat stream from %s was not understood: %r", cfg.base_url, e)
        return ChatError(f"{where} sent a reply that is not an OpenAI-compatible chat stream ({type(e).__name__}): "
                         "check that chat.base_url points at its OpenAI-compatible API")


def _content(chunk: Any, base_url: str) -> str:
    """The text in one stream chunk ('' for role-only or usage chunks); ValueError when it is not a chunk."""
    choices = getattr(chunk, "choices", None)
    if not isinstance(choices, list):
        raise ValueError(f"a stream chunk from {base_url} has no choices")
    if not choices:
        return ""
    delta = getattr(choices[0], "delta", None)
    content = getattr(delta, "content", None) if delta is not None else None
    if content is not None and not isinstance(content, str):
        raise ValueError(f"a stream chunk from {base_url} has non-text content")
    return content or ""


def _status_detail(e: Any) -> str:
    """The server's own error message, when it sent one."""
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
        if message:
            return str(message)[:200]
    return str(getattr(e, "message", "") or e)[:200]


async def _close(stream: Any) -> None:
    """Close the HTTP stream (stops the model's generation on servers that notice)."""
    close = getattr(stream, "close", None)
    try:
        if close is not None:
            await close()
    except Exception:  # noqa: BLE001 - closing must not hide the reply's own outcome
        log.debug("closing the chat stream failed", exc_info=True)
