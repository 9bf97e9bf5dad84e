"""The v4/v5/v3 golden conformance data (``tests/data/golden-v4v5``, or ``$VOICEBOT_GOLDEN_V4V5_DIR``), read in one
place: every file name, family, step count, guidance rate and fp64 error bound comes from the set's ``meta.json``
and arrays, so the tests hold on any set made the same way."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

GOLDEN_ENV = "VOICEBOT_GOLDEN_V4V5_DIR"
DEFAULT_DIR = Path(__file__).resolve().parent / "data" / "golden-v4v5"


def golden_v4v5_dir() -> Path:
    """``$VOICEBOT_GOLDEN_V4V5_DIR`` when set, else ``tests/data/golden-v4v5``."""
    return Path(os.environ.get(GOLDEN_ENV) or DEFAULT_DIR)


def npz(path: Path) -> dict[str, torch.Tensor]:
    """Every array of an ``.npz`` as a tensor."""
    with np.load(path) as z:
        return {k: torch.from_numpy(z[k]) for k in z.files}


@dataclass
class GoldenV4V5:
    """One golden set."""

    root: Path

    @cached_property
    def meta(self) -> dict[str, Any]:
        return json.loads((self.root / "meta.json").read_text())

    @property
    def families(self) -> list[str]:
        return [str(f) for f in self.meta["families"]]

    @cached_property
    def ref(self) -> dict[str, torch.Tensor]:
        return npz(self.root / "ref_io.npz")

    def ref_log_mel(self, rate: int) -> torch.Tensor:
        """The reference clip's stored log-mel at ``rate`` Hz (a family's ``mel_rate``), not normalised."""
        return self.ref[f"mel{rate // 1000}k_log"]

    def io(self, family: str) -> dict[str, torch.Tensor]:
        return npz(self.root / f"sovits_{family}_io.npz")

    def sovits_file(self, family: str) -> Path:
        return self.root / self.meta["sovits"][family]["file"]

    def sovits_meta(self, family: str) -> dict[str, Any]:
        return self.meta["sovits"][family]

    def vocoder_path(self, family: str) -> Path:
        """The vocoder file (v4/v5) or folder (v3) the family's runs used."""
        entry = self.meta["vocoders"][self.vocoder_key(family)]
        return self.root / (entry["dir"] if "dir" in entry else entry["file"])

    def vocoder_key(self, family: str) -> str:
        """``meta.json``'s vocoder entry of a family (``v5dev``/``v5turbo`` share ``v5``)."""
        return family if family in self.meta["vocoders"] or not family.startswith("v5") else "v5"

    def run(self, family: str, name: str) -> dict[str, Any]:
        """A recorded run (``"default"``, ``"few"``): steps, cfg, chunk frames..."""
        return self.sovits_meta(family)["runs"][name]

    def fp64(self, family: str) -> dict[str, float]:
        """Upstream fp32 vs fp64 on the same inputs: ``dit_v_max_abs_diff``, ``cfm_chunk0_max_abs_diff``..."""
        return self.sovits_meta(family)["fp64_check"]

    @property
    def ref_fp64(self) -> dict[str, float]:
        return self.meta["reference"]["fp64_check"]
