"""``make bench-avx2``'s CPUID mask (benchmarks/cpuid_avx2.c): Python's libraries see an AVX2-only CPU, the bench says
so, and a real fault still reaches the program's own handler."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engines.gpt_sovits.cpu_step import _cpu_flags  # pyright: ignore[reportPrivateUsage]

ROOT = Path(__file__).resolve().parents[2]
HOST_FLAGS = set(_cpu_flags().split())

pytestmark = pytest.mark.skipif("cpuid_fault" not in HOST_FLAGS
                                or shutil.which("cc") is None,
                                reason="needs Linux CPUID faulting (cpuid_fault) and a C compiler")


@pytest.fixture(scope="module")
def mask(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cpuid") / "cpuid_avx2.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(out), str(ROOT / "benchmarks" / "cpuid_avx2.c"), "-ldl"],
                   check=True, timeout=120)
    return out


def _python(mask: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"LD_PRELOAD": str(mask), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_the_libraries_see_avx2_only_and_the_bench_says_which_flags_are_hidden(mask: Path) -> None:
    code = ("import json, torch\n"
            "from benchmarks.gpt import ISA_FLAGS, hidden_isa\n"
            "from engines.gpt_sovits.cpu_step import _cpu_flags\n"
            "flags = set(_cpu_flags().split())\n"
            "isa = {f: f in flags for f in ISA_FLAGS}\n"
            "print(json.dumps({'capability': torch.backends.cpu.get_cpu_capability(), 'hidden': hidden_isa(isa),\n"
            "                  'avx2': torch.cpu._is_avx2_supported(), 'avx512': torch.cpu._is_avx512_supported()}))")
    run = _python(mask, code)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["capability"] == "AVX2" and seen["avx2"] and not seen["avx512"]
    assert seen["hidden"] == [f for f in ("avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in HOST_FLAGS]


def test_a_real_fault_still_reaches_pythons_faulthandler(mask: Path) -> None:
    run = _python(mask, "import torch, ctypes\nprint('capability', torch.backends.cpu.get_cpu_capability(), flush=True)\n"
                        "ctypes.string_at(0)", "-X", "faulthandler")
    assert "capability AVX2" in run.stdout
    assert run.returncode != 0 and "Fatal Python error: Segmentation fault" in run.stderr
