"""The suite's report guard (tests/conftest.py): a failing test whose report cannot be made (Python 3.11's
``ast.parse`` raising SystemError when another thread parses at the same moment) still fails alone, with its own
message, instead of ending the session with INTERNALERROR."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAILING = '''
import ast

REAL = ast.parse


def _raise_for(calls):
    left = [calls]

    def parse(*args, **kwargs):  # what a second thread's parse does to this one's
        if left[0] > 0:
            left[0] -= 1
            raise SystemError("AST constructor recursion depth mismatch (before=129, after=181)")
        return REAL(*args, **kwargs)

    ast.parse = parse


def test_once():
    _raise_for(1)
    assert 6 * 7 == 41, "the first failure"


def test_always():
    _raise_for(10**6)
    assert 6 * 7 == 43, "the second failure"


def test_after():
    ast.parse = REAL
'''


def test_a_failure_whose_report_raises_system_error_still_fails_alone_with_its_message(tmp_path: Path) -> None:
    (tmp_path / "test_parse_race.py").write_text(FAILING, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                        "--rootdir", str(tmp_path), str(tmp_path)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert "INTERNALERROR" not in out, out
    assert r.returncode == 1, out
    assert "2 failed, 1 passed" in out, out
    assert "the first failure" in out and "the second failure" in out, out
    lines = FAILING.splitlines()
    first = lines.index('    assert 6 * 7 == 41, "the first failure"') + 1
    second = lines.index('    assert 6 * 7 == 43, "the second failure"') + 1
    assert f"test_parse_race.py:{first}: AssertionError" in out, out  # once: pytest's own report, made again
    # always: the line and the message, without the source
    assert f"test_parse_race.py:{second}: AssertionError: the second failure" in out, out
    assert "its traceback could not be shown" in out, out
