"""Pronunciation dictionaries in the bot: the store (atomic imports, limits, forget-me), the member's merged
dictionary reaching the synthesis params, the HTTP API's file and routes, and ``python -m bot phonemes``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import pytest

from bot.__main__ import main
from bot.config import config_from_dict
from bot.http import start_server
from bot.pronunciations import PronunciationFile, Pronunciations
from bot.store import Store, StoreError
from bot.voice_service import VoiceService
from synthesis.text import Lexicon, LexiconError
from tests.bot.test_http_fakes import VOICE_FREQS, FakeSynth
from tests.fake_voices import FakeVoices, make_voice

G1, ALICE, BOB = 100000000000001000, 100000000000002001, 100000000000002002


def dictionary_file(entries: list[dict]) -> bytes:
    return json.dumps({"format": "voicebot-pronunciations/1", "entries": entries}).encode()


@pytest.fixture
async def store(tmp_path: Path):
    s = Store(tmp_path / "bot.sqlite3")
    await s.open()
    yield s
    await s.close()


async def test_add_list_remove_and_the_users_entry_wins(store: Store) -> None:
    d = Pronunciations(store)
    assert await d.for_member(G1, ALICE) is None  # nothing stored: the pipeline gets no dictionary at all
    await d.add("guild", G1, "Nguyen", say="new yen")
    await d.add("guild", G1, "GIF", phones="JH IH1 F")
    entry, replaced = await d.add("user", ALICE, "nguyen", say="win")
    assert not replaced and entry.say == "win"
    alice = await d.for_member(G1, ALICE)
    assert alice is not None and alice.rewrite("Nguyen's GIF").parts[0].text == "win's "
    bob = await d.for_member(G1, BOB)
    assert bob is not None and bob.rewrite("Nguyen").parts[0].text == "new yen"
    _, replaced = await d.add("guild", G1, "NGUYEN", say="nwin")
    assert replaced and [e.word for e in (await d.lexicon("guild", G1)).entries] == ["GIF", "NGUYEN"]
    assert await d.remove("guild", G1, "gif") and not await d.remove("guild", G1, "gif")
    with pytest.raises(LexiconError, match="unknown en phone 'XX'"):
        await d.add("guild", G1, "GIF", phones="XX", lang="en")


async def test_a_bad_import_writes_nothing(store: Store) -> None:
    d = Pronunciations(store)
    await d.import_file("guild", G1, dictionary_file([{"word": "GIF", "say": "jif"}]))
    before = await store.pronunciations("guild", G1)
    entries = [{"word": f"word{i}", "say": f"say {i}"} for i in range(1999)]
    entries[1998] = {"word": "Nguyen", "phones": "W IH1 N X", "lang": "en"}
    with pytest.raises(LexiconError, match=r"^entry 1,999: 'Nguyen': unknown en phone 'X'"):
        await d.import_file("guild", G1, dictionary_file(entries), replace=True)
    with pytest.raises(LexiconError, match="the file has 10,000 entries"):
        await d.import_file("guild", G1, dictionary_file([{"word": f"w{i}", "say": "x"} for i in range(10_000)]))
    assert await store.pronunciations("guild", G1) == before
    # valid on its own, over the limit together with what is stored: refused inside the transaction
    entries[1998] = {"word": "Nguyen", "phones": "W IH1 N", "lang": "en"}
    await d.import_file("guild", G1, dictionary_file(entries[:1500]))
    with pytest.raises(StoreError, match="would hold 2,001 entries; the limit is 2,000"):
        await d.import_file("guild", G1, dictionary_file(entries[1499:] + [{"word": "extra", "say": "x"}]))
    assert len(await store.pronunciations("guild", G1)) == 1501
    imported, total = await d.import_file("guild", G1, dictionary_file(entries), replace=True)
    assert (imported, total) == (1999, 1999)
    exported = Lexicon.from_file(await d.export("guild", G1))
    assert len(exported) == 1999 and exported.get("nguyen").phones == ("W", "IH1", "N")


async def test_forget_me_removes_the_users_dictionary(store: Store) -> None:
    d = Pronunciations(store)
    await d.add("user", ALICE, "Nguyen", say="win")
    await d.add("guild", G1, "GIF", say="jif")
    counts = await store.forget_user(ALICE)
    assert counts["pronunciations"] == 1
    assert len(await d.lexicon("user", ALICE)) == 0 and len(await d.lexicon("guild", G1)) == 1


async def test_speech_service_passes_the_members_dictionary(store: Store, tmp_path: Path) -> None:
    from bot.speech import SpeechService

    config = config_from_dict({"discord": {"database": str(tmp_path / "bot.sqlite3")}}, base_dir=tmp_path)
    service = SpeechService(SimpleNamespace(), store, config, voices=SimpleNamespace())
    settings, user = await store.guild_settings(G1), await store.user_settings(ALICE, G1)
    assert (await service._with_lexicon(service._params(settings, user), G1, ALICE)).lexicon is None
    await service.pronunciations.add("guild", G1, "GIF", say="jif")
    await service.pronunciations.add("user", ALICE, "gif", say="gift")
    params = await service._with_lexicon(service._params(settings, user), G1, ALICE)
    assert params.lexicon is not None and params.lexicon.rewrite("a GIF").parts[0].text == "a gift"
    bot_params = await service._with_lexicon(service._params(settings, {}), G1, None)  # another bot: guild's only
    assert bot_params.lexicon.rewrite("a GIF").parts[0].text == "a jif"


# ---- the HTTP API's file -----------------------------------------------------------------------------------------

def test_file_is_written_atomically_and_reloaded(tmp_path: Path) -> None:
    path = tmp_path / "pron.json"
    f = PronunciationFile(path)
    assert len(f.load()) == 0 and not path.exists()  # missing: empty
    f.add("Nguyen", say="win")
    f.add("GIF", phones="JH IH1 F")
    assert json.loads(path.read_text())["entries"][0] == {"word": "Nguyen", "say": "win"}
    assert [p.name for p in tmp_path.iterdir()] == ["pron.json"]  # no temporary file left
    path.write_bytes(dictionary_file([{"word": "GIF", "say": "jif"}, {"word": "x", "say": "y"}]))  # a hand edit
    assert f.current().get("gif").say == "jif" and len(f.current()) == 2
    path.write_text('{"entries": [{"word": "GIF", "phones": "QQ", "lang": "en"}]}')  # a bad hand edit
    assert f.current().get("gif").say == "jif"  # the last good dictionary stays
    with pytest.raises(LexiconError, match=r"pron.json \(http.pronunciations\): entry 1: 'GIF': unknown en phone"):
        PronunciationFile(path).load()
    good = dictionary_file([{"word": "GIF", "say": "jif"}])
    path.write_bytes(good)
    with pytest.raises(LexiconError):
        f.import_file(dictionary_file([{"word": "a", "say": "b"}, {"word": "c", "phones": "QQ", "lang": "en"}]))
    assert path.read_bytes() == good  # nothing written


@pytest.fixture
async def api(tmp_path: Path):
    root = tmp_path / "voices"
    root.mkdir()
    config = config_from_dict({"voices": {"dir": str(root)}, "http": {"port": 0, "pronunciations": "pron.json"}},
                              base_dir=tmp_path)
    synth = FakeSynth(FakeVoices([make_voice(n) for n in VOICE_FREQS], root))
    services = SimpleNamespace(config=config, synthesizer=synth, store=None, speech=None,
                               voices=VoiceService(None, synth),
                               pronunciations=PronunciationFile(config.http.pronunciations))
    runner = await start_server(services, "127.0.0.1", 0)
    async with aiohttp.ClientSession(f"http://127.0.0.1:{runner.addresses[0][1]}") as session:
        yield session, synth, tmp_path / "pron.json"
    await runner.cleanup()


async def test_http_dictionary_routes_and_tts_use_it(api) -> None:
    session, synth, path = api
    async with session.post("/pronunciations", json={"word": "Nguyen", "phones": "W IH1 N", "lang": "en"}) as r:
        assert r.status == 201 and (await r.json())["entry"] == {"word": "Nguyen", "phones": "W IH1 N", "lang": "en"}
    async with session.post("/pronunciations", json={"word": "Nguyen", "phones": "W IH9 N", "lang": "en"}) as r:
        body = await r.json()
        assert r.status == 400 and body["message"].startswith("'Nguyen': unknown en phone 'IH9'")
    async with session.post("/pronunciations", json={"word": "GIF", "say": "jif"}) as r:
        assert r.status == 201
    async with session.get("/pronunciations") as r:
        assert [e["word"] for e in (await r.json())["entries"]] == ["Nguyen", "GIF"]
    async with session.get("/tts", params={"text": "Hi Nguyen.", "text_lang": "en", "ref_audio_path": "alice"}) as r:
        assert r.status == 200
    lexicon = synth.calls[-1].params.lexicon
    assert lexicon is not None and lexicon.get("gif").say == "jif"
    async with session.delete("/pronunciations", params={"word": "gif"}) as r:
        assert r.status == 200 and (await r.json())["entries"] == 1
    async with session.delete("/pronunciations", params={"word": "gif"}) as r:
        assert r.status == 404
    bad = {"entries": [{"word": "a", "say": "b"}, {"word": "a", "say": "c"}]}
    async with session.put("/pronunciations", json=bad) as r:
        assert r.status == 400 and "entry 2 ('a') repeats entry 1" in (await r.json())["message"]
    assert [e["word"] for e in json.loads(path.read_text())["entries"]] == ["Nguyen"]  # nothing written
    async with session.put("/pronunciations", json={"entries": [{"word": "a", "say": "b"}]}) as r:
        assert (await r.json()) == {"imported": 1, "entries": 1}


async def test_http_phonemes(api) -> None:
    session, _, _ = api
    async with session.post("/pronunciations", json={"word": "Nguyen", "phones": "W IH1 N"}) as r:
        assert r.status == 201
    async with session.get("/phonemes", params={"text": "Hi Nguyen.", "text_lang": "en"}) as r:
        report = await r.json()
    sentence = report["sentences"][0]
    assert sentence["dictionary"] == ["Nguyen → W IH1 N (en)"]
    assert [p["phones"] for p in sentence["pieces"] if p["source"] == "dictionary"] == [["W", "IH1", "N", "."]]
    async with session.post("/phonemes", json={"text": "Hi Nguyen.", "text_lang": "en", "dictionary": False}) as r:
        assert (await r.json())["sentences"][0]["dictionary"] == []
    async with session.get("/phonemes", params={"text": "hi", "text_lang": "xx"}) as r:
        assert r.status == 400 and "text_lang must be one of" in (await r.json())["message"]


# ---- the command line --------------------------------------------------------------------------------------------

def test_cli_phonemes_and_import_export(tmp_path: Path, capsys) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("discord: {database: bot.sqlite3}\nhttp: {pronunciations: pron.json}\n")
    dict_file = tmp_path / "mine.json"
    dict_file.write_bytes(dictionary_file([{"word": "Nguyen", "phones": "W IH1 N", "lang": "en"}]))
    assert main(["phonemes", "Hi Nguyen.", "--lang", "en", "--dict", str(dict_file), "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "dictionary: Nguyen → W IH1 N (en)" in out and "'Nguyen.' (dictionary): W IH1 N ." in out
    assert main(["pronounce", "import", str(dict_file), "--guild", str(G1), "--config", str(config)]) == 0
    assert "imported 1 entries; the dictionary now holds 1" in capsys.readouterr().out
    assert main(["phonemes", "Nguyen!", "--lang", "en", "--guild", str(G1), "--json", "--config", str(config)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sentences"][0]["phones"][-4:] == ["W", "IH1", "N", "!"]
    out_file = tmp_path / "export.json"
    assert main(["pronounce", "export", "--guild", str(G1), "-o", str(out_file), "--config", str(config)]) == 0
    assert json.loads(out_file.read_text())["entries"] == [{"word": "Nguyen", "phones": "W IH1 N", "lang": "en"}]
    bad = tmp_path / "bad.json"
    bad.write_text('{"entries": [{"word": "' + "x" * 1_000_000 + '", "say": "y"}]}')
    assert main(["pronounce", "import", str(bad), "--http", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1000000 characters long; the limit is 64" in err and len(err) < 200
    assert not (tmp_path / "pron.json").exists()
