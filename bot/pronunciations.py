"""Pronunciation dictionaries where they live: a guild's and a user's in the store, the HTTP API's in a JSON file.

The entries themselves (validation, matching, the file format) are ``synthesis.text.Lexicon``'s; here they are kept.
Every change is checked whole before anything is written, and written at once: an import is one SQLite
transaction, the HTTP API's file is replaced by a complete temporary file (``os.replace``). A member's messages are
read with their guild's dictionary and their own on top (:meth:`Pronunciations.for_member`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from synthesis import SpeechError
from synthesis.text import Lexicon, LexiconError, explain_text, make_entry

from bot.store import Store

log = logging.getLogger(__name__)

SCOPES = ("guild", "user")


class Pronunciations:
    """The guild and user dictionaries in the bot's store.

    Parameters
    ----------
    store:
        The bot's database (table ``pronunciations``).
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    async def lexicon(self, scope: str, owner_id: int) -> Lexicon:
        """A guild's (``scope`` "guild", ``owner_id`` the guild id) or a user's dictionary.

        A stored entry that no longer validates (a phone table changed under it) is skipped with a warning, so
        one stale entry never silences the others.
        """
        entries = []
        for raw in await self.store.pronunciations(scope, owner_id):
            try:
                entries.append(Lexicon.from_file({"entries": [json.loads(raw)]}).entries[0])
            except (LexiconError, ValueError) as e:
                log.warning("skipping a stored %s pronunciation of %d: %s", scope, owner_id, e)
        return Lexicon(entries)

    async def for_member(self, guild_id: int, user_id: int | None) -> Lexicon | None:
        """The dictionary a member's messages are read with: the guild's, the user's entries winning (``user_id``
        None, for another bot: the guild's alone); None when empty (the pipeline then does exactly what it did
        before dictionaries)."""
        merged = await self.lexicon("guild", guild_id)
        if user_id is not None:
            merged = merged.merged(await self.lexicon("user", user_id))
        return merged or None

    async def add(self, scope: str, owner_id: int, word: str, *, say: str | None = None, phones: str | None = None,
                  lang: str | None = None) -> tuple[Any, bool]:
        """Add or replace one entry; returns (the entry, whether it replaced one). LexiconError says what is wrong."""
        entry = make_entry(word, say=say, phones=phones, lang=lang)
        replaced = (await self.lexicon(scope, owner_id)).get(entry.word) is not None
        await self.store.put_pronunciations(scope, owner_id, [(entry.key, _entry_json(entry))],
                                            limit=Lexicon.MAX_ENTRIES)
        return entry, replaced

    async def remove(self, scope: str, owner_id: int, word: str) -> bool:
        """Remove the entry for ``word`` (any case); False when there was none."""
        entry = (await self.lexicon(scope, owner_id)).get(word)
        return entry is not None and await self.store.remove_pronunciation(scope, owner_id, entry.key)

    async def export(self, scope: str, owner_id: int) -> bytes:
        """The dictionary as a file (``synthesis.text.Lexicon`` format)."""
        return (await self.lexicon(scope, owner_id)).to_file()

    async def import_file(self, scope: str, owner_id: int, data: bytes, *, replace: bool = False) -> tuple[int, int]:
        """Import a dictionary file, checked whole first: every entry goes in, or none (one transaction).

        ``replace``: the dictionary becomes the file; else the file's entries are added, replacing those with the
        same word. Returns (entries imported, entries the dictionary holds now).
        """
        incoming = Lexicon.from_file(data)
        total = await self.store.put_pronunciations(
            scope, owner_id, [(e.key, _entry_json(e)) for e in incoming.entries], limit=Lexicon.MAX_ENTRIES,
            replace=replace)
        return len(incoming), total


def _entry_json(entry: Any) -> str:
    """One entry in the file format, as stored."""
    return json.dumps(entry.to_json(), ensure_ascii=False, separators=(",", ":"))


class PronunciationFile:
    """The HTTP API's dictionary: a JSON file (``http.pronunciations``), read at start and again whenever it
    changes on disk, rewritten atomically by the API's add/remove/import.

    A missing file is an empty dictionary. A file that does not validate is a :class:`LexiconError` at start
    (:meth:`load`); edited into a bad state while the server runs, it is logged and the last good dictionary stays.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lexicon = Lexicon()
        self._stamp: tuple[int, int] | None = None  # (mtime_ns, size) of what _lexicon was read from
        self._lock = threading.Lock()  # one writer at a time (requests run writes in threads)

    def load(self) -> Lexicon:
        """Read the file now; LexiconError (naming the file) when it does not validate."""
        with self._lock:
            self._reload(strict=True)
            return self._lexicon

    def current(self) -> Lexicon:
        """The dictionary, re-read first if the file changed on disk."""
        with self._lock:
            self._reload(strict=False)
            return self._lexicon

    def add(self, word: str, *, say: str | None = None, phones: str | None = None,
            lang: str | None = None) -> tuple[Any, bool]:
        """Add or replace one entry and write the file; returns (entry, whether it replaced one)."""
        entry = make_entry(word, say=say, phones=phones, lang=lang)
        with self._lock:
            self._reload(strict=True)
            replaced = self._lexicon.get(entry.word) is not None
            self._write(Lexicon((*self._lexicon.entries, entry)))
        return entry, replaced

    def remove(self, word: str) -> bool:
        """Remove the entry for ``word``; False when there was none (the file is then left as it is)."""
        with self._lock:
            self._reload(strict=True)
            entry = self._lexicon.get(word)
            if entry is None:
                return False
            self._write(Lexicon(e for e in self._lexicon.entries if e.key != entry.key))
            return True

    def import_file(self, data: bytes | dict[str, Any], *, replace: bool = False) -> tuple[int, int]:
        """Import a dictionary (checked whole first); returns (entries imported, entries now)."""
        incoming = Lexicon.from_file(data)
        with self._lock:
            self._reload(strict=True)
            result = incoming if replace else self._lexicon.merged(incoming)
            if len(result) > Lexicon.MAX_ENTRIES:
                raise LexiconError(f"the dictionary would hold {len(result):,} entries; the limit is "
                                   f"{Lexicon.MAX_ENTRIES:,}: remove some first (or import with replace)")
            self._write(result)
            return len(incoming), len(result)

    def _reload(self, *, strict: bool) -> None:
        """Re-read the file when its size or time changed (strict: a bad file raises; else it is logged)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._lexicon, self._stamp = Lexicon(), None
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        try:
            lexicon = Lexicon.from_file(self.path.read_bytes())
        except LexiconError as e:
            if strict:
                raise LexiconError(f"{self.path} (http.pronunciations): {e}") from None
            log.error("%s (http.pronunciations) is not a valid dictionary, keeping the last good one: %s",
                      self.path, e)
            self._stamp = stamp  # logged once per change, not per request
            return
        except OSError as e:
            raise SpeechError(f"cannot read {self.path} (http.pronunciations): {e.strerror or e}") from e
        self._lexicon, self._stamp = lexicon, stamp

    def _write(self, lexicon: Lexicon) -> None:
        """Write the whole file beside itself, then swap it in: a reader never sees half a file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(lexicon.to_file())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        st = self.path.stat()
        self._lexicon, self._stamp = lexicon, (st.st_mtime_ns, st.st_size)


async def explain_phonemes(text: str, language: str, lexicon: Lexicon | None) -> dict[str, Any]:
    """``synthesis.explain_text`` off the event loop (G2P loads dictionaries and models on first use)."""
    return await asyncio.to_thread(explain_text, text, language, lexicon)


def format_explanation(report: dict[str, Any]) -> str:
    """The report as lines for a terminal or a Discord reply: per sentence, the normalised text, the dictionary
    entries used, then each language piece with its phones."""
    lines: list[str] = []
    for n, s in enumerate(report["sentences"], 1):
        lines.append(f"sentence {n}: {s['text']}")
        lines.append(f"  normalised: {s['norm_text']}")
        if s["dictionary"]:
            lines.append(f"  dictionary: {'; '.join(s['dictionary'])}")
        for p in s["pieces"]:
            source = " (dictionary)" if p["source"] == "dictionary" else ""
            lines.append(f"  {p['lang']:3} {p['norm_text']!r}{source}: {' '.join(p['phones'])}")
    return "\n".join(lines)
