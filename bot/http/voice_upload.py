"""Making a stored voice over HTTP: ``POST /voices`` (voicebot's own) and ElevenLabs' ``POST /v1/voices/add``.

Both take ``multipart/form-data`` and make the voice as ``voices add`` does (the same checks and one-line errors:
a broken or empty upload, too long or too short, no speech, music, a transcript the clip cannot carry...), as an
operator's voice (owner 0), with the common phrases precomputed in the background.

``POST /voices`` fields: ``file`` (the clip, required), ``name`` (required), ``text`` (its transcript; absent or
empty: reference-free), ``language`` (the transcript's, default ``auto``) and ``consent`` (required, ``true``: the
caller states that the recording is their own voice or that they have the speaker's permission to clone it; kept
with the voice). Any other field is a 400. The answer (201): ``voice_id``, ``name``, ``language``, ``transcript``
(as stored: "" when reference-free), ``kept`` (``start_s``/``end_s``/``seconds`` of the ``clip_s``-second upload
that became the reference) and ``warnings``.

``POST /v1/voices/add`` (ElevenLabs' instant voice cloning, as its SDK's ``voices.ivc.create`` sends it): ``name``,
``files`` (one or more: the first is the voice's clip, the others are averaged into its timbre, as ``voices add
--extra``), and consent as ``consent=true`` or in ``labels`` (``{"consent": "true"}``); ``text`` and ``language``
as above (the language also from ``labels`` when it is a language code; ElevenLabs sends no transcript, so such a
voice is reference-free). ``description``, ``remove_background_noise`` and any other field have no effect (named in
``X-Voicebot-Ignored``). The answer: ``{"voice_id", "requires_verification": false}``.

The whole body may be at most ``voices.max_upload_mb`` (plus a little for the other fields): a larger
``Content-Length`` is refused before anything is read, and a body without one is cut off where it passes that.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from bot.config import MB
from bot.http.api_v2 import check_chars
from bot.http.guard import client_of
from bot.http.responses import ApiError, say_ignored, services_of
from synthesis.text import check_speakable
from synthesis.types import LANGUAGES

FORM_ROOM_BYTES = 64 * 1024  # bytes a form may hold besides its audio (name, transcript, labels, part headers)
FIELD_MAX_BYTES = 8 * 1024  # longest text field (a transcript of a 10 s clip is well under 1 KiB)
READ_CHUNK = 64 * 1024  # bytes read from the body at a time
UPLOAD_ROUTES = ("voices:create", "elevenlabs:voices_add")  # the routes whose body limit is the upload's
_TRUE = ("true", "yes", "1", "on")
CONSENT_TEXT = ("stated by the API caller (consent=true): the recording is their own voice, or they have the "
                "speaker's permission to clone it")
_OWN_FIELDS = ("file", "name", "text", "language", "consent")
_ELEVENLABS_FIELDS = ("files", "name", "text", "language", "consent", "labels", "description",
                      "remove_background_noise")


def body_limit(config: Any) -> int:
    """The largest body an upload route reads: one upload (``voices.max_upload_mb``) and the form around it."""
    return int(config.voices.max_upload_mb * MB) + FORM_ROOM_BYTES


@dataclass
class _Form:
    fields: dict[str, str] = field(default_factory=dict[str, str])
    files: list[tuple[str, str, bytes]] = field(default_factory=list[tuple[str, str, bytes]])  # (field, name, bytes)


async def _read_form(request: web.Request, file_fields: tuple[str, ...]) -> _Form:
    """The multipart form, every byte counted against :func:`body_limit`; one-line 400/408/413 otherwise."""
    services = services_of(request)
    if request.content_type != "multipart/form-data":
        raise ApiError(400, f"send the voice as multipart/form-data (a form with a file), not "
                            f"{request.content_type or 'a body without a Content-Type'}")
    timeout = services.config.http.body_timeout_s
    try:
        async with asyncio.timeout(timeout):
            return await _parts(request, file_fields, body_limit(services.config))
    except TimeoutError:
        raise ApiError(408, f"the upload did not arrive within {timeout:g} s (http.body_timeout_s)") from None
    except (ValueError, AssertionError, HttpProcessingError, aiohttp.ClientPayloadError) as e:
        raise ApiError(400, f"the form is malformed ({type(e).__name__}): send multipart/form-data") from None


async def _parts(request: web.Request, file_fields: tuple[str, ...], limit: int) -> _Form:
    form = _Form()
    total = 0
    reader = await request.multipart()
    while True:
        part = await reader.next()
        if part is None:
            return form
        if not isinstance(part, aiohttp.BodyPartReader):
            raise ApiError(400, "a nested multipart part is not a form field: send plain fields and files")
        name = part.name or ""
        is_file = name in file_fields or part.filename is not None
        cap = limit if is_file else FIELD_MAX_BYTES
        chunks: list[bytes] = []
        size = 0
        while chunk := await part.read_chunk(READ_CHUNK):
            size += len(chunk)
            total += len(chunk)
            if total > limit:
                mb = services_of(request).config.voices.max_upload_mb
                raise ApiError(413, f"the upload is larger than {mb:g} MB (voices.max_upload_mb): send a shorter "
                                    "clip (3-10 s of speech is what a voice needs)")
            if size > cap:
                raise ApiError(400, f"the form field {name!r} is longer than {FIELD_MAX_BYTES // 1024} KiB: send "
                                    "the words said in the clip only")
            chunks.append(chunk)
        data = b"".join(chunks)
        if is_file:
            form.files.append((name, part.filename or "", data))
        else:
            try:
                form.fields[name] = check_chars(data.decode("utf-8"), name)
            except UnicodeDecodeError:
                raise ApiError(400, f"the form field {name!r} is not UTF-8 text") from None


def _consented(value: str | None) -> bool:
    return value is not None and value.strip().lower() in _TRUE


def _language(value: str | None) -> str:
    language = (value or "auto").strip().lower() or "auto"
    if language not in LANGUAGES:
        raise ApiError(400, f"language must be one of {', '.join(LANGUAGES)}; got {value!r}")
    check_speakable(language)  # a language this build cannot read: one line naming the package, before any work
    return language


async def _make(request: web.Request, name: str, uploads: list[tuple[str, bytes]], text: str | None,
                language: str) -> tuple[Any, list[str]]:
    """The voice from the first upload, the others averaged into its timbre; nothing is kept when one fails."""
    services = services_of(request)
    voicing = services.synthesizer.voicing
    (filename, data), extras = uploads[0], uploads[1:]
    consent = {"user_id": 0, "text": CONSENT_TEXT, "via": f"POST {request.path}", "client": client_of(request),
               "clip": filename, "clip_bytes": len(data)}
    voice, warnings = await voicing.create(name, data, filename, consent=consent, owner_id=0,
                                           transcript=(text or "").strip() or None, language=language,
                                           phrases=services.config.phrases)
    if extras:
        try:
            voice, more = await voicing.add_clips(voice, [(d, f) for f, d in extras], consent=consent)
        except BaseException:
            await voicing.delete(voice.id)  # a voice without the clips it was given is not kept
            raise
        warnings = [*warnings, *more]
    return voice, list(warnings)


def _consent_error() -> ApiError:
    return ApiError(400, "consent is required: send consent=true to state that the recording is your own voice, or "
                         "that you have the speaker's permission to clone it")


async def _create(request: web.Request) -> web.Response:
    form = await _read_form(request, ("file",))
    unknown = sorted({*form.fields, *(f for f, _, _ in form.files)} - set(_OWN_FIELDS))
    if unknown:
        raise ApiError(400, f"unknown form field {unknown[0]!r}: send {', '.join(_OWN_FIELDS)}")
    if not _consented(form.fields.get("consent")):
        raise _consent_error()
    files = [(filename or "upload", data) for f, filename, data in form.files if f == "file"]
    if len(files) != 1:
        raise ApiError(400, "send exactly one audio file in the form field 'file' (3-10 s of speech)")
    name = form.fields.get("name", "").strip()
    if not name:
        raise ApiError(400, "name is required: the voice's name (1-32 letters, digits, spaces, '_' or '-')")
    language = _language(form.fields.get("language"))
    voice, warnings = await _make(request, name, files, form.fields.get("text"), language)
    meta = await asyncio.to_thread(services_of(request).synthesizer.voices.meta, voice.id)
    ref = meta.get("reference") or {}
    kept = {"start_s": ref.get("start_s", 0.0), "end_s": ref.get("end_s", 0.0),
            "seconds": round(float(ref.get("end_s", 0.0)) - float(ref.get("start_s", 0.0)), 3),
            "clip_s": ref.get("clip_s", 0.0)}
    return web.json_response({"voice_id": voice.id, "name": voice.name, "language": voice.language,
                              "transcript": voice.prompt_text, "kept": kept, "warnings": warnings}, status=201,
                             dumps=_dumps)


async def _elevenlabs_add(request: web.Request) -> web.Response:
    form = await _read_form(request, ("files",))
    labels = _labels(form.fields.get("labels"))
    for ignored in ("description", "remove_background_noise"):
        if form.fields.get(ignored, "").strip().lower() not in ("", "false", "0"):
            say_ignored(request, ignored)
    for unknown in sorted({*form.fields, *(f for f, _, _ in form.files)} - set(_ELEVENLABS_FIELDS)):
        say_ignored(request, unknown)
    if not _consented(form.fields.get("consent") or labels.get("consent")):
        raise ApiError(400, "consent is required: send consent=true (or labels {\"consent\": \"true\"}) to state "
                            "that the recording is your own voice, or that you have the speaker's permission to "
                            "clone it")
    files = [(filename or f"file-{i + 1}", data) for i, (f, filename, data) in enumerate(form.files)
             if f == "files"]
    if not files:
        raise ApiError(400, "files is required: one or more audio files of the voice (3-10 s of speech each)")
    name = form.fields.get("name", "").strip()
    if not name:
        raise ApiError(400, "name is required: the voice's name (1-32 letters, digits, spaces, '_' or '-')")
    label = labels.get("language", "").strip().lower()  # ElevenLabs' labels are free text ("English")
    if label and label not in LANGUAGES:
        say_ignored(request, "labels.language")
    language = _language(form.fields.get("language") or (label if label in LANGUAGES else None))
    voice, _ = await _make(request, name, files, form.fields.get("text"), language)
    return web.json_response({"voice_id": voice.id, "requires_verification": False})


def _labels(raw: str | None) -> dict[str, str]:
    """ElevenLabs' ``labels``: a JSON object of strings (``{"accent": "british"}``)."""
    if not raw or not raw.strip():
        return {}
    try:
        labels = json.loads(raw)
    except ValueError:
        raise ApiError(400, "labels must be a JSON object of strings, like {\"consent\": \"true\"}") from None
    if labels is None:  # what the SDK sends when no labels were given
        return {}
    if not isinstance(labels, dict):
        raise ApiError(400, "labels must be a JSON object of strings, like {\"consent\": \"true\"}")
    return {str(k): str(v) for k, v in labels.items()}


def _dumps(obj: Any) -> str:
    """JSON with names and transcripts as written (not \\u escapes)."""
    return json.dumps(obj, ensure_ascii=False)


def add_routes(app: web.Application) -> None:
    """Register ``POST /voices`` and ``POST /v1/voices/add``."""
    app.router.add_post("/voices", _create, name=UPLOAD_ROUTES[0])
    app.router.add_post("/v1/voices/add", _elevenlabs_add, name=UPLOAD_ROUTES[1])
