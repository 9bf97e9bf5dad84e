"""An in-memory stand-in for the read surface of ``synthesis.voices.VoiceStore`` (get / find / list) plus ``add``:
it isolates the layers above the store (HTTP API, cogs, speaker) from real voice profiles and models."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Iterable

import numpy as np

from engines.base import VoicePrompt
from synthesis.types import Voice, VoiceNotFound

__all__ = ["FakeVoices", "make_voice"]


def make_voice(name: str, owner_id: int = 0, *, voice_id: str | None = None, model_id: str = "fake",
               prompt_text: str = "") -> Voice:
    """A voice with an empty prompt (no reference tokens); ``model_id`` is free for a fake synthesizer's use;
    ``prompt_text`` is the transcript it records ("" = reference-free)."""
    empty = VoicePrompt(np.zeros(0, np.int64), np.zeros((512, 1), np.float32), np.zeros(0, np.int64),
                        np.zeros((1024, 0), np.float32))
    return Voice(id=voice_id or uuid.uuid4().hex, name=name, owner_id=owner_id, version=1, language="en",
                 prompt_text=prompt_text, prompt=empty, model_id=model_id)


class FakeVoices:
    """Voices in a dict; with ``root``, each voice also gets a folder (a clip and a meta file) as the store makes."""

    def __init__(self, voices: Iterable[Voice] = (), root: Path | None = None) -> None:
        self.root = root
        self.cache = None  # no synthesis cache behind it
        self.by_id: dict[str, Voice] = {}
        for v in voices:
            self._put(v)

    def add(self, name: str, owner_id: int = 0, voice_id: str | None = None, prompt_text: str = "") -> Voice:
        return self._put(make_voice(name, owner_id, voice_id=voice_id or f"v{len(self.by_id) + 1:03d}",
                                    prompt_text=prompt_text))

    def get(self, voice_id: str) -> Voice:
        try:
            return self.by_id[voice_id]
        except KeyError:
            raise VoiceNotFound(f"no voice with id {voice_id!r}") from None

    def find(self, name: str, owner_id: int | None = None) -> Voice:
        for v in self.by_id.values():
            if v.name == name and (owner_id is None or v.owner_id == owner_id):
                return v
        raise VoiceNotFound(f"no voice named {name!r}")

    def meta(self, voice_id: str) -> dict:
        """The store's metadata of a voice, as far as a fake has it: no reference clip, so no reference facts."""
        voice = self.get(voice_id)
        return {"id": voice.id, "name": voice.name, "prompt_text": voice.prompt_text, "reference": {}}

    def list(self, owner_id: int | None = None) -> list[Voice]:
        return [v for v in self.by_id.values() if owner_id is None or v.owner_id == owner_id]

    def _put(self, v: Voice) -> Voice:
        self.by_id[v.id] = v
        if self.root is not None:
            folder = self.root / v.id
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "clip.flac").write_bytes(b"fLaC-test")
            (folder / "meta.json").write_text("{}")
        return v
