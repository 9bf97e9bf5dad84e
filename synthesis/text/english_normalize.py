"""English normalisation as upstream does it (``english.text_normalize`` -> ``en_normalization/expend.normalize``).

The rules run in upstream's order, each with upstream's pattern, so that numbers are spelled exactly as the v2
model heard them in training: list numbers (``1. `` -> ``first,``), arithmetic, negatives, thousands separators,
units, pounds and dollars, decimals, fractions, ordinals, other numbers (years read in pairs), then
accents, ``%``, every character but letters and ``' . , ? ! -`` dropped, ``i.e.``/``e.g.``, and a space before
each inner capital (``NASA`` -> ``N A S A``). Readings upstream gets wrong are fixed beforehand by
:mod:`.english_readings`.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Any

MAX_NAMED_DIGITS = 36  # inflect names numbers below 10**36; longer digit runs are read digit by digit

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_UNITS = {  # unit -> (singular, plural); the order is upstream's alternation order (it decides "5km/h")
    "m": ("meter", "meters"),
    "km": ("kilometer", "kilometers"),
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "ft": ("feet", "feet"),
    "L": ("liter", "liters"),
    "tbsp": ("tablespoon", "tablespoons"),
    "tsp": ("teaspoon", "teaspoons"),
    "h": ("hour", "hours"),
    "min": ("minute", "minutes"),
    "s": ("second", "seconds"),
    "°C": ("degree celsius", "degrees celsius"),
    "°F": ("degree fahrenheit", "degrees fahrenheit"),
}
_SUPERSCRIPTS = "⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ"
_OPERAND = rf"((-?)((\d+)(\.\d+)?[{_SUPERSCRIPTS}]*)|(\.\d+[{_SUPERSCRIPTS}]*)|([A-Za-z][{_SUPERSCRIPTS}]*))"
_OPERATOR_WORDS = {"+": " plus ", "-": " minus ", "×": " times ", "÷": " divided by ", "=": " Equals "}
# no word boundary around the operands (upstream's): "tired - so" becomes "tired minus so"
_ARITHMETIC_RE = re.compile(_OPERAND + r"\s+([\+\-\×÷=])\s+" + _OPERAND)
_LIST_NUMBER_RE = re.compile(r"\b([0-9]+)\. ")
_NEGATIVE_RE = re.compile(r"(?:^|\s+)(-)(\d+)")  # the space before the sign is consumed, as upstream does
_GROUPED_RE = re.compile(r"([0-9][0-9\,]+[0-9])")
_UNIT_RE = re.compile(r"\b([0-9]+(\.[0-9]+)?(" + "|".join(re.escape(u) for u in _UNITS) + r"))\b")
_POUNDS_BEFORE_RE = re.compile(r"£([0-9\.\,]*[0-9]+)")
_POUNDS_AFTER_RE = re.compile(r"([0-9\.\,]*[0-9]+)£")
_DOLLARS_BEFORE_RE = re.compile(r"\$([0-9\.\,]*[0-9]+)")
_DOLLARS_AFTER_RE = re.compile(r"([(0-9\.\,]*[0-9]+)\$")
_DECIMAL_RE = re.compile(r"([0-9]+\.\s*[0-9]+)")
_FRACTION_RE = re.compile(r"([0-9]+/[0-9]+)")
_ORDINAL_RE = re.compile(r"[0-9]+(st|nd|rd|th)")
_NUMBER_RE = re.compile(r"[0-9]+")
_DROP_RE = re.compile(r"[^ A-Za-z'.,?!\-]")
_INNER_CAPITAL_RE = re.compile(r"(?<!^)(?<![\s])([A-Z])")
_PUNCT_RUN_RE = re.compile(r"([!?…,.\-\s])([!?…,.\-])+")
_FULL_WIDTH = str.maketrans({"。": ".", "！": "!", "？": "?"})


@lru_cache(maxsize=1)
def _inflect() -> Any:
    """The inflect engine (slow to import, so loaded on first use)."""
    import inflect

    return inflect.engine()


def number_words(n: int | str, **kw: Any) -> str:
    """inflect's reading of a number ("42" -> "forty-two", "21st" -> "twenty-first"); too long: digit by digit."""
    digits = str(n)
    bare = digits.rstrip("stndrh")
    if bare.isdigit() and len(bare.lstrip("0")) > MAX_NAMED_DIGITS:
        return " ".join(DIGIT_WORDS[int(d)] for d in bare)
    return str(_inflect().number_to_words(digits if isinstance(n, str) else n, **kw))


def ordinal(word: str) -> str:
    """inflect's ordinal of a number or number word ("1" -> "1st", "four" -> "fourth")."""
    return str(_inflect().ordinal(word))


def cardinal(n: int) -> str:
    """A whole number as upstream reads it: 1001-2999 in pairs like a year (1984 -> nineteen eighty-four)."""
    if 1000 < n < 3000:
        if n == 2000:
            return "two thousand"
        if 2000 < n < 2010:
            return "two thousand " + number_words(n % 100)
        if n % 100 == 0:
            return number_words(n // 100) + " hundred"
        return number_words(n, andword="", zero="oh", group=2).replace(", ", " ")
    return number_words(n, andword="")


def _arithmetic(m: re.Match[str]) -> str:
    """``3 + 4`` -> ``3 plus 4``."""
    return m.group(1) + _OPERATOR_WORDS[m.group(8)] + m.group(9)


def _unit(m: re.Match[str]) -> str:
    """``5km`` -> ``5 kilometers``; singular only for a whole 1."""
    sign = m.group(3)
    number = int(m.group(1).replace(sign, "").replace(".", ""))
    plural = not (m.group(2) is None and number == 1)
    return m.group(1).replace(sign, " " + _UNITS[sign][plural])


def money(amount: str, unit: str, units: str, cent: str, cents: str) -> str:
    """Upstream's money reading: ``6.24`` dollars -> ``6 dollars and 24 cents`` (digits spelled later)."""
    parts = amount.split(".")
    if len(parts) > 2:
        return amount + " " + units
    whole = int(parts[0]) if parts[0] else 0
    frac = int(parts[1].ljust(2, "0")) if len(parts) > 1 and parts[1] else 0
    whole_unit = unit if whole == 1 else units
    frac_unit = cent if frac == 1 else cents
    if whole and frac:
        return f"{whole} {whole_unit} and {frac} {frac_unit}"
    if whole:
        return f"{whole} {whole_unit}"
    if frac:
        return f"{frac} {frac_unit}"
    return f"zero {units}"


def _pounds(m: re.Match[str]) -> str:
    """``£7.14`` -> ``7 pounds and 14 pence``."""
    return money(m.group(1), "pound", "pounds", "penny", "pence")


def _dollars(m: re.Match[str]) -> str:
    """``$6.24`` -> ``6 dollars and 24 cents``."""
    return money(m.group(1), "dollar", "dollars", "cent", "cents")


def _decimal(m: re.Match[str]) -> str:
    """``13.234`` -> ``13 point 2 3 4``: the part after the point digit by digit."""
    whole, frac = m.group(1).split(".")
    return whole + " point " + " ".join(frac)


def _fraction(m: re.Match[str]) -> str:
    """``3/4`` -> three fourths, ``1/2`` -> one half, ``3/2`` -> three halves, ``6/1`` -> six."""
    numerator, denominator = map(int, m.group(0).split("/"))
    top = number_words(numerator)
    if denominator == 2:
        return f"{top} {'half' if numerator == 1 else 'halves'}"
    if denominator == 1:
        return top
    bottom = ordinal(number_words(denominator))
    return f"{top} {bottom}{'s' if numerator > 1 else ''}"


def expand(text: str) -> str:
    """Upstream ``expend.normalize``: numbers, money, units and times spelled, other symbols dropped."""
    text = _LIST_NUMBER_RE.sub(lambda m: ordinal(m.group(1)) + ", ", text)
    while _ARITHMETIC_RE.search(text):
        text = _ARITHMETIC_RE.sub(_arithmetic, text)
    text = _NEGATIVE_RE.sub(lambda m: f"negative {m.group(2)}", text)
    text = _GROUPED_RE.sub(lambda m: m.group(1).replace(",", ""), text)
    # (upstream spells clock times here, adding an "a.m." to every time before noon; english_readings reads them)
    text = _UNIT_RE.sub(_unit, text)
    text = _POUNDS_BEFORE_RE.sub(_pounds, text)
    text = _POUNDS_AFTER_RE.sub(_pounds, text)
    text = _DOLLARS_BEFORE_RE.sub(_dollars, text)
    text = _DOLLARS_AFTER_RE.sub(_dollars, text)
    text = _DECIMAL_RE.sub(_decimal, text)
    text = _FRACTION_RE.sub(_fraction, text)
    text = _ORDINAL_RE.sub(lambda m: number_words(m.group(0)), text)
    text = _NUMBER_RE.sub(lambda m: cardinal(int(m.group(0))), text)
    text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
    text = text.replace("%", " percent")
    text = _DROP_RE.sub("", text)
    text = re.sub(r"(?i)i\.e\.", "that is", text)
    text = re.sub(r"(?i)e\.g\.", "for example", text)
    return _INNER_CAPITAL_RE.sub(r" \1", text)


def upstream_normalize(text: str) -> str:
    """Upstream ``english.text_normalize``: full-width ``。！？``, :func:`expand`, runs of punctuation collapsed.

    (Upstream's map of ``;:`` to ``,`` and of quotes to ``'`` never fires: its keys are escaped as literal text,
    so ``;`` and ``:`` are dropped with the other symbols.)
    """
    return _PUNCT_RUN_RE.sub(r"\1", expand(text.translate(_FULL_WIDTH)))
