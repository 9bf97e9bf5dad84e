"""Language segmentation: text -> (text, lang) pieces, by script, with upstream's per-mode merging.

No language-ID model: Latin letters are English, kana Japanese (ideographs in a text that has kana too),
hangul Korean, other CJK ideographs Chinese; digits, punctuation and spaces belong to the piece before them
(the one after, at the start). Modes follow upstream ``get_phones_and_bert`` (see ``synthesis.types.LANGUAGES``).
"""

from __future__ import annotations

import re

from .errors import TextError

_KANA_RE = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff]")
_SPACES_RE = re.compile(r" {2,}")


def _script(c: str, has_kana: bool) -> str | None:
    """The language a character's script implies, or None for neutral characters."""
    o = ord(c)
    if c.isascii():
        return "en" if c.isalpha() else None
    if 0x3040 <= o <= 0x30FF and c != "\u30fb" or 0x31F0 <= o <= 0x31FF:
        return "ja"
    if 0xAC00 <= o <= 0xD7AF or 0x1100 <= o <= 0x11FF or 0x3130 <= o <= 0x318F:
        return "ko"
    if 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0xF900 <= o <= 0xFAFF:
        return "ja" if has_kana else "zh"
    if c.isalpha():  # accented Latin etc.: read as English (normalisation strips the accents)
        return "en"
    return None


def _by_script(text: str, default: str) -> list[tuple[str, str]]:
    """Split into maximal same-script runs; neutral characters join the run before them."""
    has_kana = bool(_KANA_RE.search(text))
    runs: list[list[str]] = []  # [text, lang]
    lead = ""  # neutral characters before the first script character
    for c in text:
        lang = _script(c, has_kana)
        if lang is None:
            if runs:
                runs[-1][0] += c
            else:
                lead += c
        elif runs and runs[-1][1] == lang:
            runs[-1][0] += c
        else:
            runs.append([c, lang])
    if not runs:
        return [(lead, default)] if lead else []
    runs[0][0] = lead + runs[0][0]
    return [(t, lang) for t, lang in runs]


def _merge(pieces: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Join adjacent pieces of the same language."""
    out: list[tuple[str, str]] = []
    for text, lang in pieces:
        if out and out[-1][1] == lang:
            out[-1] = (out[-1][0] + text, lang)
        else:
            out.append((text, lang))
    return out


def segment_languages(text: str, language: str) -> list[tuple[str, str]]:
    """Cut text into (text, lang) pieces, lang in ``en zh ja ko yue``.

    ``en``: one English piece. ``auto``: by script. ``auto_yue``: by script, Chinese read as Cantonese.
    ``all_zh``/``all_ja``/``all_ko``/``all_yue``: everything but Latin-letter pieces in that language.
    ``zh``/``ja``/``ko``/``yue``: the same (upstream cannot tell CJK languages apart either; the user's choice wins).
    """
    text = _SPACES_RE.sub(" ", text)
    if language == "en":
        return [(text, "en")] if text else []
    if language in ("auto", "auto_yue"):
        pieces = _by_script(text, "en")
        if language == "auto_yue":
            pieces = [(t, "yue" if lang == "zh" else lang) for t, lang in pieces]
        return _merge(pieces)
    target = language.removeprefix("all_")
    if target not in ("zh", "ja", "ko", "yue"):
        raise TextError(f"unknown language {language!r}")
    return _merge([(t, lang if lang == "en" else target) for t, lang in _by_script(text, target)])
