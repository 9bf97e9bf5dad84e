"""Sentence splitting with upstream's semantics (``TextPreprocessor.pre_seg_text`` + ``text_segmentation_method``).

The pipeline synthesises one sentence at a time, so where text is cut decides both latency and prosody. The
methods are upstream's ``cut0``..``cut5``; one deliberate difference: a ``.`` that is part of a token (``3.5``,
``e.g.``, ``example.com``), ends a known abbreviation (``Mr.``, ``Dr.``) or an initial (``J. K.``), and a ``,``
inside a number (``1,000``), are not cut points, where upstream would cut some of them.

The cutting is written so that :class:`synthesis.text.stream.SentenceStream` can run the very same code on a prefix
that ends at a certain boundary and get the same sentences as a run on the whole text.
"""

from __future__ import annotations

import re
from typing import Callable

from synthesis.types import LANGUAGES, SPLIT_METHODS

from .errors import TextError

SPLITS = frozenset("，。？！,.?!~:：—…")  # upstream `splits`: a sentence piece must end in one of these
CUT5_PUNCT = frozenset(",.;?!、，。？！；：…")  # cut5 cuts after each of these
COLLAPSE_PUNCT = "!?…,.-"  # runs of these collapse to their first char (replace_consecutive_punctuation)
DROP_CHARS = frozenset("!?…,.- ")  # a method's piece made only of these is dropped
ALL_PUNCT = SPLITS | CUT5_PUNCT | frozenset(COLLAPSE_PUNCT)
MERGE_MIN_CHARS = 5  # merge_short_text_in_array threshold, chars
MAX_SENTENCE_CHARS = 510  # BERT's limit: longer sentences are cut at punctuation
FIRST_PIECE_MIN_CHARS = 4  # a first clause shorter than this gets a leading "。"/"." (upstream pre_seg_text)
CUT1_GROUP = 4  # cut1 joins this many pieces
CUT2_MIN_CHARS = 50  # cut2 accumulates pieces until their length exceeds this

# Words whose trailing "." is not a sentence end (lower case, inner dots kept).
ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr vs cf fig approx dept gen gov lt col sgt capt rev mt st e.g i.e a.m p.m".split()
)

_CONSECUTIVE_PUNCT_RE = re.compile(f"([{re.escape(COLLAPSE_PUNCT)}])([{re.escape(COLLAPSE_PUNCT)}])+")
_WORD_BEFORE_RE = re.compile(r"([A-Za-z][A-Za-z.]*)$")
_NOT_WORD_RE = re.compile(r"\W+")
_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\u1100-\u11ff\u3130-\u318f]")


def replace_consecutive_punctuation(text: str) -> str:
    """Collapse runs of ``! ? … , . -`` to their first character (``"?!"`` -> ``"?"``, ``"..."`` -> ``"."``)."""
    return _CONSECUTIVE_PUNCT_RE.sub(r"\1", text)


def _ends_abbreviation(text: str, i: int) -> bool:
    """True when the ``.`` at ``text[i]`` closes an abbreviation or a single-capital initial."""
    m = _WORD_BEFORE_RE.search(text[max(0, i - 16) : i])
    if m is None:
        return False
    word = m.group(1)
    return word.lower() in ABBREVIATIONS or (len(word) == 1 and word.isupper())


def is_cut(text: str, i: int, chars: frozenset[str]) -> bool:
    """Whether a method that cuts after ``chars`` cuts after ``text[i]`` (looks at most one char ahead)."""
    c = text[i]
    if c not in chars:
        return False
    nxt = text[i + 1] if i + 1 < len(text) else ""
    if c == ".":
        if nxt.isascii() and nxt.isalnum():  # 3.5, e.g., example.com
            return False
        if _ends_abbreviation(text, i):
            return False
    elif c == "," and nxt.isdigit() and i > 0 and text[i - 1].isdigit():  # 1,000
        return False
    return True


def _cut_after(text: str, chars: frozenset[str]) -> list[str]:
    """Cut ``text`` after every cut point for ``chars``; the last piece may lack a terminator."""
    pieces: list[str] = []
    start = 0
    for i in range(len(text)):
        if is_cut(text, i, chars):
            pieces.append(text[start : i + 1])
            start = i + 1
    if start < len(text):
        pieces.append(text[start:])
    return pieces


def _keep(pieces: list[str]) -> list[str]:
    """Drop pieces made only of ``! ? … , . -`` and spaces (every method does this)."""
    return [p for p in pieces if not set(p) <= DROP_CHARS]


def clauses(text: str) -> list[str]:
    """Upstream's ``split()`` helper: normalise ``……``/``——``, ensure a final terminator, cut after every split char."""
    text = text.replace("……", "。").replace("——", "，")
    if text and text[-1] not in SPLITS:
        text += "。"
    return _cut_after(text, SPLITS)


def cut0(text: str) -> list[str]:
    """No split."""
    return _keep([text])


def cut1(text: str) -> list[str]:
    """Groups of 4 clauses; as upstream, the last group takes the remainder (5..8 clauses)."""
    parts = clauses(text)
    n_groups = -(-len(parts) // CUT1_GROUP) - 1
    if n_groups < 1:
        return _keep([text])
    groups = ["".join(parts[g * CUT1_GROUP : (g + 1) * CUT1_GROUP]) for g in range(n_groups - 1)]
    groups.append("".join(parts[(n_groups - 1) * CUT1_GROUP :]))
    return _keep(groups)


def cut2(text: str) -> list[str]:
    """Clauses accumulated until longer than 50 chars; a short last group joins the previous one."""
    parts = clauses(text)
    if len(parts) < 2:
        return _keep([text])
    groups: list[str] = []
    acc = ""
    for p in parts:
        acc += p
        if len(acc) > CUT2_MIN_CHARS:
            groups.append(acc)
            acc = ""
    if acc:
        groups.append(acc)
    if len(groups) > 1 and len(groups[-1]) < CUT2_MIN_CHARS:
        last = groups.pop()
        groups[-1] += last
    return _keep(groups)


def cut3(text: str) -> list[str]:
    """Split on the Chinese full stop (which is removed)."""
    return _keep(text.strip("。").split("。"))


def cut4(text: str) -> list[str]:
    """Split on ``.`` that ends a sentence (which is removed); decimals and abbreviations stay."""
    text = text.strip(".")
    return _keep([p[:-1] if p.endswith(".") else p for p in _cut_after(text, frozenset("."))])


def cut5(text: str) -> list[str]:
    """Split after every punctuation mark in ``, . ; ? ! 、 ， 。 ？ ！ ； ： …``."""
    return _keep(_cut_after(text, CUT5_PUNCT))


METHODS: dict[str, Callable[[str], list[str]]] = {
    "cut0": cut0,
    "cut1": cut1,
    "cut2": cut2,
    "cut3": cut3,
    "cut4": cut4,
    "cut5": cut5,
}
assert tuple(METHODS) == SPLIT_METHODS


def end_mark(piece: str, language: str) -> str:
    """The terminator upstream appends: ``"."`` for English, ``"。"`` otherwise (auto: by the piece's script)."""
    if language == "en":
        return "."
    if language in ("auto", "auto_yue"):
        return "。" if _CJK_RE.search(piece) else "."
    return "。"


def _join(left: str, right: str) -> str:
    """Concatenate two pieces; a space goes between Latin text that a line break separated (upstream glues them)."""
    if left and right and left[-1].isascii() and right[0].isascii() and not left[-1].isspace() \
            and not right[0].isspace() and (left[-1].isalnum() or right[0].isalnum()):
        return left + " " + right
    return left + right


def merge_short(pieces: list[str], threshold: int = MERGE_MIN_CHARS) -> tuple[list[str], str]:
    """Join consecutive pieces until each group has ``threshold`` chars; returns (groups, unfinished tail)."""
    groups: list[str] = []
    acc = ""
    for p in pieces:
        acc = _join(acc, p)
        if len(acc) >= threshold:
            groups.append(acc)
            acc = ""
    return groups, acc


def split_big_text(text: str, max_len: int = MAX_SENTENCE_CHARS) -> list[str]:
    """Cut a too-long sentence at punctuation into pieces of at most ``max_len`` chars (hard cut as last resort)."""
    parts = re.split(f"([{re.escape(''.join(sorted(SPLITS)))}])", text)
    out: list[str] = []
    cur = ""
    for part in parts:
        if len(cur + part) > max_len and cur:
            out.append(cur)
            cur = part
        else:
            cur += part
    if cur:
        out.append(cur)
    return [chunk[j : j + max_len] for chunk in out for j in range(0, len(chunk), max_len)]


def check_options(method: str, language: str) -> None:
    """Raise :class:`TextError` for an unknown split method or language."""
    if method not in METHODS:
        raise TextError(f"unknown split method {method!r}; use one of {', '.join(METHODS)}")
    if language not in LANGUAGES:
        raise TextError(f"unknown language {language!r}; use one of {', '.join(LANGUAGES)}")


def segment(text: str, method: str, language: str, at_start: bool, final: bool) -> tuple[list[str], str]:
    """The body of :func:`split_sentences`; with ``final=False`` an unmerged short tail is returned, not appended.

    Returns
    -------
    (sentences, tail): ``tail`` is the text of the pieces that did not reach ``MERGE_MIN_CHARS`` (always ``""``
    when ``final``).
    """
    text = replace_consecutive_punctuation(text).strip("\n")
    if not text:
        return [], ""
    first = re.split(f"[{re.escape(''.join(sorted(SPLITS)))}]", text)[0].strip()
    if at_start and text[0] not in SPLITS and len(first) < FIRST_PIECE_MIN_CHARS:
        text = end_mark(text, language) + text
    lines = [line for piece in METHODS[method](text) for line in piece.split("\n")]
    lines = [line for line in lines if line not in ("", " ")]
    groups, tail = merge_short(lines)
    if final and tail:
        if groups:
            groups[-1] = _join(groups[-1], tail)
        else:
            groups.append(tail)
        tail = ""
    sentences: list[str] = []
    for group in groups:
        group = group.rstrip()
        if not group.strip() or not _NOT_WORD_RE.sub("", group):  # blank or only symbols
            continue
        if group[-1] not in SPLITS:
            group += end_mark(group, language)
        parts = split_big_text(group) if len(group) > MAX_SENTENCE_CHARS else [group]
        sentences.extend(p.strip() for p in parts if p.strip())
    return sentences, tail


def split_sentences(text: str, method: str = "cut5", language: str = "auto") -> list[str]:
    """Cut text into the sentences the model synthesises one at a time (upstream ``pre_seg_text``).

    Parameters
    ----------
    text:
        Any text; runs of ``! ? … , . -`` are collapsed first.
    method:
        ``cut0`` (no split) .. ``cut5`` (after every punctuation mark, the API default); see ``split.py``.
    language:
        One of ``synthesis.types.LANGUAGES``; decides whether ``"."`` or ``"。"`` is added to unterminated pieces.

    Returns
    -------
    Sentences, stripped, each ending in a split char; pieces shorter than 5 chars are merged with their neighbours,
    pieces made only of symbols are dropped, pieces over 510 chars are cut. ``[]`` for blank input.
    """
    check_options(method, language)
    sentences, _ = segment(text, method, language, at_start=True, final=True)
    return sentences
