"""G2P and the front-end entry points: exact phone strings, word2ph, ids, BERT layout, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from synthesis.text import Phonemes, TextError, bert_features, normalize_for_cache, text_to_phonemes
from synthesis.text import chinese, english, english_oov
from synthesis.text.language import segment_languages
from synthesis.text.pinyin import syllable_phones
from synthesis.text.symbols import NUM_SYMBOLS, phones_to_ids, symbols


def _phones(ph: Phonemes) -> list[str]:
    table = symbols()
    return [table[i] for i in ph.ids]


def test_symbol_table_matches_golden(golden_dir: Path) -> None:
    assert list(symbols()) == json.loads((golden_dir / "symbols_v2.json").read_text(encoding="utf-8"))
    assert len(symbols()) == NUM_SYMBOLS
    ids = phones_to_ids(["_", "HH", "ao3", "not-a-phone"])
    assert ids.dtype == np.int64 and list(ids) == [symbols().index(p) for p in ("_", "HH", "ao3", "UNK")]


@pytest.mark.parametrize(
    ("text", "norm"),
    [
        ("42 apples", "forty-two apples"),
        ("It's 13:30.", "It's one thirty P M."),  # 24-hour: the half of the day is known
        ("Pay $6.24 or £2", "Pay six dollars and twenty-four cents or two pounds"),
        ("3.5 and 50%", "three point five and fifty percent"),
        ("1,000 in 1999 and 2005", "one thousand in nineteen ninety-nine and two thousand five"),
        ("the 21st, 3/4, 5km", "the twenty-first, three fourths, five kilometers"),
        ("e.g. NASA", "for example N A S A"),
        ("Wait...!! café", "Wait. cafe"),
    ],
)
def test_english_normalize(text: str, norm: str) -> None:
    assert english.normalize(text) == norm


@pytest.mark.parametrize(
    ("text", "phones"),
    [
        ("hello", "HH AH0 L OW1"),  # CMU
        ("Hello, world!", "HH AH0 L OW1 , W ER1 L D !"),
        ("forty-two", "F AO1 R T IY0 T UW1"),  # a hyphen between letters is not a phone
        ("A cat", "EY1 K AE1 T"),  # a lone capital A is the letter
        ("a", ", AH0"),  # fewer than 4 phones: a leading ","
        ("qzx", "K Y UW1 Z IY1 EH1 K S"),  # unknown and <= 3 letters: spelled
        ("zorblax's", "Z AO1 R B L AE1 K S AH0 Z"),  # split zorb|lax (wordsegment), neural zorb, 's after S -> AH0 Z
        ("bob's dog", "B AA1 B Z D AO1 G"),
        ("rock ' n", "R AA1 K - EH1 N"),  # a bare apostrophe is "-"
    ],
)
def test_english_g2p(text: str, phones: str) -> None:
    assert " ".join(english.g2p(text)) == phones


@pytest.mark.parametrize(
    ("word", "phones"),
    [
        ("activationist", "AE2 K T IH0 V EY1 SH AH0 N IH0 S T"),
        ("voicebot", "V OY1 S B AA0 T"),
        ("grokking", "G R OW1 K IH0 NG"),
    ],
)
def test_neural_fallback(word: str, phones: str) -> None:
    assert " ".join(english.predict_oov(word)) == phones


def test_neural_gru_matches_torch() -> None:
    """The numpy GRU step equals torch.nn.GRUCell with the same weights (gate order, bias placement)."""
    model = english_oov._neural()
    w_ih, w_hh, b_ih, b_hh = model.enc
    cell = torch.nn.GRUCell(w_ih.shape[1], w_hh.shape[1])
    with torch.no_grad():
        for param, value in zip((cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh), model.enc):
            param.copy_(torch.from_numpy(value))
    rng = np.random.default_rng(0)
    x = rng.standard_normal(w_ih.shape[1]).astype(np.float32)
    h = rng.standard_normal(w_hh.shape[1]).astype(np.float32)
    want = cell(torch.from_numpy(x)[None], torch.from_numpy(h)[None])[0].detach().numpy()
    np.testing.assert_allclose(model._gru_step(x, h, model.enc), want, atol=1e-5)


def test_every_pypinyin_syllable_has_two_v2_phones() -> None:
    from pypinyin.contrib.tone_convert import to_tone3
    from pypinyin.pinyin_dict import pinyin_dict

    table = set(symbols())
    syllables = {to_tone3(p, neutral_tone_with_five=True) for v in pinyin_dict.values() for p in v.split(",")}
    assert len(syllables) > 1400
    for syl in syllables:
        pair = syllable_phones(syl)
        assert pair is not None and pair[0] in table and pair[1] in table, syl


@pytest.mark.parametrize(
    ("syllable", "pair"),
    [
        ("ni3", ("n", "i3")), ("you3", ("y", "ou3")), ("yan4", ("y", "En4")), ("ye3", ("y", "E3")),
        ("yuan2", ("y", "van2")), ("wu3", ("w", "u3")), ("wo3", ("w", "o3")), ("an1", ("AA", "an1")),
        ("e4", ("EE", "e4")), ("er2", ("EE", "er2")), ("ou1", ("OO", "ou1")), ("shi4", ("sh", "ir4")),
        ("ri4", ("r", "ir4")), ("zi3", ("z", "i03")), ("ju2", ("j", "v2")), ("xue2", ("x", "ve2")),
        ("lv4", ("l", "v4")), ("nve4", ("n", "ve4")), ("gui4", ("g", "ui4")), ("qiong2", ("q", "iong2")),
    ],
)
def test_pinyin_table(syllable: str, pair: tuple[str, str]) -> None:
    assert syllable_phones(syllable) == pair


@pytest.mark.parametrize(
    ("text", "phones", "word2ph"),
    [
        ("你好", "n i2 h ao3", [2, 2]),  # 3-3 sandhi
        ("你好。", "n i2 h ao3 .", [2, 2, 1]),
        ("不对，不是", "b u2 d ui4 , b u2 sh ir4", [2, 2, 1, 2, 2]),  # 不 before a 4th tone
        ("看一看", "k an4 y i5 k an4", [2, 2, 2]),
        ("第一，一天", "d i4 y i1 , y i4 t ian1", [2, 2, 1, 2, 2]),
        ("奶奶好吗？", "n ai3 n ai5 h ao3 m a5 ?", [2, 2, 2, 2, 1]),  # reduplication and particle: neutral
        ("玩儿", "w an2 EE er2", [2, 2]),  # erhua takes the previous tone
        ("我有3.5个", "w o2 y ou3 s an1 d ian3 w u3 g e5", [2] * 6),  # 个 after a numeral: neutral (upstream)
    ],
)
def test_chinese_g2p(text: str, phones: str, word2ph: list[int]) -> None:
    norm = chinese.normalize(text)
    got, w2p = chinese.g2p(norm)
    assert " ".join(got) == phones
    assert w2p == word2ph and len(norm) == len(w2p) and sum(w2p) == len(got)


def test_chinese_normalize() -> None:
    assert chinese.normalize("我有3.5个苹果，在2024年！") == "我有三点五个苹果,在二零二四年!"
    assert chinese.normalize("Hello,世界~ 嗯……") == ",世界…恩…"


@pytest.mark.parametrize(
    ("text", "language", "pieces"),
    [
        ("我喜欢Python", "auto", [("我喜欢", "zh"), ("Python", "en")]),
        ("Hello 你好 world", "auto", [("Hello ", "en"), ("你好 ", "zh"), ("world", "en")]),
        ("我有3个", "auto", [("我有3个", "zh")]),
        ("123", "auto", [("123", "en")]),
        ("123", "zh", [("123", "zh")]),
        ("東京に行きます", "auto", [("東京に行きます", "ja")]),
        ("안녕 hi", "auto", [("안녕 ", "ko"), ("hi", "en")]),
        ("你好hello", "all_zh", [("你好", "zh"), ("hello", "en")]),
        ("こんにちは世界", "zh", [("こんにちは世界", "zh")]),
        ("粤语text", "auto_yue", [("粤语", "yue"), ("text", "en")]),
        ("我  喜欢  Python", "en", [("我 喜欢 Python", "en")]),
    ],
)
def test_segment_languages(text: str, language: str, pieces: list[tuple[str, str]]) -> None:
    assert segment_languages(text, language) == pieces


def test_mixed_sentence() -> None:
    ph = text_to_phonemes("我喜欢Python")
    assert _phones(ph) == "w o2 x i3 h uan5 P AY1 TH AA0 N".split()  # 3-3 sandhi, 欢 neutral (upstream)
    assert [(p.lang, p.norm_text, p.start, p.end, p.word2ph) for p in ph.pieces] == [
        ("zh", "我喜欢", 0, 6, (2, 2, 2)),
        ("en", "Python", 6, 11, None),
    ]
    assert ph.norm_text == "我喜欢Python" and ph.ids.dtype == np.int64


def test_short_text_retries_with_a_leading_period() -> None:
    ph = text_to_phonemes("你好", "zh")  # 4 phones < 6: rerun on ".你好"
    assert _phones(ph) == [".", "n", "i2", "h", "ao3"] and ph.pieces[0].word2ph == (1, 2, 2)
    assert _phones(text_to_phonemes("hi", "en")) == [",", ".", "HH", "AY1"]


@pytest.mark.parametrize(
    "text", ["Hello, world! 42 apples cost $3.50.", "今天天气很好，我们去公园吧！", "I love 北京 and Python 3.11", "@#$%"]
)
def test_ids_in_range(text: str) -> None:
    ids = text_to_phonemes(text).ids
    assert len(ids) >= 1 and ids.min() >= 0 and ids.max() < NUM_SYMBOLS


def test_bert_features_layout() -> None:
    ph = text_to_phonemes("Hi there, 你好世界。")
    calls: list[tuple[str, tuple[int, ...]]] = []

    def fake_bert(norm: str, word2ph: tuple[int, ...]) -> np.ndarray:
        calls.append((norm, tuple(word2ph)))
        return np.arange(1, sum(word2ph) + 1, dtype=np.float32)[None, :].repeat(1024, 0)

    feats = bert_features(ph, fake_bert)
    zh = next(p for p in ph.pieces if p.lang == "zh")
    assert calls == [(zh.norm_text, zh.word2ph)] and zh.norm_text == "你好世界."
    assert feats.shape == (1024, len(ph.ids)) and feats.dtype == np.float32
    assert np.all(feats[:, : zh.start] == 0) and list(feats[0, zh.start : zh.end]) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert not bert_features(ph, None).any()
    with pytest.raises(TextError, match="shape"):
        bert_features(ph, lambda n, w: np.zeros((1024, 3), np.float32))


@pytest.mark.parametrize(
    ("text", "language", "match"),
    [
        ("", "auto", "empty"),
        ("   ", "zh", "empty"),
        ("hello", "fr", "unknown language"),
    ],
)
def test_errors(text: str, language: str, match: str) -> None:
    with pytest.raises(TextError, match=match):
        text_to_phonemes(text, language)


def test_normalize_for_cache() -> None:
    assert normalize_for_cache("  Hello   WORLD!!  ") == normalize_for_cache("hello world!") == "hello world!"
    assert normalize_for_cache("你好，世界") == "你好,世界"
    assert normalize_for_cache("Hello world") != normalize_for_cache("Hello word")
