"""A voice's model-side life: encode an upload into a voice, re-encode it for another model, precompute its phrases,
delete it with every derived byte. The files are :class:`~synthesis.voices.VoiceStore`'s; the model work runs on
the :class:`~synthesis.scheduler.DeviceWorker`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Coroutine, Mapping, Protocol, Sequence

import numpy as np

from engines import Engine, EngineError
from engines.base import DIFFUSION_FAMILIES, SAMPLE_RATE, SAMPLES_PER_TOKEN, SSL_SAMPLE_RATE, VoicePrompt
from synthesis.audio import Reference, reference_from_upload, resample
from synthesis.precompute import precompute_phrases
from synthesis.stages import Stages
from synthesis.styles import Timbres, with_style
from synthesis.text import bert_features, text_to_phonemes
from synthesis.types import Limits, SynthesisParams, Voice, VoiceNotFound
from synthesis.voices import Removed, VoiceError, VoiceStore, check_consent, check_name

log = logging.getLogger(__name__)

MIN_ROOM_POSITIONS = 400  # GPT context a voice's prompt must leave for a sentence (~100 phones + 12 s of tokens)
TOKENS_PER_S = SAMPLE_RATE / SAMPLES_PER_TOKEN  # semantic tokens per second of reference (25)
Progress = Callable[[str, float], None]


class VoiceTasks:
    """Background work for voices (the phrase precomputes), by the voice each is for: a failure is logged, and
    :meth:`stop` cancels one voice's tasks (or all) and waits for them to end."""

    def __init__(self) -> None:
        self._tasks: dict[asyncio.Task[int], str] = {}  # task -> voice id

    def start(self, voice_id: str, work: Coroutine[Any, Any, int]) -> asyncio.Task[int]:
        task = asyncio.create_task(work)
        self._tasks[task] = voice_id
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[int]) -> None:
        self._tasks.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("precompute failed: %s", task.exception())

    async def stop(self, voice_id: str | None = None) -> None:
        pending = [t for t, vid in self._tasks.items() if voice_id is None or vid == voice_id]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


@dataclass(frozen=True)
class VoiceOrder:
    """A voice to be made, its arguments checked once (:func:`create_voice`), before any decoding or encoding;
    what travels to the process that holds the model (a Ray replica) as it is.

    Attributes
    ----------
    name: the voice's name (checked: :func:`synthesis.voices.check_name`).
    consent: the speaker's consent record (``user_id``, ``text``; see ``synthesis.voices.Consent``).
    owner_id: the Discord user who owns it (0 for server/CLI voices).
    transcript: what the clip says (None: the enrollment prompt, else reference-free).
    language: the transcript's language ("auto": detected).
    enrollment_prompt: the sentence the user was asked to read, if any.
    voice_id: the id reserved for it (a new one when None).
    """

    name: str
    consent: dict[str, Any]
    owner_id: int = 0
    transcript: str | None = None
    language: str = "auto"
    enrollment_prompt: str | None = None
    voice_id: str | None = None


class _Maker(Protocol):
    """What :func:`create_voice` needs of a voicing (local or remote)."""

    async def make(self, order: VoiceOrder, data: bytes, filename: str,
                   progress: Progress) -> tuple[Voice, list[str]]: ...

    def precompute(self, voice: Voice, phrases: Sequence[str]) -> asyncio.Task[int]: ...


async def create_voice(voicing: _Maker, name: str, data: bytes, filename: str = "", *, consent: Mapping[str, Any],
                       owner_id: int = 0, transcript: str | None = None, language: str = "auto",
                       enrollment_prompt: str | None = None, progress: Progress | None = None,
                       phrases: Sequence[str] = (), voice_id: str | None = None) -> tuple[Voice, list[str]]:
    """Validate and encode an uploaded clip, store the voice, start precomputing ``phrases``: the argument handling
    of ``create``, one body for the local :class:`Voicing` and the remote one (``synthesis.cluster.client``).

    ``consent`` is the speaker's consent record (``user_id``, ``text``; see ``synthesis.voices.Consent``): nothing
    is stored without it. ``voice_id``: the id reserved for it (a new one when None). Returns the voice and the
    clip's warnings.
    """
    check_name(name)  # a name the store would refuse is refused before any decoding or encoding
    order = VoiceOrder(name, dict(consent), int(owner_id), transcript, language, enrollment_prompt, voice_id)
    voice, warnings = await voicing.make(order, data, filename, progress or _no_progress)
    if phrases:
        voicing.precompute(voice, phrases)
    return voice, list(warnings)


def _no_progress(stage: str, fraction: float) -> None:
    """A :data:`Progress` that reports nowhere."""


def _told_what_was_kept(ref: Reference, has_transcript: bool, subject: str = "the voice") -> Reference:
    """The reference with its ``kept`` line finished for the person: what became of the transcript, and the fix;
    ``subject`` is what the clip makes ("the voice", or a style: "the style 'calm'").

    No ASR checks which words the kept seconds say, so a transcript of an upload whose speech was partly left out is
    never stored (the voice or style is made reference-free); to keep one, the person sends only the seconds they
    want.
    """
    if not ref.kept:
        return ref
    if has_transcript:
        tail = (f", so its transcript was not stored and {subject} is reference-free; to keep a transcript, send "
                "only the seconds you want, with the words said in them")
    else:
        tail = "; to choose the part yourself, send only the seconds you want"
    kept = ref.kept.replace("the voice uses", f"{subject} uses", 1)  # the upload's line names the voice
    return dataclasses.replace(ref, kept=kept + tail)


class Voicing:
    """Creates, re-encodes, precomputes and deletes voices for the loaded model. One per synthesizer.

    Parameters
    ----------
    stages: the pipeline's stages (their worker runs the model work, their caches get the precomputed phrases).
    store: the voice folders.
    limits: the upload limits (``max_upload_bytes``, ``max_upload_s``, ``min_speech_s``, ``max_speech_s``).
    defaults: the sampling options a precompute uses when not told.
    """

    def __init__(self, stages: Stages, store: VoiceStore, limits: Limits, defaults: SynthesisParams) -> None:
        self.stages = stages
        self.store = store
        self.limits = limits
        self.defaults = defaults
        self.uses_sv: bool | None = None  # does the engine's SoVITS read SV features (v2Pro)? None: not yet known
        self._precomputing = VoiceTasks()
        self._reencoding: dict[str, asyncio.Lock] = {}  # voice id -> lock held while it is re-encoded
        self._timbres = Timbres()  # the fused ge of each combination of voices a request named (aux_ref_audio_paths)

    @property
    def engine(self) -> Engine:
        return self.stages.engine

    # ---- create ------------------------------------------------------------------------------------------------

    create = create_voice  # the argument handling, one body with the remote voicing's

    async def make(self, order: VoiceOrder, data: bytes, filename: str,
                   progress: Progress = _no_progress) -> tuple[Voice, list[str]]:
        """Decode and encode the clip of a checked order, and store the voice: (voice, the clip's warnings)."""
        progress("decoding", 0.0)
        ref = await self._prepare(data, filename)
        progress("encoding", 0.3)
        prompt_text = (order.transcript or order.enrollment_prompt or "").strip()
        ref = _told_what_was_kept(ref, bool(prompt_text))
        if ref.speech_left_out:
            prompt_text = ""  # it covers words the kept audio does not say: GPT-SoVITS would garble or repeat them
        prompt = await self._encode_prompt(ref.wav16k, ref.wav32k, prompt_text, order.language)
        self._check_prompt_room(prompt.prompt_phones.size, prompt.prompt_tokens.size)
        progress("storing", 0.8)
        voice = await asyncio.to_thread(
            self.store.create, order.name, ref, prompt, owner_id=order.owner_id, language=order.language,
            prompt_text=prompt_text, model_id=self.engine.model_id, consent=order.consent,
            enrollment_prompt=order.enrollment_prompt, voice_id=order.voice_id)
        progress("done", 1.0)
        return voice, [ref.kept, *ref.warnings] if ref.kept else list(ref.warnings)

    async def _encode_prompt(self, wav16k: np.ndarray, wav32k: np.ndarray, prompt_text: str,
                             language: str) -> VoicePrompt:
        worker, engine = self.stages.worker, self.engine
        # v2Pro/v2ProPlus: the clip's speaker-verification features, fused into its style and kept with the voice
        # (the engine checks at decode time that a voice's features match its model); None for a v2 model
        sv = await worker.call(lambda: engine.encode_speaker([wav32k]))
        sv_emb = None if sv is None else np.asarray(sv, np.float32)  # [1, sv_dim]
        self.uses_sv = sv_emb is not None
        family = engine.family
        ref_mel = None
        if family in DIFFUSION_FAMILIES:  # checked before any other model work: the voice needs both
            if not prompt_text:
                raise VoiceError(f"the loaded {family} model needs the clip's transcript (prompt_text): give the words "
                                 "spoken in the clip")
            try:  # its mel prompt, from the clip as it is (upstream: not loudness-normalised)
                ref_mel = await worker.call(lambda: engine.reference_mel(wav32k, SAMPLE_RATE))
            except EngineError as e:
                raise VoiceError(str(e)) from None
        if prompt_text:
            if prompt_text[-1] not in "，。？！,.?!~:：—…":
                prompt_text += "." if language == "en" else "。"
            ph = await asyncio.to_thread(text_to_phonemes, prompt_text, language)
            # checked before the model work, with the tokens the clip will give (25 per second)
            self._check_prompt_room(len(ph.ids), math.ceil(wav16k.size / SSL_SAMPLE_RATE * TOKENS_PER_S))
            await self.stages.load_bert_for(ph)
            bert = await worker.call(lambda: bert_features(ph, engine.text_features))
            tokens, ge = await worker.call(lambda: engine.encode_reference(wav16k, [wav32k], sv_emb=sv_emb))
            if ref_mel is not None and np.asarray(tokens).size == 0:
                raise VoiceError("the clip gave no semantic tokens for the model's prompt; record 3 to 10 s of speech")
            return VoicePrompt(np.asarray(tokens, np.int64), np.asarray(ge, np.float32),
                               np.asarray(ph.ids, np.int64), np.asarray(bert, np.float32), sv_emb, family=family,
                               ref_mel=ref_mel)
        _, ge = await worker.call(lambda: engine.encode_reference(None, [wav32k], sv_emb=sv_emb))
        return VoicePrompt(np.zeros(0, np.int64), np.asarray(ge, np.float32), np.zeros(0, np.int64),
                           np.zeros((1024, 0), np.float32), sv_emb, family=family)

    async def _prepare(self, data: bytes, filename: str) -> Reference:
        """An upload -> a reference clip, as a voice's main clip is prepared (the same checks and messages)."""
        lim = self.limits
        return await asyncio.to_thread(reference_from_upload, data, filename, max_bytes=lim.max_upload_bytes,
                                       max_seconds=lim.max_upload_s, min_s=lim.min_speech_s, max_s=lim.max_speech_s)

    async def _clip_ges(self, clips32k: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Each clip's ``ge`` ``[gin, 1]`` on its own (v2Pro/v2ProPlus: fused with its own SV features, as upstream
        does per reference before averaging)."""
        worker, engine = self.stages.worker, self.engine
        ges: list[np.ndarray] = []
        for clip in clips32k:
            _, ge = await worker.call(lambda clip=clip: engine.encode_reference(None, [clip]))
            ges.append(np.asarray(ge, np.float32))
        return ges

    # ---- extra clips and styles --------------------------------------------------------------------------------

    async def add_clips(self, voice: Voice, uploads: Sequence[tuple[bytes, str]], *,
                        consent: Mapping[str, Any]) -> tuple[Voice, list[str]]:
        """Store extra clips with a voice: each prepared like its main clip, its ``ge`` averaged with the voice's
        clips' (upstream's aux references: timbre only; the prompt tokens and transcript stay the main clip's).

        ``uploads``: (file bytes, file name) each; ``consent``: the speaker's consent record for them (as
        :func:`create_voice` takes it), stored with each clip: nothing is stored without it. Returns the new
        version and each clip's warnings, prefixed by the clip's file name. Nothing is stored when any clip is
        refused.
        """
        record = check_consent(consent)  # refused before any decoding or encoding
        voice = await self.fit(voice)
        refs = [await self._prepare(data, filename) for data, filename in uploads]
        ges = await self._clip_ges([r.wav32k for r in refs])
        clip_ges = np.concatenate([voice.ges, np.stack(ges)], axis=0)  # [K, gin, 1], main clip first
        prompt = dataclasses.replace(voice.prompt, ge=clip_ges.mean(axis=0).astype(np.float32))
        stored = await asyncio.to_thread(self.store.add_clips, voice.id, refs, prompt, clip_ges, consent=record)
        warnings = [f"{filename}: {w}" for (_, filename), r in zip(uploads, refs)
                    for w in ([r.kept] if r.kept else []) + list(r.warnings)]
        return stored, warnings

    async def add_style(self, voice: Voice, style: str, data: bytes, filename: str, *, consent: Mapping[str, Any],
                        transcript: str = "", language: str = "auto") -> tuple[Voice, list[str]]:
        """Store a named style of a voice: a reference of its own (prompt tokens, transcript, ``ge``), prepared
        and encoded like a voice's main clip, with ``consent``, the speaker's consent record for its clip (as
        :func:`create_voice` takes it; nothing is stored without it). Returns the new version and the clip's
        warnings."""
        check_name(style, "style name")
        record = check_consent(consent)  # refused before any decoding or encoding
        voice = await self.fit(voice)
        ref = _told_what_was_kept(await self._prepare(data, filename), bool(transcript.strip()),
                                  f"the style {style!r}")
        prompt_text = "" if ref.speech_left_out else transcript.strip()
        prompt = await self._encode_prompt(ref.wav16k, ref.wav32k, prompt_text, language)
        self._check_prompt_room(prompt.prompt_phones.size, prompt.prompt_tokens.size)
        stored = await asyncio.to_thread(self.store.put_style, voice.id, style, ref, prompt, language=language,
                                         prompt_text=prompt_text, consent=record)
        return stored, [ref.kept, *ref.warnings] if ref.kept else list(ref.warnings)

    async def remove_style(self, voice: Voice, style: str) -> Voice:
        """Remove a named style of a voice (its clip, arrays and cache entries go with the new version)."""
        return await asyncio.to_thread(self.store.remove_style, voice.id, style)

    async def speaking(self, voice: Voice, params: SynthesisParams) -> Voice:
        """What a request speaks with: the fitted voice in the style ``params.style`` names, its ``ge`` averaged
        with every clip of the voices ``params.aux_voices`` names (each fitted to the loaded model too).

        Raises
        ------
        VoiceNotFound
            the voice has no such style, or an aux voice is gone.
        """
        chosen = with_style(voice, params.style)
        if not params.aux_voices:
            return chosen
        aux: list[Voice] = []
        for voice_id in params.aux_voices:
            aux.append(await self.fit(await asyncio.to_thread(self.store.get, voice_id)))
        return self._timbres.speak_with(chosen, aux)

    def _check_prompt_room(self, phones: int, tokens: int) -> None:
        """Refuse a reference whose transcript and tokens leave the GPT no room for a sentence.

        Every request puts the reference's phones and prompt tokens in front of the sentence, in a context of
        ``engine.max_context`` positions; an overlong transcript would make every synthesis with the voice fail.
        """
        context = self.engine.max_context
        used = int(phones) + int(tokens)
        if used + MIN_ROOM_POSITIONS > context:
            raise VoiceError(
                f"the reference is too long for the model: its transcript ({phones} phones) "
                f"and clip ({tokens} tokens) take {used} of the GPT's {context} positions, "
                f"leaving less than the {MIN_ROOM_POSITIONS} a sentence needs; give only the words spoken in "
                "the 3-10 s clip as its transcript")

    # ---- fit to the loaded model -------------------------------------------------------------------------------

    async def fit(self, voice: Voice) -> Voice:
        """The voice as the loaded model needs it: re-encoded (once) from its stored reference clip when its prompt
        was made by another model, so a prompt of one model never conditions another.

        Raises
        ------
        VoiceError
            the voice needs re-encoding but has no stored reference clip; the message says to create it again.
        """
        if await self._fits(voice):
            return voice
        lock = self._reencoding.setdefault(voice.id, asyncio.Lock())
        async with lock:  # concurrent requests for the voice wait for one re-encode
            try:
                stored = await asyncio.to_thread(self.store.get, voice.id)
            except VoiceNotFound:
                raise VoiceError(f"voice {voice.name!r} was made for another model and is not in the voice store, "
                                 "so it cannot be re-encoded; create the voice again") from None
            if await self._fits(stored):  # re-encoded meanwhile (the caller held the previous version)
                return stored
            return await self._reencode(stored)

    async def learn_sv(self) -> bool:
        """Whether the loaded SoVITS reads SV features (asked once, with one second of silence)."""
        if self.uses_sv is None:
            engine = self.engine
            sv = await self.stages.worker.call(lambda: engine.encode_speaker([np.zeros(SAMPLE_RATE, np.float32)]))
            self.uses_sv = sv is not None
        return self.uses_sv

    async def _fits(self, voice: Voice) -> bool:
        """Was this voice's prompt made by the loaded model (its model id, and SV features exactly when it uses
        them)?"""
        if voice.model_id != self.engine.model_id:
            return False
        # a prompt of one family never conditions another; among the v2 families the SV features tell (a voice
        # stored before prompts named their family reads as "v2")
        family = self.engine.family
        if {voice.prompt.family, family} & set(DIFFUSION_FAMILIES) and voice.prompt.family != family:
            return False
        return (voice.prompt.sv_emb is not None) == await self.learn_sv()

    async def _reencode(self, voice: Voice) -> Voice:
        """Encode a stored voice again, from its stored clip and transcript, with the loaded model; store it."""
        try:
            clip, *extras = await asyncio.to_thread(self.store.load_clips, voice.id)  # [N] float32 @ 32 kHz each
        except VoiceNotFound:
            raise VoiceError(f"voice {voice.name!r} was made for another model and its reference clip is missing, "
                             "so it cannot be re-encoded; create the voice again") from None
        log.info("voice %s was encoded by model %s; re-encoding it for model %s", voice.id, voice.model_id,
                 self.engine.model_id)
        wav16k = await asyncio.to_thread(resample, clip, SAMPLE_RATE, SSL_SAMPLE_RATE)  # [M] float32 @ 16 kHz
        prompt = await self._encode_prompt(wav16k, clip, voice.prompt_text, voice.language)
        clip_ges = None
        if extras:  # the extra clips: each one's ge again, averaged with the main clip's
            clip_ges = np.stack([prompt.ge, *await self._clip_ges(extras)])  # [K, gin, 1]
            prompt = dataclasses.replace(prompt, ge=clip_ges.mean(axis=0).astype(np.float32))
        styles: dict[str, VoicePrompt] = {}
        for style in voice.styles.values():  # each its own reference, encoded from its own clip and transcript
            wav32k = await asyncio.to_thread(self.store.load_style_clip, voice.id, style.name)
            wav16k = await asyncio.to_thread(resample, wav32k, SAMPLE_RATE, SSL_SAMPLE_RATE)
            styles[style.name] = await self._encode_prompt(wav16k, wav32k, style.prompt_text, style.language)
        self.stages.stats.counters["voice_reencoded"] += 1
        return await asyncio.to_thread(self.store.replace, voice.id, prompt, model_id=self.engine.model_id,
                                       clip_ges=clip_ges, style_prompts=styles)

    # ---- precompute --------------------------------------------------------------------------------------------

    def precompute(self, voice: Voice, phrases: Sequence[str], progress: Progress | None = None,
                   params: SynthesisParams | None = None) -> asyncio.Task[int]:
        """Compute the prosody of ``phrases`` in the background (live requests always go first)."""
        return self._precomputing.start(voice.id, self._precompute(voice, list(phrases), progress,
                                                                   params or self.defaults))

    async def _precompute(self, voice: Voice, phrases: list[str], progress: Progress | None,
                          params: SynthesisParams) -> int:
        return await precompute_phrases(self.stages, await self.fit(voice), phrases, params, progress)

    async def stop_precompute(self, voice_id: str | None = None) -> None:
        """Cancel the background precomputes of one voice (every voice when None) and wait for them to end."""
        await self._precomputing.stop(voice_id)

    # ---- delete ------------------------------------------------------------------------------------------------

    async def delete(self, voice_id: str) -> Removed:
        """Remove the voice and every byte derived from it (files and cache entries); returns what went.

        Its background precomputes are stopped first, and the cache refuses the voice's entries from now on, so
        a request still in flight for it cannot write its results back after the delete.
        """
        await self.stop_precompute(voice_id)
        removed = await asyncio.to_thread(self.store.delete, voice_id)
        self._reencoding.pop(voice_id, None)
        return removed
