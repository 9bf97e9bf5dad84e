"""Mandarin: normalisation and G2P to ``[initial, final+tone]`` phone pairs (upstream ``chinese2`` semantics).

Pinyin comes from ``pypinyin`` (per jieba word, so its phrase dictionary resolves most polyphones); g2pW is a
model download and is not used, which upstream accepts as the fallback. Then a subset of upstream's tone sandhi
(不, 一, neutral-tone particles and reduplication, 3-3) and erhua, then :mod:`synthesis.text.pinyin`.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from typing import Any

from .pinyin import syllable_phones
from .symbols import PUNCTUATION, UNK

log = logging.getLogger(__name__)

PUNCT_CHARS = "".join(PUNCTUATION)  # the punctuation that survives normalisation: ! ? … , .
_PUNCT_MAP = {
    "：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "·": ",", "、": ",", "...": "…",
    "$": ".", "/": ",", "—": "-", "~": "…", "～": "…", ":": ",", ";": ",",
}
_PUNCT_RE = re.compile("|".join(re.escape(k) for k in sorted(_PUNCT_MAP, key=len, reverse=True)))
_DROP_RE = re.compile(f"[^\u4e00-\u9fa5{re.escape(PUNCT_CHARS)}]+")
_CONSEC_RE = re.compile(f"([{re.escape(PUNCT_CHARS)}])([{re.escape(PUNCT_CHARS)}])+")
_TOKEN_RE = re.compile(f"[\u4e00-\u9fa5]+|[{re.escape(PUNCT_CHARS)}]")

_DATE_RE = re.compile(r"(?<![0-9])([0-9]{4})[-/.]([0-9]{1,2})[-/.]([0-9]{1,2})(?![0-9])")
_US_DATE_RE = re.compile(r"(?<![0-9])([0-9]{1,2})/([0-9]{1,2})/([0-9]{4})(?![0-9])")
_GROUPED_RE = re.compile(r"(?<![0-9,])([0-9]{1,3}(?:,[0-9]{3})+)(?![0-9])")
_CURRENCY_RE = re.compile(r"([¥￥$€£])\s?([0-9]+(?:\.[0-9]+)?)")
_CURRENCIES = {"¥": "元", "￥": "元", "$": "美元", "€": "欧元", "£": "英镑"}
_TEMPERATURE = {"℃": "摄氏度", "°C": "摄氏度", "℉": "华氏度", "°F": "华氏度"}
MAX_CN2AN_DIGITS = 16  # longer digit runs (ids, card numbers) are read digit by digit

_PARTICLES = set("吧呢啊呐噻嘛吖嗨哦哒额滴哩哟喽啰耶喔诶")  # a word-final particle is neutral
_STRUCTURAL = set("的地得")  # word-final structural particles are neutral
_NUMERALS = set("零一二三四五六七八九十百千万亿两")
_NOT_ERHUA = {
    "女儿", "男儿", "婴儿", "孤儿", "幼儿", "患儿", "侄儿", "孙儿", "少儿", "妻儿", "婴幼儿", "混血儿", "流浪儿",
}


def normalize(text: str) -> str:
    """Chinese text -> CJK characters and ``! ? … , .`` only.

    Numbers, dates, percentages and decimals are read out with ``cn2an`` (``3.5`` -> 三点五, ``50%`` -> 百分之五十);
    punctuation is mapped as upstream (``，`` -> ``,`` ...); every other character is removed; runs of
    punctuation collapse to their first mark.
    """
    if re.search(r"\d", text):
        text = _prepare_numbers(text)
        import cn2an  # pyright: ignore[reportMissingTypeStubs]  # untyped; its source gives the types

        try:
            text = cn2an.transform(text, "an2cn")
        except Exception as e:  # cn2an raises on odd digit strings: read digits one by one instead
            log.debug("cn2an could not convert %r (%s); reading digits", text, e)
            text = re.sub(r"\d", lambda m: "零一二三四五六七八九"[int(m.group(0))], text)
    text = text.replace("嗯", "恩").replace("呣", "母")
    text = _PUNCT_RE.sub(lambda m: _PUNCT_MAP[m.group(0)], text)
    text = _DROP_RE.sub("", text)
    return _CONSEC_RE.sub(r"\1", text)


def _prepare_numbers(text: str) -> str:
    """Rewrite what cn2an misreads into forms it reads right.

    ``2024-03-15`` -> 2024年3月15日 (not 二千零二十四负三负十五), ``-5℃`` -> -5摄氏度 (cn2an drops the sign of a
    temperature), ``1,250`` -> 1250, ``¥100`` -> 100元, and digit runs too long to be quantities are spelled.
    """
    def date(y: str, mo: str, d: str, original: str) -> str:
        return f"{y}年{int(mo)}月{int(d)}日" if 1 <= int(mo) <= 12 and 1 <= int(d) <= 31 else original

    text = _DATE_RE.sub(lambda m: date(m.group(1), m.group(2), m.group(3), m.group(0)), text)
    text = _US_DATE_RE.sub(lambda m: date(m.group(3), m.group(1), m.group(2), m.group(0)), text)
    for sign, word in _TEMPERATURE.items():
        text = text.replace(sign, word)
    text = _GROUPED_RE.sub(lambda m: m.group(1).replace(",", ""), text)
    text = _CURRENCY_RE.sub(lambda m: m.group(2) + _CURRENCIES[m.group(1)], text)
    return re.sub(r"[0-9]{%d,}" % (MAX_CN2AN_DIGITS + 1),
                  lambda m: "".join("零一二三四五六七八九"[int(c)] for c in m.group(0)), text)


@lru_cache(maxsize=1)
def _posseg() -> Any:
    """jieba's POS segmenter, loaded on first use (about half a second)."""
    import jieba  # pyright: ignore[reportMissingTypeStubs]  # untyped; its source gives the types
    import jieba.posseg  # pyright: ignore[reportMissingTypeStubs]  # untyped; its source gives the types

    jieba.setLogLevel(logging.WARNING)  # pyright: ignore[reportUnknownMemberType]  # untyped parameter
    return jieba.posseg


def _pinyin(word: str) -> list[str]:
    """TONE3 pinyin (``v`` for ü, 5 = neutral) per character of a CJK word."""
    from pypinyin import Style, lazy_pinyin

    # (pypinyin's stub types errors= as returning a str; a list, one entry per character, is what it handles here)
    out = lazy_pinyin(word, style=Style.TONE3, neutral_tone_with_five=True,
                      errors=lambda s: [""] * len(s))  # pyright: ignore[reportArgumentType]
    return out if len(out) == len(word) else [""] * len(word)


def _with_tone(syl: str, tone: str) -> str:
    """Replace a syllable's tone digit."""
    return syl[:-1] + tone if syl and syl[-1].isdigit() else syl


def _tone(syl: str) -> str:
    """A syllable's tone digit ('' when unknown)."""
    return syl[-1] if syl and syl[-1].isdigit() else ""


def _merge_words(words: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Upstream's pre-merge: 不/一 join the next word, X一X and reduplications join, short 3-3 words join."""
    out: list[tuple[str, str]] = []
    for word, pos in words:
        if out and out[-1][0] in ("不", "一") and _is_cjk(word):
            out[-1] = (out[-1][0] + word, pos)
        elif len(out) >= 2 and out[-1][0] == "一" and out[-2][0] == word and len(word) == 1:
            out[-2:] = [(word + "一" + word, out[-2][1])]
        elif out and out[-1][0] == word and len(word) == 1 and _is_cjk(word) and pos in ("v", "a", "n"):
            out[-1] = (word + word, pos)
        elif (
            out
            and _is_cjk(word)
            and _is_cjk(out[-1][0])
            and len(out[-1][0]) + len(word) <= 3
            and not (len(out[-1][0]) == 2 and out[-1][0][0] == out[-1][0][1])  # 奶奶 keeps its neutral tone
            and all(_tone(s) == "3" for s in _pinyin(out[-1][0] + word))
        ):
            out[-1] = (out[-1][0] + word, out[-1][1])
        else:
            out.append((word, pos))
    return out


def _is_cjk(word: str) -> bool:
    """Whether a token is Chinese characters only."""
    return bool(word) and all("\u4e00" <= c <= "\u9fa5" for c in word)


def _sandhi(word: str, pos: str, syls: list[str]) -> list[str]:
    """Tone sandhi on one word's syllables (a subset of upstream ``ToneSandhi.modified_tone``)."""
    syls = list(syls)
    n = len(word)
    # 不: X不X (看不懂) is neutral; before a 4th tone 不 is bu2.
    for i, c in enumerate(word):
        if c != "不":
            continue
        if n == 3 and i == 1:
            syls[i] = _with_tone(syls[i], "5")
        elif i + 1 < n and _tone(syls[i + 1]) == "4":
            syls[i] = _with_tone(syls[i], "2")
    # 一: unchanged in numbers and 第一; X一X is neutral; yi2 before a 4th tone, yi4 before others.
    if "一" in word and not all(c in _NUMERALS for c in word):
        for i, c in enumerate(word):
            if c != "一":
                continue
            if n == 3 and i == 1 and word[0] == word[2]:
                syls[i] = _with_tone(syls[i], "5")
            elif i > 0 and word[i - 1] == "第":
                syls[i] = _with_tone(syls[i], "1")
            elif i + 1 < n:
                syls[i] = _with_tone(syls[i], "2" if _tone(syls[i + 1]) == "4" else "4")
    # Neutral tones: particles, 的地得, noun/verb/adjective reduplication (奶奶, 看看).
    if n >= 1 and (word[-1] in _PARTICLES or word[-1] in _STRUCTURAL):
        syls[-1] = _with_tone(syls[-1], "5")
    elif n == 2 and word[0] == word[1] and pos[:1] in ("n", "v", "a") and word[0] not in _NUMERALS:
        syls[-1] = _with_tone(syls[-1], "5")
    # 3-3: in a run of 3rd tones, all but the last become 2nd.
    for i in range(n - 1):
        if _tone(syls[i]) == "3" and _tone(syls[i + 1]) == "3":
            syls[i] = _with_tone(syls[i], "2")
    return syls


def _erhua(word: str, pos: str, syls: list[str]) -> list[str]:
    """A word-final 儿 read as erhua takes the tone of the syllable before it (upstream ``_merge_erhua``)."""
    if len(word) >= 2 and word[-1] == "儿" and syls[-1] in ("er1", "er2", "er5"):
        if word not in _NOT_ERHUA and word[-2:] not in _NOT_ERHUA and pos not in ("a", "j", "nr"):
            syls = syls[:-1] + ["er" + (_tone(syls[-2]) or "5")]
    return syls


def g2p(norm_text: str) -> tuple[list[str], list[int]]:
    """Normalised Chinese -> (phones, word2ph): 2 phones per character, 1 per punctuation mark.

    Returns
    -------
    phones: v2 phone strings (``UNK`` for a character without a reading).
    word2ph: ``[len(norm_text)]`` phones per character; ``sum(word2ph) == len(phones)``.
    """
    phones: list[str] = []
    word2ph: list[int] = []
    words = [(w, p) for w, p in _posseg().lcut(norm_text)]
    pieces: list[tuple[str, str]] = []
    for word, pos in words:  # jieba may glue punctuation; keep CJK runs and marks apart
        pieces.extend((tok, pos) for tok in _TOKEN_RE.findall(word))
    for word, pos in _merge_words(pieces):
        if not _is_cjk(word):
            for c in word:
                phones.append(c)
                word2ph.append(1)
            continue
        syls = _erhua(word, pos, _sandhi(word, pos, _pinyin(word)))
        for syl in syls:
            pair = syllable_phones(syl)
            if pair is None:
                log.debug("no phones for syllable %r in %r", syl, word)
                pair = (UNK, UNK)
            phones.extend(pair)
            word2ph.append(2)
    assert len(phones) == sum(word2ph), (phones, word2ph)
    assert len(word2ph) == len(norm_text), (norm_text, word2ph)
    return phones, word2ph
