"""synthesis.text.lexicon: entries, matching, the hook into the front-end, cache keys, the file format."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from engines.base import BERT_DIM
from synthesis.cache import SynthesisCache
from synthesis.text import Lexicon, LexiconError, bert_features, make_entry, text_to_phonemes
from synthesis.text.explain import explain_text
from synthesis.text.lexicon import MAX_ENTRIES, parse_file
from synthesis.text.symbols import symbols

SAMPLING = {"top_k": 15, "top_p": 1.0, "temperature": 1.0, "repetition_penalty": 1.35, "seed": "any"}


def phones(ph) -> list[str]:
    table = symbols()
    return [table[int(i)] for i in ph.ids]


def lex(*entries) -> Lexicon:
    return Lexicon(make_entry(w, **kw) for w, kw in entries)


# ---- entries -----------------------------------------------------------------------------------------------------

def test_phones_entries_are_mapped_and_their_language_found() -> None:
    assert make_entry("Nguyen", phones="W IH1 N").phones == ("W", "IH1", "N")
    zh = make_entry("长城", phones="chang2 cheng2")
    assert (zh.lang, zh.phones) == ("zh", ("ch", "ang2", "ch", "eng2"))  # pinyin through synthesis.text.pinyin
    assert make_entry("绿", phones="lv4", lang="zh").phones == ("l", "v4")
    assert make_entry("konnichiwa", phones="k o N n i ch i w a", lang="ja").phones[:3] == ("k", "o", "N")
    assert make_entry("  Nguyen   Van ", say=" win  van ").word == "Nguyen Van"


@pytest.mark.parametrize("kwargs, needle", [
    (dict(word="Nguyen", phones="W IH7 N", lang="en"), "unknown en phone 'IH7'; English phones are ARPAbet"),
    (dict(word="长城", phones="chang7 cheng2", lang="zh"), "unknown zh phone 'chang7'; Chinese phones are pinyin"),
    (dict(word="长城", phones="chang cheng2", lang="zh"), "unknown zh phone 'chang'"),  # a tone is required
    (dict(word="x", phones="QQ"), "are not English, Chinese or Japanese phones: say which language with lang"),
    (dict(word="x", phones="a", lang="fr"), "lang must be one of en, zh, ja, ko, yue"),
    (dict(word="hello, world", say="hi"), "contains ',', where sentences are cut"),
    (dict(word="x", say="y", phones="W"), "not both"),
    (dict(word="x"), "not neither"),
    (dict(word="   ", say="y"), "the word to fix is empty"),
    (dict(word="GIF", say="jif", lang="en"), "lang goes with phones only"),
])
def test_bad_entries_are_one_line_errors_naming_the_problem(kwargs, needle) -> None:
    with pytest.raises(LexiconError) as e:
        make_entry(**kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_word_of_one_megabyte_is_refused_in_one_short_line() -> None:
    t0 = time.thread_time()  # this thread's CPU seconds: what the refusal costs, whatever else the machine runs
    with pytest.raises(LexiconError) as e:
        make_entry("x" * 1_000_000, say="y")
    assert time.thread_time() - t0 < 0.5
    message = str(e.value)
    assert "1000000 characters long; the limit is 64" in message and len(message) < 120
    with pytest.raises(LexiconError, match="the respelling is 1000000 characters long; the limit is 200"):
        make_entry("x", say="y" * 1_000_000)
    with pytest.raises(LexiconError, match="the phones are too many"):
        make_entry("x", phones="AA1 " * 500_000)


# ---- matching ----------------------------------------------------------------------------------------------------

def test_matching_is_whole_word_case_insensitive_longest_first() -> None:
    lx = lex(("GIF", dict(say="jif")), ("New York", dict(say="Noo Yawk")), ("New", dict(say="gnu")))
    r = lx.rewrite("A gif, GIFs, a GIF-maker, new\tyork and New  York City, renew.")
    assert [p.text for p in r.parts] == ["A jif, GIFs, a jif-maker, Noo Yawk and Noo Yawk City, renew."]
    assert [e.word for e in r.used] == ["GIF", "GIF", "New York", "New York"]


def test_cjk_entries_match_exactly_anywhere() -> None:
    lx = lex(("长城", dict(phones="chang2 cheng2")), ("行长", dict(say="航长")))
    r = lx.rewrite("我去长城见行长")
    assert [(p.text, p.entry.word if p.entry else None) for p in r.parts] == [
        ("我去", None), ("长城", "长城"), ("见航长", None)]


def test_only_whole_words_match() -> None:
    lx = lex(("GIF", dict(say="jif")))
    assert lx.rewrite("Nothing here.").used == () and lx.rewrite("GIFs are here.").used == ()
    assert [e.word for e in lx.rewrite("a GIF").used] == ["GIF"]


def test_a_users_entry_wins_over_the_guilds() -> None:
    guild = lex(("Nguyen", dict(say="new yen")), ("GIF", dict(say="jif")))
    user = lex(("nguyen", dict(say="win")))
    merged = guild.merged(user)
    assert merged.rewrite("Nguyen posted a GIF").parts[0].text == "win posted a jif"
    assert len(merged) == 2 and guild.merged(None) is guild


# ---- the front-end hook ------------------------------------------------------------------------------------------

def test_phones_entry_becomes_its_own_piece_with_those_phones() -> None:
    lx = lex(("Nguyen", dict(phones="W IH1 N")))
    ph = text_to_phonemes("Nguyen is here.", "en", lx)
    fixed = [p for p in ph.pieces if p.fixed]
    assert [(p.text, p.lang, p.word2ph) for p in fixed] == [("Nguyen", "en", None)]
    assert phones(ph)[fixed[0].start:fixed[0].end] == ["W", "IH1", "N"]
    plain = text_to_phonemes("is here.", "en")
    assert phones(ph)[3:] == phones(plain)  # the rest is read as it was


def test_respelling_is_read_in_its_sentence() -> None:
    lx = lex(("GIF", dict(say="jif")))
    assert phones(text_to_phonemes("I sent a GIF today.", "en", lx)) == phones(
        text_to_phonemes("I sent a jif today.", "en"))
    assert text_to_phonemes("I sent a GIF today.", "en", lx).norm_text == text_to_phonemes(
        "I sent a jif today.", "en").norm_text


def test_chinese_phones_piece_has_zero_bert_and_neighbours_keep_word2ph() -> None:
    lx = lex(("长城", dict(phones="chang2 cheng2")))
    ph = text_to_phonemes("我们去长城玩吧", "zh", lx)
    assert [(p.text, p.fixed) for p in ph.pieces] == [("我们去", False), ("长城", True), ("玩吧", False)]
    for p in ph.pieces:
        if not p.fixed:
            assert p.word2ph is not None and sum(p.word2ph) == p.end - p.start == 2 * len(p.norm_text)
    wall = ph.pieces[1]
    assert phones(ph)[wall.start:wall.end] == ["ch", "ang2", "ch", "eng2"]
    seen: list[str] = []

    def bert(norm: str, word2ph) -> np.ndarray:
        seen.append(norm)
        return np.ones((BERT_DIM, sum(word2ph)), np.float32)

    feats = bert_features(ph, bert)
    assert seen == ["我们去", "玩吧"]  # BERT never sees the dictionary piece
    assert feats[:, wall.start:wall.end].sum() == 0 and feats[:, : wall.start].min() == 1


def test_without_a_matching_entry_phonemes_are_unchanged() -> None:
    lx = lex(("GIF", dict(say="jif")), ("长城", dict(phones="chang2 cheng2")))
    for text, lang in (("Hello there, how are you?", "en"), ("你好，世界。", "zh"), ("Hi 你好", "auto")):
        with_lx, without = text_to_phonemes(text, lang, lx), text_to_phonemes(text, lang)
        assert with_lx.ids.tolist() == without.ids.tolist() and with_lx.reading_key == without.reading_key
        assert with_lx.pieces == without.pieces


# ---- cache keys --------------------------------------------------------------------------------------------------

def key_of(ph) -> str:
    """As synthesis.stages.Stages.prosody_key computes it."""
    from synthesis.text import normalize_for_cache

    return SynthesisCache.prosody_key("model-a", "v1", 1, normalize_for_cache(ph.norm_text),
                                      "+".join(p.lang for p in ph.pieces), SAMPLING, reading=ph.reading_key)


def test_untouched_sentences_keep_their_key() -> None:
    text = "Hello there, friend."
    assert key_of(text_to_phonemes(text, "en", lex(("GIF", dict(say="jif"))))) == key_of(text_to_phonemes(text, "en"))


def test_touched_sentences_get_a_key_per_reading() -> None:
    text = "Say hi to Nguyen."
    plain = key_of(text_to_phonemes(text, "en"))
    a = key_of(text_to_phonemes(text, "en", lex(("Nguyen", dict(phones="W IH1 N")))))
    b = key_of(text_to_phonemes(text, "en", lex(("Nguyen", dict(phones="N UW1 Y EH0 N")))))
    c = key_of(text_to_phonemes(text, "en", lex(("nguyen", dict(phones="W IH1 N")))))
    assert len({plain, a, b}) == 3  # same norm text, different phones: different keys
    assert a == c  # the same reading (the key is matched case-insensitively) shares its entries
    audio = {SynthesisCache.audio_key(k, 1.0, 0.5, "any") for k in (plain, a, b)}
    assert len(audio) == 3


# ---- the file format ---------------------------------------------------------------------------------------------

def test_file_round_trip() -> None:
    lx = lex(("Nguyen", dict(say="win")), ("长城", dict(phones="chang2 cheng2")), ("GIF", dict(phones="JH IH1 F")))
    data = lx.to_file()
    assert json.loads(data)["entries"][1] == {"word": "长城", "phones": "chang2 cheng2", "lang": "zh"}
    assert "长城" in data.decode("utf-8")  # written as text, not \\u escapes
    assert Lexicon.from_file(data) == lx


def test_a_bad_entry_refuses_the_whole_file_naming_it() -> None:
    entries = [{"word": f"w{i}", "say": f"s{i}"} for i in range(1600)]
    entries[1499] = {"word": "Nguyen", "phones": "W IH9 N", "lang": "en"}
    with pytest.raises(LexiconError) as e:
        parse_file(json.dumps({"entries": entries}))
    assert str(e.value).startswith("entry 1,500: 'Nguyen': unknown en phone 'IH9'")
    assert str(e.value).endswith("nothing was imported")


@pytest.mark.parametrize("body, needle", [
    ({"entries": [{"word": f"w{i}", "say": "x"} for i in range(10_000)]},
     f"the file has 10,000 entries; a dictionary holds at most {MAX_ENTRIES:,}"),
    ({"entries": [{"word": "GIF", "say": "jif"}, {"word": "gif", "say": "gif"}]}, "entry 2 ('gif') repeats entry 1"),
    ({"entries": [{"word": "GIF", "sey": "jif"}]}, "entry 1: unknown key 'sey'"),
    ({"entries": [{"word": "GIF", "say": 3}]}, "entry 1: say must be text"),
    ({"format": "other/2", "entries": []}, "this version reads voicebot-pronunciations/1"),
    ([{"word": "GIF", "say": "jif"}], "the file must be a JSON object"),
])
def test_bad_files_are_refused_in_one_line(body, needle) -> None:
    with pytest.raises(LexiconError) as e:
        parse_file(json.dumps(body))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_file_size_limit_and_bad_json() -> None:
    with pytest.raises(LexiconError, match="the file is 1,100,000 bytes; the limit is 1,048,576"):
        parse_file(b" " * 1_100_000)
    with pytest.raises(LexiconError, match="not valid JSON"):
        parse_file(b"{nope")


def test_explain_reports_pieces_phones_and_entries() -> None:
    lx = lex(("Nguyen", dict(phones="W IH1 N")))
    report = explain_text("Hi Nguyen. Bye!", "en", lx)
    first = report["sentences"][0]
    assert first["dictionary"] == ["Nguyen → W IH1 N (en)"]
    assert [(p["norm_text"], p["source"]) for p in first["pieces"]][-1] == ("Nguyen.", "dictionary")
    assert first["phones"][-4:] == ["W", "IH1", "N", "."]  # the full stop is read after the entry, as after a word
    assert report["sentences"][1]["dictionary"] == []
