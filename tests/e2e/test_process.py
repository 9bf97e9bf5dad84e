"""The shipped entry point itself: `python -m bot --config PATH run` as a process, against the stand-in.

The in-process end-to-end tests build the bot from its parts; this one proves the wiring users run (`make run`):
config -> services -> Discord client + HTTP API in one process, commands synced, a command answered, the HTTP API
up, and a clean exit on SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.standin.fixtures import standin  # noqa: F401  (the fixture)

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_run_serves_discord_and_http_in_one_process(standin, tiny_models: Path, tmp_path: Path):  # noqa: F811
    cfg = yaml.safe_load((tiny_models / "config.yaml").read_text())
    cfg["models"] = {k: str((tiny_models / v).resolve()) if k in ("gpt", "sovits", "hubert", "bert") else v
                     for k, v in cfg["models"].items()}
    cfg["models"]["dir"] = str(tiny_models)
    port = _free_port()
    cfg.update(voices={"dir": str(tmp_path / "voices")}, cache={"dir": str(tmp_path / "cache")},
               discord={"database": str(tmp_path / "db.sqlite3"), "api_base": standin.api_base,
                        "gateway_url": standin.gateway_url, "ca_file": str(standin.ca_pem_path),
                        "guild_ready_timeout_s": 0.05},
               http={"port": port})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DISCORD_TOKEN": standin.token}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "bot", "--config", str(tmp_path / "config.yaml"),
                                                "run", cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    try:
        await standin.wait_ready(timeout=90)
        await standin.wait_commands("join", "say", "voice", "settings", timeout=30)
        lay = standin.layout
        iid = await standin.invoke_slash(lay.guild_id, lay.member_id, "skip")
        reply = await standin.wait_reply(iid, timeout=10)
        assert reply.ephemeral  # nothing playing: an ephemeral explanation
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
                assert r.status == 200
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            raise
        out = (await proc.stdout.read()).decode(errors="replace")
    assert proc.returncode == 0, out[-3000:]
