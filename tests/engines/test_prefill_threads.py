"""A CPU prefill gives the same logits on one thread as on two: it drops to one thread when another process takes a
core, and a seeded sentence must not speak other tokens under load than when the machine is quiet (MKL_CBWR, set
by ``import engines``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# in a fresh process: MKL reads the setting at its first call, which in this test process came long ago
SNIPPET = """
import os, sys, tempfile
from pathlib import Path
import numpy as np, torch
import engines
from engines import write_model_set
from engines.gpt_sovits.checkpoint import load_gpt_checkpoint
from engines.gpt_sovits import tiny
from engines.gpt_sovits.gpt import Text2SemanticModel

tiny.GPT_SIZES["tiny"] = (512, 16, 2)  # the released width (MKL's paths depend on it), two layers
paths = write_model_set(Path(tempfile.mkdtemp()), size="tiny", seed=0)
gpt = Text2SemanticModel.from_checkpoint(load_gpt_checkpoint(paths["gpt"]), device="cpu")
gpt.setup_caches(1, 128)
rng = np.random.default_rng(0)
unequal = []
for tx, tp in [(1, 0), (3, 0), (5, 2), (7, 0), (9, 4), (12, 7), (20, 11), (33, 0), (40, 30), (70, 50)]:
    phones = torch.as_tensor(rng.integers(1, 300, tx))
    bert = torch.zeros(1024, tx)
    prompt = torch.as_tensor(rng.integers(0, 1000, tp))
    torch.set_num_threads(2)
    two = gpt.prefill(0, phones, bert, prompt).clone()
    gpt._prefill_solo_left = 1  # as after a slow prefill: this one on one thread
    one = gpt.prefill(0, phones, bert, prompt).clone()
    assert torch.get_num_threads() == 2
    if not torch.equal(one, two):
        unequal.append((tx + tp, float((one - two).abs().max())))
print("MKL_CBWR", os.environ.get("MKL_CBWR"), "unequal", unequal)
sys.exit(1 if unequal else 0)
"""


def test_a_prefill_on_one_thread_gives_the_logits_of_two() -> None:
    run = subprocess.run([sys.executable, "-c", SNIPPET], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "MKL_CBWR AUTO,STRICT unequal []" in run.stdout
