"""The consent given for an extra clip or a named style, through the path Discord's ``/voice add-clip`` and
``/voice style add`` take (bot.voice_service over the real voice store and bot database): stored with the clip or
style (who, when, what was agreed), there after a restart, gone with the style, and gone with every voice on
forget-me. The model work is stood in for, as in tests/bot/test_voice_service.py; the real encoding path is in
tests/synthesis/test_voice_styles.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from bot.store import Store
from bot.voice_service import VoiceService
from synthesis.cache import SynthesisCache
from synthesis.voices import VoiceError, VoiceStore
from tests.bot.test_voice_service import ALICE, G1, StandInVoicing, make_voice
from tests.synthesis.test_voices import db_bytes, make_prompt, make_reference

CLIP_CONSENT = {"user_id": ALICE, "guild_id": G1, "statement": "I confirm second.ogg is my own voice",
                "at": "2025-03-04T05:06:07+00:00", "clip": "second.ogg", "clip_bytes": 4096}
STYLE_CONSENT = {"user_id": ALICE, "guild_id": G1, "statement": "I confirm calm.ogg is my own voice",
                 "at": "2025-03-04T05:07:08+00:00", "clip": "calm.ogg", "clip_bytes": 2048, "style": "calm"}


class ClipsAndStyles(StandInVoicing):
    """The stand-in voicing with extra clips and styles, each written by the real voice store with its consent."""

    async def add_clips(self, voice: Any, uploads: Any, *, consent: Any) -> tuple[Any, list[str]]:
        refs = [make_reference(seed=i + 1) for i in range(len(uploads))]
        ges = [voice.prompt.ge] * (len(refs) + 1)  # one ge row per clip, main clip first
        return await asyncio.to_thread(self.voices.add_clips, voice.id, refs, voice.prompt, np.stack(ges),
                                       consent=consent), []

    async def add_style(self, voice: Any, style: str, data: bytes, filename: str, *, consent: Any,
                        transcript: str = "", language: str = "auto") -> tuple[Any, list[str]]:
        return await asyncio.to_thread(self.voices.put_style, voice.id, style, make_reference(seed=9), make_prompt(9),
                                       language="en", prompt_text=transcript, consent=consent), []

    async def remove_style(self, voice: Any, style: str) -> Any:
        return await asyncio.to_thread(self.voices.remove_style, voice.id, style)


async def _open(root: Path) -> tuple[Store, SynthesisCache, VoiceStore, VoiceService]:
    store = Store(root / "voicebot.sqlite3")
    await store.open()
    cache = SynthesisCache(root / "cache", 1 << 22, 1 << 22)
    voices = VoiceStore(root / "voices", cache=cache)
    synthesizer = SimpleNamespace(voices=voices, voicing=ClipsAndStyles(voices))
    return store, cache, voices, VoiceService(store, synthesizer)  # type: ignore[arg-type]


async def _close(store: Store, cache: SynthesisCache, voices: VoiceStore) -> None:
    await store.close()
    voices.close()
    cache.close()


async def test_clip_and_style_consent_survive_a_restart_and_go_with_the_style_and_on_forget_me(tmp_path: Path):
    store, cache, voices, service = await _open(tmp_path)
    voice = (await make_voice(service)).voice
    voice, _ = await service.add_clips(voice, [(b"clip", "second.ogg")], consent=CLIP_CONSENT, guild_id=G1)
    voice, _ = await service.add_style(voice, "calm", b"clip", "calm.ogg", consent=STYLE_CONSENT,
                                       transcript="I am calm.", language="en", guild_id=G1)
    await _close(store, cache, voices)

    store, cache, voices, service = await _open(tmp_path)  # the next start
    meta = voices.meta(voice.id)
    clip_record = meta["reference"]["extras"][0]["consent"]
    style_record = meta["styles"]["calm"]["consent"]
    assert clip_record == {"user_id": ALICE, "guild_id": G1, "text": "I confirm second.ogg is my own voice",
                           "at": "2025-03-04T05:06:07+00:00", "clip": "second.ogg", "clip_bytes": 4096}
    assert style_record == {"user_id": ALICE, "guild_id": G1, "text": "I confirm calm.ogg is my own voice",
                            "at": "2025-03-04T05:07:08+00:00", "clip": "calm.ogg", "clip_bytes": 2048, "style": "calm"}
    await service.remove_style(voices.get(voice.id), "calm", guild_id=G1)
    assert voices.meta(voice.id)["styles"] == {}
    assert b"calm.ogg is my own voice" not in db_bytes(tmp_path / "voices")  # nor in the WAL
    voice, _ = await service.add_style(voices.get(voice.id), "calm", b"clip", "calm.ogg", consent=STYLE_CONSENT,
                                       guild_id=G1)
    assert b"calm.ogg is my own voice" in db_bytes(tmp_path / "voices")
    deleted, _ = await service.forget_user(ALICE)
    assert deleted == 1
    left = db_bytes(tmp_path / "voices")
    assert b"calm.ogg is my own voice" not in left and b"second.ogg is my own voice" not in left
    await _close(store, cache, voices)


async def test_without_consent_nothing_is_added(tmp_path: Path):
    store, cache, voices, service = await _open(tmp_path)
    voice = (await make_voice(service)).voice
    with pytest.raises(VoiceError, match="needs the speaker's consent"):
        await service.add_style(voice, "calm", b"clip", "calm.ogg", consent={"user_id": ALICE}, guild_id=G1)
    with pytest.raises(VoiceError, match="needs the speaker's consent"):
        await service.add_clips(voice, [(b"clip", "x.ogg")], consent={"statement": "yes"}, guild_id=G1)
    assert voices.get(voice.id).version == voice.version and voices.meta(voice.id)["styles"] == {}
    await _close(store, cache, voices)
