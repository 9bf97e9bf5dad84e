"""The text front-end's golden data, read in one place (``tests/data/golden-text`` or ``$VOICEBOT_GOLDEN_TEXT_DIR``).

Each language file holds the phones upstream GPT-SoVITS's own front-end gives realistic chat sentences (its README
says how they were made and how to compare): ``inference`` is the synthesis path :func:`text_to_phonemes` mirrors,
``phone_ids`` / ``word2ph`` at the top level the whole-text ``clean_text`` call each language module mirrors.
Entries marked ``upstream_quirk`` are upstream mistakes a better front-end may fix (``quirk_scope`` says which path).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GoldenText", "golden_text_dir", "load_language", "LANGUAGES"]

GOLDEN_TEXT_ENV = "VOICEBOT_GOLDEN_TEXT_DIR"
DEFAULT_DIR = Path(__file__).resolve().parent / "data" / "golden-text"
LANGUAGES = ("en", "zh", "ja", "ko", "yue")


def golden_text_dir() -> Path:
    """``$VOICEBOT_GOLDEN_TEXT_DIR`` when set, else ``tests/data/golden-text``."""
    return Path(os.environ.get(GOLDEN_TEXT_ENV) or DEFAULT_DIR)


@dataclass(frozen=True)
class GoldenText:
    """One golden sentence.

    Attributes
    ----------
    id, category, text, language: as in the file (``language`` is the code passed to upstream).
    phone_ids, word2ph, norm_text: upstream ``clean_text`` on the whole text (word2ph None outside zh/yue).
    inference_ids: upstream ``get_phones_and_bert``'s phone ids (language pieces, the retry on ``"." + text``).
    segments: the inference path's pieces, each ``{text, lang, norm_text, phone_ids, phones, word2ph}``.
    quirk: upstream's output is a mistake here; ``quirk_scope`` ``both``, ``direct`` or ``inference``.
    """

    id: str
    category: str
    text: str
    language: str
    phone_ids: tuple[int, ...]
    word2ph: tuple[int, ...] | None
    norm_text: str
    inference_ids: tuple[int, ...]
    segments: tuple[dict[str, Any], ...]
    quirk: bool
    quirk_scope: str | None
    quirk_note: str | None

    def quirk_in(self, path: str) -> bool:
        """Whether upstream is marked wrong on ``path`` (``"direct"`` or ``"inference"``)."""
        return self.quirk and self.quirk_scope in ("both", path, None)


def load_language(lang: str, folder: Path | None = None) -> list[GoldenText]:
    """Every entry of ``<folder>/<lang>.json``, in file order (empty when the set has no file for ``lang``)."""
    path = (folder or golden_text_dir()) / f"{lang}.json"
    if not path.exists():
        return []
    data = json.loads(path.read_text(encoding="utf-8"))
    out: list[GoldenText] = []
    for e in data["entries"]:
        inf = e["inference"]
        out.append(GoldenText(
            id=e["id"], category=e["category"], text=e["text"], language=e["language"],
            phone_ids=tuple(e["phone_ids"]), word2ph=tuple(e["word2ph"]) if e.get("word2ph") else None,
            norm_text=e["norm_text"], inference_ids=tuple(inf["phone_ids"]), segments=tuple(inf["segments"]),
            quirk=bool(e.get("upstream_quirk")), quirk_scope=e.get("quirk_scope"), quirk_note=e.get("quirk_note"),
        ))
    return out
