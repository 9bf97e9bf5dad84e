"""Korean: G2P to compatibility-jamo phones (upstream ``korean.py`` semantics, offline).

As upstream: Latin letters become their hangul names (K -> 케이); g2pk2 applies standard pronunciation (its idiom
list, MeCab part-of-speech marks from python-mecab-ko, Arabic numerals spelled out, its special rules, the
coda/onset table, liaison) and gives syllables; these are cut into compatibility jamo with compound vowels split
(ㅘ -> ㅗㅏ); each character is one phone: a space is ``空``, a character outside the phone table ``停``, Korean and
CJK punctuation map to ``, . ! ?``, and runs of punctuation are kept. A text ending in a bare jamo gets ``.``.

g2pk2's ``G2p`` class is not used: its module calls ``nltk.download('cmudict')`` on import, for English words that
never reach it here (Latin letters are respelled first). Its rule modules are loaded without the package's
``__init__`` and the class's steps are taken here, in its order.

Beyond upstream: numbers before native-Korean counters that g2pk2 reads with Sino-Korean numerals (명, 사람, 잔,
시간 ...) take native ones: 25명 -> 스물다섯명, where g2pk2 says 이십오명. Counters g2pk2 already reads natively
(개, 시, 살, 번 ...) and Sino-Korean ones (분, 원, 년, 월, 일 ...) are left to it.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import threading
import types
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, cast

from . import packages
from .errors import TextError
from .symbols import symbol_ids

SPACE = "空"  # the phone of a space
UNKNOWN = "停"  # the phone of a character the table lacks

LETTER_NAMES = {  # Latin letters as Koreans name them
    "a": "에이", "b": "비", "c": "시", "d": "디", "e": "이", "f": "에프", "g": "지", "h": "에이치", "i": "아이",
    "j": "제이", "k": "케이", "l": "엘", "m": "엠", "n": "엔", "o": "오", "p": "피", "q": "큐", "r": "아르",
    "s": "에스", "t": "티", "u": "유", "v": "브이", "w": "더블유", "x": "엑스", "y": "와이", "z": "제트",
}
VOWEL_SPLITS = {  # compound vowels as their two simple ones (the phone table has only simple jamo)
    "ㅘ": "ㅗㅏ", "ㅙ": "ㅗㅐ", "ㅚ": "ㅗㅣ", "ㅝ": "ㅜㅓ", "ㅞ": "ㅜㅔ", "ㅟ": "ㅜㅣ", "ㅢ": "ㅡㅣ",
    "ㅑ": "ㅣㅏ", "ㅒ": "ㅣㅐ", "ㅕ": "ㅣㅓ", "ㅖ": "ㅣㅔ", "ㅛ": "ㅣㅗ", "ㅠ": "ㅣㅜ",
}
PUNCTUATION_PHONES = {"：": ",", "；": ",", "，": ",", "。": ".", "！": "!", "？": "?", "\n": ".", "·": ",", "、": ","}
# Counters counted with native numerals that g2pk2 may read otherwise (its own native list: 개 시 살 번 켤레 ...);
# it reads them with Sino-Korean numerals, or digit by digit where MeCab tags the counter a common noun (2잔).
NATIVE_COUNTERS = frozenset("명 사람 잔 병 장 시간 달 가지 곳 송이 자루 그릇 접시 봉지 켤레".split())
G2PK_SPECIAL_RULES = (  # g2pk2.special, in the order its G2p applies them
    "jyeo", "ye", "consonant_ui", "josa_ui", "vowel_ui", "jamo", "rieulgiyeok", "rieulbieub", "verb_nieun",
    "balb", "palatalize", "modifying_rieul",
)

_LATIN_RE = re.compile("[a-z]", re.IGNORECASE)
_MARK_RE = re.compile("/[PJEB]")  # g2pk2's part-of-speech marks
_RIEUL_NIEUN_RE = re.compile("([ㅇㄹ]ㅡㄹ) ㄹ")  # g2pk2 keeps ㄹ after 을/를 + space; upstream reads it ㄴ
_TRAILING_JAMO_RE = re.compile("([\u3131-\u3163])$")

_tagger_lock = threading.Lock()  # one MeCab tagger; its C state is not safe to share between threads
Rule = Callable[[str, bool, bool], str]  # g2pk2's rule signature: (text, descriptive, verbose) -> text


@dataclass(frozen=True)
class _G2pk:
    """The parts of g2pk2 its ``G2p`` class strings together, plus a MeCab tagger."""

    tagger: Any
    idioms: tuple[tuple[re.Pattern[str], str], ...]
    table: tuple[tuple[re.Pattern[str], str], ...]
    annotate: Callable[[str, Any], str]
    spell_numbers: Callable[[str], str]
    spell_number: Callable[[str, bool], str]
    special_rules: tuple[Rule, ...]
    link_rules: tuple[Rule, ...]
    compose: Callable[[str], str]
    decompose: Callable[[str], str]  # jamo.h2j: syllables -> conjoining jamo
    to_compatibility: Callable[[str], str]  # jamo.j2hcj: conjoining -> compatibility jamo


def _g2pk_module(name: str) -> Any:
    """``g2pk2.<name>``, imported without running ``g2pk2/__init__`` (which imports the downloading module)."""
    if "g2pk2" not in sys.modules:
        spec = importlib.util.find_spec("g2pk2")
        assert spec is not None and spec.submodule_search_locations is not None
        package = types.ModuleType("g2pk2", "g2pk2's rule modules (its __init__ would download NLTK's cmudict)")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec  # find_spec answers from sys.modules, and fails on a module without a spec
        sys.modules["g2pk2"] = package
    return importlib.import_module(f"g2pk2.{name}")


def _idioms(path: Path) -> tuple[tuple[re.Pattern[str], str], ...]:
    """g2pk2's idiom list (``pattern===replacement`` lines, ``#`` comments), as regex substitutions."""
    out: list[tuple[re.Pattern[str], str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if "===" in line:
            pattern, replacement = line.split("===")
            out.append((re.compile(pattern), replacement))
    return tuple(out)


@lru_cache(maxsize=1)
def _g2pk() -> _G2pk:
    """g2pk2's rules and a MeCab tagger, loaded on the first Korean text."""
    missing = packages.missing("ko")
    if missing:
        raise TextError(f"Korean needs {', '.join(missing)}: pip install {' '.join(missing)}")
    import mecab  # pyright: ignore[reportMissingTypeStubs]  # untyped; python-mecab-ko finds its dictionary itself

    utils, numerals = _g2pk_module("utils"), _g2pk_module("numerals")
    special, regular = _g2pk_module("special"), _g2pk_module("regular")
    jamo = importlib.import_module("jamo")
    table = cast(list[tuple[str, str, list[str]]], utils.parse_table())
    return _G2pk(
        tagger=mecab.MeCab(),
        idioms=_idioms(Path(cast(str, utils.__file__)).with_name("idioms.txt")),
        table=tuple((re.compile(pattern), replacement) for pattern, replacement, _ in table),
        annotate=utils.annotate,
        spell_numbers=numerals.convert_num,
        spell_number=numerals.process_num,
        special_rules=tuple(getattr(special, name) for name in G2PK_SPECIAL_RULES),
        link_rules=tuple(getattr(regular, f"link{i}") for i in range(1, 5)),  # liaison, in its order
        compose=utils.compose,
        decompose=jamo.h2j,
        to_compatibility=jamo.j2hcj,
    )


def _letter_name(letter: str) -> str:
    """The hangul name of a letter ``_LATIN_RE`` matched (case-insensitively, as upstream)."""
    return next(name for c, name in LETTER_NAMES.items() if re.fullmatch(c, letter, re.IGNORECASE))


def _native_counts(text: str, g: _G2pk) -> str:
    """Spell numbers before :data:`NATIVE_COUNTERS` with native numerals (not after 제, the ordinal prefix)."""
    tokens = cast(list[tuple[str, str]], g.tagger.pos(text))
    found = {
        (number, counter)
        for (number, tag), (counter, counter_tag) in zip(tokens, tokens[1:])
        if tag == "SN" and counter in NATIVE_COUNTERS and counter_tag.startswith("NN")
    }
    for number, counter in found:
        spelled = g.spell_number(number, False)
        text = re.sub(rf"(?<![\d,.제]){re.escape(number)}(?={re.escape(counter)})", lambda _: spelled, text)
    return text


def pronounce(text: str) -> str:
    """Korean text as g2pk2 pronounces it, in hangul syllables (Latin letters respelled first).

    >>> pronounce("국물이 맛있습니다")  # doctest: +SKIP
    '궁무리 마싣씀니다'
    """
    g = _g2pk()
    text = _LATIN_RE.sub(lambda m: _letter_name(m.group(0)), text)
    for pattern, replacement in g.idioms:
        text = pattern.sub(replacement, text)
    with _tagger_lock:
        if any(c.isdigit() for c in text):
            text = _native_counts(text, g)
        text = g.annotate(text, g.tagger)
    text = g.spell_numbers(text)
    letters = g.decompose(text)
    for rule in g.special_rules:
        letters = rule(letters, False, False)
    letters = _MARK_RE.sub("", letters)
    for pattern, replacement in g.table:
        letters = pattern.sub(replacement, letters)
    for rule in g.link_rules:
        letters = rule(letters, False, False)
    return g.compose(letters)


def g2p(text: str) -> list[str]:
    """Korean text -> v2 phones: compatibility jamo, ``空`` per space, punctuation, ``停`` for the rest.

    Raises
    ------
    TextError
        A package Korean needs is not installed (the message names it).
    """
    g = _g2pk()
    letters = g.to_compatibility(g.decompose(pronounce(text)))
    letters = "".join(VOWEL_SPLITS.get(c, c) for c in letters)
    letters = _RIEUL_NIEUN_RE.sub(r"\1 ㄴ", letters)
    letters = _TRAILING_JAMO_RE.sub(r"\1.", letters)
    table = symbol_ids()
    phones: list[str] = []
    for c in letters:
        c = SPACE if c == " " else PUNCTUATION_PHONES.get(c, c)
        phones.append(c if c in table else UNKNOWN)
    return phones
