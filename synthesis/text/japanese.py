"""Japanese: normalisation and G2P to OpenJTalk phones with prosody marks (upstream ``text/japanese.py`` semantics).

The text is cut at every character outside upstream's "Japanese" class (kana, kanji, 々, digits, Latin and
full-width alphanumerics, half-width katakana). Each run between those marks goes through OpenJTalk
(``pyopenjtalk.make_label(run_frontend(run))``, the ``pyopenjtalk-plus`` wheel, whose dictionary ships with it,
so this works offline) and its full-context labels become phones plus prosody marks, as espnet's
``pyopenjtalk_g2p_prosody`` defines them: ``[`` pitch rise, ``]`` pitch fall, ``#`` accent-phrase boundary,
``_`` pause; the outer ``^``/``$`` (or ``?``) of each run are dropped. Unvoiced vowels (``I``, ``U``) are read as
voiced ones. Each mark between runs becomes a phone: ``、，：；·`` -> ``,``, ``。`` -> ``.``, ``！`` -> ``!``,
``？`` -> ``?``, a newline -> ``.``, a space -> nothing, anything else itself. As upstream's cleaner does, a phone
outside the v2 table becomes ``UNK``: that includes ``#`` (the v2 table has no ``#``, so v2 models were trained
on ``UNK`` at accent-phrase boundaries) and marks such as ``「`` or ``～``.

Upstream also defines sokuon/hatsuon rewrite rules (``Q`` + consonant, ``N`` + consonant to IPA), but never
applies them, and they match symbols OpenJTalk does not emit: the geminate stays ``cl`` and the moraic nasal ``N``,
which is what v2 models were trained on. Upstream's one-entry user dictionary (主殿) is not included.

``pyopenjtalk`` is imported on the first Japanese text (about half a second).
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from types import ModuleType

from .symbols import UNK, symbol_ids

log = logging.getLogger(__name__)

# Upstream's "Japanese character" class; every other character is a mark that splits the text.
_JA_CLASS = r"A-Za-z\d\u3005\u3040-\u30ff\u4e00-\u9fff\uff11-\uff19\uff21-\uff3a\uff41-\uff5a\uff66-\uff9d"
_MARK_RE = re.compile(f"[^{_JA_CLASS}]")
_COLLAPSE = "!?…,.-"  # runs of these collapse to their first (upstream text_normalize)
_CONSEC_RE = re.compile(f"([{re.escape(_COLLAPSE)}])[{re.escape(_COLLAPSE)}]+")
_MARK_PHONES = {"：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "·": ",", "、": ","}
_SYMBOL_WORDS = {"％": "パーセント"}  # marks read as words

_XX = -50  # value of an absent ("xx") numeric label field, as espnet's parser returns it
_BORDER_PHONES = {"a", "i", "u", "e", "o", "N", "cl"}  # an accent phrase can end after these (vowels lowered)
_P3_RE = re.compile(r"-(.*?)\+")  # current phoneme: p1^p2-p3+p4=p5
_A1_RE = re.compile(r"/A:([0-9\-]+)\+")  # accent nucleus position relative to this mora
_A2_RE = re.compile(r"\+(\d+)\+")  # mora position in the accent phrase, from the front (1-based)
_A3_RE = re.compile(r"\+(\d+)/")  # mora position in the accent phrase, from the back (1-based)
_E3_RE = re.compile(r"!(\d+)_")  # previous accent phrase is interrogative (1) or not (0)
_F1_RE = re.compile(r"/F:(\d+)_")  # morae in the current accent phrase


def normalize(text: str) -> str:
    """Japanese text -> the text G2P reads.

    Runs of ``! ? … , . -`` collapse to their first mark and ``％`` is spelled パーセント; everything else is
    left to OpenJTalk, which reads numbers, dates and symbols itself.
    """
    text = _CONSEC_RE.sub(r"\1", text)
    for symbol, word in _SYMBOL_WORDS.items():
        text = text.replace(symbol, word)
    return text


def g2p(norm_text: str) -> list[str]:
    """Normalised Japanese -> v2 phone strings with prosody marks (no word2ph: Japanese gets no BERT).

    Examples: ``こんにちは。`` -> ``k o [ N n i ch i w a .``; ``東京に行きます`` ->
    ``t o [ o ky o o n i UNK i [ k i m a ] s u`` (``UNK`` is upstream's ``#``, an accent-phrase boundary).

    Returns
    -------
    Phone strings, every one in the v2 table (``UNK`` for anything the table lacks).
    """
    text = norm_text.lower()  # upstream lowers Latin letters before OpenJTalk
    runs = _MARK_RE.split(text)
    marks: list[str] = _MARK_RE.findall(text)
    phones: list[str] = []
    for i, run in enumerate(runs):
        if run:
            phones.extend(_prosody_phones(run)[1:-1])
        if i < len(marks) and marks[i] != " ":
            phones.append(_MARK_PHONES.get(marks[i], marks[i]))
    table = symbol_ids()
    unknown = sorted({p for p in phones if p not in table})
    if unknown:
        log.debug("Japanese phones outside the v2 table read as UNK: %s (in %r)", unknown, norm_text)
    return [p if p in table else UNK for p in phones]


@lru_cache(maxsize=1)
def _openjtalk() -> ModuleType:
    """``pyopenjtalk``, imported on first use."""
    import pyopenjtalk

    return pyopenjtalk


def _number(regex: re.Pattern[str], label: str) -> int:
    """The first integer ``regex`` captures in a label, or ``_XX`` when the field is absent."""
    m = regex.search(label)
    return int(m.group(1)) if m else _XX


def _prosody_phones(run: str) -> list[str]:
    """One run of Japanese characters -> ``^`` + phones and prosody marks + ``$`` (or ``?``), from OpenJTalk labels."""
    jtalk = _openjtalk()
    labels: list[str] = jtalk.make_label(jtalk.run_frontend(run))
    out: list[str] = []
    for n, label in enumerate(labels):
        m = _P3_RE.search(label)
        assert m is not None, f"malformed OpenJTalk label {label!r}"
        p3 = m.group(1)
        if p3 in ("A", "E", "I", "O", "U"):  # unvoiced vowel: read as the voiced one
            p3 = p3.lower()
        if p3 == "sil":  # only at the ends
            if n == 0:
                out.append("^")
            elif n == len(labels) - 1:
                e3 = _number(_E3_RE, label)
                if e3 == 0:
                    out.append("$")
                elif e3 == 1:
                    out.append("?")
            continue
        if p3 == "pau":
            out.append("_")
            continue
        out.append(p3)
        a1, a2, a3 = _number(_A1_RE, label), _number(_A2_RE, label), _number(_A3_RE, label)
        f1 = _number(_F1_RE, label)
        a2_next = _number(_A2_RE, labels[n + 1]) if n + 1 < len(labels) else _XX
        if a3 == 1 and a2_next == 1 and p3 in _BORDER_PHONES:
            out.append("#")
        elif a1 == 0 and a2_next == a2 + 1 and a2 != f1:
            out.append("]")
        elif a2 == 1 and a2_next == 2:
            out.append("[")
    return out
