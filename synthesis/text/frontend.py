"""Text -> phone ids (+ word2ph, BERT layout): the entry points the pipeline calls, per sentence.

Mirrors upstream ``TextPreprocessor.get_phones_and_bert``: segment by language, normalise and G2P each piece,
concatenate; when fewer than 6 phones come out, run once more on ``"." + text``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from engines.base import BERT_DIM
from synthesis.types import LANGUAGES

from . import cantonese, chinese, english, japanese, korean
from .packages import missing as _missing
from .errors import TextError
from .lexicon import Lexicon, segments
from .symbols import phones_to_ids

MIN_PHONES = 6  # fewer phones than this: retry on "." + text (upstream)
BertFn = Callable[[str, Sequence[int]], np.ndarray]  # (norm_text, word2ph) -> [1024, sum(word2ph)] float32

_NAMES = {"en": "English", "zh": "Mandarin", "ja": "Japanese", "ko": "Korean", "yue": "Cantonese"}
# The piece languages a language mode can give (Latin letters are English everywhere). Auto modes need the
# languages of the scripts they fall back on; a Korean piece in them still needs Korean.
_MODE_LANGS = {
    "auto": ("en", "zh", "ja"), "auto_yue": ("en", "yue", "ja"), "en": ("en",), "zh": ("en", "zh"),
    "ja": ("en", "ja"), "yue": ("en", "yue"), "ko": ("en", "ko"), "all_zh": ("en", "zh"), "all_ja": ("en", "ja"),
    "all_yue": ("en", "yue"), "all_ko": ("en", "ko"),
}

@dataclass(frozen=True)
class Piece:
    """One language piece of a sentence.

    Attributes
    ----------
    text: the piece as written.
    lang: ``en``, ``zh``, ``ja``, ``ko`` or ``yue``.
    norm_text: the normalised text G2P read (for ``zh`` and ``yue``, one char per ``word2ph`` entry; for ``zh``
        BERT's input).
    start, end: the piece's phones are ``ids[start:end]``.
    word2ph: phones per char of ``norm_text`` (``zh``, ``yue``), else None.
    fixed: the phones are a pronunciation-dictionary entry's (``text`` is what it matched, no G2P, no
        ``word2ph``: zero BERT rows; see :mod:`synthesis.text.lexicon`).
    """

    text: str
    lang: str
    norm_text: str
    start: int
    end: int
    word2ph: tuple[int, ...] | None
    fixed: bool = False


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

    @property
    def reading_key(self) -> str:
        """A digest of everything the GPT reads from the sentence besides its characters: the phone ids and, per
        piece, its language and ``word2ph`` (the BERT layout). Part of the prosody cache key, so a changed reading
        (a new front-end version, G2PW installed, a pronunciation-dictionary entry) never hits tokens made for
        another."""
        h = hashlib.sha256(np.ascontiguousarray(self.ids, dtype=np.int64).tobytes())
        for p in self.pieces:
            h.update(f"|{p.lang}:{p.start}-{p.end}:{','.join(map(str, p.word2ph or ()))}".encode())
        return h.hexdigest()[:32]


def speakable_languages() -> tuple[str, ...]:
    """The language modes (``synthesis.types.LANGUAGES``) this build can read, found without loading anything.

    Checks that each needed package is installed and holds its dictionary, so a bot can offer languages before
    any model is downloaded. ``auto`` needs English, Mandarin and Japanese (Korean pieces in it also need Korean),
    ``auto_yue`` English, Cantonese and Japanese; every other mode needs its language and English.
    """
    readable = {lang: not _missing(lang) for lang in _NAMES}
    return tuple(mode for mode in LANGUAGES if all(readable[lang] for lang in _MODE_LANGS[mode]))


def check_speakable(language: str) -> None:
    """Refuse, in one line naming what to install, a language mode this build cannot read (nothing is loaded).

    Raises
    ------
    TextError
        An unknown mode, or one whose languages lack a package (see :func:`speakable_languages`).
    """
    if language not in LANGUAGES:
        raise TextError(f"unknown language {language!r}; use one of {', '.join(LANGUAGES)}")
    for lang in _MODE_LANGS[language]:
        missing = _missing(lang)
        if missing:
            raise TextError(f"this build cannot read {_NAMES[lang]} ({language!r} needs it): pip install "
                            f"{' '.join(missing)}, or choose one of {', '.join(speakable_languages()) or 'none'}")


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
    if lang == "ko":  # upstream has no Korean normalisation: G2P reads the text as written
        return text, korean.g2p(text), None
    if lang == "yue":
        norm = cantonese.normalize(text)
        phones, word2ph = cantonese.g2p(norm)
        return norm, phones, word2ph
    raise TextError(f"cannot read {text!r}: language {lang!r} is not supported")


def _convert(text: str, language: str, lexicon: Lexicon | None = None) -> Phonemes:
    """Apply the dictionary, segment, G2P and concatenate (no retry)."""
    pieces: list[Piece] = []
    ids: list[np.ndarray] = []
    offset = 0
    for piece_text, lang, fixed in segments(text, language, lexicon):
        norm, phones, word2ph = (piece_text, list(fixed), None) if fixed is not None else _g2p(piece_text, lang)
        if not phones:
            continue
        ids.append(phones_to_ids(phones))
        pieces.append(Piece(piece_text, lang, norm, offset, offset + len(phones), tuple(word2ph) if word2ph else None,
                            fixed is not None))
        offset += len(phones)
    all_ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    return Phonemes(all_ids, "".join(p.norm_text for p in pieces), tuple(pieces))


def text_to_phonemes(text: str, language: str = "auto", lexicon: Lexicon | None = None) -> Phonemes:
    """One sentence -> phone ids with per-piece language, normalised text and word2ph.

    Parameters
    ----------
    text:
        A sentence (see :func:`synthesis.text.split.split_sentences`).
    language:
        One of ``synthesis.types.LANGUAGES``; see :func:`speakable_languages` for what this build can read.
    lexicon:
        A pronunciation dictionary applied first, on the sentence text (:mod:`synthesis.text.lexicon`).

    Raises
    ------
    TextError
        Blank text, an unknown language, or a piece in a language this build cannot read (the message names
        the package to install).
    """
    if language not in LANGUAGES:
        raise TextError(f"unknown language {language!r}; use one of {', '.join(LANGUAGES)}")
    if not text or not text.strip():
        raise TextError("no text to speak: the text is empty")
    result = _convert(text, language, lexicon)
    if len(result.ids) < MIN_PHONES:
        result = _convert("." + text, language, lexicon)
    if len(result.ids) == 0:
        raise TextError(f"nothing speakable in {text!r}: write words in English, Chinese, Japanese or Korean")
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
