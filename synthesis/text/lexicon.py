"""Pronunciation dictionaries: entries people write to fix how a word is read, validated and matched (no I/O).

An entry maps a word or phrase to either a *respelling* (text read instead: ``Nguyen -> win``, ``GIF -> jif``) or
*phones* (``Nguyen -> W IH1 N`` in English ARPAbet, ``长城 -> chang2 cheng2`` in pinyin), checked against the v2
phone table. A :class:`Lexicon` is applied to a sentence before language segmentation and G2P:

* matching is whole-word and case-insensitive where the entry's edge is a Latin-script letter or digit, exact and
  anywhere for CJK (Chinese has no spaces between words); a space in an entry matches any run of whitespace;
* at each position the longest entry wins, left to right, without overlaps;
* a respelling replaces the matched text in place, so G2P reads it in its sentence (context, word segmentation);
* a phones entry becomes a piece of its own with exactly those phones. It has no characters BERT could read, so
  its BERT rows are zero and its ``word2ph`` is None, as for English and Japanese pieces (a Chinese piece next to
  it keeps its own, consistent ``word2ph``).

The cache keys follow what the model is given (the phones, see :attr:`synthesis.text.Phonemes.reading_key`), so
a sentence an entry changed gets keys of its own and a sentence no entry touches keeps the keys it had.

The file format (export and import, the HTTP API's dictionary file) is one JSON object::

    {"format": "voicebot-pronunciations/1",
     "entries": [{"word": "Nguyen", "say": "win"},
                 {"word": "GIF", "phones": "JH IH1 F", "lang": "en"},
                 {"word": "长城", "phones": "chang2 cheng2", "lang": "zh"}]}

``format`` may be left out; each entry has ``word`` and exactly one of ``say`` or ``phones`` (``lang`` is needed
only where the phones could be read as more than one language's). A file is checked whole before anything is
used: one bad entry refuses the file, with a one-line message naming the entry.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable, Mapping, Sequence

from .errors import TextError
from .language import segment_languages
from .pinyin import syllable_phones
from .split import replace_consecutive_punctuation
from .symbols import PUNCTUATION, symbol_ids

FORMAT = "voicebot-pronunciations/1"  # the "format" value files carry
MAX_ENTRIES = 2000  # entries per dictionary (a guild's, a user's, the HTTP API's)
MAX_WORD_CHARS = 64  # characters of a word or phrase
MAX_SAY_CHARS = 200  # characters of a respelling
MAX_PHONES = 64  # phones (or pinyin syllables) of one entry
MAX_FILE_BYTES = 1024 * 1024  # an imported file, bytes (2000 entries of the longest kind fit)
PHONE_LANGUAGES = ("en", "zh", "ja", "ko", "yue")
QUOTE_CHARS = 24  # characters of a bad value quoted back in an error
# Sentences are cut after these before the dictionary is applied, so an entry holding one could never match.
_CUT_CHARS = frozenset(",;?!、，。？！；：…~:—")
_ARPABET_VOWELS = ("AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW")
_ARPABET_CONSONANTS = ("B", "CH", "D", "DH", "F", "G", "HH", "JH", "K", "L", "M", "N", "NG", "P", "R", "S", "SH",
                       "T", "TH", "V", "W", "Y", "Z", "ZH")
# upstream's Japanese phones (pyopenjtalk), and the accent marks the v2 table holds
_JA_PHONES = ("I", "N", "U", "a", "b", "by", "ch", "cl", "d", "dy", "e", "f", "g", "gy", "h", "hy", "i", "j", "k",
              "ky", "m", "my", "n", "ny", "o", "p", "py", "r", "ry", "s", "sh", "t", "ts", "u", "v", "w", "y", "z",
              "[", "]")
_HINTS = {
    "en": "English phones are ARPAbet, vowels with stress 0-2: e.g. W IH1 N",
    "zh": "Chinese phones are pinyin syllables with a tone digit 1-5 (5 = neutral, v for ü): e.g. chang2 cheng2",
    "ja": "Japanese phones are OpenJTalk's: a i u e o N cl and consonants like k sh ts ky; e.g. k o N n i ch i w a",
    "ko": "Korean phones are single jamo: e.g. ㅎ ㅏ ㄴ ㄱ ㅡ ㄹ",
    "yue": "Cantonese phones are the v2 table's Y-phones (initial, then final with tone 1-6): e.g. Yn Yei5",
}


class LexiconError(TextError):
    """A dictionary entry or file is refused; the one-line message names the entry and the fix."""


def _quote(text: str) -> str:
    """``text`` quoted for an error, shortened (a 1 MB word is not echoed back)."""
    return repr(text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS] + "…")


def _clean(text: str) -> str:
    """NFC, whitespace runs -> one space, stripped."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def match_key(word: str) -> str:
    """The form entries are matched and stored by: cleaned and case-folded (``"GIF"`` and ``"gif"`` are one)."""
    return _clean(word).casefold()


def _is_word_char(c: str) -> bool:
    """A letter or digit of an alphabetic script (Latin, Greek, Cyrillic...): whole-word matching applies to it."""
    return c.isalnum() and ord(c) < 0x2E80  # CJK, kana and hangul start at U+2E80


@lru_cache(maxsize=len(PHONE_LANGUAGES))
def _phone_set(lang: str) -> frozenset[str]:
    """The v2 phones an entry of ``lang`` may use (pinyin syllables are mapped before this check)."""
    table = symbol_ids()
    if lang == "en":
        names = [*_ARPABET_CONSONANTS, *(v + s for v in _ARPABET_VOWELS for s in "012")]
    elif lang == "zh":
        names = []  # pinyin syllables, mapped by synthesis.text.pinyin before this check
    elif lang == "ja":
        names = list(_JA_PHONES)
    elif lang == "ko":
        names = [s for s in table if len(s) == 1 and 0x3131 <= ord(s) <= 0x318E]
    else:
        names = [s for s in table if s.startswith("Y") and len(s) > 1]
    return frozenset(n for n in [*names, *PUNCTUATION, "SP"] if n in table)


def _phones_for(spelled: Sequence[str], lang: str) -> tuple[tuple[str, ...], str | None]:
    """Tokens -> (v2 phones, None), or ((), the first token ``lang`` cannot read)."""
    allowed = _phone_set(lang)
    out: list[str] = []
    for token in spelled:
        if token in PUNCTUATION:
            out.append(token)
        elif lang == "zh":
            pair = syllable_phones(token.lower()) if token[-1:] in "12345" else None
            if pair is None:
                return (), token
            out.extend(pair)
        elif token in allowed:
            out.append(token)
        else:
            return (), token
    return tuple(out), None


@dataclass(frozen=True)
class Entry:
    """One dictionary entry, validated (build it with :func:`make_entry`).

    Attributes
    ----------
    word: the word or phrase as written (NFC, whitespace collapsed).
    say: the respelling read instead, or None for a phones entry.
    spelled: the phones as written (``"W IH1 N"``, ``"chang2 cheng2"``), ``""`` for a respelling.
    lang: the language of the phones, None for a respelling.
    phones: the v2 phones ``spelled`` stands for (pinyin syllables mapped to two phones each).
    """

    word: str
    say: str | None = None
    spelled: str = ""
    lang: str | None = None
    phones: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """The match key (:func:`match_key`)."""
        return match_key(self.word)

    def to_json(self) -> dict[str, str]:
        """The entry in the file format."""
        if self.say is not None:
            return {"word": self.word, "say": self.say}
        return {"word": self.word, "phones": self.spelled, "lang": self.lang or ""}

    def describe(self) -> str:
        """``Nguyen → “win”`` / ``Nguyen → W IH1 N (en)``: how lists show it."""
        if self.say is not None:
            return f"{self.word} → “{self.say}”"
        return f"{self.word} → {self.spelled} ({self.lang})"


def make_entry(word: str, *, say: str | None = None, phones: str | None = None, lang: str | None = None) -> Entry:
    """Validate one entry.

    Parameters
    ----------
    word:
        The word or phrase to fix (1-64 characters, no sentence punctuation).
    say:
        A respelling (1-200 characters), or
    phones:
        Space-separated phones of ``lang``'s v2 table (pinyin syllables with tones for zh).
    lang:
        ``en``, ``zh``, ``ja``, ``ko`` or ``yue``; with ``phones`` only. When left out, the first of en, zh, ja
        whose table reads every phone.

    Raises
    ------
    LexiconError
        One line naming what is wrong and how to write it.
    """
    if not _clean(word):
        raise LexiconError("the word to fix is empty: write the word or phrase as it appears in messages")
    if len(word) > MAX_WORD_CHARS * 4 or len(_clean(word)) > MAX_WORD_CHARS:
        raise LexiconError(f"the word {_quote(word)} is {len(word)} characters long; the limit is {MAX_WORD_CHARS}")
    clean_word = _clean(word)
    cut = next((c for c in clean_word if c in _CUT_CHARS), None)
    if cut is not None:
        raise LexiconError(f"the word {_quote(clean_word)} contains {cut!r}, where sentences are cut, so it could "
                           "never match: add its parts as separate entries")
    if (say is None) == (phones is None):
        raise LexiconError(f"{_quote(clean_word)}: give either a respelling (say) or phones, not "
                           f"{'both' if say is not None else 'neither'}")
    if say is not None:
        if not _clean(say):
            raise LexiconError(f"{_quote(clean_word)}: the respelling is empty: write how the word should be read")
        if len(say) > MAX_SAY_CHARS * 4 or len(_clean(say)) > MAX_SAY_CHARS:
            raise LexiconError(f"{_quote(clean_word)}: the respelling is {len(say)} characters long; the limit is "
                               f"{MAX_SAY_CHARS}")
        if lang:
            raise LexiconError(f"{_quote(clean_word)}: lang goes with phones only; a respelling is read in the "
                               "sentence's language")
        return Entry(clean_word, say=_clean(say))
    assert phones is not None
    tokens = phones.split() if len(phones) <= MAX_PHONES * 8 else []
    if not tokens or len(tokens) > MAX_PHONES:
        what = "are empty" if len(phones.strip()) == 0 else f"are too many (the limit is {MAX_PHONES})"
        raise LexiconError(f"{_quote(clean_word)}: the phones {what}")
    if lang is not None and lang not in PHONE_LANGUAGES:
        raise LexiconError(f"{_quote(clean_word)}: lang must be one of {', '.join(PHONE_LANGUAGES)}, got "
                           f"{_quote(str(lang))}")
    for candidate in [lang] if lang else ["en", "zh", "ja"]:
        resolved, bad = _phones_for(tokens, candidate)
        if bad is None:
            return Entry(clean_word, spelled=" ".join(tokens), lang=candidate, phones=resolved)
        if lang:
            raise LexiconError(f"{_quote(clean_word)}: unknown {candidate} phone {_quote(bad)}; {_HINTS[candidate]}")
    raise LexiconError(f"{_quote(clean_word)}: the phones {_quote(' '.join(tokens))} are not English, Chinese or "
                       f"Japanese phones: say which language with lang ({_HINTS['en']}; {_HINTS['zh']})")


def entry_from_json(item: object) -> Entry:
    """One entry of the file format -> :class:`Entry` (LexiconError without the entry's position)."""
    if not isinstance(item, dict):
        raise LexiconError(f"an entry must be an object like {{\"word\": \"GIF\", \"say\": \"jif\"}}, got "
                           f"{type(item).__name__}")
    fields: dict[str, Any] = dict(item)  # pyright: ignore[reportUnknownArgumentType]
    unknown = sorted(str(k) for k in fields if k not in ("word", "say", "phones", "lang"))
    if unknown:
        raise LexiconError(f"unknown key {_quote(unknown[0])}: an entry has word, and say or phones (with lang)")
    for name in ("word", "say", "phones", "lang"):
        value = fields.get(name)
        if value is not None and not isinstance(value, str):
            raise LexiconError(f"{name} must be text, got {type(value).__name__}")
    return make_entry(fields.get("word") or "", say=fields.get("say"), phones=fields.get("phones"),
                      lang=fields.get("lang") or None)


@dataclass(frozen=True)
class Part:
    """A stretch of a rewritten sentence: text for G2P (``entry`` None, respellings already in it), or the text an
    entry with phones matched (``entry`` set: its phones are read instead)."""

    text: str
    entry: Entry | None = None


@dataclass(frozen=True)
class Rewrite:
    """A sentence after the dictionary: its parts, in order, and the entries that matched, in order."""

    parts: tuple[Part, ...]
    used: tuple[Entry, ...]


class Lexicon:
    """An immutable pronunciation dictionary; the later of two entries with one key wins.

    Parameters
    ----------
    entries:
        Validated entries (:func:`make_entry`, :func:`parse_file`). At most :data:`MAX_ENTRIES` distinct words
        (a merged guild + user dictionary may hold twice that).
    """

    MAX_ENTRIES = MAX_ENTRIES

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        by_key: dict[str, Entry] = {}
        for e in entries:
            by_key.pop(e.key, None)  # a replaced entry moves to the end: lists show the latest last
            by_key[e.key] = e
        self._entries = tuple(by_key.values())
        index: dict[str, list[Entry]] = {}
        for e in self._entries:
            index.setdefault(e.key[0], []).append(e)
        for bucket in index.values():
            bucket.sort(key=lambda e: len(e.key), reverse=True)  # longest first at each position
        self._index = index

    @property
    def entries(self) -> tuple[Entry, ...]:
        """The entries, oldest first."""
        return self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Lexicon) and self._entries == other._entries

    def __hash__(self) -> int:
        return hash(self._entries)

    def __repr__(self) -> str:
        return f"Lexicon({len(self._entries)} entries)"

    def __reduce__(self) -> tuple[type[Lexicon], tuple[tuple[Entry, ...]]]:
        return Lexicon, (self._entries,)  # pickled as its entries (Ray replicas rebuild the index)

    def get(self, word: str) -> Entry | None:
        """The entry for ``word`` (matched by :func:`match_key`), or None."""
        key = match_key(word)
        return next((e for e in self._index.get(key[:1], ()) if e.key == key), None)

    def merged(self, over: Lexicon | None) -> Lexicon:
        """This dictionary with ``over``'s entries on top (a user's over their guild's)."""
        return self if not over else Lexicon((*self._entries, *over.entries))

    def to_json(self) -> dict[str, Any]:
        """The file format (see the module docstring)."""
        return {"format": FORMAT, "entries": [e.to_json() for e in self._entries]}

    @staticmethod
    def from_file(data: bytes | str | Mapping[str, Any], *, limit: int = MAX_ENTRIES) -> Lexicon:
        """:func:`parse_file`."""
        return parse_file(data, limit=limit)

    def to_file(self) -> bytes:
        """:func:`dump_file`."""
        return dump_file(self)

    def rewrite(self, text: str) -> Rewrite:
        """Apply the dictionary to one sentence (see the module docstring for the matching rules)."""
        parts: list[Part] = []
        used: list[Entry] = []
        pending: list[str] = []  # text (respellings included) since the last phones part
        i = last = 0
        n = len(text)
        while i < n:
            found = self._match(text, i) if self._entries else None
            if found is None:
                i += 1
                continue
            end, entry = found
            pending.append(text[last:i])
            if entry.say is not None:
                pending.append(entry.say)
            else:
                if "".join(pending):
                    parts.append(Part("".join(pending)))
                pending = []
                parts.append(Part(text[i:end], entry))
            used.append(entry)
            i = last = end
        pending.append(text[last:])
        if "".join(pending):
            parts.append(Part("".join(pending)))
        return Rewrite(tuple(parts), tuple(used))

    def _match(self, text: str, i: int) -> tuple[int, Entry] | None:
        """The longest entry matching at ``text[i]``: (end, entry), or None."""
        bucket = self._index.get(text[i].casefold()[:1])
        if not bucket:
            return None
        after_word = i > 0 and _is_word_char(text[i - 1])
        for entry in bucket:
            key = entry.key
            if after_word and _is_word_char(key[0]):
                continue
            end = _match_at(text, i, key)
            if end < 0:
                continue
            if end < len(text) and _is_word_char(key[-1]) and _is_word_char(text[end]):
                continue
            return end, entry
        return None


def _match_at(text: str, i: int, key: str) -> int:
    """Where ``key`` (case-folded, single spaces) ends if it matches ``text`` from ``i`` case-insensitively, else
    -1; a space in the key matches any run of whitespace."""
    j = 0
    k = i
    n = len(text)
    while j < len(key):
        if k >= n:
            return -1
        if key[j] == " ":
            if not text[k].isspace():
                return -1
            while k < n and text[k].isspace():
                k += 1
            j += 1
            continue
        folded = text[k].casefold()
        if key[j : j + len(folded)] != folded:
            return -1
        j += len(folded)
        k += 1
    return k


Segment = tuple[str, str, "tuple[str, ...] | None"]  # (text, lang, phones from an entry or None: G2P reads it)


def segments(text: str, language: str, lexicon: Lexicon | None) -> list[Segment]:
    """A sentence -> its language pieces with the dictionary applied.

    Without a dictionary (or one that matches nothing) this is exactly ``segment_languages(text, language)``.
    """
    if not lexicon:
        return [(t, lang, None) for t, lang in segment_languages(text, language)]
    rewrite = lexicon.rewrite(text)
    out: list[Segment] = []
    for part in rewrite.parts:
        if part.entry is not None:
            out.append((part.text, part.entry.lang or "en", part.entry.phones))
        elif not any(c.isalpha() for c in part.text) and out:
            marks = [c for c in replace_consecutive_punctuation(part.text) if not c.isspace()]
            prev_text, prev_lang, prev_phones = out[-1]
            if marks and prev_phones is not None and all(c in PUNCTUATION for c in marks):
                # "Nguyen!": the mark is read after the entry's phones, as G2P reads it after a word
                out[-1] = (prev_text + part.text, prev_lang, (*prev_phones, *marks))
            elif marks:  # other punctuation belongs to the piece before, as in language segmentation
                out.append((part.text, prev_lang, None))
        else:
            out.extend((t, lang, None) for t, lang in segment_languages(part.text, language))
    return out


def parse_file(data: bytes | str | Mapping[str, Any], *, limit: int = MAX_ENTRIES) -> Lexicon:
    """A dictionary file (bytes, text or the parsed object) -> :class:`Lexicon`, checked whole.

    Raises
    ------
    LexiconError
        The first problem, in one line naming the entry ("entry 9,999 ('foo'): ..."): nothing of the file is
        used. Too large a file, too many entries, a word listed twice are refused too.
    """
    if isinstance(data, (bytes, str)):
        if len(data) > MAX_FILE_BYTES:
            raise LexiconError(f"the file is {len(data):,} bytes; the limit is {MAX_FILE_BYTES:,} "
                               f"({MAX_ENTRIES} entries fit): split it")
        try:
            raw: Any = json.loads(data)
        except RecursionError:
            raise LexiconError("the file is nested too deeply: it must be one object with an entries list") from None
        except ValueError as e:
            raise LexiconError(f"the file is not valid JSON ({e}): export a dictionary to see the format") from None
    else:
        raw = data
    obj: dict[str, Any] = dict(raw) if isinstance(raw, dict) else {}  # pyright: ignore[reportUnknownArgumentType]
    if not isinstance(obj.get("entries"), list):
        raise LexiconError('the file must be a JSON object {"format": "' + FORMAT + '", "entries": [...]}')
    if obj.get("format", FORMAT) != FORMAT:
        raise LexiconError(f"the file's format is {_quote(str(obj.get('format')))}; this version reads {FORMAT}")
    extra = sorted(str(k) for k in obj if k not in ("format", "entries"))
    if extra:
        raise LexiconError(f"unknown key {_quote(extra[0])} in the file: it holds format and entries only")
    items: list[Any] = obj["entries"]
    if len(items) > limit:
        raise LexiconError(f"the file has {len(items):,} entries; a dictionary holds at most {limit:,}: "
                           "split it or remove entries")
    entries: list[Entry] = []
    seen: dict[str, int] = {}
    for n, item in enumerate(items, 1):
        try:
            entry = entry_from_json(item)
        except LexiconError as e:
            raise LexiconError(f"entry {n:,}: {e}; nothing was imported") from None
        if entry.key in seen:
            raise LexiconError(f"entry {n:,} ({_quote(entry.word)}) repeats entry {seen[entry.key]:,}: keep one; "
                               "nothing was imported")
        seen[entry.key] = n
        entries.append(entry)
    return Lexicon(entries)


def dump_file(lexicon: Lexicon) -> bytes:
    """The file format as UTF-8 JSON, one entry per line (diffs and hand edits stay readable)."""
    lines = ",\n".join("    " + json.dumps(e.to_json(), ensure_ascii=False) for e in lexicon.entries)
    body = f'{{\n  "format": "{FORMAT}",\n  "entries": [\n{lines}\n  ]\n}}\n' if lines else \
        f'{{\n  "format": "{FORMAT}",\n  "entries": []\n}}\n'
    return body.encode("utf-8")
