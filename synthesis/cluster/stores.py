"""What a replica reads and writes beside its engine: its voice store and caches, and where its state reports go.

Shared by the replica (:mod:`synthesis.cluster.replica`), the storage actor (:mod:`synthesis.cluster.storage`) and the
client (:mod:`synthesis.cluster.client`), so that none of them imports another for these.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Protocol

from synthesis.cache import SynthesisCache
from synthesis.cache_lane import SpeechCache
from synthesis.voices import VoiceStore

Stores = tuple[VoiceStore, SynthesisCache]  # a machine's voice store and caches, opened from its folders
SynthStores = tuple[VoiceStore, SpeechCache]  # what a replica's local synthesizer reads its voices and caches through


class Reports(Protocol):
    """Where a replica's state goes (``ray.storage`` decides: the state folder itself, or the storage actor)."""

    def write(self, replica: str, state: Mapping[str, Any]) -> None: ...
    def remove(self, replica: str) -> None: ...


class FileReports:
    """The state folder: ``<replica>.json`` per replica, written atomically (temp + rename)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def write(self, replica: str, state: Mapping[str, Any]) -> None:
        path = self.folder / f"{replica}.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(state), encoding="utf-8")
        os.replace(tmp, path)

    def remove(self, replica: str) -> None:
        (self.folder / f"{replica}.json").unlink(missing_ok=True)
