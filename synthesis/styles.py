"""What a request speaks with beyond its stored voice: a named style, and the timbre of other voices' clips.

A named style is a reference of its own (prompt tokens, transcript, ``ge``): choosing one swaps the whole prompt, so
it changes prosody as well as timbre, and the prosody and audio cache keys carry its name. Aux voices (upstream's
``aux_ref_audio_paths``) change only the timbre: upstream's SoVITS decode averages the global style vector ``ge``
over every reference clip (for v2Pro/v2ProPlus each clip's ``ge`` already fused with its speaker-verification
features), while the prompt tokens and transcript stay the main voice's. Here the same mean is taken over the stored
per-clip ``ge`` of the main voice (or its style) and of each aux voice, once per combination of voice versions.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections import OrderedDict
from typing import Sequence

import numpy as np

from synthesis.types import Voice, VoiceNotFound

HELD_TIMBRES = 256  # fused ge kept per combination of (voice, version, style) (gin floats each: a few MB at most)
_NAMED = re.compile(r"\s*(?:style\s*[:=]\s*)?(.+?)[\s.!]*", re.IGNORECASE)  # "calm", "style: calm", "Style=calm."


def style_named(voice: Voice, text: str) -> str | None:
    """The style of ``voice`` that a free-text instruction names ("calm", "style: calm"), or None when it names
    none of them (the caller says it was ignored)."""
    m = _NAMED.fullmatch(text)
    if m is None or m.group(1).casefold() not in voice.styles:
        return None
    return voice.styles[m.group(1).casefold()].name


def with_style(voice: Voice, style: str) -> Voice:
    """The voice speaking in its named style ``style`` (case-insensitive; "" keeps the main clip).

    Raises
    ------
    VoiceNotFound
        The voice has no such style; the message names the styles it has.
    """
    if not style:
        return voice
    found = voice.styles.get(style.casefold())
    if found is None:
        have = ", ".join(sorted(s.name for s in voice.styles.values())) or "none yet"
        raise VoiceNotFound(f"voice {voice.name!r} has no style {style!r} (its styles: {have}); add one with "
                            "/voice style add")
    return dataclasses.replace(voice, prompt_text=found.prompt_text, language=found.language, prompt=found.prompt,
                               clip_ges=None, style=found.name.casefold())


def fused_ge(voices: Sequence[Voice]) -> np.ndarray:
    """``ge`` ``[gin, 1]`` float32: the mean over every clip of ``voices`` (upstream's mean over its references)."""
    return np.concatenate([v.ges for v in voices], axis=0).mean(axis=0).astype(np.float32)


def timbre_key(voices: Sequence[Voice]) -> str:
    """What names a fusion of clips in the cache keys: each voice's id, version and style, in order."""
    return ",".join(f"{v.id}@{v.version}{':' + v.style if v.style else ''}" for v in voices)


class Timbres:
    """The fused ``ge`` of each combination of voices used lately (LRU, thread-safe): computed once per combination,
    a changed voice (its version) is a new combination."""

    def __init__(self, limit: int = HELD_TIMBRES) -> None:
        self.limit = limit
        self._held: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def speak_with(self, voice: Voice, aux: Sequence[Voice]) -> Voice:
        """``voice`` with its ``ge`` the mean over its clips and every clip of ``aux`` (each a fitted voice, or
        a voice in a style); itself when ``aux`` is empty."""
        if not aux:
            return voice
        key = timbre_key([voice, *aux])
        with self._lock:
            ge = self._held.get(key)
            if ge is not None:
                self._held.move_to_end(key)
        if ge is None:
            ge = fused_ge([voice, *aux])
            with self._lock:
                self._held[key] = ge
                while len(self._held) > self.limit:
                    self._held.popitem(last=False)
        return dataclasses.replace(voice, prompt=dataclasses.replace(voice.prompt, ge=ge), timbre=key)

    def __len__(self) -> int:
        return len(self._held)
