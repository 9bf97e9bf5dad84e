"""Text -> phone ids (+ word2ph, BERT layout): the entry points the pipeline calls, per sentence.

Mirrors upstream ``TextPreprocessor.get_phones_and_bert``: segment by language, normalise and G2P each piece,
concatenate; when fewer than 6 phones come out, run once more on ``"." + text``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from engines import BERT_DIM
from synthesis.types import LANGUAGES

from . import chinese, english, japanese
from .errors import TextError
from .language import segment_languages
from .symbols import phones_to_ids

MIN_PHONES = 6  # fewer phones than this: retry on "." + text (upstream)
BertFn = Callable[[str, Sequence[int]], np.ndarray]  # (norm_text, word2ph) -> [1024, sum(word2ph)] float32

_UNSUPPORTED = {
    "ko": "Korean needs g2pk2 and a MeCab dictionary, which this build does not include; use en, zh or ja",
    "yue": "Cantonese needs ToJyutping, which this build does not include; use zh (Mandarin), en or ja",
}


@dataclass(frozen=True)
class Piece:
    """One language piece of a sentence.

    Attributes
    ----------
    text: the piece as written.
    lang: ``en``, ``zh`` or ``ja``.
    norm_text: the normalised text G2P read (for ``zh``, one char per ``word2ph`` entry: BERT's input).
    start, end: the piece's phones are ``ids[start:end]``.
    word2ph: phones per char of ``norm_text`` (``zh``), else None.
    """

    text: str
    lang: str
    norm_text: str
    start: int
    end: int
    word2ph: tuple[int, ...] | None


@dataclass(frozen=True)
class Phonemes:
    """A sentence as the GPT and SoVITS read it.

    Attributes
    ----------
    ids: ``[T]`` int64 phone ids, indices into the 732-symbol v2 table.
    norm_text: normalised text of all pieces, concatenated.
    pieces: the language pieces, in order, covering ``ids``.
    """

    ids: np.ndarray
    norm_text: str
    pieces: tuple[Piece, ...]


def _g2p(text: str, lang: str) -> tuple[str, list[str], list[int] | None]:
    """One piece -> (norm_text, phones, word2ph)."""
    if lang == "en":
        norm = english.normalize(text)
        return norm, english.g2p(norm), None
    if lang == "zh":
        norm = chinese.normalize(text)
        phones, word2ph = chinese.g2p(norm)
        return norm, phones, word2ph
    if lang == "ja":
        norm = japanese.normalize(text)
        return norm, japanese.g2p(norm), None
    raise TextError(f"cannot read {text!r}: {_UNSUPPORTED.get(lang, f'language {lang!r} is not supported')}")


def _convert(text: str, language: str) -> Phonemes:
    """Segment, G2P and concatenate (no retry)."""
    pieces: list[Piece] = []
    ids: list[np.ndarray] = []
    offset = 0
    for piece_text, lang in segment_languages(text, language):
        norm, phones, word2ph = _g2p(piece_text, lang)
        if not phones:
            continue
        ids.append(phones_to_ids(phones))
        pieces.append(Piece(piece_text, lang, norm, offset, offset + len(phones), tuple(word2ph) if word2ph else None))
        offset += len(phones)
    all_ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    return Phonemes(all_ids, "".join(p.norm_text for p in pieces), tuple(pieces))


def text_to_phonemes(text: str, language: str = "auto") -> Phonemes:
    """One sentence -> phone ids with per-piece language, normalised text and word2ph.

    Parameters
    ----------
    text:
        A sentence (see :func:`synthesis.text.split.split_sentences`).
    language:
        One of ``synthesis.types.LANGUAGES``. English, Mandarin and Japanese are read; Korean and Cantonese
        pieces raise :class:`TextError`.

    Raises
    ------
    TextError
        Blank text, an unknown language, or a piece in a language this build cannot read.
    """
    if language not in LANGUAGES:
        raise TextError(f"unknown language {language!r}; use one of {', '.join(LANGUAGES)}")
    if not text or not text.strip():
        raise TextError("no text to speak: the text is empty")
    result = _convert(text, language)
    if len(result.ids) < MIN_PHONES:
        result = _convert("." + text, language)
    if len(result.ids) == 0:
        raise TextError(f"nothing speakable in {text!r}: write words in English, Chinese or Japanese")
    return result


def bert_features(ph: Phonemes, bert_fn: BertFn | None) -> np.ndarray:
    """The GPT's BERT input for a sentence: ``bert_fn`` features for Chinese pieces, zeros elsewhere.

    Parameters
    ----------
    ph:
        From :func:`text_to_phonemes`.
    bert_fn:
        ``(norm_text, word2ph) -> [1024, sum(word2ph)]`` float32 (the engine's ``text_features``); None gives
        zeros for Chinese too.

    Returns
    -------
    ``[1024, T]`` float32, ``T = len(ph.ids)``, pieces concatenated along time in order.
    """
    out = np.zeros((BERT_DIM, len(ph.ids)), np.float32)
    if bert_fn is None:
        return out
    for piece in ph.pieces:
        if piece.lang != "zh" or piece.word2ph is None:
            continue
        feats = np.asarray(bert_fn(piece.norm_text, piece.word2ph), dtype=np.float32)
        if feats.shape != (BERT_DIM, piece.end - piece.start):
            raise TextError(
                f"BERT features for {piece.norm_text!r} have shape {feats.shape}, expected "
                f"({BERT_DIM}, {piece.end - piece.start}); the engine's text_features must return [1024, sum(word2ph)]"
            )
        out[:, piece.start : piece.end] = feats
    return out
