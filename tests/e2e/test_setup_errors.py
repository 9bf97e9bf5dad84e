"""The setup errors a new user meets, each one line with the fix (issue 34, 3): a token of the wrong shape before
anything is installed or loaded, the Message Content intent switched off (the application's flags, and the gateway's
close code 4014), missing voice permissions in a channel, libopus or davey missing."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from bot.client import MESSAGE_CONTENT_OFF, VoiceBot
from bot.config import ConfigError
from bot.services import Services
from tests.cogs.conftest import FakeSynthesizer
from tests.e2e.standin_bot import LightEnv, light, point_at_standin, standin_config  # noqa: F401
from tests.standin.model import CONNECT, SPEAK, bot_token_for
from tests.standin.server import Standin

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parents[2]


async def _cli(*args: str, env: dict[str, str], python: tuple[str, ...] = (sys.executable,)) -> tuple[int, str, str]:
    """Run a command line without blocking the stand-in's event loop; (status, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(*python, *args, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 50)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _one_line(rc: int, err: str, *needles: str) -> str:
    assert rc == 2, (rc, err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-2000:]  # no traceback
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _write_config(tmp_path: Path, standin: Standin) -> Path:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"discord:\n  api_base: {standin.api_base}\n  gateway_url: {standin.gateway_url}\n"
                   f"  ca_file: {standin.ca_pem_path}\n  token_env: MY_BOT_TOKEN\n")
    return cfg


async def test_a_token_of_the_wrong_shape_is_refused_with_nothing_installed(tmp_path: Path):
    """``make run``'s first step runs on a Python without site-packages (-S: the standard library alone)."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text("engine:\n  device: cpu\ndiscord:\n  token_env: MY_BOT_TOKEN   # the bot token\nhttp:\n"
                   "  token_env: OTHER\n")
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    command = ("-m", "bot.token_shape", "--config", str(cfg))
    bare = (sys.executable, "-S")
    cases = {
        "123456789012345678": "holds an application or user id, not a token",
        "A" * 32: "looks like the OAuth2 client secret",
        "ab" * 32: "holds the application's public key",
        "Bot " + bot_token_for(123456789012345678): "without 'Bot '",
        "hello.world": "not shaped like a bot token (three parts joined by dots)",
        "MTIzNDU2Nzg5MDEyMzQ1Njc4.abc.def": "cut short or mistyped",
    }
    for token, needle in cases.items():
        rc, _, err = await _cli(*command, env={**base, "MY_BOT_TOKEN": token}, python=bare)
        line = _one_line(rc, err, needle, "MY_BOT_TOKEN")
        assert token not in line  # a secret pasted by mistake is not echoed
    rc, _, err = await _cli(*command, env=base, python=bare)
    _one_line(rc, err, "set the MY_BOT_TOKEN environment variable")
    rc, out, err = await _cli(*command, env={**base, "MY_BOT_TOKEN": bot_token_for(123456789012345678)}, python=bare)
    assert (rc, out, err) == (0, "", "")


async def test_check_token_reads_the_message_content_flag(tmp_path: Path):
    async with Standin(application_flags=0) as standin:
        cfg = _write_config(tmp_path, standin)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MY_BOT_TOKEN": standin.token}
        rc, _, err = await _cli("-m", "bot", "--config", str(cfg), "check-token", env=env)
        _one_line(rc, err, "Message Content intent is off", "Privileged Gateway Intents -> Message Content Intent")
        assert [r.path for r in standin.requests] == ["/users/@me", "/applications/@me"]
        standin.application_flags = 1 << 19  # GATEWAY_MESSAGE_CONTENT_LIMITED: switched on in the portal
        rc, out, err = await _cli("-m", "bot", "--config", str(cfg), "check-token", env=env)
        assert (rc, out.strip(), err) == (0, "Discord accepts the token in MY_BOT_TOKEN", "")


async def test_the_gateway_refusing_the_intent_is_one_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Close code 4014 at IDENTIFY: discord.py's PrivilegedIntentsRequired becomes the same one line."""
    point_at_standin(monkeypatch)
    async with Standin(application_flags=0) as standin:
        config = standin_config(standin, tmp_path)
        bot = VoiceBot(Services(config, FakeSynthesizer()), extensions=(), sync_commands=False)  # type: ignore[arg-type]
        with pytest.raises(ConfigError) as refused:
            await asyncio.wait_for(bot.start(standin.token), 10)
        await bot.close()
        assert str(refused.value) == MESSAGE_CONTENT_OFF
        assert standin.identify_payload is None  # refused at IDENTIFY, never READY


async def test_missing_voice_permissions_are_named_in_the_reply(light: LightEnv):  # noqa: F811
    s = light.standin
    lay = s.layout
    await s.set_member_overwrite(lay.voice_channel_id, s.bot_user.id, deny=CONNECT)
    await asyncio.sleep(0.1)  # the CHANNEL_UPDATE reaches the bot's cache
    iid = await s.invoke_slash(lay.guild_id, lay.admin_id, "join")
    reply = await s.wait_reply(iid, lambda r: r.kind == "followup")
    assert reply.payload["content"] == (f"I need the Connect permission in <#{lay.voice_channel_id}> to speak there; "
                                        "ask a server admin to grant it")
    light.synth.voices.add("alice", lay.admin_id)
    await s.set_member_overwrite(lay.voice_channel_id, s.bot_user.id, deny=SPEAK)
    await asyncio.sleep(0.1)
    iid = await s.invoke_slash(lay.guild_id, lay.admin_id, "say", {"text": "hello"})
    reply = await s.wait_reply(iid, lambda r: r.kind == "followup")
    assert reply.payload["content"].startswith(f"I need the Speak permission in <#{lay.voice_channel_id}>")
    assert not s.gateway_voice_updates and light.synth.streamed == []  # never tried to connect or speak


@pytest.mark.parametrize("library, needle", [("davey", "the davey package (DAVE, the voice encryption Discord "
                                                        "requires) is missing: install it"),
                                             ("opus", "libopus was not found: install it")])
async def test_a_missing_voice_library_is_one_line_at_start(tmp_path: Path, library: str, needle: str):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("discord:\n  api_base: http://127.0.0.1:1/api/v10\n")
    hide = ("import sys; sys.modules['davey'] = None" if library == "davey" else
            "import discord.opus; discord.opus._load_default = lambda: False")
    code = f"{hide}; from bot.__main__ import main; sys.exit(main(['--config', {str(cfg)!r}, 'run']))"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DISCORD_TOKEN": bot_token_for(123456789012345678)}
    rc, _, err = await _cli("-c", ("import sys; " if library != "davey" else "") + code, env=env)
    _one_line(rc, err, needle)
