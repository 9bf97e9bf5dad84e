"""Numbers read right (issue 16, items 3 and 10): a table of real cases per language, through the normalisers and
through the whole front-end (no number, however long, escapes as an exception)."""

from __future__ import annotations

import pytest

from synthesis.text import chinese, english, text_to_phonemes

EN = [  # upstream's readings (en_normalization/expend.py), except where noted
    ("1,250 dogs", "twelve fifty dogs"),  # upstream reads 1001-2999 in pairs, like a year, separators or not
    ("We sold 12,000,000 copies.", "We sold twelve million copies."),
    ("It weighs 1,250.75 kg", "It weighs twelve fifty point seven five kg"),
    ("That is €20.", "That is twenty euros."),  # beyond upstream (it drops the sign)
    ("€20.50 each", "twenty euros and fifty cents each"),
    ("¥100 only", "one hundred yen only"),
    ("$1,500 rent", "fifteen hundred dollars rent"),
    ("Pay $6.24 or £2", "Pay six dollars and twenty-four cents or two pounds"),
    ("Due 2024-03-15.", "Due March fifteenth, twenty twenty-four."),  # beyond upstream: numeric dates
    ("Due 03/15/2024.", "Due March fifteenth, twenty twenty-four."),
    ("Born 15/03/1984", "Born March fifteenth, nineteen eighty-four"),  # day first when it cannot be a month
    ("On 2000-01-01", "On January first, two thousand"),
    ("It is -5℃ outside", "It isnegative five degrees celsius outside"),  # upstream eats the space before "-"
    ("in 1999 and 2005", "in nineteen ninety-nine and two thousand five"),
    ("1,000 in 1999", "one thousand in nineteen ninety-nine"),
    ("42 apples", "forty-two apples"),
    ("3/4 of it", "three fourths of it"),
    ("the 21st", "the twenty-first"),
    ("card 4111111111111111", "card four quadrillion, one hundred eleven trillion, one hundred eleven billion, one "
     "hundred eleven million, one hundred eleven thousand, one hundred eleven"),
    ("Score: 3 - 2", "Score three minus two"),
    ("1. Buy milk", "first, Buy milk"),
    ("1/2 cup, 3/2 cups, 6/1", "one half cup, three halves cups, six"),
    ("It took 3h and 1.5km", "It took three hours and one point five kilometers"),
    ("$0.99 and 30$", "ninety-nine cents and thirty dollars"),
    ("£7.14", "seven pounds and fourteen pence"),
]

ZH = [
    ("今天是2024-03-15。", "今天是二零二四年三月十五日."),
    ("日期2024/3/5", "日期二零二四年三月五日"),
    ("气温-5℃", "气温零下五度"),  # upstream's temperature reading
    ("零下5℃", "零下五度"),
    ("我有1,250只狗", "我有一千二百五十只狗"),
    ("价格¥100", "价格一百元"),
    ("只要￥3.5", "只要三点五元"),
    ("我有3.5个苹果，在2024年！", "我有三点五个苹果,在二零二四年!"),
    ("涨了50%", "涨了百分之五十"),
]


@pytest.mark.parametrize(("text", "norm"), EN)
def test_english_numbers(text: str, norm: str) -> None:
    assert english.normalize(text) == norm


@pytest.mark.parametrize(("text", "norm"), ZH)
def test_chinese_numbers(text: str, norm: str) -> None:
    assert chinese.normalize(text) == norm


@pytest.mark.parametrize("digits", [37, 40, 120])
@pytest.mark.parametrize("language", ["en", "zh", "ja", "auto"])
def test_no_number_is_too_long_to_read(digits: int, language: str) -> None:
    """inflect names numbers only up to 10**36; longer ones are read digit by digit instead of raising."""
    number = "7" * digits
    for text in (number, f"Call {number} now.", f"the {number}th", f"{number}.5", f"${number}"):
        ph = text_to_phonemes(text, language)
        assert ph.ids.size > 0
    if language == "en":
        assert english.normalize(number) == " ".join(["seven"] * digits)
