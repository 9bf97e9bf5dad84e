"""Inference engines for GPT-SoVITS v2: the only package where tensors live.

The face is what the layers above call: the :class:`Engine` protocol, the error root and the engines' own error, and
the functions that load an engine, build its exported graphs and write a random model set. The types and constants
that cross the protocol (``SemanticRequest``, ``VoicePrompt``, ``SAMPLE_RATE``...) are imported from
:mod:`engines.base`; what the benchmarks measure from the inside, from :mod:`engines.instruments`.

Every name loads on first use (:mod:`engines.lazy`), so ``import engines`` runs the standard library alone: the
packages above share its lazy-face helper, and ``bot``'s face must load on a bare Python (``make run``'s token check).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from engines.lazy import lazy_face

# MKL's strict conditional numerical reproducibility: the same fp32 products whatever the thread count. A CPU
# prefill drops to one thread when another process takes a core (engines/gpt_sovits/gpt.py), and without this some
# prefill-sized products differ on one thread from two, so a seeded sentence could speak other tokens under load than
# when quiet; it costs nothing measurable (see FINDINGS.md#mkl-strict-reproducibility). Read by MKL at its first
# call, which comes after this import; a value set by the user stays.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

if TYPE_CHECKING:
    from engines.base import Engine, EngineError, SpeechError
    from engines.build import build_engines
    from engines.gpt_sovits.tiny import write_model_set
    from engines.loader import load_engine

__all__ = [
    # the interface (numpy in, numpy out; its types in engines.base)
    "Engine",
    # the error root (every layer's errors derive from SpeechError) and the engines' own
    "SpeechError", "EngineError",
    # entry points: load one, export/build its graphs, write a random model set (tests, `models make-tiny`)
    "load_engine", "build_engines", "write_model_set",
]

__getattr__, __dir__ = lazy_face(__name__, __all__, {
    "engines.base": ["Engine", "SpeechError", "EngineError"], "engines.loader": ["load_engine"],
    "engines.build": ["build_engines"], "engines.gpt_sovits.tiny": ["write_model_set"]})  # the last two: torch
