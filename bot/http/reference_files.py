"""api_v2's ``ref_audio_path`` as upstream's clients send it: the path of a reference clip, with its ``prompt_text``
and ``prompt_lang``, on every request.

Only files inside ``http.reference_dirs`` are read. The path (absolute, or relative to each folder in turn) is
resolved with its symlinks and must then lie strictly inside one of the folders; anything else is not a reference
file here (api_v2 goes on to the stored voices, and refuses the path in one line). Each clip is encoded once, with
the same checks as ``voices add``, and kept as a stored voice whose id is the hash of the file's bytes, the
transcript and its language: a second request with the same file, transcript and language reads that voice back with
no model work (its prosody and audio cache entries too), and a changed file or transcript is another voice.

These voices belong to :data:`REFERENCE_OWNER` (``voices list`` shows them; ``voices delete`` removes them), are left
out of the API's voice listings, and the oldest go once there are :data:`MAX_REFERENCE_VOICES`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Sequence

from bot.config import MB
from bot.http.responses import ApiError, voices_of
from synthesis import Voice
from synthesis.audio import read_upload_file
from synthesis.types import VoiceNotFound

if TYPE_CHECKING:
    from bot.services import Services

log = logging.getLogger(__name__)

REFERENCE_OWNER = -1  # owner id of the voices made from reference files (Discord ids are positive, 0 the operator)
MAX_REFERENCE_VOICES = 64  # reference-file voices kept; the oldest is deleted to make room for a new one
_CONSENT = {"user_id": 0, "text": "a reference clip the operator placed in http.reference_dirs, with the speaker's "
                                  "permission", "via": "http.reference_dirs"}
_making: dict[tuple[str, str], asyncio.Future[Voice]] = {}  # (voice folder, id) -> its encoding, for every waiter


def reference_path(dirs: Sequence[Path], ref: str) -> Path | None:
    """The regular file ``ref`` names strictly inside one of ``dirs`` (symlinks resolved first), else None.

    ``ref``: absolute, or relative to each folder in turn; a path with a ``..`` part is never one.
    """
    text = ref.replace("\\", "/")
    if not dirs or not text or ".." in PurePosixPath(text).parts:
        return None
    given = Path(text)
    for folder in dirs:
        try:
            root = Path(os.path.realpath(folder))
            path = Path(os.path.realpath(given if given.is_absolute() else root / given))
            if root in path.parents and path.is_file():
                return path
        except (OSError, ValueError):  # too long, a loop: not a file in this folder
            continue
    return None


def content_id(data: bytes, prompt_text: str, prompt_lang: str) -> str:
    """The voice id of a reference: 32 hex digits of the hash of the file's bytes, its transcript and language."""
    h = hashlib.blake2b(digest_size=16)
    for part in (data, prompt_text.encode("utf-8"), prompt_lang.encode("utf-8")):
        h.update(len(part).to_bytes(8, "little"))  # length-prefixed: no two inputs hash as one
        h.update(part)
    return h.hexdigest()


async def reference_voice(services: Services, path: Path, prompt_text: str, prompt_lang: str | None, *,
                          name: str = "ref_audio_path") -> Voice:
    """The stored voice of the reference clip at ``path`` (from :func:`reference_path`), made now if it is new.

    ``prompt_text``: what the clip says ("": reference-free, as upstream); ``prompt_lang`` is required with it.
    An aux reference (``name`` aux_ref_audio_paths) lends only its timbre, so its transcript is not used.

    Raises
    ------
    ApiError
        400: prompt_text without prompt_lang.
    AudioInputError, VoiceError
        The clip is refused (too short, no speech, music, too large...), with ``voices add``'s messages.
    """
    aux = name != "ref_audio_path"
    text = "" if aux else prompt_text.strip()
    if text and not prompt_lang:
        raise ApiError(400, "prompt_lang is required with prompt_text: the language of the reference's transcript "
                            "(zh, en, ja, ko, yue or auto)")
    language = (prompt_lang or "auto") if text else "auto"
    max_bytes = int(services.config.voices.max_upload_mb * MB)
    data = await asyncio.to_thread(read_upload_file, path, max_bytes=max_bytes)
    voice_id = content_id(data, text, language)
    voices = voices_of(services)
    try:
        return await voices.get(voice_id)
    except VoiceNotFound:
        pass
    key = (str(voices.voices.root), voice_id)
    making = _making.get(key)
    if making is None:  # the first request encodes it; the others wait for that one
        making = _making[key] = asyncio.ensure_future(_make(services, voice_id, data, path.name, text, language))
        making.add_done_callback(lambda done: _done(key, done))
    return await asyncio.shield(making)  # a client that leaves does not stop the encoding the others wait for


def _done(key: tuple[str, str], done: asyncio.Future[Voice]) -> None:
    """Forget a finished encoding (its failure was raised to every request that waited for it)."""
    _making.pop(key, None)
    if not done.cancelled():
        done.exception()  # retrieved: a refusal nobody waits for any more is not logged as never retrieved


async def _make(services: Services, voice_id: str, data: bytes, filename: str, text: str, language: str) -> Voice:
    """Encode and store a reference clip as a voice (making room first)."""
    try:  # stored by an encoding that finished while this request read the file
        return await voices_of(services).get(voice_id)
    except VoiceNotFound:
        pass
    await _make_room(services)
    voice, warnings = await services.synthesizer.voicing.create(
        f"ref-{voice_id[:16]}", data, filename, consent=_CONSENT, owner_id=REFERENCE_OWNER,
        transcript=text or None, language=language, voice_id=voice_id)
    for warning in warnings:
        log.info("reference clip %s: %s", filename, warning)
    log.info("reference clip %s kept as voice %s (%s)", filename, voice.id,
             "with its transcript" if voice.prompt_text else "reference-free")
    return voice


async def _make_room(services: Services) -> None:
    """Delete the oldest reference-file voices so that one more fits under :data:`MAX_REFERENCE_VOICES`."""
    store = voices_of(services).voices

    def oldest_first() -> list[str]:
        metas = []
        for voice in store.list(REFERENCE_OWNER):
            try:
                metas.append(store.meta(voice.id))
            except VoiceNotFound:  # deleted meanwhile
                continue
        return [m["id"] for m in sorted(metas, key=lambda m: m["created"])]

    ids = await asyncio.to_thread(oldest_first)
    for voice_id in ids[:max(0, len(ids) - MAX_REFERENCE_VOICES + 1)]:
        log.info("reference-file voice %s deleted to make room (at most %d are kept)", voice_id,
                 MAX_REFERENCE_VOICES)
        try:
            await services.synthesizer.voicing.delete(voice_id)
        except VoiceNotFound:
            continue
