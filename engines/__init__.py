"""Inference engines for GPT-SoVITS v2: the only package where tensors live.

The layers above see the engine through this surface only: the :class:`Engine` protocol and the numpy types that
cross it, the error root, the model's fixed rates and sizes, and the functions that load an engine, build its
exported graphs and write a random model set; and, for the benchmarks only, :mod:`engines.instruments` (what they
measure from the inside). ``build_engines``, ``write_model_set`` and ``instruments`` load torch, so they are
imported on first use (module ``__getattr__``): ``import engines`` stays free of torch.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from engines.base import (
    BERT_DIM,
    DIFFUSION_FAMILIES,
    FRAME_SAMPLES,
    SAMPLE_RATE,
    SAMPLES_PER_TOKEN,
    SSL_SAMPLE_RATE,
    Engine,
    EngineError,
    SamplingParams,
    SemanticBatch,
    SemanticRequest,
    SpeechError,
    VoicePrompt,
    check_sampler,
    token_sample,
)
from engines.loader import load_engine

# MKL's strict conditional numerical reproducibility: the same fp32 products whatever the thread count. A CPU
# prefill drops to one thread when another process takes a core (engines/gpt_sovits/gpt.py), and without this 24 of
# 172 prefill-like product shapes (rows 1-39, 64-230) came out differently on one thread than on two (MKL splits
# small row counts another way), so a seeded sentence could speak other tokens under load than when quiet. Measured on
# a 2-core EPYC Zen 4: no cost (204x512x2048: 2.6 ms strict, 2.9 ms without). Read by MKL at its first call, which
# comes after this import; a value set by the user stays.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

if TYPE_CHECKING:
    from engines import instruments
    from engines.build import build_engines
    from engines.gpt_sovits.tiny import write_model_set

__all__ = [
    # the interface and what crosses it (numpy in, numpy out)
    "Engine", "SemanticBatch", "SemanticRequest", "SamplingParams", "VoicePrompt",
    # the error root (every layer's errors derive from SpeechError) and the engines' own
    "SpeechError", "EngineError",
    # the model's fixed facts: Hz, samples per semantic token and per latent frame (and where a token begins at
    # another speed), BERT feature size
    "SAMPLE_RATE", "SSL_SAMPLE_RATE", "SAMPLES_PER_TOKEN", "FRAME_SAMPLES", "token_sample", "BERT_DIM",
    # the SoVITS families that decode through a DiT sampler, and the sampler options each accepts
    "DIFFUSION_FAMILIES", "check_sampler",
    # entry points: load one, export/build its graphs, write a random model set (tests, `models make-tiny`)
    "load_engine", "build_engines", "write_model_set",
    # what the benchmarks measure from the inside (the naive baseline, each backend class, torch-side figures):
    # a module of its own, for the tools beside the product, never for the layers above
    "instruments",
]

_LAZY = {  # name -> module (torch); a name that is the module's own is the module itself
    "build_engines": "engines.build", "write_model_set": "engines.gpt_sovits.tiny",
    "instruments": "engines.instruments",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name])
    value = module if _LAZY[name] == f"{__name__}.{name}" else getattr(module, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
