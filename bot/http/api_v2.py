"""GPT-SoVITS ``api_v2`` on top of the one pipeline: ``GET/POST /tts`` and its control endpoints.

Parameters, types and defaults are upstream's ``TTS_Request`` (a pydantic model here too, so its coercion rules
hold: numbers as JSON numbers or query strings, booleans as ``true``/``"true"``/``1``; ``text``, ``text_lang``,
``ref_audio_path`` required; ``streaming_mode`` a bool or 0-3). An empty value counts as not sent, as upstream's
clients mean it. Defaults for the sampling options come from ``synthesis:`` in config.yaml, whose shipped values
are upstream's. A NUL byte or an unpaired surrogate in any value is a 400.

How upstream's parameters map here:

* ``ref_audio_path``: a stored voice's name or id; a clip inside one of ``http.reference_dirs`` (absolute, or
  relative to each folder), upstream's own use: read with ``prompt_text`` and ``prompt_lang`` (required with a
  transcript; no transcript: reference-free, as upstream), encoded once and kept as a voice by the hash of the
  file, transcript and language (``bot.http.reference_files``); a path whose file name (stem) names a stored voice
  (clients such as AstrBot's plugin and SillyTavern send ``/their/dir/alice`` or ``./参考音频/alice.wav``; that file
  is never opened); or a path to a stored voice's folder or one of its files inside ``voices.dir`` (absolute, or
  relative to that folder or to the working directory). Any other path (``..``, a symlink pointing out, a file that
  is not a stored voice's, a name too long for a file system) is refused with 400. A stored voice's own reference,
  transcript and language are used, so for it ``prompt_text`` and ``prompt_lang`` are validated and otherwise
  ignored.
* ``aux_ref_audio_paths``: each must resolve like ``ref_audio_path``, to a stored voice or a reference clip (its
  transcript unused); as upstream, they change
  the timbre only: the decode's style vector ``ge`` is the mean over every clip of the main voice (its extra clips
  too) and of each aux voice, while the prompt tokens and transcript stay the main voice's. Audio made so is not
  kept in the audio cache (it would outlive the deletion of an aux voice).
* No-ops, validated for type and range: ``batch_size``, ``batch_threshold``, ``split_bucket``, ``parallel_infer``
  (the scheduler batches across requests by itself), ``super_sampling`` (v3 only), ``overlap_length`` and
  ``min_chunk_length`` (token streaming); ``sample_steps`` and ``cfg_rate`` with a v2-family model (no sampler).
* ``sample_steps``, ``cfg_rate``: the v3/v4/v5 sampler's steps and guidance (unset: the family's defaults; v5 takes
  4, 8, 16 or 32 steps, another count is a 400).
* ``streaming_mode``: 0/false = one body; 1/true = one chunk per sentence. 2 and 3 (token chunks upstream) stream
  per sentence too: the pipeline yields whole sentences, and per-sentence decoding is upstream's best quality.
* ``noise_scale`` (not upstream's): the SoVITS noise, default from config.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping

import pydantic
from aiohttp import web

from bot.config import Config
from bot.http.reference_files import REFERENCE_OWNER, reference_path, reference_voice
from bot.http.responses import ApiError, pydantic_message, services_of, stream_audio, voices_of, whole_audio
from synthesis import SpeechError, SynthesisParams, Voice
from synthesis.text import check_speakable
from synthesis.types import LANGUAGES, SPLIT_METHODS, VoiceNotFound

if TYPE_CHECKING:
    from bot.services import Services
    from bot.voice_service import VoiceService

MEDIA_TYPES = ("wav", "raw", "ogg", "aac")
ReferenceLookup = Callable[[str, str], Awaitable["Voice | None"]]  # (ref_audio_path, field name) -> voice or None
MAX_SEED = 2**63 - 1
_ID_RE = re.compile(r"[\w-]{1,64}")  # what may be passed to VoiceStore.get
_NAME_RE = re.compile(r"[\w -]{1,32}")  # what may be passed to VoiceStore.find
_MISSING: Any = object()
_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_NAME_CHARS = 255  # longest file name (and ref_audio_path) a file system takes
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


class ParamReader:
    """Typed, range-checked parameters from a JSON object or a query string (WebSocket queries, control endpoints).

    Every failure is an :class:`ApiError` 400 naming the parameter, what it accepts and what arrived. ``null``
    counts as absent.
    """

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = values

    def raw(self, name: str) -> Any:
        value = self._values.get(name)
        if value is None or value == "":  # upstream's clients send empty values for "not set"
            return None
        if isinstance(value, str):
            check_chars(value, name)
        return value

    def string(self, name: str, default: Any = _MISSING, *, choices: tuple[str, ...] | None = None,
               lower: bool = False, hint: str = "") -> Any:
        value = self.raw(name)
        if value is None:
            return self._default(name, default, hint)
        if not isinstance(value, str):
            raise ApiError(400, f"{name} must be a string, got {value!r}")
        if lower:
            value = value.strip().lower()
        if choices is not None and value not in choices:
            raise ApiError(400, f"{name} must be one of {', '.join(choices)}; got {value!r}")
        return value

    def integer(self, name: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
        value = self.raw(name)
        if value is None:
            return default
        number: int | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, float) and value.is_integer():
            number = int(value)
        elif isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+\s*", value):
            number = int(value)
        if number is None or (lo is not None and number < lo) or (hi is not None and number > hi):
            raise ApiError(400, f"{name} must be an integer{_range(lo, hi)}; got {value!r}")
        return number

    def number(self, name: str, default: float, lo: float | None = None, hi: float | None = None, *,
               lo_open: bool = False) -> float:
        value = self.raw(name)
        if value is None:
            return default
        number: float | None = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                number = None
        bad = number is None or not math.isfinite(number)
        if not bad and lo is not None:
            bad = number <= lo if lo_open else number < lo  # type: ignore[operator]
        if not bad and hi is not None:
            bad = number > hi  # type: ignore[operator]
        if bad:
            parts = [("above " if lo_open else "from ") + f"{lo:g}"] if lo is not None else []
            parts += [f"up to {hi:g}"] if hi is not None else []
            span = " " + " ".join(parts) if parts else ""
            raise ApiError(400, f"{name} must be a number{span}; got {value!r}")
        assert number is not None
        return number

    def boolean(self, name: str, default: bool) -> bool:
        value = self.raw(name)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise ApiError(400, f"{name} must be true or false; got {value!r}")

    def _default(self, name: str, default: Any, hint: str) -> Any:
        if default is _MISSING:
            raise ApiError(400, f"{name} is required" + (f": {hint}" if hint else ""))
        return default


def check_chars(value: str, name: str) -> str:
    """Refuse a NUL byte or an unpaired surrogate (neither is text; both break paths and encoders)."""
    if "\x00" in value or _SURROGATE.search(value):
        raise ApiError(400, f"{name} contains a NUL byte or an unpaired surrogate: send valid UTF-8 text")
    return value


def _range(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f" from {lo} to {hi}"
    if lo is not None:
        return f" >= {lo}"
    if hi is not None:
        return f" <= {hi}"
    return ""


def base_params(config: Config, services: Services | None = None) -> SynthesisParams:
    """The server's default :class:`SynthesisParams` (config ``synthesis:``), with the HTTP API's pronunciation
    dictionary (``http.pronunciations``, re-read when the file changes) when ``services`` has one that is not empty."""
    file = getattr(services, "pronunciations", None)
    lexicon = file.current() if file is not None else None
    return dataclasses.replace(config.synthesis.params, lexicon=lexicon) if lexicon else config.synthesis.params


def make_params(base: SynthesisParams, **changes: Any) -> SynthesisParams:
    """``base`` with ``changes``; a value SynthesisParams refuses, or a language this build cannot read (a package
    missing), becomes a 400 before any work is done."""
    try:
        params = dataclasses.replace(base, **changes)
        check_speakable(params.language)
    except (ValueError, SpeechError) as e:
        raise ApiError(400, str(e)) from e
    return params


def check_text(text: str, config: Config, name: str = "text") -> str:
    """Refuse empty or over-long text (``http.max_text_chars``)."""
    if not text.strip():
        raise ApiError(400, f"{name} is empty: send the words to speak")
    limit = config.http.max_text_chars
    if len(text) > limit:
        raise ApiError(400, f"{name} is {len(text)} characters long; the limit is {limit} "
                            "(http.max_text_chars): send it in parts")
    return text


# ---- voices ------------------------------------------------------------------------------------------------------

async def lookup_voice(voices: VoiceService, key: str) -> Voice | None:
    """A stored voice by id or name (any owner), or None."""
    key = key.strip()
    if _ID_RE.fullmatch(key):
        try:
            return await voices.get(key)
        except (VoiceNotFound, KeyError, ValueError, OSError):
            pass
    if _NAME_RE.fullmatch(key):
        try:
            return await voices.find(key)
        except (VoiceNotFound, KeyError, ValueError):
            pass
    return None


async def voice_names(voices: VoiceService, limit: int = 20) -> str:
    """The stored voices' names, for error messages."""
    names = sorted({v.name for v in await voices.list() if v.owner_id != REFERENCE_OWNER})
    if not names:
        return "there are no voices yet: create one first (Discord /voice create, or `python -m bot voices add`)"
    more = f" (and {len(names) - limit} more)" if len(names) > limit else ""
    return "available voices: " + ", ".join(names[:limit]) + more


async def voice_catalog(voices: VoiceService) -> list[tuple[str, str, Voice]]:
    """Every stored voice as (key, display name, voice), sorted by name; the key is the name, or the id when
    several owners use the same name."""
    stored = sorted((v for v in await voices.list() if v.owner_id != REFERENCE_OWNER),
                    key=lambda v: (v.name.lower(), v.id))
    counts: dict[str, int] = {}
    for v in stored:
        counts[v.name] = counts.get(v.name, 0) + 1
    return [(v.name, v.name, v) if counts[v.name] == 1 else (v.id, f"{v.name} ({v.id[:8]})", v) for v in stored]


async def resolve_ref(voices: VoiceService, voices_dir: Path, ref: str, name: str = "ref_audio_path", *,
                      references: ReferenceLookup | None = None) -> Voice:
    """``ref_audio_path`` -> a stored voice: its name or id; the voice ``references`` gives for a clip inside
    ``http.reference_dirs`` (``bot.http.reference_files``); a path whose file name (stem) names a stored voice (as
    clients that resolve the name to a path of their own send it); or a path inside the voices folder that belongs
    to a voice. No file outside the voices folder and the reference folders is ever opened.

    Raises :class:`ApiError` 400 for anything else, paths that leave those folders above all.
    """
    ref = check_chars(ref, name).strip()
    if not ref:
        raise ApiError(400, f"{name} is empty: name a stored voice; {await voice_names(voices)}")
    if len(ref) > 4096 or any(len(part) > MAX_NAME_CHARS for part in ref.replace("\\", "/").split("/")):
        raise ApiError(400, f"{name} is too long to be a path ({len(ref)} characters): name a stored voice; "
                            f"{await voice_names(voices)}")
    voice = await lookup_voice(voices, ref)
    if voice is not None:
        return voice
    if references is not None:
        voice = await references(ref, name)
        if voice is not None:
            return voice
    text = ref.replace("\\", "/")
    stem = PurePosixPath(text).stem
    if stem and stem != text:
        voice = await lookup_voice(voices, stem)
        if voice is not None:
            return voice
    if ".." in PurePosixPath(text).parts:
        raise ApiError(400, f"{name} may not contain '..': name a stored voice, or a file inside the voices folder")
    try:
        return await _voice_of_path(voices, voices_dir, text, ref, name, references is not None)
    except (OSError, ValueError) as e:  # ENAMETOOLONG, ELOOP, EACCES...: not a voice's file, whatever it is
        raise ApiError(400, f"{name} {ref[:80]!r} is not a usable path ({type(e).__name__}): name a stored voice; "
                            f"{await voice_names(voices)}") from None


async def _voice_of_path(voices: VoiceService, voices_dir: Path, text: str, ref: str, name: str,
                         reference_dirs: bool) -> Voice:
    root = Path(os.path.realpath(voices_dir))
    given = Path(os.path.expanduser(text))
    candidates = [given] if given.is_absolute() else [root / given, Path.cwd() / given]
    inside = [Path(os.path.realpath(c)) for c in candidates]  # symlinks resolved: a link pointing out is outside
    inside = [p for p in inside if p == root or root in p.parents]
    if not inside:
        also, usable = (" or a clip inside http.reference_dirs", "stored voices and those clips") if reference_dirs \
            else ("", "only stored voices")
        raise ApiError(400, f"{name} {ref!r} is neither a stored voice nor a file inside the voices folder{also}: "
                            f"{usable} can be used; {await voice_names(voices)}")
    for path in inside:
        if path == root or not path.exists():
            continue
        voice_id = path.relative_to(root).parts[0]
        voice = await lookup_voice(voices, voice_id) if _ID_RE.fullmatch(voice_id) else None
        if voice is not None and voice.id == voice_id:
            return voice
        raise ApiError(400, f"{name} {ref!r} is inside the voices folder but is not a stored voice's file; "
                            f"{await voice_names(voices)}")
    if reference_dirs:
        raise ApiError(400, f"{name} {ref!r}: no such voice, and no such file inside http.reference_dirs (links out "
                            f"of them are not followed); {await voice_names(voices)}")
    raise ApiError(400, f"{name} {ref!r}: no such voice or file; {await voice_names(voices)}")


# ---- /tts --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TtsRequest:
    """A validated api_v2 request, ready for ``Synthesizer.stream``."""

    text: str
    voice: Voice
    params: SynthesisParams
    media_type: str  # wav | raw | ogg | aac
    streaming_mode: int  # 0: one body; 1-3: streamed per sentence


def streaming_mode(value: Any) -> int:
    """api_v2's ``streaming_mode``: false/true or 0-3 (JSON or query string)."""
    if value is None:
        return 0
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int) and 0 <= value <= 3:
        return value
    if isinstance(value, float) and value.is_integer() and 0 <= value <= 3:
        return int(value)
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("true", "false"):
            return int(v == "true")
        if v in ("0", "1", "2", "3"):
            return int(v)
    raise ApiError(400, f"streaming_mode must be false/true or 0-3; got {value!r}")


_Num = pydantic.Field  # shorthand for the constrained fields below


def refuse_bool(value: Any) -> Any:
    """A pydantic ``before`` check for number fields: JSON true/false is not 1/0 (pydantic's lax mode takes it)."""
    if isinstance(value, bool):
        raise ValueError("input should be a number, not true or false")
    return value


class TtsParams(pydantic.BaseModel):
    """upstream api_v2's ``TTS_Request``, with its lax coercion (``"5"``, ``5.0``, ``"true"`` all arrive as the field's
    type) and this server's ranges. ``None`` means "the server's default" (config ``synthesis:``)."""

    model_config = pydantic.ConfigDict(extra="ignore", allow_inf_nan=False, str_strip_whitespace=False)

    text: str
    text_lang: str
    ref_audio_path: str
    aux_ref_audio_paths: list[str] = []
    prompt_text: str = ""
    prompt_lang: str | None = None
    top_k: int | None = _Num(None, ge=1)
    top_p: float | None = _Num(None, gt=0.0, le=1.0)
    temperature: float | None = _Num(None, ge=0.0)
    text_split_method: str | None = None
    batch_size: int = _Num(1, ge=1, le=1024)  # accepted, no effect (module docstring)
    batch_threshold: float = _Num(0.75, ge=0.0, le=1.0)
    split_bucket: bool = True
    speed_factor: float | None = _Num(None, ge=0.25, le=4.0)
    fragment_interval: float | None = _Num(None, ge=0.0, le=5.0)
    seed: int | None = _Num(None, ge=-1, le=MAX_SEED)
    media_type: str = "wav"
    streaming_mode: int = 0
    parallel_infer: bool = True
    repetition_penalty: float | None = _Num(None, gt=0.0)
    sample_steps: int | None = _Num(None, ge=1, le=256)  # v3/v4/v5: the sampler's steps (None: the family's)
    cfg_rate: float | None = _Num(None, ge=0.0, le=2.0)  # v5: classifier-free guidance (None: the family's)
    super_sampling: bool = False
    overlap_length: int = _Num(2, ge=0, le=100)
    min_chunk_length: int = _Num(16, ge=1, le=1000)
    noise_scale: float | None = _Num(None, ge=0.0, le=10.0)

    @pydantic.field_validator("streaming_mode", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> int:
        try:
            return streaming_mode(value)
        except ApiError as e:
            raise ValueError(str(e)) from None

    @pydantic.field_validator("top_k", "top_p", "temperature", "batch_size", "batch_threshold", "speed_factor",
                              "fragment_interval", "seed", "repetition_penalty", "sample_steps", "cfg_rate", "overlap_length",
                              "min_chunk_length", "noise_scale", mode="before")
    @classmethod
    def _no_bool(cls, value: Any) -> Any:
        return refuse_bool(value)

    @pydantic.field_validator("text_lang", "prompt_lang", "text_split_method", "media_type", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value


def _request_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON object or a query string as TtsParams input: empty values dropped (upstream's clients send them for
    "not set"), repeated query keys as a list for ``aux_ref_audio_paths``, no NUL bytes or lone surrogates."""
    out: dict[str, Any] = {}
    getall = getattr(values, "getall", None)
    for key in values:
        value = values[key]
        if key == "aux_ref_audio_paths" and getall is not None:
            value = getall(key)
        if isinstance(value, str):
            check_chars(value, key)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, str):
                    check_chars(item, key)
            value = [x for x in value if x != ""]
        if value is None or (value == "" and key != "text"):
            continue
        out[key] = value
    return out


async def parse_tts(values: Mapping[str, Any], services: Services, *,
              media_types: tuple[str, ...] = MEDIA_TYPES) -> TtsRequest:
    """Validate every api_v2 parameter (see the module docstring) and resolve the voice."""
    config: Config = services.config
    voices = voices_of(services)
    base = base_params(config, services)
    try:
        q = TtsParams.model_validate(_request_values(values))
    except pydantic.ValidationError as e:
        first = e.errors(include_url=False)[0]
        if first["type"] == "missing":
            hints = {"text": "the words to speak", "text_lang": "the text's language, e.g. auto, en, zh",
                     "ref_audio_path": f"a stored voice's name; {await voice_names(voices)}"}
            name = str(first["loc"][0])
            raise ApiError(400, f"{name} is required: {hints.get(name, '')}") from None
        raise ApiError(400, pydantic_message(e)) from None
    text = check_text(q.text, config)
    for name, value, choices in [("text_lang", q.text_lang, LANGUAGES), ("prompt_lang", q.prompt_lang, LANGUAGES),
                                 ("text_split_method", q.text_split_method, SPLIT_METHODS),
                                 ("media_type", q.media_type, media_types)]:
        if value is not None and value not in choices:
            raise ApiError(400, f"{name} must be one of {', '.join(choices)}; got {value!r}")
    given = {"language": q.text_lang, "top_k": q.top_k, "top_p": q.top_p, "temperature": q.temperature,
             "split_method": q.text_split_method, "speed": q.speed_factor, "fragment_interval": q.fragment_interval,
             "seed": q.seed, "repetition_penalty": q.repetition_penalty, "noise_scale": q.noise_scale,
             "steps": q.sample_steps, "cfg": q.cfg_rate}
    references = _reference_lookup(services, q.prompt_text, q.prompt_lang) if config.http.reference_dirs else None
    voice = await resolve_ref(voices, config.voices.dir, q.ref_audio_path, references=references)
    aux = [await resolve_ref(voices, config.voices.dir, path, name="aux_ref_audio_paths", references=references)
           for path in q.aux_ref_audio_paths]
    given["aux_voices"] = tuple(v.id for v in aux) or None
    params = make_params(base, **{k: v for k, v in given.items() if v is not None})
    return TtsRequest(text, voice, params, q.media_type, q.streaming_mode)


def _reference_lookup(services: Services, prompt_text: str, prompt_lang: str | None) -> ReferenceLookup:
    """Finds the voice of a clip inside ``http.reference_dirs`` (None: the path is not one)."""
    dirs = services.config.http.reference_dirs

    async def lookup(ref: str, name: str) -> Voice | None:
        path = reference_path(dirs, ref)
        if path is None:
            return None
        return await reference_voice(services, path, prompt_text, prompt_lang, name=name)

    return lookup


async def respond(request: web.Request, tts: TtsRequest, *, wav_size_unknown: bool = False) -> web.StreamResponse:
    """Run the request through the synthesizer and answer in its media type and streaming mode.

    A streamed WAV keeps upstream's header (sizes 0, byte for byte) unless ``wav_size_unknown``: then 0xFFFFFFFF,
    which soundfile and ``wave`` read to the end.
    """
    synth = services_of(request).synthesizer
    chunks = synth.stream(tts.text, tts.voice, tts.params)
    content_type = "audio/mpeg" if tts.media_type == "mp3" else f"audio/{tts.media_type}"  # upstream's names
    if tts.streaming_mode == 0:
        return await whole_audio(request, chunks, tts.media_type, content_type=content_type)
    return await stream_audio(request, chunks, tts.media_type, content_type=content_type,
                              wav_size_unknown=wav_size_unknown)


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 (408 when it arrives too slowly) that says what is wrong."""
    timeout = services_of(request).config.http.body_timeout_s
    try:
        async with asyncio.timeout(timeout):
            raw = await request.read()
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s (http.body_timeout_s)") from None
    return parse_json_object(raw, "the request body")


def parse_json_object(raw: bytes | str, what: str) -> dict[str, Any]:
    """``raw`` as a JSON object; a 400 naming ``what`` otherwise (deep nesting included)."""
    if not raw.strip():
        raise ApiError(400, f"{what} is empty: send a JSON object")
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ApiError(400, f"{what} is nested too deeply: send a flat JSON object") from None
    except ValueError as e:
        raise ApiError(400, f"{what} is not valid JSON ({e}): send a JSON object") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"{what} must be a JSON object, got {type(body).__name__}")
    return body


async def _tts_get(request: web.Request) -> web.StreamResponse:
    return await respond(request, await parse_tts(request.query, services_of(request)))


async def _tts_post(request: web.Request) -> web.StreamResponse:
    return await respond(request, await parse_tts(await read_json_object(request), services_of(request)))


# ---- control endpoints -------------------------------------------------------------------------------------------

async def _params_of(request: web.Request) -> Mapping[str, Any]:
    return await read_json_object(request) if request.method == "POST" else request.query


async def _control(request: web.Request) -> web.Response:
    command = ParamReader(await _params_of(request)).string("command", choices=("restart", "exit"), lower=True,
                                                           hint="restart or exit")
    raise ApiError(501, f"/control?command={command} is not available here: this API runs inside voicebot "
                        "(python -m bot serve|run); stop or restart that process with Ctrl+C or your service manager")


async def _set_refer_audio(request: web.Request) -> web.Response:
    raise ApiError(501, "/set_refer_audio is not available: voices are chosen per request here, so concurrent users "
                        "never share one; pass ref_audio_path=<voice name> to /tts")


def _weights(kind: str, configured: Path) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A ``/set_*_weights`` handler. Weights are not switched at run time; the answer says what happened: success
    (nothing loaded, nothing to load) when the request names the loaded file, else a 501 naming the setting."""

    async def handler(request: web.Request) -> web.Response:
        path = ParamReader(await _params_of(request)).string("weights_path", hint=f"the {kind} weights file")
        given = Path(path.replace("\\", "/"))
        exists = same_file = False
        try:
            exists = given.exists()
            same_file = exists and os.path.samefile(given, configured)
        except (OSError, ValueError):  # too long, not a path, or nothing loaded from there: not the loaded file
            pass
        if same_file or (given.name == configured.name and not exists):
            # the same file, or upstream's layout on the client's side naming the loaded file
            detail = f"{configured.name} is already the loaded {kind} model (models.{kind}); nothing was loaded"
            return web.json_response({"message": "success", "detail": detail, "loaded": configured.name,
                                      "changed": False})
        what = "a different file with the loaded file's name" if given.name == configured.name else repr(path[:120])
        raise ApiError(501, f"switching {kind} weights at run time is not available here, so {what} was not "
                            f"loaded: set models.{kind} in config.yaml to that file and restart (loaded now: "
                            f"{configured.name})")

    return handler


def add_routes(app: web.Application, config: Config) -> None:
    """Register ``/tts`` (GET, POST) and upstream's control endpoints."""
    app.router.add_get("/tts", _tts_get, name="api_v2:tts_get")
    app.router.add_post("/tts", _tts_post, name="api_v2:tts_post")
    app.router.add_route("*", "/control", _control, name="api_v2:control")
    app.router.add_route("*", "/set_refer_audio", _set_refer_audio, name="api_v2:set_refer_audio")
    app.router.add_route("*", "/set_gpt_weights", _weights("gpt", config.models.gpt), name="api_v2:set_gpt_weights")
    app.router.add_route("*", "/set_sovits_weights", _weights("sovits", config.models.sovits),
                         name="api_v2:set_sovits_weights")
