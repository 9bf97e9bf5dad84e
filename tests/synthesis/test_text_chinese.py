"""Mandarin front-end: upstream's whole-text path on the golden set, sandhi rules, readings beyond upstream, G2PW."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from synthesis.text import chinese, g2pw
from synthesis.text.symbols import phones_to_ids
from synthesis.text.zh_normalize import normalize_sentences
from synthesis.text.zh_numbers import cardinal, number
from tests.golden_text import load_language


def _direct(text: str) -> tuple[list[int], list[int]]:
    """Upstream ``clean_text(text, "zh")``: normalise the whole text, then G2P."""
    phones, word2ph = chinese.g2p(chinese.normalize(text))
    return [int(i) for i in phones_to_ids(phones)], word2ph


def _golden_direct() -> list[object]:
    """The zh golden entries whose whole-text phones upstream got right (one pytest param each)."""
    return [pytest.param(e, id=e.id) for e in load_language("zh") if not e.quirk_in("direct")]


@pytest.mark.parametrize("entry", _golden_direct())
def test_whole_text_path_equals_upstream(entry) -> None:  # type: ignore[no-untyped-def]
    ids, word2ph = _direct(entry.text)
    assert chinese.normalize(entry.text) == entry.norm_text
    assert ids == list(entry.phone_ids)
    assert tuple(word2ph) == tuple(entry.word2ph or ())


# ---- normalisation: upstream's readings ---------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "sentences"), [
    ("我们班一共有42个人，今天来了38个。", ["我们班一共有四十二个人，", "今天来了三十八个。"]),
    ("原价299元，只要158.5元", ["原价二百九十九元，", "只要一百五十八点五元"]),
    ("原价299", ["原价二九九"]),  # three digits or more with no measure word: read as a code
    ("2024年3月15日", ["二零二四年三月十五日"]),
    ("2024-03-15", ["二零二四年三月十五日"]),
    ("8:30开会", ["八点半开会"]),
    ("7:05:09", ["七点零五分零九秒"]),
    ("剩15%了", ["剩百分之十五了"]),
    ("气温-5℃", ["气温零下五度"]),
    ("第3名", ["第三名"]),
    ("电话13812345678", ["电话幺三八幺二三四五六七八"]),
    ("有2个", ["有两个"]),
    ("3/4的人", ["四分之三的人"]),
    ("1012", ["幺零幺二"]),
    ("10000人", ["一万人"]),
    ("1012人", ["一千零一十二人"]),
    ("12.50米", ["十二点五零米"]),
    ("版本1.2.3", ["版本一点二点三"]),
    ("3~5天", ["三到五天"]),
    ("2+3=5", ["二加三等于五"]),
    ("x²", ["x的二次方"]),
    ("說話", ["说话"]),
    ("", [""]),
])
def test_normalize_sentences_reads_like_upstream(text: str, sentences: list[str]) -> None:
    assert normalize_sentences(text) == sentences


@pytest.mark.parametrize(("digits", "reading"), [
    ("0", "零"), ("10", "十"), ("12", "十二"), ("105", "一百零五"), ("1050", "一千零五十"), ("1012", "一千零一十二"),
    ("120000", "十二万"), ("100000000", "一亿"), ("13812345678", "一百三十八亿一千二百三十四万五千六百七十八"),
])
def test_cardinals(digits: str, reading: str) -> None:
    assert cardinal(digits) == reading


def test_decimals_keep_one_trailing_zero() -> None:
    assert (number("3.0"), number("3.50"), number("3.500"), number(".5")) == ("三点零", "三点五零", "三点五零", "零点五")


# ---- beyond upstream: readings upstream gets wrong ----------------------------------------------------------------

@pytest.mark.parametrize(("text", "normalised"), [
    ("7:20出发", "七点二十分出发"),
    ("8:30开会", "八点半开会"),
    ("8:30-9:15上课", "八点半至九点十五分上课"),  # upstream: 九点半 (it looks at the first time's minutes)
    ("8:30-9:30上课", "八点半至九点半上课"),
    ("打13812345678", "打幺三八幺二三四五六七八"),
    ("打138-1234-5678", "打幺三八,幺二三四,五六七八"),  # upstream: 幺三八减幺二三四减五六七八
    ("拨010-62345678", "拨零幺零,六二三四五六七八"),
    ("拨400-820-8820", "拨四零零,八二零,八八二零"),
    ("花了$5", "花了五美元"),  # upstream: 花了. (the sign is a full stop, the digit gone)
    ("花了$1,299.99", "花了一千二百九十九点九九美元"),
    ("¥100", "一百元"),
    ("￥88", "八十八元"),
    ("€20", "二十欧元"),
    ("£3.5", "三点五英镑"),
    ("₩5000", "五千韩元"),
    ("₹200", "二百卢比"),
    ("我有1,250只狗", "我有一千二百五十只狗"),  # upstream: 一,二百五十
    ("日期2024/3/5", "日期二零二四年三月五日"),  # upstream: 三分之二千零二十四每五
    ("2024-3-15见", "二零二四年三月十五日见"),
])
def test_beyond_upstream_readings(text: str, normalised: str) -> None:
    assert chinese.normalize(text) == normalised


@pytest.mark.parametrize(("text", "syllable", "reading"), [
    ("银行门口排了很长的队。", "长", ("ch", "ang2")),  # zh-shared-12: upstream's pypinyin says zhang3
    ("队伍太长了。", "长", ("ch", "ang2")),
    ("需要多长时间？", "长", ("ch", "ang2")),
    ("他长大了。", "长", ("zh", "ang3")),  # the verb keeps zhang3
    ("他长得很高。", "长", ("zh", "ang3")),
])
def test_polyphone_chang(text: str, syllable: str, reading: tuple[str, str]) -> None:
    norm = chinese.normalize(text)
    phones, word2ph = chinese.g2p(norm)
    at = sum(word2ph[: norm.index(syllable)])
    assert tuple(phones[at : at + 2]) == reading


# ---- sandhi and erhua (upstream's rules) --------------------------------------------------------------------------

def _finals(text: str) -> list[str]:
    """The final+tone phone of each Chinese character of ``text``."""
    phones, word2ph = chinese.g2p(chinese.normalize(text))
    out: list[str] = []
    at = 0
    for n in word2ph:
        if n == 2:
            out.append(phones[at + 1])
        at += n
    return out


@pytest.mark.parametrize(("text", "finals"), [
    ("不怕", ["u2", "a4"]),  # 不 before a 4th tone
    ("不好", ["u4", "ao3"]),
    ("看不懂", ["an4", "u5", "ong3"]),
    ("一天", ["i4", "ian1"]),  # 一 before a non-4th tone
    ("一样", ["i2", "ang4"]),
    ("看一看", ["an4", "i5", "an4"]),
    ("第一", ["i4", "i1"]),
    ("你好", ["i2", "ao3"]),  # 3-3
    ("我很好", ["o3", "en2", "ao3"]),
    ("奶奶", ["ai3", "ai5"]),  # reduplication
    ("衣服", ["i1", "u5"]),  # conventional neutral tone
    ("我们", ["o3", "en5"]),
    ("玩一会儿", ["an2", "i2", "ui4", "er4"]),  # erhua takes the tone before it
    ("女儿", ["v3", "er2"]),  # 儿 = child: its own syllable
])
def test_sandhi(text: str, finals: list[str]) -> None:
    assert _finals(text) == finals


def test_word2ph_covers_norm_text() -> None:
    norm = chinese.normalize("真的吗？？？太好了！！！")
    phones, word2ph = chinese.g2p(norm)
    assert norm == "真的吗?太好了!" and len(word2ph) == len(norm) and sum(word2ph) == len(phones)


def test_no_g2pw_without_its_folder(tmp_path: Path) -> None:
    g2pw.configure(tmp_path / "absent")
    try:
        assert not g2pw.available() and g2pw.predict("很长") is None
    finally:
        g2pw.use_defaults()


# ---- G2PW, on a tiny model built here (real file layout and ONNX signature, weights chosen by hand) ------------------

def _tiny_g2pw(folder: Path, prefer: str) -> None:
    """A G2PW folder whose model reads 長 as ``prefer`` (a bopomofo label) and a 5-token BERT tokenizer."""
    import onnx
    from onnx import TensorProto, helper

    model_dir, tok_dir = folder / "G2PWModel", folder / "bert"
    model_dir.mkdir()
    tok_dir.mkdir()
    (model_dir / "config.py").write_text("use_mask = True\nuse_char_phoneme = False\n", encoding="utf-8")
    (model_dir / "POLYPHONIC_CHARS.txt").write_text("長\tㄓㄤ3\n長\tㄔㄤ2\n", encoding="utf-8")
    (model_dir / "MONOPHONIC_CHARS.txt").write_text("隊\tㄉㄨㄟ4\n", encoding="utf-8")
    (model_dir / "bopomofo_to_pinyin_wo_tune_dict.json").write_text(
        json.dumps({"ㄓㄤ": "zhang", "ㄔㄤ": "chang", "ㄉㄨㄟ": "dui"}), encoding="utf-8")
    labels = sorted(["ㄓㄤ3", "ㄔㄤ2"])
    weights = np.array([[1.0 if label == prefer else 0.5 for label in labels]], np.float32)  # [chars, labels]
    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["N", "T"])
            for n in ("input_ids", "token_type_ids", "attention_mask")]
    graph = helper.make_graph(
        [helper.make_node("Gather", ["W", "char_ids"], ["scores"], axis=0),
         helper.make_node("Mul", ["scores", "phoneme_mask"], ["probs"])],
        "tiny_g2pw",
        [*ints, helper.make_tensor_value_info("phoneme_mask", TensorProto.FLOAT, ["N", len(labels)]),
         helper.make_tensor_value_info("char_ids", TensorProto.INT64, ["N"]),
         helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", len(labels)])],
        [helper.make_tensor("W", TensorProto.FLOAT, list(weights.shape), weights.flatten().tolist())],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(model_dir / "g2pW.onnx"))
    (tok_dir / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n很\n長\n的\n隊\n", encoding="utf-8")
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer"}), encoding="utf-8")


@pytest.mark.parametrize(("prefer", "reading"), [("ㄔㄤ2", "ang2"), ("ㄓㄤ3", "ang3")])
def test_g2pw_reads_polyphones_when_installed(tmp_path: Path, prefer: str, reading: str) -> None:
    pytest.importorskip("onnx")
    _tiny_g2pw(tmp_path, prefer)
    g2pw.configure(tmp_path / "G2PWModel", tmp_path / "bert")
    try:
        assert g2pw.available()
        assert g2pw.predict("很长的队") == ["hen3", "chang2" if prefer == "ㄔㄤ2" else "zhang3", "de5", "dui4"]
        assert _finals("很长的队")[1] == reading
    finally:
        g2pw.use_defaults()
