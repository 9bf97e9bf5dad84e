"""Cantonese: normalisation and G2P to jyutping phones (upstream ``cantonese.py`` semantics).

Normalisation is Mandarin's (:func:`synthesis.text.zh_normalize.normalize_sentences`: numbers, dates and times read
out in characters, traditional characters simplified), then upstream's Cantonese punctuation map, which unlike the
Mandarin one keeps runs of marks (``？！`` -> ``?!``) and maps ``~`` to ``-``; every other character outside the
CJK block U+4E00..U+9FA5 and ``! ? … , . -`` is dropped (``㗎`` too: upstream's models never saw it).

Readings come from ToJyutping, per character with phrase context. A syllable is two phones, ``Y`` + onset and
``Y`` + rest + tone (``hai6`` -> Yh Yai6). The onset is the first entry of :data:`ONSETS` the syllable starts with,
so a syllable without a consonant initial splits the way upstream's models were trained: ``aa3`` -> Yaa Ya3,
``uk1`` -> Yuk Yk1, ``ng5`` -> Yng Yg5 (when nothing is left, the onset's last letter is the rest). ``word2ph``:
2 per syllable, 1 per punctuation mark.

Beyond upstream: a number of three or more digits before a Cantonese measure word the Mandarin list lacks (蚊
dollars, 仙 cents, 部, 次 ...) is read as a quantity, ``350蚊`` -> 三百五十蚊, where upstream reads it digit by digit
(三五零蚊) as it does for codes.
"""

from __future__ import annotations

import importlib
import re
from functools import lru_cache
from typing import Callable, cast

from . import packages
from .errors import TextError
from .zh_normalize import normalize_sentences, to_simplified
from .zh_numbers import cardinal

PUNCTUATION = "!?…,.-"  # marks that are phones of their own (upstream's list)
PUNCTUATION_MAP = {  # upstream's Cantonese map; a mark not here and not in PUNCTUATION is dropped
    "：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "·": ",", "、": ",", "...": "…",
    "$": ".", "“": "'", "”": "'", '"': "'", "‘": "'", "’": "'", "（": "'", "）": "'", "(": "'", ")": "'",
    "《": "'", "》": "'", "【": "'", "】": "'", "[": "'", "]": "'", "—": "-", "～": "-", "~": "-", "「": "'", "」": "'",
}
# Syllable onsets, tried in this order (the first prefix wins, so "aai" splits as aa + i): upstream's convention.
ONSETS = tuple(
    "aa aai aak aap aat aau ai au ap at ak a p b e ts t dz d kw k gw g f h l m ng n s y w c z j "
    "ong on ou oi ok o uk ung".split()
)
# Cantonese characters upstream leaves as written whose zh-cn forms read otherwise (噉 gam2 -> 啖 daam6, 枱 toi2 ...).
KEEP_AS_WRITTEN = frozenset("噉枱捱摺閤蓆")
_PLACEHOLDER = 0xE000  # private-use code points stand in for kept characters during normalisation
_PRIVATE_USE_RE = re.compile("[\ue000-\uf8ff]")  # dropped from the input first (upstream drops them too)
# Measure words (as written: traditional or simplified) before which a number is a quantity, added to Mandarin's.
QUANTITY_WORDS = ("蚊", "仙", "部", "次", "份", "餐", "嚿", "呎", "磅", "轉", "转")

_PUNCTUATION_RE = re.compile("|".join(re.escape(k) for k in sorted(PUNCTUATION_MAP, key=len, reverse=True)))
_DROP_RE = re.compile(f"[^\u4e00-\u9fa5{re.escape(PUNCTUATION)}\ue000-\uf8ff]+")
_READING_RE = re.compile(r"(?:[a-z]+[1-6]+ ?)+")  # what upstream accepts as a character's reading
_QUANTITY_RE = re.compile(r"(?<![\d.,])(\d{1,3}(?:,\d{3})+|\d{3,})(?=" + "|".join(QUANTITY_WORDS) + ")")

JyutpingFn = Callable[[str], list[tuple[str, str | None]]]


@lru_cache(maxsize=1)
def _jyutping() -> JyutpingFn:
    """ToJyutping's per-character reader, loaded on the first Cantonese text (its trie takes about a second)."""
    missing = packages.missing("yue")
    if missing:
        raise TextError(f"Cantonese needs {', '.join(missing)}: pip install {' '.join(missing)}")
    package = importlib.import_module("ToJyutping")  # typed in its source, but its __init__ imports both ways
    return cast(JyutpingFn, package.get_jyutping_list)


def _map_punctuation(sentence: str) -> str:
    """Upstream's Cantonese punctuation map, then drop what is neither a CJK character nor a kept mark."""
    return _DROP_RE.sub("", _PUNCTUATION_RE.sub(lambda m: PUNCTUATION_MAP[m.group(0)], sentence))


def normalize(text: str) -> str:
    """Cantonese text -> simplified CJK characters and ``! ? … , . -`` (``係咪3點？！`` -> 系咪三点?!).

    Numbers, dates and times are read as Mandarin normalisation reads them; the characters keep their Cantonese
    readings (ToJyutping reads simplified text).
    """
    text = _QUANTITY_RE.sub(lambda m: cardinal(m.group(1).replace(",", "")), _PRIVATE_USE_RE.sub("", text))
    kept = sorted({c for c in text if _keep(c)})
    text = text.translate({ord(c): _PLACEHOLDER + i for i, c in enumerate(kept)})
    norm = "".join(_map_punctuation(s) for s in normalize_sentences(text))
    return norm.translate({_PLACEHOLDER + i: c for i, c in enumerate(kept)})


def _keep(char: str) -> bool:
    """Whether simplifying a CJK character would change its Cantonese reading or drop it (its zh-cn form lies
    outside the block upstream keeps: 嗰 -> U+20BB6)."""
    if char in KEEP_AS_WRITTEN:
        return True
    return "\u4e00" <= char <= "\u9fa5" and not all("\u4e00" <= c <= "\u9fa5" for c in to_simplified(char))


def _syllable_phones(syllable: str) -> tuple[str, str] | None:
    """``hai6`` -> (Yh, Yai6), ``aa3`` -> (Yaa, Ya3); None when no onset fits.

    A character ToJyutping reads as two syllables (卅 ``saa1 aa6``) is split like one, as upstream does, and its
    second phone is no symbol (UNK).
    """
    tone, base = (syllable[-1], syllable[:-1]) if syllable[-1].isdigit() else ("", syllable)
    onset = next((o for o in ONSETS if base.startswith(o)), None)
    if onset is None:
        return None
    rest = base[len(onset):] or onset[-1]
    return f"Y{onset}", f"Y{rest}{tone}"


def g2p(norm_text: str) -> tuple[list[str], list[int]]:
    """Normalised Cantonese (from :func:`normalize`) -> (phones, word2ph), one word2ph entry per character.

    A character with no Cantonese reading (a bare radical such as 亻) gets no phones and a word2ph of 0, where
    upstream would fail.

    Raises
    ------
    TextError
        ToJyutping is not installed.
    """
    phones: list[str] = []
    word2ph: list[int] = []
    for chars, reading in _jyutping()(norm_text):
        if all(c in PUNCTUATION for c in chars):
            phones.extend(chars)
            word2ph.extend(1 for _ in chars)
            continue
        pair = _syllable_phones(reading) if reading and _READING_RE.fullmatch(reading) else None
        phones.extend(pair or ())
        word2ph.append(len(pair or ()))
    return phones, word2ph
