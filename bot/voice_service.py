"""One owner for a voice's life: create, share, delete, forget-me, across the voice files and the bot's database.

A voice lives in two places: the synthesis layer's voice store (its row in the voice database, with the consent
given for it, and its folder: clip and encodings) and the rows of the bot's SQLite store that name it (server voices,
shares, users' choices). Each operation here is a short, fixed sequence of steps, journalled so that a crash between
any two of them leaves no half-voice: :meth:`VoiceService.recover`, run at start-up, finishes every journalled
deletion and undoes every creation that did not commit.

* create: journal ``create`` -> the voice (its folder and its row, committed together; the consent in the row) ->
  one transaction: its rows, the journal entry gone -> the phrase precompute (background; only cache entries).
  Undone at start-up before the commit: the voice (if it got that far) and its cache entries are deleted.
* delete / forget-me: one transaction: journal ``delete`` + remove every row naming the voices (and, for
  forget-me, every row of the user) -> stop its precomputes, delete it from the voice store (folder, row, cache
  entries) -> drop the journal entry. Finished at start-up from any step.

Reads (``list``, ``usable``) run off the event loop; listing is one query of the voice database, and each voice's
prompt arrays stay in memory per version, so autocomplete reads no file.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from synthesis.types import VoiceNotFound
from synthesis.voices import VoiceError

if TYPE_CHECKING:
    from bot.store import Store
    from synthesis import SpeechBackend, Voice
    from synthesis.backend import VoiceMaker
    from synthesis.voices import VoiceStore

log = logging.getLogger(__name__)

PREVIEW_MAX_S = 15.0  # seconds of audio at most in a preview file
KIND_ORDER = ("yours", "server", "shared", "operator")  # how personal a usable voice is, most first
Progress = Callable[[str, float], None]
PhraseProgress = Callable[[int, int], None]  # (phrases done, phrases in all)


@dataclass(frozen=True)
class NewVoice:
    """What :meth:`VoiceService.create` made.

    Attributes
    ----------
    voice: the stored voice.
    warnings: what the clip's checks noticed (too quiet, trimmed, ...), for the user.
    chosen: it became the owner's voice (they had none).
    phrases: the background precompute of the common and the guild's phrases (None when there are none).
    phrase_count: how many phrases it computes.
    """

    voice: Voice
    warnings: list[str]
    chosen: bool
    phrases: asyncio.Task[int] | None
    phrase_count: int


class VoiceService:
    """Creates, shares, deletes and forgets voices; see the module docstring for the steps and their journal.

    Parameters
    ----------
    store: the bot's database; None for a process without one (the HTTP API alone), which only reads voices.
    synthesizer: its voice store (``voices``) and its voice work (``voicing``: encoding, precompute); for a process
        that only deletes (the CLI), ``voices`` alone may be given instead.
    phrases: the configured common phrases (precomputed for every new voice, before the guild's own).
    """

    def __init__(self, store: Store | None, synthesizer: SpeechBackend | None = None, *,
                 voices: VoiceStore | None = None, phrases: Sequence[str] = ()) -> None:
        self.store = store
        self.synthesizer = synthesizer
        resolved = voices if voices is not None else synthesizer.voices if synthesizer is not None else None
        if resolved is None:
            raise ValueError("VoiceService needs a synthesizer or a voice store")
        self.voices: VoiceStore = resolved
        self.phrases = list(phrases)

    @property
    def _db(self) -> Store:
        if self.store is None:
            raise RuntimeError("this voice service has no database: it can only read voices")
        return self.store

    # ---- create ------------------------------------------------------------------------------------------------

    async def create(self, name: str, data: bytes, filename: str, *, owner_id: int, consent: Mapping[str, Any],
                     guild_id: int | None = None, server: bool = False, transcript: str | None = None,
                     language: str = "auto", enrollment_prompt: str | None = None, progress: Progress | None = None,
                     phrase_progress: PhraseProgress | None = None) -> NewVoice:
        """Encode and store a voice with its consent, give it its rows, start its phrase precompute.

        ``server``: a server voice of ``guild_id`` (else the owner's own voice, chosen for them when they have
        none). ``progress`` reports the encoding, ``phrase_progress`` the precompute.
        """
        voicing = self._voicing()
        voice_id = uuid.uuid4().hex
        await self._db.begin_voice_create(voice_id)
        try:
            voice, warnings = await voicing.create(
                name, data, filename, owner_id=owner_id, consent=consent, transcript=transcript, language=language,
                enrollment_prompt=enrollment_prompt, progress=progress, voice_id=voice_id)
            chosen = await self._db.commit_voice(voice_id, owner_id, guild_id=guild_id, server=server)
        except BaseException:
            await asyncio.shield(self._undo_create(voice_id))
            raise
        task, count = await self._precompute(voice, guild_id, phrase_progress)
        return NewVoice(voice, warnings, chosen, task, count)

    async def _undo_create(self, voice_id: str) -> None:
        """A creation failed before its commit: remove whatever of it exists, then its journal entry."""
        try:
            await self._delete_files(voice_id)
        finally:
            await self._db.end_voice([voice_id])

    async def _precompute(self, voice: Voice, guild_id: int | None,
                          progress: PhraseProgress | None) -> tuple[asyncio.Task[int] | None, int]:
        """Start the background precompute of the common and the guild's phrases."""
        guild_phrases = await self._db.phrases(guild_id) if guild_id is not None else []
        phrases = list(dict.fromkeys([*self.phrases, *guild_phrases]))
        if not phrases:
            return None, 0
        total = len(phrases)
        report = None if progress is None else (lambda stage, frac: progress(round(frac * total), total))
        return self._voicing().precompute(voice, phrases, progress=report), total

    def precompute(self, voices: Sequence[Voice], phrases: Sequence[str]) -> list[asyncio.Task[int]]:
        """Precompute ``phrases`` for each of ``voices`` in the background (a guild added phrases)."""
        voicing = self._voicing()
        return [voicing.precompute(voice, list(phrases)) for voice in voices]

    # ---- extra clips and styles --------------------------------------------------------------------------------

    async def add_clips(self, voice: Voice, uploads: Sequence[tuple[bytes, str]], *, consent: Mapping[str, Any],
                        guild_id: int | None = None) -> tuple[Voice, list[str]]:
        """Average extra clips into a voice's timbre, each stored with ``consent`` (the speaker's consent record,
        as :meth:`create` takes it); a new version: its phrases are precomputed again."""
        voice, warnings = await self._voicing().add_clips(voice, uploads, consent=consent)
        await self._precompute(voice, guild_id, None)
        return voice, warnings

    async def add_style(self, voice: Voice, style: str, data: bytes, filename: str, *, consent: Mapping[str, Any],
                        transcript: str = "", language: str = "auto",
                        guild_id: int | None = None) -> tuple[Voice, list[str]]:
        """Store a named style with a voice (its own clip and transcript, and ``consent``, the speaker's consent
        record for the clip, as :meth:`create` takes it; a new version)."""
        voice, warnings = await self._voicing().add_style(voice, style, data, filename, consent=consent,
                                                          transcript=transcript, language=language)
        await self._precompute(voice, guild_id, None)
        return voice, warnings

    async def remove_style(self, voice: Voice, style: str, *, guild_id: int | None = None) -> Voice:
        """Remove a named style of a voice (its clip, encodings, cached sentences and consent record)."""
        voice = await self._voicing().remove_style(voice, style)
        await self._precompute(voice, guild_id, None)
        return voice

    # ---- share -------------------------------------------------------------------------------------------------

    async def share(self, voice: Voice, guild_id: int, user_id: int, *, shared: bool = True) -> bool:
        """Let a guild's members use one of ``user_id``'s voices (``shared=False``: stop); False when unchanged."""
        if voice.owner_id != user_id:
            raise VoiceError(f"only the owner of {voice.name!r} can share it")
        if shared:
            return await self._db.share_voice(voice.id, guild_id, user_id)
        return await self._db.unshare_voice(voice.id, guild_id)

    # ---- delete / forget-me ------------------------------------------------------------------------------------

    async def delete(self, voice_id: str) -> dict[str, int]:
        """Delete a voice: its rows, its files, its cache entries; counts of rows per table."""
        counts = await self._db.begin_voice_delete([voice_id])
        await self._finish_delete([voice_id])
        return counts

    async def forget_user(self, user_id: int) -> tuple[int, dict[str, int]]:
        """Delete every voice of a user and every row about them: (voices deleted, rows per table)."""
        voice_ids = [v.id for v in await self.list(user_id)]
        counts = await self._db.begin_voice_delete(voice_ids, user_id=user_id)
        await self._finish_delete(voice_ids)
        log.info("forgot user %d: %d voice(s), %s", user_id, len(voice_ids), counts)
        return len(voice_ids), counts

    async def _finish_delete(self, voice_ids: Sequence[str]) -> None:
        for voice_id in voice_ids:
            await self._delete_files(voice_id)
        await self._db.end_voice(voice_ids)

    async def _delete_files(self, voice_id: str) -> None:
        """Stop the voice's precomputes, retire it in the cache, delete its folder (nothing there: nothing to do)."""
        voicing = self.synthesizer.voicing if self.synthesizer is not None else None
        try:
            if voicing is not None:
                await voicing.delete(voice_id)
            else:
                await asyncio.to_thread(self.voices.delete, voice_id)
        except VoiceNotFound:
            cache = self.voices.cache
            if cache is not None:  # a crash may have come between the cache's entries and the folder
                await asyncio.to_thread(cache.retire_voice, voice_id)

    async def recover(self) -> int:
        """Finish or undo what a crash interrupted (see the module docstring); returns how many voices it touched."""
        journal = await self._db.voice_journal()
        for voice_id, op in journal:
            log.warning("voice %s: finishing an interrupted %s", voice_id, "deletion" if op == "delete" else
                        "creation (undone)")
            if op == "delete":
                await self._db.begin_voice_delete([voice_id])  # the rows again, in case it never got that far
            await self._finish_delete([voice_id])
        return len(journal)

    # ---- read --------------------------------------------------------------------------------------------------

    async def get(self, voice_id: str) -> Voice:
        """The voice with this id (off the event loop)."""
        return await asyncio.to_thread(self.voices.get, voice_id)

    async def find(self, name: str, owner_id: int | None = None) -> Voice:
        """The voice with this name (case-insensitive; of this owner when given), off the event loop."""
        return await asyncio.to_thread(self.voices.find, name, owner_id)

    async def list(self, owner_id: int | None = None) -> list[Voice]:
        """Voices of one owner (every voice when None), sorted by name (off the event loop)."""
        return await asyncio.to_thread(self.voices.list, owner_id)

    async def consent(self, voice_id: str) -> dict[str, Any]:
        """The consent stored with the voice (``user_id``, ``text``, ``at`` and what the front-end added)."""
        meta = await asyncio.to_thread(self.voices.meta, voice_id)
        return dict(meta["consent"])

    async def references(self, voice_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """What each voice's stored reference is, by id (one trip off the event loop): ``start_s``-``end_s`` of a
        ``clip_s`` upload, ``left_out_s`` of its speech left out and the ``kept`` line the person was told about it
        ("" when only silence was trimmed; both absent for voices made before they were recorded), ``warnings``."""
        def read() -> dict[str, dict[str, Any]]:
            found: dict[str, dict[str, Any]] = {}
            for voice_id in voice_ids:
                try:
                    found[voice_id] = dict(self.voices.meta(voice_id).get("reference") or {})
                except VoiceNotFound:  # deleted since it was listed
                    continue
            return found

        return await asyncio.to_thread(read)

    async def usable(self, guild_id: int, user_id: int) -> list[tuple[Voice, str]]:
        """``(voice, kind)`` for every voice the member can use in the guild, each once under its most personal
        kind (:data:`KIND_ORDER`: their own, the guild's server voices, voices shared with it, the operator's)."""
        server, shared = await self._db.guild_voices(guild_id), await self._db.shared_voices(guild_id)
        return await asyncio.to_thread(self._usable, user_id, server, shared)

    def _usable(self, user_id: int, server: Sequence[str], shared: Sequence[str]) -> list[tuple[Voice, str]]:
        found: dict[str, tuple[Voice, str]] = {}
        for voice in self.voices.list(user_id):
            found.setdefault(voice.id, (voice, "yours"))
        for kind, ids in (("server", server), ("shared", shared)):
            for voice_id in ids:
                try:
                    found.setdefault(voice_id, (self.voices.get(voice_id), kind))
                except VoiceNotFound:  # a row left behind by a voice deleted elsewhere
                    continue
        for voice in self.voices.list(0):
            found.setdefault(voice.id, (voice, "operator"))
        return sorted(found.values(), key=lambda c: (KIND_ORDER.index(c[1]), c[0].name.lower()))

    # ---- preview -----------------------------------------------------------------------------------------------

    async def preview_wav(self, text: str, voice: Voice, max_s: float = PREVIEW_MAX_S) -> bytes:
        """``text`` spoken by ``voice`` as a 16-bit WAV file, at most ``max_s`` seconds."""
        from synthesis.audio import encode_audio  # the audio codecs load only when a preview is asked for

        assert self.synthesizer is not None, "previews need the synthesizer"
        pieces, rate, total = [], 32000, 0
        stream = self.synthesizer.stream(text, voice)
        try:
            async for chunk in stream:
                rate = chunk.sample_rate
                pieces.append(chunk.audio)
                total += chunk.audio.size
                if total >= max_s * rate:
                    break
        finally:
            await stream.aclose()
        audio = np.concatenate(pieces)[: int(max_s * rate)] if pieces else np.zeros(0, np.float32)
        return encode_audio(audio, rate, "wav")

    def _voicing(self) -> VoiceMaker:
        if self.synthesizer is None:
            raise RuntimeError("this voice service has no synthesizer: it can only list and delete voices")
        return self.synthesizer.voicing
