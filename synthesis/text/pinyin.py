"""Pinyin syllable -> the two v2 phones ``[initial, final+tone]`` (the opencpop-strict convention).

Derived from pinyin spelling rules and the phone inventory: zero-initial syllables take ``AA``/``EE``/``OO``
(a-, e-, o-) or ``y``/``w`` as initial; ``zhi chi shi ri`` have final ``ir``, ``zi ci si`` final ``i0``; ``ü`` is
``v`` (``ju`` -> ``j v``, ``yuan`` -> ``y van``); after ``y``, ``an`` is ``En`` and ``e`` is ``E``.
"""

from __future__ import annotations

from functools import lru_cache

from .symbols import symbol_ids

INITIALS = ("zh", "ch", "sh", "b", "p", "m", "f", "d", "t", "n", "l", "g", "k", "h", "j", "q", "x", "r", "z", "c", "s")
TONES = "12345"  # 5 = neutral
# Interjection syllables outside the standard inventory -> the closest standard syllable.
_INTERJECTIONS = {"m": "mu", "hm": "hen", "n": "en", "ng": "en", "hng": "heng", "ê": "ei", "eh": "ei"}
# pypinyin's strict initial/final split gives 哟 yo no initial, so upstream reads it as the bare final o.
_RESPELL = {"yo": "o"}


def _split(base: str) -> tuple[str, str]:
    """Toneless pinyin (``v`` for ü) -> (initial, final) in opencpop-strict spelling, not yet validated."""
    base = base.replace("ü", "v")
    base = _INTERJECTIONS.get(base, base)
    base = _RESPELL.get(base, base)
    first = base[:1]
    if first == "a":
        return "AA", base
    if first == "e":
        return "EE", base
    if first == "o":
        return "OO", base
    if first == "y":
        rest = base[1:]
        if rest.startswith("u"):
            rest = "v" + rest[1:]
        return "y", {"an": "En", "e": "E"}.get(rest, rest)
    if first == "w":
        rest = base[1:]
        return "w", rest if rest else "u"
    for ini in INITIALS:  # two-letter initials are listed first
        if base.startswith(ini):
            rest = base[len(ini) :]
            if rest == "i" and ini in ("zh", "ch", "sh", "r"):
                return ini, "ir"
            if rest == "i" and ini in ("z", "c", "s"):
                return ini, "i0"
            if ini in ("j", "q", "x") and rest.startswith("u"):
                rest = "v" + rest[1:]
            return ini, rest
    return "", base


@lru_cache(maxsize=4096)
def syllable_phones(syllable: str) -> tuple[str, str] | None:
    """``"ni3"`` -> ``("n", "i3")``; ``"you3"`` -> ``("y", "ou3")``; None when it has no v2 phones.

    ``syllable`` is TONE3-style pinyin with ``v`` for ü and a tone digit (1-5); a missing digit means neutral.
    """
    if not syllable:
        return None
    tone = syllable[-1] if syllable[-1] in TONES else "5"
    base = syllable[:-1] if syllable[-1] in TONES else syllable
    if not base:
        return None
    ini, fin = _split(base.lower())
    table = symbol_ids()
    if ini in table and fin + tone in table:
        return ini, fin + tone
    return None
