"""Voices over HTTP, against a running server on the tiny real models: ``POST /voices`` and ElevenLabs'
``POST /v1/voices/add`` make stored voices with ``voices add``'s checks; api_v2's ``ref_audio_path`` reads clips in
``http.reference_dirs`` only, each encoded once (the engine's reference encoder is counted)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
import soundfile as sf
from tests.audio_samples import plucked_melody, speech_like_wav

from bot.config import load_config
from bot.http import reference_files, start_server
from bot.http.reference_files import REFERENCE_OWNER
from bot.http.voice_upload import CONSENT_TEXT
from bot.services import Services, build_local_synthesizer
from synthesis.pipeline import Synthesizer

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN_ENV = "VOICEBOT_TEST_HTTP_VOICES_TOKEN"
TOKEN = "voices-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_UPLOAD_MB = 1.0  # the server's voices.max_upload_mb: a 4 s clip is 256 KB, a refused one 2 MB
TRANSCRIPT = "Hello, this is my voice."


@dataclass
class Env:
    url: str
    config: Any
    synth: Synthesizer
    refs: Path  # the one http.reference_dirs folder
    outside: Path  # a folder beside it, never to be read
    encodes: list[int] = field(default_factory=list)  # one entry per call of the engine's encode_reference

    def voice_ids(self) -> set[str]:
        return {v.id for v in self.synth.voices.list()}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory):
    data = tmp_path_factory.mktemp("http-voices")
    refs, outside = data / "refs", data / "outside"
    refs.mkdir()
    outside.mkdir()
    cfg = load_config(tiny_models / "config.yaml")
    config = dataclasses.replace(
        cfg,
        voices=dataclasses.replace(cfg.voices, dir=data / "voices", max_upload_mb=MAX_UPLOAD_MB),
        cache=dataclasses.replace(cfg.cache, dir=data / "cache"),
        discord=dataclasses.replace(cfg.discord, database=data / "voicebot.sqlite3"),
        http=dataclasses.replace(cfg.http, token_env=TOKEN_ENV, rate_limit_per_min=0, reference_dirs=(refs,)))
    os.environ[TOKEN_ENV] = TOKEN
    synth = build_local_synthesizer(config)
    env = Env("", config, synth, refs, outside)
    engine: Any = synth.stages.engine
    encode = engine.encode_reference

    def counted(*args: Any, **kwargs: Any) -> Any:
        env.encodes.append(1)
        return encode(*args, **kwargs)

    engine.encode_reference = counted  # the real encoder, counted
    await synth.voicing.create("Base", speech_like_wav(4.0, 140.0, 0), "base.wav", transcript=TRANSCRIPT,
                               language="en", consent={"user_id": 1, "text": "my own voice"})
    runner = await start_server(Services(config, synth), "127.0.0.1", 0)
    env.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield env
    await runner.cleanup()
    await synth.close()
    os.environ.pop(TOKEN_ENV, None)


def wav(data: np.ndarray, rate: int = 32000) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, data, rate, format="WAV")
    return buf.getvalue()


def form(fields: dict[str, str], files: dict[str, list[tuple[str, bytes]]]) -> aiohttp.FormData:
    f = aiohttp.FormData(default_to_multipart=True)
    for name, value in fields.items():
        f.add_field(name, value)
    for name, clips in files.items():
        for filename, data in clips:
            f.add_field(name, data, filename=filename, content_type="audio/wav")
    return f


async def post(env: Env, path: str, body: Any, headers: dict[str, str] | None = None,
               **kwargs: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s:
        async with s.post(env.url + path, data=body, headers=AUTH if headers is None else headers, **kwargs) as r:
            return r.status, await r.json()


async def tts(env: Env, **params: Any) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s:
        async with s.post(env.url + "/tts", json={"text": "Good morning.", "text_lang": "en", "seed": 1, **params},
                          headers=AUTH) as r:
            return r.status, await r.read()


def one_line(body: Any) -> str:
    message = body["message"] if "message" in body else body["detail"]["message"]
    assert "\n" not in message and "Traceback" not in message, message
    return message


# ---- POST /voices ------------------------------------------------------------------------------------------------

async def test_an_upload_makes_a_voice_that_speaks(env: Env) -> None:
    before = len(env.encodes)
    status, body = await post(env, "/voices", form(
        {"name": "Uploaded Ann", "text": TRANSCRIPT, "language": "en", "consent": "true"},
        {"file": [("ann.wav", speech_like_wav(4.0, 150.0, 3))]}))
    assert status == 201, body
    assert body["name"] == "Uploaded Ann" and body["transcript"] == TRANSCRIPT and body["language"] == "en"
    kept = body["kept"]
    assert kept["clip_s"] == pytest.approx(4.0, abs=0.01)
    assert 3.0 <= kept["seconds"] <= kept["clip_s"]  # at least min_speech_s of the upload became the reference
    assert kept["seconds"] == pytest.approx(kept["end_s"] - kept["start_s"], abs=0.002)
    assert len(env.encodes) == before + 1
    meta = env.synth.voices.meta(body["voice_id"])
    assert meta["owner_id"] == 0 and meta["consent"]["text"] == CONSENT_TEXT
    assert meta["consent"]["via"] == "POST /voices" and meta["consent"]["clip"] == "ann.wav"
    status, audio = await tts(env, ref_audio_path="Uploaded Ann")
    assert status == 200 and audio[:4] == b"RIFF" and len(audio) > 44 + 3200


@pytest.mark.parametrize("case", ["no consent", "consent false", "broken file", "empty file", "too short", "music",
                                  "no file", "two files", "no name", "bad name", "unknown field", "bad language",
                                  "not a form", "transcript too long"])
async def test_a_refused_upload_is_one_line_and_keeps_nothing(env: Env, case: str) -> None:
    good = {"name": "Refused", "text": TRANSCRIPT, "language": "en", "consent": "true"}
    clip = [("clip.wav", speech_like_wav(4.0, 140.0, 5))]
    fields, files, needle = dict(good), {"file": clip}, ""
    if case == "no consent":
        del fields["consent"]
        needle = "consent is required"
    elif case == "consent false":
        fields["consent"], needle = "false", "consent is required"
    elif case == "broken file":
        files, needle = {"file": [("clip.wav", b"RIFF\x10\x00\x00\x00WAVEfmt garbage" * 40)]}, "clip.wav"
    elif case == "empty file":
        files, needle = {"file": [("clip.wav", b"")]}, "empty"
    elif case == "too short":
        files, needle = {"file": [("clip.wav", speech_like_wav(1.0, 140.0, 5))]}, "needs 3-10 s"
    elif case == "music":
        files, needle = {"file": [("song.wav", wav(plucked_melody(6.0, 32000)))]}, ""
    elif case == "no file":
        files, needle = {}, "exactly one audio file"
    elif case == "two files":
        files, needle = {"file": clip + clip}, "exactly one audio file"
    elif case == "no name":
        del fields["name"]
        needle = "name is required"
    elif case == "bad name":
        fields["name"], needle = "a/b", "not allowed"
    elif case == "unknown field":
        fields["transcript"], needle = TRANSCRIPT, "unknown form field 'transcript'"
    elif case == "bad language":
        fields["language"], needle = "klingon", "language must be one of"
    elif case == "transcript too long":
        fields["text"], needle = "This is far too many words for a short clip. " * 150, "too long for the model"
    before, encodes = env.voice_ids(), len(env.encodes)
    body: Any = form(fields, files)
    if case == "not a form":
        body, needle = json.dumps(good), "multipart/form-data"
    status, answer = await post(env, "/voices", body)
    assert status == 400, (case, answer)
    assert needle in one_line(answer), (case, answer)
    assert env.voice_ids() == before and len(env.encodes) == encodes


async def test_an_upload_over_the_limit_is_413_before_it_is_read(env: Env) -> None:
    big = [("big.wav", b"\x00" * int(2 * MAX_UPLOAD_MB * 1024 * 1024))]
    fields = {"name": "Big", "consent": "true"}
    status, body = await post(env, "/voices", form(fields, {"file": big}))  # with its Content-Length
    assert status == 413 and "the limit is" in one_line(body)

    boundary = "voicebotboundary"
    head = "".join(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
                   for k, v in fields.items())
    head += f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.wav"\r\n\r\n'

    async def chunked():  # no Content-Length: counted as it arrives
        yield head.encode()
        for _ in range(32):
            yield b"\x00" * 65536
        yield f"\r\n--{boundary}--\r\n".encode()

    status, body = await post(env, "/voices", chunked(),
                              headers={**AUTH, "Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert status == 413 and f"larger than {MAX_UPLOAD_MB:g} MB (voices.max_upload_mb)" in one_line(body)
    assert "Big" not in {v.name for v in env.synth.voices.list()}


async def test_an_upload_needs_the_token(env: Env) -> None:
    status, body = await post(env, "/voices", form({"name": "NoToken", "consent": "true"},
                                                   {"file": [("c.wav", speech_like_wav(4.0, 140.0, 1))]}), headers={})
    assert status == 401 and "needs a token" in one_line(body)
    assert "NoToken" not in {v.name for v in env.synth.voices.list()}


# ---- POST /v1/voices/add (ElevenLabs) ----------------------------------------------------------------------------

async def test_elevenlabs_voices_add_makes_a_voice_of_every_file(env: Env) -> None:
    clips = [("a.wav", speech_like_wav(4.0, 170.0, 7)), ("b.wav", speech_like_wav(4.0, 170.0, 8))]
    async with aiohttp.ClientSession() as s:
        async with s.post(env.url + "/v1/voices/add", headers={"xi-api-key": TOKEN}, data=form(
                {"name": "Eleven", "labels": json.dumps({"consent": "true", "language": "English"}),
                 "description": "test"}, {"files": clips})) as r:
            status, body = r.status, await r.json()
            assert r.headers.get("X-Voicebot-Ignored") == "description, labels.language"
    assert status == 200, body
    assert body["requires_verification"] is False
    voice = env.synth.voices.get(body["voice_id"])
    assert voice.name == "Eleven" and voice.prompt_text == ""  # ElevenLabs sends no transcript: reference-free
    assert voice.clip_ges is not None and voice.clip_ges.shape[0] == 2  # the second file averaged into its timbre

    status, body = await post(env, "/v1/voices/add", form({"name": "Eleven2"}, {"files": clips[:1]}),
                              headers={"xi-api-key": TOKEN})
    assert status == 400 and "consent is required" in one_line(body)  # in ElevenLabs' shape: detail.message


async def test_the_official_sdk_adds_a_voice_over_native_tls(env: Env, tmp_path: Path) -> None:
    elevenlabs = pytest.importorskip("elevenlabs", reason="the official ElevenLabs SDK is a dev dependency")
    import httpx
    from tests.bot.test_http_tls import make_cert

    cert, key = make_cert(tmp_path)
    config = dataclasses.replace(env.config, http=dataclasses.replace(env.config.http, tls_cert=cert, tls_key=key))
    runner = await start_server(Services(config, env.synth), "127.0.0.1", 0)
    try:
        url = f"https://localhost:{runner.addresses[0][1]}"
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(cert))) as http:
            client = elevenlabs.AsyncElevenLabs(api_key=TOKEN, base_url=url, httpx_client=http)
            made = await client.voices.ivc.create(name="Sdk Voice", labels={"consent": "true"},
                                                  files=[("sdk.wav", speech_like_wav(4.0, 160.0, 9), "audio/wav")])
    finally:
        await runner.cleanup()
    assert env.synth.voices.get(made.voice_id).name == "Sdk Voice"
    assert made.requires_verification is False


# ---- ref_audio_path inside http.reference_dirs -------------------------------------------------------------------

async def test_a_reference_file_is_encoded_once_and_kept_by_content(env: Env) -> None:
    (env.refs / "jingyuan.wav").write_bytes(speech_like_wav(4.0, 120.0, 11))
    request = {"ref_audio_path": "jingyuan.wav", "prompt_text": TRANSCRIPT, "prompt_lang": "en"}
    before = len(env.encodes)
    status, first = await tts(env, **request)
    assert status == 200, first[:300]
    assert len(env.encodes) == before + 1
    kept = [v for v in env.synth.voices.list(REFERENCE_OWNER) if v.prompt_text == TRANSCRIPT]
    assert len(kept) == 1 and kept[0].language == "en"

    status, again = await tts(env, **request)  # the same file, transcript and language: no encoding
    assert status == 200 and again == first
    status, _ = await tts(env, **{**request, "ref_audio_path": str(env.refs / "jingyuan.wav")})  # absolute
    assert status == 200 and len(env.encodes) == before + 1

    (env.refs / "copy.wav").write_bytes((env.refs / "jingyuan.wav").read_bytes())  # same bytes, another name
    status, _ = await tts(env, **{**request, "ref_audio_path": "copy.wav"})
    assert status == 200 and len(env.encodes) == before + 1

    status, _ = await tts(env, **{**request, "prompt_text": "Hello, this is my own voice."})  # another transcript
    assert status == 200 and len(env.encodes) == before + 2

    async with aiohttp.ClientSession() as s:  # reference-file voices stay out of the voice listings
        async with s.get(env.url + "/speakers", headers=AUTH) as r:
            names = {v["name"] for v in await r.json()}
    assert names and not any(n.startswith("ref-") for n in names)


async def test_requests_at_once_for_a_new_reference_file_share_one_encoding(env: Env) -> None:
    (env.refs / "together.wav").write_bytes(speech_like_wav(4.0, 125.0, 15))
    before = len(env.encodes)
    request = {"ref_audio_path": "together.wav", "prompt_text": TRANSCRIPT, "prompt_lang": "en"}
    results = await asyncio.gather(*(tts(env, **request, seed=seed) for seed in (1, 2, 3)))
    assert [status for status, _ in results] == [200, 200, 200]
    assert len(env.encodes) == before + 1


async def test_paths_outside_the_reference_folders_are_refused_unread(env: Env) -> None:
    secret = env.outside / "secret.wav"
    secret.write_bytes(speech_like_wav(4.0, 120.0, 12))
    (env.refs / "escape.wav").symlink_to(secret)  # a link inside pointing out
    (env.refs / "linked").symlink_to(env.outside)  # a folder link pointing out
    (env.refs / "sub").mkdir()
    cases = {
        str(secret): "neither a stored voice nor a file inside the voices folder or a clip inside "
                     "http.reference_dirs",
        "escape.wav": "no such file inside http.reference_dirs",
        "linked/secret.wav": "no such file inside http.reference_dirs",
        str(env.refs / "escape.wav"): "or a clip inside http.reference_dirs",
        "../outside/secret.wav": "may not contain '..'",
        "sub/../../outside/secret.wav": "may not contain '..'",
        "sub\\..\\..\\outside\\secret.wav": "may not contain '..'",
        "/etc/passwd": "or a clip inside http.reference_dirs",
    }
    before = len(env.encodes)
    for ref, needle in cases.items():
        status, body = await tts(env, ref_audio_path=ref, prompt_text=TRANSCRIPT, prompt_lang="en")
        assert status == 400, ref
        assert needle in one_line(json.loads(body)), (ref, body)
    status, body = await tts(env, ref_audio_path="Base", aux_ref_audio_paths=["escape.wav"])
    assert status == 400 and "aux_ref_audio_paths" in one_line(json.loads(body))
    assert len(env.encodes) == before


async def test_reference_file_errors_are_one_line_in_utf8(env: Env) -> None:
    (env.refs / "参考音频.wav").write_bytes(speech_like_wav(4.0, 130.0, 13))
    status, body = await tts(env, ref_audio_path="参考音频.wav", prompt_text="你好，这是我的声音。")
    assert status == 400
    assert "prompt_lang is required with prompt_text" in one_line(json.loads(body))

    (env.refs / "song.wav").write_bytes(wav(plucked_melody(6.0, 32000)))
    status, body = await tts(env, ref_audio_path="song.wav", prompt_text=TRANSCRIPT, prompt_lang="en")
    assert status == 400 and one_line(json.loads(body))

    status, body = await tts(env, ref_audio_path="/elsewhere/参考音频 2.wav", prompt_text=TRANSCRIPT,
                             prompt_lang="en")
    assert status == 400 and "参考音频 2.wav".encode() in body and b"\\u" not in body  # UTF-8 as written


async def test_aux_reference_files_lend_their_timbre(env: Env) -> None:
    (env.refs / "aux.wav").write_bytes(speech_like_wav(4.0, 200.0, 14))
    before = len(env.encodes)
    status, audio = await tts(env, ref_audio_path="Base", aux_ref_audio_paths=["aux.wav"])
    assert status == 200 and audio[:4] == b"RIFF"
    assert len(env.encodes) == before + 1
    status, _ = await tts(env, ref_audio_path="Base", aux_ref_audio_paths=["aux.wav"])
    assert status == 200 and len(env.encodes) == before + 1


async def test_the_oldest_reference_voices_make_room(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reference_files, "MAX_REFERENCE_VOICES", 2)
    for i in range(3):
        (env.refs / f"room{i}.wav").write_bytes(speech_like_wav(4.0, 110.0 + 10 * i, 20 + i))
        status, _ = await tts(env, ref_audio_path=f"room{i}.wav")
        assert status == 200
    kept = env.synth.voices.list(REFERENCE_OWNER)
    assert len(kept) == 2
    newest = reference_files.content_id((env.refs / "room2.wav").read_bytes(), "", "auto")
    assert newest in {v.id for v in kept}
