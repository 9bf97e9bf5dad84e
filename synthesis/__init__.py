"""The synthesis pipeline, numpy at its edges: text and audio in, 32 kHz float32 chunks out, one sentence at a time.

The face is what every caller needs: the local synthesizer and the client of Ray Serve replicas (both a
:class:`SpeechBackend`), the per-call options, a voice, and the error root. Everything else is imported from the module
that owns it: :mod:`synthesis.types` (chunks, streams, limits, languages, the errors a front-end answers differently),
:mod:`synthesis.voices` (the voice store), :mod:`synthesis.text` (the text front-end and pronunciation dictionaries),
:mod:`synthesis.audio` (uploads, resampling, encoding), :mod:`synthesis.styles`, :mod:`synthesis.cache`,
:mod:`synthesis.scheduler`, :mod:`synthesis.backend`, :mod:`synthesis.cluster.options`.

The synthesizers and their protocol load on first use (the pipeline pulls in the text front-end, PyAV and diskcache;
the client, Ray; the protocol, asyncio), so that a module that only needs a type (the config, the store) does not pay
for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engines import SpeechError
from engines.lazy import lazy_face
from synthesis.types import SynthesisParams, Voice

if TYPE_CHECKING:
    from synthesis.backend import SpeechBackend
    from synthesis.cluster.client import connect_cluster
    from synthesis.pipeline import Synthesizer

__all__ = [
    # the synthesizers: the pipeline on this machine, and the client of Ray Serve replicas (ray imported only then)
    "Synthesizer", "connect_cluster",
    # what the bot is typed against, local or remote
    "SpeechBackend",
    # what every call carries: per-call options and a voice
    "SynthesisParams", "Voice",
    # the error root
    "SpeechError",
]

__getattr__, __dir__ = lazy_face(__name__, __all__, {
    "synthesis.pipeline": ["Synthesizer"], "synthesis.cluster.client": ["connect_cluster"],
    "synthesis.backend": ["SpeechBackend"]})  # a protocol: asyncio, for annotations mostly
