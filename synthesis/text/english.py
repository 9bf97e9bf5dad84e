"""English: normalisation and G2P to ARPAbet with stress, as upstream ``text/english.py`` does it, offline.

``normalize`` rewrites what upstream misreads (:mod:`.english_readings`), then runs upstream's own rules
(:mod:`.english_normalize`). ``g2p`` tokenises like upstream (nltk's ``TweetTokenizer``: hyphenated words and
``'s`` stay whole), tags parts of speech (:mod:`.english_tagger`) to choose between a homograph's readings, and
reads each word as upstream's ``qryword``: CMU dictionary, letters of a short unknown word, ``'s`` by voicing,
compound split (wordsegment), then g2p_en's neural model (:mod:`.english_oov`).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from functools import lru_cache

from .english_lexicon import cmu, homographs, pick_homograph, split_compound, title_words
from .english_normalize import upstream_normalize
from .english_oov import predict_oov
from .english_readings import rewrite
from .english_tagger import pos_tags
from .symbols import UNK, symbol_ids

__all__ = ["normalize", "g2p", "predict_oov"]

MIN_PHONES = 4  # fewer phones than this get a leading "," (upstream cleaner)
SPELL_MAX_LETTERS = 3  # unknown words this short are read letter by letter

_VOICELESS = {"P", "T", "K", "F", "TH", "HH"}  # 's after these is S
_SIBILANTS = {"S", "Z", "SH", "ZH", "CH", "JH"}  # 's after these is AH0 Z
_POSSESSIVE_RE = re.compile(r"^([a-z]+)('s)$")
_LETTER_RE = re.compile(r"[a-z]")
# a time that puts "I read" in the past (the tagger calls that "read" VBP, present, and upstream says R IY1 D)
_PAST_RE = re.compile(
    r"\b(yesterday|ago|last\s+(night|week|weekend|month|year|time|summer|winter|spring|fall|autumn|monday|tuesday|"
    r"wednesday|thursday|friday|saturday|sunday)|earlier\s+today)\b",
    re.IGNORECASE,
)
_PERFECT = {"have", "has", "had", "haven't", "hasn't", "hadn't", "i've", "you've", "we've", "they've"}


def normalize(text: str) -> str:
    """English text -> the words and punctuation G2P reads (numbers, money, times, units spelled out).

    Upstream's ``english.text_normalize`` (see :mod:`.english_normalize`), after the rewrites of
    :mod:`.english_readings` for what upstream reads wrong (clock times, ``Dr.``, decades, phone numbers...).
    """
    return upstream_normalize(rewrite(text))


@lru_cache(maxsize=1)
def _tokenizer() -> Callable[[str], list[str]]:
    """nltk's ``TweetTokenizer().tokenize`` (nltk.tokenize needs no downloaded data; imported on first use)."""
    casual = importlib.import_module("nltk.tokenize.casual")  # untyped: reached through getattr
    tokenize: Callable[[str], list[str]] = getattr(casual, "TweetTokenizer")().tokenize
    return tokenize


def _letters(word: str) -> list[str]:
    """A short unknown word letter by letter ("a" is the letter EY1, not the article)."""
    table = cmu()
    out: list[str] = []
    for c in word:
        if c == "a":
            out.append("EY1")
        elif not c.isalpha():
            out.append(c)
        else:
            out.extend(table[c])
    return out


def _word_phones(word: str) -> list[str]:
    """Upstream ``qryword``: dictionary, Title-case words, spelling, possessive, compound split, neural model."""
    low = word.lower()
    table = cmu()
    if len(low) > 1 and low in table:
        return list(table[low])
    if word.istitle() and low in title_words():
        return list(title_words()[low])
    if len(low) <= SPELL_MAX_LETTERS:
        return _letters(low)
    m = _POSSESSIVE_RE.match(low)
    if m:
        out = _word_phones(m.group(1))
        if not out:
            return ["Z"]
        if out[-1] in _VOICELESS:
            return out + ["S"]
        if out[-1] in _SIBILANTS:
            return out + ["AH0", "Z"]
        return out + ["Z"]
    parts = split_compound(low)
    if len(parts) == 1:
        return predict_oov(low)
    return [p for part in parts for p in _word_phones(part)]


def _read_tag(tokens: list[str], i: int, tag: str, past: bool) -> str:
    """The tag for "read" where the tagger's present tense is wrong: after have/has/had, or with a past time."""
    if tag not in ("VB", "VBP"):
        return tag
    before = [t.lower() for t in tokens[max(0, i - 2): i]]
    if before and (before[-1] in _PERFECT or (len(before) == 2 and before[0] in _PERFECT and before[1] != "to")):
        return "VBN"  # "have you read", "I've read": the participle, R EH1 D
    return "VBD" if tag == "VBP" and past else tag  # "I read it last year"


def _token_phones(token: str, tag: str) -> list[str]:
    """One token's phones; punctuation passes through as itself."""
    low = token.lower()
    if not _LETTER_RE.search(low):
        return [low]
    if len(low) == 1:
        return ["EY1"] if token == "A" else list(cmu()[low])
    entry = homographs().get(low)
    if entry is not None:
        return pick_homograph(entry, tag)
    return _word_phones(token)


def g2p(norm_text: str) -> list[str]:
    """Normalised English -> phones (ARPAbet with stress, punctuation ``! ? … , . -``).

    Returns
    -------
    Phone strings, all in the v2 table (``UNK`` for a phone the model invents, ``-`` for a bare apostrophe);
    a leading ``","`` when fewer than 4.
    """
    table = symbol_ids()
    tokens = _tokenizer()(norm_text)
    past = bool(_PAST_RE.search(norm_text))
    phones: list[str] = []
    for i, (token, tag) in enumerate(zip(tokens, pos_tags(tokens))):
        if token.lower() == "read":
            tag = _read_tag(tokens, i, tag, past)
        for ph in _token_phones(token, tag):
            if ph == "<unk>":
                phones.append(UNK)
            elif ph in table:
                phones.append(ph)
            elif ph == "'":
                phones.append("-")
    if len(phones) < MIN_PHONES:
        phones = [","] + phones
    return phones
