"""The text front-end: sentence splitting (batch and streaming), language pieces, G2P to v2 phone ids.

Dictionaries and models (CMU, jieba, pypinyin, the g2p_en GRU, OpenJTalk) load on first use, so importing is cheap.
"""

from __future__ import annotations

from .assets import configure_frontend
from .errors import TextError
from .explain import explain_text
from .frontend import Phonemes, bert_features, check_speakable, speakable_languages, text_to_phonemes
from .lexicon import Lexicon, LexiconError, make_entry
from .normalize import normalize_for_cache
from .split import split_sentences
from .stream import SentenceStream

__all__ = [
    "split_sentences",
    "SentenceStream",
    "Phonemes",
    "text_to_phonemes",
    "bert_features",
    "normalize_for_cache",
    "TextError",
    "Lexicon",
    "LexiconError",
    "make_entry",
    "explain_text",
    "speakable_languages",
    "check_speakable",
    "configure_frontend",
]
