"""``python -m bot serve`` as a process: Ctrl-C while the models load ends it at once with one line, and what can be
refused without the models (a bind beyond loopback without a token, TLS files) is refused before they load.

The model load is held at a known point by a ``sitecustomize`` this test puts first on the child's path: it makes
``engines.load_engine`` write a marker line and wait, so "during the load" does not depend on the machine's speed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
MARKER = "test: the model load is held here"
INTERRUPTED = "interrupted while loading the models: the HTTP API was not started"
STARTUP_LIMIT_S = 240  # a guard against a hang, not a measure: the child imports torch twice on a busy machine

_SITECUSTOMIZE = f'''
import os, time
import engines, engines.loader

def _held(*args, **kwargs):
    os.write(2, b"{MARKER}\\n")
    while True:
        time.sleep(3600)

engines.load_engine = engines.loader.load_engine = _held
'''


def _config(tiny_models: Path, tmp_path: Path, **http: object) -> Path:
    cfg = yaml.safe_load((tiny_models / "config.yaml").read_text())
    cfg["models"] = {k: str((tiny_models / v).resolve()) if k in ("gpt", "sovits", "hubert", "bert") else v
                     for k, v in cfg["models"].items()}
    cfg["models"]["dir"] = str(tiny_models)
    cfg.update(voices={"dir": str(tmp_path / "voices")}, cache={"dir": str(tmp_path / "cache")},
               discord={"database": str(tmp_path / "db.sqlite3")},
               http={"port": 0, "token_env": "VOICEBOT_TEST_SERVE_UNSET_TOKEN", **http})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


async def _serve(tmp_path: Path, config: Path, *args: str) -> asyncio.subprocess.Process:
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{ROOT}"}
    env.pop("VOICEBOT_TEST_SERVE_UNSET_TOKEN", None)
    return await asyncio.create_subprocess_exec(sys.executable, "-m", "bot", "--config", str(config), "serve", *args,
                                                cwd=ROOT, env=env, stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE)


async def _lines_until(proc: asyncio.subprocess.Process, needle: str) -> list[str]:
    """stderr lines up to the first that holds ``needle`` (or to the end)."""
    assert proc.stderr is not None
    lines: list[str] = []
    while True:
        raw = await proc.stderr.readline()
        if not raw:
            return lines
        lines.append(raw.decode(errors="replace").rstrip("\n"))
        if needle in lines[-1]:
            return lines


async def test_ctrl_c_during_the_model_load_ends_serve_with_one_line(tiny_models: Path, tmp_path: Path) -> None:
    proc = await _serve(tmp_path, _config(tiny_models, tmp_path))
    try:
        lines = await asyncio.wait_for(_lines_until(proc, MARKER), STARTUP_LIMIT_S)
        assert lines and lines[-1] == MARKER, lines
        proc.send_signal(signal.SIGINT)
        assert proc.stderr is not None
        rest = (await asyncio.wait_for(proc.stderr.read(), STARTUP_LIMIT_S)).decode(errors="replace")
        code = await asyncio.wait_for(proc.wait(), STARTUP_LIMIT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 130, (code, rest)
    assert rest.strip().splitlines() == [INTERRUPTED], rest
    assert "Traceback" not in "\n".join(lines) + rest


async def _refused_before_the_load(tmp_path: Path, config: Path, *args: str) -> str:
    proc = await _serve(tmp_path, config, *args)
    try:
        lines = await asyncio.wait_for(_lines_until(proc, MARKER), STARTUP_LIMIT_S)
        code = await asyncio.wait_for(proc.wait(), STARTUP_LIMIT_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert MARKER not in lines, lines  # the load never began
    assert code == 2 and len(lines) == 1 and "Traceback" not in lines[0], (code, lines)
    return lines[0]


async def test_serve_beyond_loopback_without_a_token_is_refused_before_the_load(tiny_models: Path,
                                                                              tmp_path: Path) -> None:
    line = await _refused_before_the_load(tmp_path, _config(tiny_models, tmp_path), "--host", "0.0.0.0")
    assert "would listen on 0.0.0.0" in line and "without a token" in line and "VOICEBOT_TEST_SERVE_UNSET_TOKEN" in line


async def test_missing_tls_files_and_reference_folders_are_refused_before_the_load(tiny_models: Path,
                                                                                 tmp_path: Path) -> None:
    config = _config(tiny_models, tmp_path, tls_cert=str(tmp_path / "no.crt"), tls_key=str(tmp_path / "no.key"))
    assert "http.tls_cert" in await _refused_before_the_load(tmp_path, config)
    config = _config(tiny_models, tmp_path, reference_dirs=[str(tmp_path / "no-such-folder")])
    line = await _refused_before_the_load(tmp_path, config)
    assert "http.reference_dirs" in line and "is not a folder" in line
