"""Cache-key text: the same key for texts that differ only in spacing, case, width or repeated punctuation."""

from __future__ import annotations

import re
import unicodedata

from .split import replace_consecutive_punctuation

_WS_RE = re.compile(r"\s+")


def normalize_for_cache(text: str) -> str:
    """Text -> a stable key for the prosody cache.

    NFKC (full-width -> ASCII forms), case-folded, whitespace runs -> one space, stripped, runs of
    ``! ? … , . -`` collapsed (as the splitter does before G2P).
    """
    text = unicodedata.normalize("NFKC", text).casefold()
    return replace_consecutive_punctuation(_WS_RE.sub(" ", text).strip())
