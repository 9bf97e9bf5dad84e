"""The HTTP API's pronunciation dictionary and what a text will be read as.

* ``GET /pronunciations``: the dictionary, in the file format (``synthesis.text.Lexicon``; the same as
  ``python -m bot pronounce export --http``).
* ``POST /pronunciations``: add or replace one entry, ``{"word": "Nguyen", "say": "win"}`` or
  ``{"word": "Nguyen", "phones": "W IH1 N", "lang": "en"}``; or, with an ``entries`` list (a dictionary file),
  add every entry of it (``?replace=true``: the dictionary becomes the file).
* ``PUT /pronunciations``: replace the whole dictionary with the body (a dictionary file).
* ``DELETE /pronunciations?word=Nguyen``: remove one entry (404 when there is none).
* ``GET /phonemes?text=...&text_lang=auto`` or ``POST /phonemes`` with the same as JSON: the sentences, their
  normalised text, language pieces and phones, with the dictionary applied (``dictionary=false``: without it).

The dictionary is the file ``http.pronunciations``; every change is checked whole, then written at once (temp
file + rename). A refused body is a 400 with one line naming the entry and the fix; nothing is written.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from aiohttp import web

from bot.http.api_v2 import ParamReader, check_text, read_json_object
from bot.http.responses import ApiError, services_of
from bot.pronunciations import PronunciationFile, explain_phonemes
from synthesis.text import LexiconError
from synthesis.types import LANGUAGES

if TYPE_CHECKING:
    from bot.services import Services

_ENTRY_KEYS = ("word", "say", "phones", "lang")


def _file(request: web.Request) -> PronunciationFile:
    file = getattr(services_of(request), "pronunciations", None)
    if file is None:  # pragma: no cover - Services always builds one
        raise ApiError(500, "no pronunciation dictionary is configured (http.pronunciations)")
    return file


async def _list(request: web.Request) -> web.Response:
    lexicon = await asyncio.to_thread(_file(request).current)
    return web.json_response(lexicon.to_json(), dumps=_dumps)


async def _add(request: web.Request) -> web.Response:
    body = await read_json_object(request)
    file = _file(request)
    try:
        if "entries" in body:
            replace = ParamReader(request.query).boolean("replace", False)
            imported, total = await asyncio.to_thread(file.import_file, body, replace=replace)
            return web.json_response({"imported": imported, "entries": total})
        unknown = sorted(k for k in body if k not in _ENTRY_KEYS)
        if unknown:
            raise ApiError(400, f"unknown key {unknown[0]!r}: send word, and say or phones (with lang); or a "
                                "dictionary file with an entries list")
        r = ParamReader(body)
        entry, replaced = await asyncio.to_thread(
            file.add, r.string("word", hint="the word or phrase to fix"), say=r.string("say", None),
            phones=r.string("phones", None), lang=r.string("lang", None, lower=True))
    except LexiconError as e:
        raise ApiError(400, str(e)) from None
    return web.json_response({"entry": entry.to_json(), "replaced": replaced, "entries": len(file.current())},
                             status=200 if replaced else 201, dumps=_dumps)


async def _replace(request: web.Request) -> web.Response:
    body = await read_json_object(request)
    try:
        imported, total = await asyncio.to_thread(_file(request).import_file, body, replace=True)
    except LexiconError as e:
        raise ApiError(400, str(e)) from None
    return web.json_response({"imported": imported, "entries": total})


async def _remove(request: web.Request) -> web.Response:
    word = ParamReader(request.query).string("word", hint="pass ?word=THE_WORD")
    if not await asyncio.to_thread(_file(request).remove, word):
        raise ApiError(404, f"{word[:64]!r} is not in the dictionary: GET /pronunciations lists it")
    return web.json_response({"removed": word, "entries": len(_file(request).current())}, dumps=_dumps)


async def _phonemes(request: web.Request) -> web.Response:
    services = services_of(request)
    values = await read_json_object(request) if request.method == "POST" else request.query
    r = ParamReader(values)
    text = check_text(r.string("text", hint="the words to read"), services.config)
    language = r.string("text_lang", services.config.synthesis.language, choices=LANGUAGES, lower=True)
    lexicon = await asyncio.to_thread(_file(request).current) if r.boolean("dictionary", True) else None
    return web.json_response(await explain_phonemes(text, language, lexicon), dumps=_dumps)


def _dumps(obj: Any) -> str:
    """JSON with the text as written (not \\u escapes): what a user reads back."""
    return json.dumps(obj, ensure_ascii=False)


def add_routes(app: web.Application, services: Services) -> None:
    """Register ``/pronunciations`` and ``/phonemes``; the dictionary file is read (and checked) now."""
    file = getattr(services, "pronunciations", None)
    if file is not None:
        file.load()  # a bad file stops the server at start, naming the entry
    app.router.add_get("/pronunciations", _list, name="pronunciations:list")
    app.router.add_post("/pronunciations", _add, name="pronunciations:add")
    app.router.add_put("/pronunciations", _replace, name="pronunciations:replace")
    app.router.add_delete("/pronunciations", _remove, name="pronunciations:remove")
    app.router.add_get("/phonemes", _phonemes, name="pronunciations:phonemes_get")
    app.router.add_post("/phonemes", _phonemes, name="pronunciations:phonemes_post")
