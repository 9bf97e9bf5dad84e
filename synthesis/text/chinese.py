"""Mandarin: normalisation and G2P to ``[initial, final+tone]`` phone pairs (upstream ``chinese2`` semantics).

Normalisation is :func:`synthesis.text.zh_normalize.normalize_sentences` plus upstream's punctuation map. G2P
follows upstream's pypinyin branch (the one the v2 golden data was made with): each clause is cut into words by
jieba's POS tagger, words are merged and retoned by :mod:`synthesis.text.tone_sandhi`, each word's pinyin comes
from ``pypinyin`` (its phrase table resolves most polyphones), and :mod:`synthesis.text.pinyin` maps syllables to
v2 phones. A few polyphones pypinyin misreads are corrected (:mod:`synthesis.text.zh_polyphones`, beyond
upstream). Where upstream's G2PW polyphone model is installed, :mod:`synthesis.text.g2pw` reads the syllables
instead (upstream's default).
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from typing import Any

from . import g2pw
from .pinyin import syllable_phones
from .symbols import PUNCTUATION, UNK
from .tone_sandhi import erhua, merge_words, modify_tones, word_pinyin
from .zh_normalize import normalize_sentences
from .zh_polyphones import fix_polyphones

log = logging.getLogger(__name__)

PUNCT_CHARS = "".join(PUNCTUATION)  # the punctuation that survives normalisation: ! ? … , .
_PUNCT_MAP = {
    "：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "·": ",", "、": ",", "...": "…",
    "$": ".", "/": ",", "—": "-", "~": "…", "～": "…",
}
_PUNCT_RE = re.compile("|".join(re.escape(k) for k in _PUNCT_MAP))
_DROP_RE = re.compile(f"[^\u4e00-\u9fa5{re.escape(PUNCT_CHARS)}]+")
_CONSEC_RE = re.compile(f"([{re.escape(PUNCT_CHARS)}])([{re.escape(PUNCT_CHARS)}])+")
_CLAUSE_END_RE = re.compile(f"(?<=[{re.escape(PUNCT_CHARS)}])\\s*")
_LATIN_RE = re.compile("[a-zA-Z]+")


def normalize(text: str) -> str:
    """Chinese text -> CJK characters and ``! ? … , .`` only (upstream ``chinese2.text_normalize``).

    Numbers, dates, times, phone numbers and units are read out (:mod:`synthesis.text.zh_normalize`),
    punctuation is mapped (``，`` -> ``,`` ...), every other character is removed, and runs of punctuation
    collapse to their first mark.
    """
    return _CONSEC_RE.sub(r"\1", "".join(_map_punctuation(s) for s in normalize_sentences(text)))


def _map_punctuation(sentence: str) -> str:
    """Upstream ``replace_punctuation``: map marks to ``! ? … , .``, drop everything that is not CJK or one of them."""
    sentence = sentence.replace("嗯", "恩").replace("呣", "母")  # readings pypinyin gives as n/m, outside the table
    sentence = _PUNCT_RE.sub(lambda m: _PUNCT_MAP[m.group(0)], sentence)
    return _DROP_RE.sub("", sentence)


@lru_cache(maxsize=1)
def _posseg() -> Any:
    """jieba's POS segmenter, loaded on first use (about half a second)."""
    import jieba  # pyright: ignore[reportMissingTypeStubs]  # untyped; its source gives the types
    import jieba.posseg  # pyright: ignore[reportMissingTypeStubs]  # untyped; its source gives the types

    jieba.setLogLevel(logging.WARNING)  # pyright: ignore[reportUnknownMemberType]  # untyped parameter
    return jieba.posseg


def _words(clause: str) -> list[tuple[str, str]]:
    """A clause -> jieba (word, tag) pairs."""
    return [(str(w), str(p)) for w, p in _posseg().lcut(clause)]


def _char_pinyin(word: str) -> list[str]:
    """One pinyin item per character of ``word`` (pypinyin keeps a run of non-Chinese characters together)."""
    syls = word_pinyin(word)
    if len(syls) == len(word):
        return syls
    return [item for c in word for item in (word_pinyin(c) or [c])][: len(word)]


def _clause_syllables(clause: str) -> list[tuple[str, str]]:
    """A clause -> (character, TONE3 syllable or the mark itself), after sandhi and erhua."""
    predicted = g2pw.predict(clause)  # None unless the G2PW model is installed
    out: list[tuple[str, str]] = []
    start = 0
    previous = ""
    for word, pos in merge_words(_words(clause)):
        if pos == "eng":
            start += len(word)
            continue
        if predicted is not None:
            syls = g2pw.correct(word, predicted[start : start + len(word)])
        else:
            syls = fix_polyphones(previous, word, _char_pinyin(word))
        start += len(word)
        previous = word
        syls = erhua(word, pos, modify_tones(word, pos, syls))
        out.extend(zip(word, syls))
    return out


def g2p(norm_text: str) -> tuple[list[str], list[int]]:
    """Normalised Chinese -> (phones, word2ph): 2 phones per character, 1 per punctuation mark.

    Returns
    -------
    phones: v2 phone strings (``UNK UNK`` for a character without a reading).
    word2ph: ``[len(norm_text)]`` phones per character; ``sum(word2ph) == len(phones)``.
    """
    phones: list[str] = []
    word2ph: list[int] = []
    for clause in _CLAUSE_END_RE.split(norm_text):
        clause = _LATIN_RE.sub("", clause)
        if not clause.strip():
            continue
        for char, syl in _clause_syllables(clause):
            if char in PUNCT_CHARS:
                phones.append(char)
                word2ph.append(1)
                continue
            pair = syllable_phones(syl)
            if pair is None:
                log.debug("no phones for %r (%r) in %r", char, syl, clause)
                pair = (UNK, UNK)
            phones.extend(pair)
            word2ph.append(2)
    assert len(phones) == sum(word2ph), (phones, word2ph)
    return phones, word2ph
