"""Cantonese: upstream's phones and word2ph on the golden set, the reading table where we read better, loading.

The golden text set (see its README) holds, per sentence, the phones and word2ph of upstream's whole-text
``clean_text``; ``cantonese.g2p(cantonese.normalize(text))`` is that path, so it is compared here (the segmented
inference path is compared in test_text_conformance.py). Entries marked ``upstream_quirk`` are left out: the
reading table reads those cases right on purpose.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from synthesis.text import cantonese, text_to_phonemes
from synthesis.text.frontend import bert_features
from synthesis.text.symbols import phones_to_ids
from tests.golden_text import load_language

REPO = Path(__file__).resolve().parents[2]
MIN_EXACT = 0.95  # share of non-quirk entries that must equal upstream exactly (as test_text_conformance.py)


def _direct(text: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Phone ids and word2ph of the whole-text path."""
    phones, word2ph = cantonese.g2p(cantonese.normalize(text))
    return tuple(int(i) for i in phones_to_ids(phones)), tuple(word2ph)


def test_direct_path_equals_upstreams_clean_text() -> None:
    entries = [e for e in load_language("yue") if not e.quirk_in("direct")]
    if not entries:
        pytest.skip("the golden text set has no yue entries")
    misses = [e.id for e in entries if _direct(e.text) != (e.phone_ids, tuple(e.word2ph or ()))]
    assert 1 - len(misses) / len(entries) >= MIN_EXACT, misses


def test_quirks_are_read_otherwise() -> None:
    for e in load_language("yue"):
        if e.quirk_in("direct"):
            assert _direct(e.text)[0] != e.phone_ids, e.id


@pytest.mark.parametrize(
    ("text", "norm"),
    [
        # beyond upstream: a number before a Cantonese measure word is a quantity, not digit by digit (三五零蚊)
        ("呢件衫要350蚊，好貴呀。", "呢件衫要三百五十蚊,好贵呀."),
        ("張飛機票要1,200蚊", "张飞机票要一千二百蚊"),
        ("我哋行咗100次", "我哋行咗一百次"),
        # upstream's other readings stay
        ("我哋班有32個學生。", "我哋班有三十二个学生."),
        ("嗰度有300幾個人", "嗰度有三百几个人"),
        ("我嘅生日係2024年3月15號。", "我嘅生日系二零二四年三月十五号."),
        ("聽朝8:30喺地鐵站等啦。", "听朝八点半喺地铁站等啦."),
        ("部手機得返15%電咋。", "部手机得返百分之十五电咋."),
        ("編號係123", "编号系幺二三"),
        # punctuation: runs kept, ~ is -, quotes and brackets dropped
        ("真係㗎？！唔係嘛！！", "真系?!唔系嘛!!"),
        ("「你好」，佢話～", "你好,佢话-"),
        # Cantonese characters kept as written where simplifying would drop them or change their reading
        ("嗰度噉樣劏雞", "嗰度噉样劏鸡"),
    ],
)
def test_normalisation_table(text: str, norm: str) -> None:
    assert cantonese.normalize(text) == norm


def test_syllables_split_as_upstream_trained() -> None:
    """Y + onset, Y + rest + tone; a syllable without a consonant initial splits at its first letters."""
    assert cantonese.g2p("屋五呀係,") == (
        ["Yuk", "Yk1", "Yng", "Yg5", "Yaa", "Ya3", "Yh", "Yai6", ","], [2, 2, 2, 2, 1])
    assert cantonese.g2p("你乛") == (["Yn", "Yei5"], [2, 0])  # a character with no reading: no phones, word2ph 0


def test_pieces_carry_word2ph_and_zero_bert() -> None:
    ph = text_to_phonemes("你食咗飯未呀？", "yue")
    (piece,) = ph.pieces
    assert piece.lang == "yue" and piece.word2ph is not None
    assert len(piece.word2ph) == len(piece.norm_text) and sum(piece.word2ph) == len(ph.ids)
    assert not bert_features(ph, lambda n, w: np.ones((1024, sum(w)), np.float32)).any()


def test_loads_lazily() -> None:
    code = (
        "import sys; import synthesis.text as t\n"
        "assert 'ToJyutping' not in sys.modules, 'loaded on import'\n"
        "t.text_to_phonemes('佢哋聽日會嚟。', 'yue')\n"
        "assert 'ToJyutping' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)
