"""Korean: upstream's phones on the golden set, the reading table where we read better, loading and packages.

The golden text set (see its README) holds, per sentence, the phones of upstream's whole-text ``clean_text``
(top-level ``phone_ids``); :func:`korean.g2p` is that path for Korean, so it is compared here (the segmented
inference path is compared in test_text_conformance.py). Entries marked ``upstream_quirk`` are left out: the
reading table below reads those cases right on purpose.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from synthesis.text import korean, text_to_phonemes
from synthesis.text.frontend import bert_features, speakable_languages
from synthesis.text.symbols import symbol_ids
from tests.golden_text import load_language

REPO = Path(__file__).resolve().parents[2]
MIN_EXACT = 0.95  # share of non-quirk entries that must equal upstream exactly (as test_text_conformance.py)


def test_direct_path_equals_upstreams_clean_text() -> None:
    entries = [e for e in load_language("ko") if not e.quirk_in("direct")]
    if not entries:
        pytest.skip("the golden text set has no ko entries")
    table = symbol_ids()
    misses = [e.id for e in entries if tuple(table[p] for p in korean.g2p(e.text)) != e.phone_ids]
    assert 1 - len(misses) / len(entries) >= MIN_EXACT, misses


def test_quirks_are_read_otherwise() -> None:
    """Where the set marks upstream wrong, our phones differ from upstream's (what they are: the table below)."""
    table = symbol_ids()
    for e in load_language("ko"):
        if e.quirk_in("direct"):
            assert tuple(table[p] for p in korean.g2p(e.text)) != e.phone_ids, e.id


@pytest.mark.parametrize(
    ("text", "reading"),
    [
        # beyond upstream: native numerals before native counters g2pk2 reads as Sino-Korean (이십오명)
        ("학생이 25명 있어요.", "학생이 스물다섯명 있어요."),
        ("20명", "스무명"),
        ("손님 1명", "손님 한명"),
        ("커피 2잔 주세요", "커피 두잔 주세요"),
        ("물 3병", "물 세병"),
        ("사진 4장", "사진 네장"),
        ("2시간 기다렸어요", "두시간 기다렸어요"),
        ("3달 동안", "세달 동안"),
        ("2사람이 왔어요", "두사람이 왔어요"),
        # native counters upstream already reads natively: unchanged
        ("3시에 만나요", "세시에 만나요"),
        ("사과 2개", "사과 두개"),
        ("5살이에요", "다섯살이에요"),
        ("3번째 시도", "세번째 시도"),
        ("1번째", "첫번째"),
        # Sino-Korean counters stay Sino-Korean
        ("7시 30분에", "일곱시 삼십분에"),
        ("4500원이에요", "사천오백원이에요"),
        ("2024년 3월 15일", "이천이십사년 삼월 십오일"),
        ("제3장", "제삼장"),
        ("15%", "십오퍼센트"),
    ],
)
def test_reading_table(text: str, reading: str) -> None:
    assert korean.g2p(text) == korean.g2p(reading)


def test_phone_conventions() -> None:
    """One phone per jamo, compound vowels split, 空 for a space, 停 for the unknown, a final bare jamo gets '.'."""
    assert korean.g2p("와 좋다") == ["ㅇ", "ㅗ", "ㅏ", "空", "ㅈ", "ㅗ", "ㅌ", "ㅏ", "."]
    assert korean.g2p("ㅋㅋ") == ["ㅋ", "ㅋ", "."]
    assert korean.g2p("네 漢") == ["ㄴ", "ㅔ", "空", "停"]
    assert korean.g2p("네!!") == ["ㄴ", "ㅔ", "!", "!"]  # punctuation runs are kept
    assert korean.g2p("AI") == korean.g2p("에이아이")  # Latin letters are spelled out


def test_bert_features_stay_zero_for_korean() -> None:
    ph = text_to_phonemes("오늘 날씨가 좋네요.", "ko")
    assert [p.lang for p in ph.pieces] == ["ko"] and ph.pieces[0].word2ph is None
    assert not bert_features(ph, lambda n, w: np.ones((1024, sum(w)), np.float32)).any()
    assert {"ko", "all_ko"} <= set(speakable_languages())  # still found once g2pk2's modules are loaded


def test_loads_lazily_and_never_imports_the_downloading_module() -> None:
    """Importing the front-end loads no Korean package; reading Korean imports neither nltk nor g2pk2's G2p."""
    code = (
        "import sys; import synthesis.text as t\n"
        "assert not {'mecab', 'g2pk2', 'jamo'} & set(sys.modules), 'loaded on import'\n"
        "t.text_to_phonemes('국물이 정말 맛있습니다.', 'ko')\n"
        "assert 'nltk' not in sys.modules and 'g2pk2.g2pk2' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)
