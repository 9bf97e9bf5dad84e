"""SillyTavern's "GPT-SoVITS-V2" TTS provider: ``GET /speakers`` and ``POST /``.

The provider (``public/scripts/extensions/tts/gpt-sovits-v2.js``) lists voices from ``/speakers`` as objects with
``name`` and ``voice_id``, then posts api_v2-style JSON to ``/`` with ``ref_audio_path`` set to
``./参考音频/<voice_id>.wav`` and ``prompt_text`` derived from the voice id, ``streaming_mode: "true"``,
``media_type: "ogg"``. Here the file stem names the stored voice (its transcript is already stored, so the derived
``prompt_text`` is ignored); the SillyTavern adapter's ``target_voice`` is accepted too. Everything else is parsed
and streamed exactly as api_v2's ``/tts``. Its UI runs in the browser: allow its origin in ``http.cors_origins``.
It cannot send a token: put its machine in ``http.trusted_networks`` when the API needs one. Errors are a JSON
string, which its UI shows as the message (it prints ``await response.json()``).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bot.http.api_v2 import parse_tts, read_json_object, respond, voice_catalog
from bot.http.responses import services_of, voices_of

MEDIA_TYPES = ("wav", "raw", "ogg", "aac", "mp3", "flac")  # what the provider's players can ask for
AUTO_MEDIA_TYPE = "mp3"  # "auto" (the adapter's default): the format every browser plays


async def speakers(voices: Any) -> list[dict[str, str]]:
    """The voice list in the provider's shape: ``name`` shown, ``voice_id`` sent back (the name, or the id when
    names collide)."""
    return [{"name": display, "voice_id": key} for key, display, _ in await voice_catalog(voices)]


async def _speakers(request: web.Request) -> web.Response:
    return web.json_response(await speakers(voices_of(services_of(request))))


async def _generate(request: web.Request) -> web.StreamResponse:
    services = services_of(request)
    body = await read_json_object(request)
    values: dict[str, Any] = dict(body)
    if body.get("ref_audio_path") in (None, ""):
        for key in ("target_voice", "voice_id", "voice"):
            if isinstance(body.get(key), str):
                values["ref_audio_path"] = body[key]
                break
    values.setdefault("text_lang", "auto")
    if isinstance(values.get("media_type"), str) and values["media_type"].strip().lower() == "auto":
        values["media_type"] = AUTO_MEDIA_TYPE
    # its players are browsers and common decoders, not upstream's own scripts: a streamed WAV says "to the end"
    return await respond(request, await parse_tts(values, services, media_types=MEDIA_TYPES), wav_size_unknown=True)


def add_routes(app: web.Application) -> None:
    """Register ``/speakers`` and ``POST /``."""
    app.router.add_get("/speakers", _speakers, name="sillytavern:speakers")
    app.router.add_post("/", _generate, name="sillytavern:generate")
