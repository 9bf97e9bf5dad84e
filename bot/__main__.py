"""``python -m bot``: the command line (run, serve, say, voices, phrases, models, engines; the bench commands come
from the ``benchmarks`` package)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Sequence

from synthesis import SpeechError

if TYPE_CHECKING:
    from synthesis import SpeechBackend, Voice

log = logging.getLogger("bot")

# Voices added from the command line: the operator vouches for the speaker's permission.
_OPERATOR_CONSENT = {"user_id": 0, "text": "added from the command line by the operator, who has the "
                                           "speaker's permission"}


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS, help="config file (default: ./config.yaml)")
    p = argparse.ArgumentParser(prog="voicebot", parents=[common],
                                description="A Discord bot and TTS server that speaks in its users' own voices.")
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("run", parents=[common], help="start the Discord bot and the local HTTP API")
    sub.add_parser("check-token", parents=[common],
                   help="ask Discord whether it accepts the bot token (before downloading the models)")
    sp = sub.add_parser("serve", parents=[common], help="start only the local HTTP API")
    sp.add_argument("--host")
    sp.add_argument("--port", type=int)

    sp = sub.add_parser("say", parents=[common], help="synthesize text to a WAV file")
    sp.add_argument("text")
    sp.add_argument("--voice", help="a stored voice (name or id)")
    sp.add_argument("--ref", type=Path, help="a reference clip (instead of --voice)")
    sp.add_argument("--ref-text", default="", help="transcript of --ref (empty: reference-free)")
    sp.add_argument("--ref-lang", default=None, help="language of --ref-text (default: --lang)")
    sp.add_argument("--lang", default=None, help="text language (default from config)")
    sp.add_argument("--seed", type=int, default=None)
    sp.add_argument("--style", default="", help="a named style of --voice (voices add-style)")
    sp.add_argument("-o", "--output", type=Path, required=True)
    sp.add_argument("--timings", action="store_true", help="print time to first audio and per-sentence times")
    sp.add_argument("--json", action="store_true", help="with --timings: one JSON object on stdout")

    vp = sub.add_parser("voices", parents=[common], help="manage stored voices")
    vsub = vp.add_subparsers(dest="action", required=True)
    sp = vsub.add_parser("add", parents=[common])
    sp.add_argument("name")
    sp.add_argument("clip", type=Path)
    sp.add_argument("--text", default=None, help="what is said in the clip (empty: reference-free)")
    sp.add_argument("--lang", default="auto")
    sp.add_argument("--extra", type=Path, nargs="+", default=[], metavar="CLIP",
                    help="more clips of the same voice: their timbre is averaged in (the transcript stays CLIP's)")
    sp = vsub.add_parser("add-clip", parents=[common], help="add extra clips to a voice (timbre averaged in)")
    sp.add_argument("name")
    sp.add_argument("clips", type=Path, nargs="+")
    sp = vsub.add_parser("add-style", parents=[common], help="add a named style (its own clip and transcript)")
    sp.add_argument("name")
    sp.add_argument("style", help='e.g. "calm", "excited"; chosen per request')
    sp.add_argument("clip", type=Path)
    sp.add_argument("--text", default="", help="what is said in the clip (empty: reference-free)")
    sp.add_argument("--lang", default="auto")
    sp = vsub.add_parser("remove-style", parents=[common])
    sp.add_argument("name")
    sp.add_argument("style")
    vsub.add_parser("list", parents=[common])
    sp = vsub.add_parser("delete", parents=[common])
    sp.add_argument("name")

    pp = sub.add_parser("phrases", parents=[common], help="common phrases")
    psub = pp.add_subparsers(dest="action", required=True)
    sp = psub.add_parser("precompute", parents=[common])
    sp.add_argument("--voice", default=None)

    sp = sub.add_parser("phonemes", parents=[common],
                        help="show how a text will be read: normalised text, language pieces, phones")
    sp.add_argument("text")
    sp.add_argument("--lang", default=None, help="text language (default from config)")
    _dictionary_args(sp)
    sp.add_argument("--json", action="store_true", help="one JSON object on stdout")

    dp = sub.add_parser("pronounce", parents=[common], help="pronunciation dictionaries: export, import")
    dsub = dp.add_subparsers(dest="action", required=True)
    sp = dsub.add_parser("export", parents=[common], help="write a dictionary as a JSON file")
    _dictionary_args(sp, required=True)
    sp.add_argument("-o", "--output", type=Path, default=None, help="file to write (default: stdout)")
    sp = dsub.add_parser("import", parents=[common], help="load a JSON dictionary file (checked whole first)")
    sp.add_argument("file", type=Path)
    _dictionary_args(sp, required=True)
    sp.add_argument("--replace", action="store_true", help="replace the whole dictionary (default: add to it)")

    mp = sub.add_parser("models", parents=[common], help="model files")
    msub = mp.add_subparsers(dest="action", required=True)
    families = ["v2", "v2Pro", "v2ProPlus", "v4", "v5turbo", "v5dev", "v3"]
    sp = msub.add_parser("download", parents=[common])
    sp.add_argument("dir", nargs="?", type=Path, default=None)
    sp.add_argument("--family", choices=families, default=None,
                    help="the pretrained set to fetch (default: models.family)")
    sp = msub.add_parser("make-tiny", parents=[common], help="write a tiny random model set + config (tests)")
    sp.add_argument("dir", type=Path)
    sp.add_argument("--size", choices=["tiny", "real"], default="tiny")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--family", choices=families, default="v2", help="the model family of the set (default v2)")

    ep = sub.add_parser("engines", parents=[common], help="inference engines")
    esub = ep.add_subparsers(dest="action", required=True)
    sp = esub.add_parser("build", parents=[common], help="export ONNX graphs and build TensorRT engines")
    sp.add_argument("--backend", choices=["onnx", "tensorrt"], default=None)

    import benchmarks  # the bench commands are tools beside the product: they live (and load) there

    benchmarks.add_commands(sub, common)
    return p


def _dictionary_args(sp: argparse.ArgumentParser, *, required: bool = False) -> None:
    """--guild / --user / --http / --dict: which pronunciation dictionary a command reads or writes."""
    group = sp.add_mutually_exclusive_group(required=required)
    group.add_argument("--guild", type=int, help="a Discord server's dictionary (its id)")
    group.add_argument("--user", type=int, help="a Discord user's dictionary (their id)")
    group.add_argument("--http", action="store_true", help="the HTTP API's dictionary file (http.pronunciations)")
    if not required:
        group.add_argument("--dict", type=Path, help="a dictionary JSON file")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    config_path = Path(getattr(args, "config", "config.yaml"))
    try:
        if args.command == "models" and args.action == "make-tiny":
            return _make_tiny(args)
        from bot.config import load_config

        config = load_config(config_path)
        logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        handler = getattr(args, "run", None) or _COMMANDS[(args.command, getattr(args, "action", None))]
        return handler(config, args)
    except SpeechError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


# ---- commands -------------------------------------------------------------------------------------------------

def _make_tiny(args: argparse.Namespace) -> int:
    from engines import write_model_set

    paths = write_model_set(args.dir, size=args.size, seed=args.seed, family=args.family)
    files = [k for k in ("gpt", "sovits", "hubert", "bert", "sv", "vocoder") if k in paths]
    config = {
        "models": {"dir": ".", "family": args.family, **{k: str(paths[k].relative_to(args.dir)) for k in files},
                   "download_base_url": "http://127.0.0.1:1/unused"},
        "engine": {"backend": "torch", "device": "cpu", "precision": "fp32"},
        "voices": {"dir": "voices"},
        "cache": {"dir": "cache"},
        "discord": {"database": "voicebot.sqlite3"},
    }
    import yaml

    out = args.dir / "config.yaml"
    out.write_text("# Written by `python -m bot models make-tiny`: tiny random models for tests.\n"
                   + yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    print(f"wrote a {args.size} {args.family} model set and {out}")
    return 0


def _download(config: Any, args: argparse.Namespace) -> int:
    from bot.downloads import MODEL_SETS, download_models

    m = config.models
    name = args.family or m.family
    if name not in MODEL_SETS:
        print(f"error: models.family is {name}: say which set to fetch with --family (one of "
              f"{', '.join(MODEL_SETS)})", file=sys.stderr)
        return 2
    family = MODEL_SETS[name]
    dest = args.dir or m.dir
    # a pretrained GPT or SoVITS that models.gpt / models.sovits replace with the user's own file is not fetched
    # (with --family naming another set than the configured one, the set's own files are)
    mine = args.family is None or args.family == m.family
    files = family.files(gpt=not mine or Path(m.gpt) == Path(m.dir) / family.gpt.path,
                         sovits=not mine or Path(m.sovits) == Path(m.dir) / family.sovits.path)
    written = download_models(dest, m.download_base_url, files)
    print(f"{len(written)} file(s) of the {name} set downloaded into {dest}" if written
          else f"all {name} model files present in {dest}")
    _download_text_files(m, dest)
    return 0


def _download_text_files(m: Any, dest: Path) -> None:
    """The front-end's optional files: a line for what was done, a note for what was skipped or failed."""
    from bot.downloads import download_frontend_files

    if not m.frontend_assets:
        print("note: the text front-end's optional files were skipped (models.frontend_assets: false)")
        return
    got = download_frontend_files(dest, m.text_base_url, m.g2pw_url)
    for problem in got.failed:  # optional: speech works without them, so the command still succeeds
        print(f"note: {problem} (optional: speech works without it)", file=sys.stderr)
    if got.written:
        print(f"{len(got.written)} text front-end file(s) downloaded into {dest}")
    elif not got.failed:
        print(f"all text front-end files present in {dest}")


def _check_models(config: Any) -> str | None:
    m = config.models
    needed = [("GPT", m.gpt), ("SoVITS", m.sovits), ("HuBERT", m.hubert), ("BERT", m.bert)]
    if m.family in ("v2Pro", "v2ProPlus"):
        needed.append(("speaker-verification", m.sv))
    if m.vocoder is not None:
        needed.append(("vocoder", m.vocoder))
    for label, path in needed:
        if not Path(path).exists():
            return f"the {label} model {path} is missing: run `python -m bot models download` (or `make run`)"
    return None


def _discord_token(config: Any) -> str | None:
    """The bot token from its environment variable, or None after saying how to set it."""
    from bot.token_shape import token_shape_error

    token = config.secret(config.discord.token_env)
    if token is None:
        print(f"set the {config.discord.token_env} environment variable to your bot token "
              f"(Discord developer portal -> your application -> Bot -> Reset Token)", file=sys.stderr)
        return None
    if (error := token_shape_error(token, config.discord.token_env)) is not None:
        print(error, file=sys.stderr)  # a client secret or an id pasted by mistake: said without asking Discord
        return None
    return token


def _voice_libraries_error() -> str | None:
    """One line naming the missing voice library (libopus: Opus audio; davey: DAVE, Discord's end-to-end
    encryption, required in every voice channel but Stage channels) and how to install it; None when both load."""
    import discord.opus

    if not discord.opus.is_loaded():
        try:
            discord.opus._load_default()
        except Exception:  # noqa: BLE001
            pass
    if not discord.opus.is_loaded():
        return ("libopus was not found: install it (Debian/Ubuntu: sudo apt-get install libopus0; "
                "macOS: brew install opus)")
    try:
        import davey  # noqa: F401
    except ImportError:
        return ("the davey package (DAVE, the voice encryption Discord requires) is missing: install it with "
                "`.venv/bin/pip install davey` (or run `make run`)")
    return None


def _run(config: Any, args: argparse.Namespace) -> int:
    token = _discord_token(config)
    if token is None:
        return 2
    if (missing := _voice_libraries_error()) is not None:
        print(missing, file=sys.stderr)
        return 2
    if (missing := _check_models(config)) is not None:
        print(missing, file=sys.stderr)
        return 2
    from bot.client import check_token

    asyncio.run(check_token(config.discord, token))  # one line now, not a traceback after loading the models
    from bot.app import run_bot_and_api

    asyncio.run(run_bot_and_api(config, token))
    return 0


def _check_token(config: Any, args: argparse.Namespace) -> int:
    token = _discord_token(config)
    if token is None:
        return 2
    from bot.client import check_token

    asyncio.run(check_token(config.discord, token))
    print(f"Discord accepts the token in {config.discord.token_env}")
    return 0


def _serve(config: Any, args: argparse.Namespace) -> int:
    from bot.http.app import check_start

    check_start(config, args.host)  # bind, TLS files, reference folders: refused now, not after the models load
    if (missing := _check_models(config)) is not None:
        print(missing, file=sys.stderr)
        return 2
    # Ctrl-C must stop the load itself: asyncio.run's own handler only cancels its task, which then waits for the
    # load (and the warm-up's threads) to end. Once the API is up, run_api's handler takes Ctrl-C over.
    previous = signal.signal(signal.SIGINT, _interrupted_load)
    try:
        from bot.app import run_api

        asyncio.run(run_api(config, args.host, args.port))
    finally:
        signal.signal(signal.SIGINT, previous)
    return 0


def _interrupted_load(signum: int, frame: Any) -> None:
    """Ctrl-C before the API serves: one line, and the process ends now. It serves nothing yet and writes nothing
    that a crash could break (the voice store and caches are crash-safe), while the threads inside the model could
    only be waited for, not stopped."""
    os.write(2, b"interrupted while loading the models: the HTTP API was not started\n")  # no buffer to re-enter
    os._exit(130)


def _say(config: Any, args: argparse.Namespace) -> int:
    # everything that can be wrong with the command line is said before the models load
    if args.ref is None and not args.voice:
        print("error: give --voice NAME (a stored voice) or --ref CLIP (a reference recording)", file=sys.stderr)
        return 2
    for option in ("lang", "ref_lang"):
        _check_language(getattr(args, option), "--" + option.replace("_", "-"))
    if args.ref is not None:
        args.ref_bytes = _read_clip(config, args.ref)
    elif args.voice:
        _find_voice(config, args.voice)
    if (missing := _check_models(config)) is not None:
        print(missing, file=sys.stderr)
        return 2
    return asyncio.run(_say_async(config, args))


def _check_language(language: str | None, option: str) -> None:
    """Refuse, in one line and before any model loads, an unknown language code or one this build cannot read."""
    from synthesis.text import check_speakable
    from synthesis.types import LANGUAGES

    if language is None:
        return
    if language not in LANGUAGES:
        raise SpeechError(f"{option} {language!r} is not a language code: use one of {', '.join(LANGUAGES)}")
    check_speakable(language)


def _read_clip(config: Any, path: Path) -> bytes:
    """A clip's bytes, refused in one line when it is missing, not a file or too large (checked before reading)."""
    from synthesis.audio import read_upload_file

    from bot.services import MB

    return read_upload_file(path, max_bytes=int(config.voices.max_upload_mb * MB))


def _open_voices(config: Any) -> tuple[Any, Any]:
    """The voice store opened with its cache, as the bot opens it: a delete a kill cut short is finished, cache
    entries included, whichever command runs next. Returns (store, cache); the caller closes the cache."""
    from bot.services import open_stores

    return open_stores(config)


def _find_voice(config: Any, name: str) -> Voice:
    """A stored voice by name or id (VoiceNotFound names how to list them)."""
    store, cache = _open_voices(config)
    try:
        return store.lookup(name)
    finally:
        cache.close()


async def _say_async(config: Any, args: argparse.Namespace) -> int:
    import dataclasses

    from bot.services import build_synthesizer, default_params
    from synthesis.audio import encode_audio

    t_load = time.perf_counter()
    synth = build_synthesizer(config)
    await synth.warm_up()
    load_s = time.perf_counter() - t_load
    try:
        params = default_params(config)
        if args.lang:
            params = dataclasses.replace(params, language=args.lang)
        if args.seed is not None:
            params = dataclasses.replace(params, seed=args.seed)
        if args.style:
            params = dataclasses.replace(params, style=args.style)
        temp_voice = None
        if args.ref is not None:
            lang = args.ref_lang or params.language
            temp_voice, warnings = await synth.voicing.create(
                f"cli-{int(time.time())}", args.ref_bytes, args.ref.name, transcript=args.ref_text or None,
                language=lang, consent=_OPERATOR_CONSENT)
            for w in warnings:
                print(f"warning: {w}", file=sys.stderr)
            voice: Any = temp_voice
        elif args.voice:
            voice = args.voice
        else:
            print("error: give --voice NAME or --ref CLIP", file=sys.stderr)
            return 2
        started = time.perf_counter()
        ttfa = None
        chunks = []
        try:
            async for chunk in synth.stream(args.text, voice, params):
                if ttfa is None:
                    ttfa = time.perf_counter() - started
                chunks.append(chunk)
        finally:
            if temp_voice is not None:
                await synth.voicing.delete(temp_voice.id)
        total = time.perf_counter() - started
        import numpy as np

        audio = np.concatenate([c.audio for c in chunks]) if chunks else np.zeros(0, np.float32)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        fmt = args.output.suffix.lower().lstrip(".")  # the file's own type where it is one we encode, else WAV
        fmt = fmt if fmt in ("flac", "ogg", "opus", "mp3", "aac") else "wav"
        rate = chunks[0].sample_rate if chunks else synth.sample_rate  # the model's: 32, 48 (v4/v5) or 24 kHz (v3)
        args.output.write_bytes(encode_audio(audio, rate, fmt))
        audio_s = audio.size / rate
        if args.timings:
            report = {
                "ttfa_s": round(ttfa or 0.0, 4), "total_s": round(total, 4), "audio_s": round(audio_s, 4),
                "rtf": round(total / audio_s, 4) if audio_s else None, "load_s": round(load_s, 3),
                # one entry per sentence (an early first chunk is part of its sentence)
                "sentences": [{"text": c.sentence, "gpt_s": round(c.timings.get("gpt_s", 0.0), 4),
                               "sovits_s": round(c.timings.get("sovits_s", 0.0), 4),
                               "prosody_hit": bool(c.timings.get("prosody_hit")),
                               "audio_hit": bool(c.timings.get("audio_hit"))}
                              for c in chunks if not c.timings.get("partial")],
            }
            if args.json:
                print(json.dumps(report))
            else:
                print(f"model load {load_s:.2f} s; time to first audio {report['ttfa_s']:.3f} s; total "
                      f"{total:.3f} s for {audio_s:.2f} s of audio (RTF {report['rtf']})")
                for s in report["sentences"]:
                    print(f"  GPT {s['gpt_s']:.3f} s  SoVITS {s['sovits_s']:.3f} s  prosody hit "
                          f"{s['prosody_hit']!s:5}  audio hit {s['audio_hit']!s:5}  {s['text']}")
        else:
            print(f"wrote {args.output} ({audio_s:.2f} s)")
        return 0
    finally:
        await synth.close()


def _voices_add(config: Any, args: argparse.Namespace) -> int:
    from synthesis.voices import check_name

    check_name(args.name)  # what the store would refuse is refused before the clip is read or encoded
    _check_language(args.lang, "--lang")
    clip = _read_clip(config, args.clip)
    extras = [(_read_clip(config, path), path.name) for path in args.extra]

    async def go(synth: SpeechBackend) -> int:
        from tqdm import tqdm

        with tqdm(total=100, desc="preparing voice", unit="%") as bar:
            def progress(stage: str, frac: float) -> None:
                bar.set_postfix_str(stage)
                bar.update(int(frac * 100) - bar.n)

            voice, warnings = await synth.voicing.create(
                args.name, clip, args.clip.name, transcript=args.text, language=args.lang,
                consent=_OPERATOR_CONSENT,
                progress=progress)
        if extras:
            try:
                voice, more = await synth.voicing.add_clips(voice, extras, consent=_OPERATOR_CONSENT)
            except BaseException:
                await synth.voicing.delete(voice.id)  # a voice without the clips asked for is not kept
                raise
            warnings = [*warnings, *more]
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
        text = "with its transcript" if voice.prompt_text else "reference-free (no transcript)"
        if extras:
            text += f", and {len(extras)} extra clip(s) averaged into its timbre"
        print(f"voice {voice.name!r} created (id {voice.id}) from {_kept_seconds(synth.voices.meta(voice.id))}, "
              f"{text}")
        if args.text and not voice.prompt_text:  # the clip had speech outside the kept seconds (the warning)
            print(f"to keep a transcript: cut {args.clip.name} to the seconds it uses, run `python -m bot voices "
                  f"delete {voice.name}`, then add it again with --text \"the words said in them\"", file=sys.stderr)
        if config.phrases:
            await _precompute_with_bar(synth, voice, config.phrases)
        return 0

    return _with_model(config, go)


async def _precompute_with_bar(synth: SpeechBackend, voice: Voice, phrases: Sequence[str]) -> None:
    from tqdm import tqdm

    with tqdm(total=len(phrases), desc=f"phrases for {voice.name}", unit="phrase") as bar:
        def progress(stage: str, frac: float) -> None:
            bar.update(round(frac * len(phrases)) - bar.n)

        await synth.voicing.precompute(voice, phrases, progress)


def _voices_add_clip(config: Any, args: argparse.Namespace) -> int:
    clips = [(_read_clip(config, path), path.name) for path in args.clips]
    return _with_voice(config, args.name, lambda synth, voice: synth.voicing.add_clips(
        voice, clips, consent=_OPERATOR_CONSENT), f"{len(clips)} extra clip(s) averaged into the timbre of")


def _voices_add_style(config: Any, args: argparse.Namespace) -> int:
    from synthesis.voices import check_name

    check_name(args.style, "style name")
    _check_language(args.lang, "--lang")
    clip = _read_clip(config, args.clip)
    return _with_voice(config, args.name, lambda synth, voice: synth.voicing.add_style(
        voice, args.style, clip, args.clip.name, consent=_OPERATOR_CONSENT, transcript=args.text,
        language=args.lang),
        f"style {args.style!r} stored with")


def _voices_remove_style(config: Any, args: argparse.Namespace) -> int:
    async def remove(synth: SpeechBackend, voice: Voice) -> tuple[Voice, list[str]]:
        return await synth.voicing.remove_style(voice, args.style), []

    return _with_voice(config, args.name, remove, f"style {args.style!r} removed from")


def _with_voice(config: Any, name: str, change: Callable[[SpeechBackend, Voice], Awaitable[tuple[Voice, list[str]]]],
                done: str) -> int:
    """Run ``change(synth, voice)`` (-> (voice, warnings)) on a stored voice with the loaded model; say what it did."""

    async def go(synth: SpeechBackend) -> int:
        voice = synth.voices.lookup(name)
        voice, warnings = await change(synth, voice)
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
        print(f"{done} voice {voice.name!r} (now version {voice.version})")
        if config.phrases:  # a new version: its phrases are precomputed again
            await _precompute_with_bar(synth, voice, config.phrases)
        return 0

    return _with_model(config, go)


def _with_model(config: Any, body: Callable[[SpeechBackend], Awaitable[int]]) -> int:
    """``body(synth)`` with the model loaded (after checking its files are there), the synthesizer closed after."""
    if (missing := _check_models(config)) is not None:
        print(missing, file=sys.stderr)
        return 2

    async def go() -> int:
        from bot.services import build_synthesizer

        synth = build_synthesizer(config)
        try:
            return await body(synth)
        finally:
            await synth.close()

    return asyncio.run(go())


def _voices_list(config: Any, args: argparse.Namespace) -> int:
    store, cache = _open_voices(config)
    cache.close()  # (its start-up finished any delete a kill cut short; listing reads no cache)
    voices = store.list()
    if not voices:
        print("no voices yet: add one with `python -m bot voices add NAME CLIP --text \"...\"`")
    for v in voices:
        print(f"{v.name:24} {v.id}  owner {v.owner_id}  v{v.version}  {v.language:6} "
              f"{'reference-free' if not v.prompt_text else repr(v.prompt_text[:40])}  {_kept_seconds(store.meta(v.id))}"
              + _clips_and_styles(v))
    return 0


def _clips_and_styles(voice: Any) -> str:
    """What a voice has beyond its main clip, for a listing ("" when nothing)."""
    extra = "" if voice.clip_ges is None else f"  +{voice.clip_ges.shape[0] - 1} clip(s)"
    styles = ", ".join(sorted(s.name for s in voice.styles.values()))
    return extra + (f"  styles: {styles}" if styles else "")


def _kept_seconds(meta: dict[str, Any]) -> str:
    """Which seconds of the upload a voice's reference is, from its stored metadata."""
    ref = meta.get("reference") or {}
    if "clip_s" not in ref:  # made before the upload's length was recorded
        return f"seconds {ref.get('start_s', 0.0):.1f}-{ref.get('end_s', 0.0):.1f} of its clip"
    cut = ", speech left out" if ref.get("kept") else ""
    return f"seconds {ref['start_s']:.1f}-{ref['end_s']:.1f} of the {ref['clip_s']:.1f} s clip{cut}"


def _voices_delete(config: Any, args: argparse.Namespace) -> int:
    from synthesis.cache import SynthesisCache
    from synthesis.voices import VoiceStore

    from bot.services import MB

    cache = SynthesisCache(config.cache.dir, config.cache.prosody_mb * MB, config.cache.audio_mb * MB,
                           reuse_random=config.cache.reuse_random)
    try:
        store = VoiceStore(config.voices.dir, cache=cache)
        voice = store.find(args.name)
        rows = asyncio.run(_delete_voice(config, store, voice.id))
    finally:
        cache.close()
    print(f"deleted voice {voice.name!r} and everything derived from it"
          + (f" ({rows} database row(s) naming it)" if rows else ""))
    return 0


async def _delete_voice(config: Any, voices: Any, voice_id: str) -> int:
    """Delete a voice with the bot's voice service (its rows, files and cache entries, journalled, so a bot
    running beside this command keeps nothing of it); how many database rows named it."""
    from bot.store import Store
    from bot.voice_service import VoiceService

    path = Path(config.discord.database)
    if not path.exists():  # no bot has run here: nothing names the voice
        await asyncio.to_thread(voices.delete, voice_id)
        return 0
    async with Store(path) as store:
        counts = await VoiceService(store, voices=voices).delete(voice_id)
    return sum(counts.values())


def _phrases_precompute(config: Any, args: argparse.Namespace) -> int:
    async def go(synth: SpeechBackend) -> int:
        from bot.voice_service import VoiceService

        service = VoiceService(None, synth)  # reads only: no database in this command
        voices = [await service.find(args.voice)] if args.voice else await service.list()
        if not voices:
            print("no voices to precompute for")
        for voice in voices:
            await _precompute_with_bar(synth, voice, config.phrases)
        return 0

    return _with_model(config, go)


def _engines_build(config: Any, args: argparse.Namespace) -> int:
    from engines import build_engines

    build_engines(config.engine, config.models, backend=args.backend)
    return 0


async def _with_dictionaries(config: Any, fn: Any) -> Any:
    """Run ``fn(Pronunciations)`` against the bot's database (created if missing, as the bot would)."""
    from bot.pronunciations import Pronunciations
    from bot.store import Store

    async with Store(Path(config.discord.database)) as store:
        return await fn(Pronunciations(store))


def _read_dictionary(config: Any, args: argparse.Namespace) -> Any:
    """The dictionary --guild/--user/--http/--dict names, or None."""
    from synthesis.text import Lexicon

    from bot.pronunciations import PronunciationFile

    if getattr(args, "dict", None) is not None:
        return Lexicon.from_file(_read_file(args.dict))
    if args.http:
        return PronunciationFile(config.http.pronunciations).load()
    if args.guild is not None:
        return asyncio.run(_with_dictionaries(config, lambda d: d.lexicon("guild", args.guild)))
    if args.user is not None:
        return asyncio.run(_with_dictionaries(config, lambda d: d.lexicon("user", args.user)))
    return None


def _read_file(path: Path) -> bytes:
    """A dictionary file's bytes; SpeechError naming the file when it cannot be read."""
    try:
        return path.read_bytes()
    except OSError as e:
        raise SpeechError(f"cannot read {path}: {e.strerror or e}") from e


def _phonemes(config: Any, args: argparse.Namespace) -> int:
    from bot.pronunciations import explain_phonemes, format_explanation
    from bot.services import configure_text_files

    language = args.lang or config.synthesis.language
    _check_language(language, "--lang")
    lexicon = _read_dictionary(config, args)
    configure_text_files(config.models)  # the readings the bot would give, with the files it would read
    report = asyncio.run(explain_phonemes(args.text, language, lexicon))
    print(json.dumps(report, ensure_ascii=False) if args.json else format_explanation(report))
    return 0


def _pronounce_export(config: Any, args: argparse.Namespace) -> int:
    lexicon = _read_dictionary(config, args)
    data = lexicon.to_file()
    if args.output is None:
        sys.stdout.write(data.decode("utf-8"))
    else:
        args.output.write_bytes(data)
        print(f"wrote {len(lexicon)} entries to {args.output}")
    return 0


def _pronounce_import(config: Any, args: argparse.Namespace) -> int:
    from bot.pronunciations import PronunciationFile

    data = _read_file(args.file)
    if args.http:
        imported, total = PronunciationFile(config.http.pronunciations).import_file(data, replace=args.replace)
    else:
        scope, owner = ("guild", args.guild) if args.guild is not None else ("user", args.user)
        imported, total = asyncio.run(_with_dictionaries(
            config, lambda d: d.import_file(scope, owner, data, replace=args.replace)))
    print(f"imported {imported} entries; the dictionary now holds {total}")
    return 0


_COMMANDS = {
    ("run", None): _run,
    ("check-token", None): _check_token,
    ("serve", None): _serve,
    ("say", None): _say,
    ("voices", "add"): _voices_add,
    ("voices", "list"): _voices_list,
    ("voices", "add-clip"): _voices_add_clip,
    ("voices", "add-style"): _voices_add_style,
    ("voices", "remove-style"): _voices_remove_style,
    ("voices", "delete"): _voices_delete,
    ("phrases", "precompute"): _phrases_precompute,
    ("phonemes", None): _phonemes,
    ("pronounce", "export"): _pronounce_export,
    ("pronounce", "import"): _pronounce_import,
    ("models", "download"): _download,
    ("engines", "build"): _engines_build,
}

if __name__ == "__main__":
    sys.exit(main())
