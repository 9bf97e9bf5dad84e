"""The bot's SQLite store: guild and user settings, nicknames, voice sharing, consent, phrases, the restart journal,
pronunciation dictionaries.

One database file in WAL mode, opened on one dedicated thread: every query runs there, so the event loop never
blocks on disk, and every write is one transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on error)
behind an :class:`asyncio.Lock`. The schema is versioned: :data:`MIGRATIONS` is a list of SQL scripts applied in
order, each inside its own transaction together with the bump of ``schema_version``.

Settings are typed: :data:`GUILD_SETTINGS` and :data:`USER_SETTINGS` are the one table of definitions (type,
default, bounds, help); values are stored as JSON and checked on the way in. Voice *files* (and the consent given
for each voice) live in the synthesis layer's voice store; this database holds which guilds may use which voice,
and the journal of voice creations and deletions under way (see ``bot.voice_service``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TypeVar

from synthesis import SpeechError
from synthesis.text import speakable_languages

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_GUILD_PHRASES = 100  # phrases per guild (each is precomputed for every guild voice)
MAX_PHRASE_CHARS = 200  # characters per phrase
MAX_NICKNAME_CHARS = 32  # characters of a spoken nickname
MAX_SUMMARY_CHARS = 120  # characters of a message kept in the restart journal
BUSY_TIMEOUT_MS = 5000  # how long a write waits for another connection's lock


class StoreError(SpeechError):
    """The database cannot be opened or a stored value is refused."""


class SettingError(StoreError):
    """A setting name or value is invalid; the message names the allowed values."""


# --- migrations ---------------------------------------------------------------------------------------------------

MIGRATIONS: tuple[str, ...] = (
    # v1: settings, nicknames, which guilds may use a voice, consent records, guild phrases
    """
    CREATE TABLE guild_settings (
        guild_id INTEGER NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (guild_id, key));
    CREATE TABLE user_settings (
        user_id INTEGER NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (user_id, key));
    CREATE TABLE nicknames (
        guild_id INTEGER NOT NULL, user_id INTEGER NOT NULL, nickname TEXT NOT NULL, PRIMARY KEY (guild_id, user_id));
    CREATE TABLE voice_shares (
        voice_id TEXT NOT NULL, guild_id INTEGER NOT NULL, PRIMARY KEY (voice_id, guild_id));
    CREATE TABLE guild_voices (
        guild_id INTEGER NOT NULL, voice_id TEXT NOT NULL, added_by INTEGER NOT NULL, PRIMARY KEY (guild_id, voice_id));
    CREATE TABLE consent (voice_id TEXT NOT NULL, user_id INTEGER NOT NULL, text TEXT NOT NULL, at REAL NOT NULL);
    CREATE INDEX consent_voice ON consent (voice_id);
    CREATE TABLE guild_phrases (guild_id INTEGER NOT NULL, text TEXT NOT NULL, PRIMARY KEY (guild_id, text));
    """,
    # v2: per-guild overrides of user settings (guild_id 0 = global), who shared a voice, the restart journal
    """
    CREATE TABLE user_settings_new (
        user_id INTEGER NOT NULL, guild_id INTEGER NOT NULL DEFAULT 0, key TEXT NOT NULL, value TEXT NOT NULL,
        PRIMARY KEY (user_id, guild_id, key));
    INSERT INTO user_settings_new (user_id, guild_id, key, value) SELECT user_id, 0, key, value FROM user_settings;
    DROP TABLE user_settings;
    ALTER TABLE user_settings_new RENAME TO user_settings;
    ALTER TABLE voice_shares ADD COLUMN shared_by INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX consent_user ON consent (user_id);
    CREATE TABLE queue_journal (
        id INTEGER PRIMARY KEY AUTOINCREMENT, guild_id INTEGER NOT NULL, author_id INTEGER NOT NULL,
        summary TEXT NOT NULL, enqueued_at REAL NOT NULL);
    CREATE INDEX queue_journal_guild ON queue_journal (guild_id);
    """,
    # v3: consent is kept once, with the voice (a column of its row in the voice store's voices.sqlite3, written and
    # deleted with it; a meta.json is only imported from older versions); the voice journal names the voices whose
    # creation or deletion is under way, so start-up finishes or undoes it
    """
    DROP TABLE consent;
    CREATE TABLE voice_journal (
        voice_id TEXT PRIMARY KEY, op TEXT NOT NULL CHECK (op IN ('create', 'delete')), at REAL NOT NULL);
    """,
    # v4: pronunciation dictionaries, a guild's and a user's (``key``: the entry's match key, ``entry``: its JSON in
    # the dictionary file format, checked by synthesis' Lexicon on the way in and out)
    """
    CREATE TABLE pronunciations (
        scope TEXT NOT NULL CHECK (scope IN ('guild', 'user')), owner_id INTEGER NOT NULL, key TEXT NOT NULL,
        entry TEXT NOT NULL, PRIMARY KEY (scope, owner_id, key));
    """,
    # v5: a guild's block list (members or roles whose messages are not read and who cannot use /say), and its usage
    # counters for /stats (numbers only: no message text is stored)
    """
    CREATE TABLE guild_blocks (
        guild_id INTEGER NOT NULL, kind TEXT NOT NULL CHECK (kind IN ('user', 'role')), target_id INTEGER NOT NULL,
        PRIMARY KEY (guild_id, kind, target_id));
    CREATE TABLE guild_usage (
        guild_id INTEGER PRIMARY KEY, messages INTEGER NOT NULL DEFAULT 0, characters INTEGER NOT NULL DEFAULT 0,
        sentences INTEGER NOT NULL DEFAULT 0, cache_hits INTEGER NOT NULL DEFAULT 0, since REAL NOT NULL);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection, upto: int = SCHEMA_VERSION) -> int:
    """Apply the pending migrations up to version ``upto``, each in one transaction; return the version reached.

    ``conn`` must be in autocommit mode (``isolation_level=None``) so the scripts' own BEGIN/COMMIT hold.
    """
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    if row is None:
        conn.execute("INSERT INTO schema_version (version) VALUES (0)")
        current = 0
    else:
        current = int(row[0])
    if current > SCHEMA_VERSION:
        raise StoreError(
            f"the database is at schema version {current}, newer than this program ({SCHEMA_VERSION}): "
            "upgrade voicebot or point discord.database at another file"
        )
    for version in range(current + 1, upto + 1):
        script = MIGRATIONS[version - 1]
        try:
            conn.executescript(f"BEGIN IMMEDIATE;\n{script}\nUPDATE schema_version SET version = {version};\nCOMMIT;")
        except sqlite3.Error as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise StoreError(f"database migration to version {version} failed: {e}") from e
        log.info("database migrated to schema version %d", version)
        current = version
    return current


# --- typed settings -----------------------------------------------------------------------------------------------

_ID_RE = re.compile(r"^<[#@]&?!?(\d{15,21})>$|^(\d{15,21})$")  # a raw snowflake or a channel/role mention
_VOICE_ID_RE = re.compile(r"^[0-9a-zA-Z_-]{1,64}$")
_TRUE = {"true", "yes", "on", "1", "enable", "enabled"}
_FALSE = {"false", "no", "off", "0", "disable", "disabled"}
_NONE = {"", "none", "null", "off", "unset", "-"}


@dataclass(frozen=True)
class SettingDef:
    """One setting: its scope, type, default and bounds.

    ``kind`` is one of ``bool``, ``int``, ``float``, ``channel``, ``role`` (snowflake or None), ``voice`` (voice id or
    None), ``choice`` (one of ``choices``; ``nullable`` adds None = inherit), ``text`` (None or a short string) and
    ``voice_map`` (``{user id: voice id}``).
    """

    name: str
    scope: str  # "guild" | "user"
    kind: str
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    nullable: bool = False

    def parse(self, raw: str) -> Any:
        """A value typed by a user (``/set guild max_seconds 20``) -> the typed value; SettingError says the fix."""
        text = raw.strip()
        if self.kind == "bool":
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise SettingError(f"{self.name} is on or off: use true or false")
        if self.kind in ("int", "float"):
            if self.nullable and text.lower() in _NONE:
                return None
            try:
                number = int(text) if self.kind == "int" else float(text)
            except ValueError:
                raise SettingError(f"{self.name} must be a number{self._range_text()}, got {raw!r}") from None
            return self.check(number)
        if self.kind in ("channel", "role"):
            if text.lower() in _NONE:
                return None
            match = _ID_RE.match(text)
            if match is None:
                raise SettingError(f"{self.name} must be a {self.kind} (mention it or paste its id), or none")
            return int(match.group(1) or match.group(2))
        if self.kind == "voice":
            return None if text.lower() in _NONE else self.check(text)
        if self.kind == "choice":
            if self.nullable and text.lower() in _NONE:
                return None
            return self.check(text.lower())
        if self.kind == "text":
            return None if text.lower() in _NONE else self.check(text)
        if self.kind == "voice_map":
            raise SettingError(f"{self.name} is changed entry by entry: use `<bot id>=<voice id>` or `<bot id>=none`")
        raise AssertionError(f"unknown setting kind {self.kind}")  # pragma: no cover - table error

    def check(self, value: Any) -> Any:
        """Validate a typed value (from code or from JSON) and return it normalised."""
        if value is None and (self.nullable or self.kind in ("channel", "role", "voice", "text")):
            return None
        kind = self.kind
        if kind == "bool":
            if not isinstance(value, bool):
                raise SettingError(f"{self.name} must be true or false, got {value!r}")
            return value
        if kind in ("int", "float"):
            what = "an integer" if kind == "int" else "a number"
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SettingError(f"{self.name} must be {what}, got {value!r}")
            if kind == "int" and value != int(value):
                raise SettingError(f"{self.name} must be {what}, got {value!r}")
            value = int(value) if kind == "int" else float(value)
            too_low = self.minimum is not None and value < self.minimum
            if too_low or (self.maximum is not None and value > self.maximum):
                raise SettingError(f"{self.name} must be{self._range_text()}, got {value}")
            return value
        if kind in ("channel", "role"):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise SettingError(f"{self.name} must be a {kind} id, got {value!r}")
            return value
        if kind == "voice":
            if not isinstance(value, str) or not _VOICE_ID_RE.match(value):
                raise SettingError(f"{self.name} must be a voice id (pick one from /voice list), got {value!r}")
            return value
        if kind == "choice":
            if value not in self.choices:
                raise SettingError(f"{self.name} must be one of {', '.join(self.choices)}, got {value!r}")
            return value
        if kind == "text":
            if not isinstance(value, str) or not value.strip() or len(value) > MAX_NICKNAME_CHARS:
                raise SettingError(f"{self.name} must be 1-{MAX_NICKNAME_CHARS} characters, got {value!r}")
            return value.strip()
        if kind == "voice_map":
            if not isinstance(value, dict):
                raise SettingError(f"{self.name} must map bot ids to voice ids, got {value!r}")
            out: dict[int, str] = {}
            for k, v in value.items():
                try:
                    key = int(k)
                except (TypeError, ValueError):
                    raise SettingError(f"{self.name}: {k!r} is not a user id") from None
                if not isinstance(v, str) or not _VOICE_ID_RE.match(v):
                    raise SettingError(f"{self.name}: {v!r} is not a voice id")
                out[key] = v
            return out
        raise AssertionError(f"unknown setting kind {kind}")  # pragma: no cover - table error

    def _range_text(self) -> str:
        """' between A and B' for the error messages."""
        if self.minimum is not None and self.maximum is not None:
            return f" between {self.minimum:g} and {self.maximum:g}"
        return ""

    def to_json(self, value: Any) -> str:
        """The stored form (JSON; map keys become strings)."""
        return json.dumps(value)

    def from_json(self, text: str) -> Any:
        """Stored JSON -> the typed value; a row that no longer validates falls back to the default."""
        try:
            return self.check(json.loads(text))
        except (ValueError, SettingError):
            log.warning("ignoring an invalid stored value for %s: %r", self.name, text)
            return self.default


_LANG_CHOICES = speakable_languages()  # only what this build can read (packages found, nothing loaded)

GUILD_SETTINGS: dict[str, SettingDef] = {
    s.name: s
    for s in (
        SettingDef("autoread_channel", "guild", "channel", None, "text channel whose messages are read aloud"),
        SettingDef("read_voice_chat", "guild", "bool", False, "also read the text chat of the bot's voice channel"),
        SettingDef("announce_author", "guild", "bool", False, 'say "X said" before a new author\'s message'),
        SettingDef("autojoin", "guild", "bool", False, "join the author's voice channel to read auto-read messages"),
        SettingDef("require_in_voice", "guild", "bool", True, "only read members who are in the bot's voice channel"),
        SettingDef("ignore_bots", "guild", "bool", True, "do not read other bots (bots listed in bot_voices are read)"),
        SettingDef("required_role", "guild", "role", None, "role a member needs to be read (none: everyone)"),
        SettingDef("max_seconds", "guild", "float", 30.0, "longest speech per message, seconds", minimum=1,
                   maximum=300),
        SettingDef("repeat_cap", "guild", "int", 3, "a character repeated more often is cut to this", minimum=1,
                   maximum=20),
        SettingDef("default_voice", "guild", "voice", None, "voice for members who have none"),
        SettingDef("default_language", "guild", "choice", "auto", "language of messages", choices=_LANG_CHOICES),
        SettingDef("emoji_mode", "guild", "choice", "name", "custom emoji: say the name or skip",
                   choices=("name", "skip")),
        SettingDef("clone_role", "guild", "role", None, "role a member needs to clone a voice (none: everyone)"),
        SettingDef("cloning_enabled", "guild", "bool", True, "members may clone voices here"),
        SettingDef("chat_enabled", "guild", "bool", True, "members may talk to the chat model (/ask)"),
        SettingDef("mention_chat", "guild", "bool", False, "mentioning the bot asks the chat model"),
        SettingDef("bot_voices", "guild", "voice_map", {}, "voice for each bot that is read (bot id -> voice)"),
        SettingDef("autoread_prefix", "guild", "text", None,
                   "auto-read only messages starting with this, read without it (none: every message)"),
        SettingDef("max_message_chars", "guild", "int", None, "longest text read per message, characters "
                   "(none: the bot's limit)", minimum=1, maximum=2000, nullable=True),
        SettingDef("speed_min", "guild", "float", 0.25, "slowest voice speed members may choose", minimum=0.25,
                   maximum=4.0),
        SettingDef("speed_max", "guild", "float", 4.0, "fastest voice speed members may choose", minimum=0.25,
                   maximum=4.0),
    )
}

USER_SETTINGS: dict[str, SettingDef] = {
    s.name: s
    for s in (
        SettingDef("voice", "user", "voice", None, "your voice (none: your own newest voice)"),
        SettingDef("speed", "user", "float", None, "speaking rate, 0.25-4 (none: the server's)", minimum=0.25,
                   maximum=4.0, nullable=True),
        SettingDef("nickname", "user", "text", None, "the name the bot says for you"),
        SettingDef("language", "user", "choice", None, "language you write in (none: the server's)",
                   choices=_LANG_CHOICES, nullable=True),
    )
}


def setting_def(scope: str, name: str) -> SettingDef:
    """The definition of one setting; SettingError lists the valid names."""
    table = GUILD_SETTINGS if scope == "guild" else USER_SETTINGS
    try:
        return table[name]
    except KeyError:
        raise SettingError(f"there is no {scope} setting {name!r}: use one of {', '.join(table)}") from None


# --- records ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JournalEntry:
    """A message that was waiting (or playing) when the bot stopped."""

    guild_id: int
    author_id: int
    summary: str
    enqueued_at: float  # unix seconds


# --- the store ----------------------------------------------------------------------------------------------------


class Store:
    """The SQLite database; every method is a coroutine that runs its query on the store's own thread.

    Parameters
    ----------
    path:
        The database file (created with its folder if missing), or ``":memory:"``.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = path if str(path) == ":memory:" else Path(path)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="voicebot-sqlite")
        self._write_lock = asyncio.Lock()
        self._conn: sqlite3.Connection | None = None
        self._opened = False

    # lifecycle

    async def open(self) -> Store:
        """Open the file, switch to WAL, apply migrations. Idempotent; the other methods call it."""
        if not self._opened:
            self._conn = await self._call(self._open_sync)
            self._opened = True
        return self

    def _open_sync(self) -> sqlite3.Connection:
        """Connect on the store thread and migrate."""
        try:
            if isinstance(self.path, Path):
                self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA secure_delete=ON")  # deleted rows are overwritten, not just unlinked
            migrate(conn)
        except sqlite3.Error as e:
            raise StoreError(
                f"cannot open the database {self.path}: {e} (check discord.database in config.yaml)"
            ) from e
        return conn

    async def close(self) -> None:
        """Close the connection and the store thread."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await self._call(conn.close)
        self._opened = False
        self._executor.shutdown(wait=True)

    async def __aenter__(self) -> Store:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def schema_version(self) -> int:
        """The schema version of the open database."""
        rows = await self._read("SELECT version FROM schema_version")
        return int(rows[0][0])

    # plumbing

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the store thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """One SELECT, all rows."""
        await self.open()
        assert self._conn is not None
        conn = self._conn
        return await self._call(lambda: conn.execute(sql, params).fetchall())

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` as one transaction on the store thread, behind the write lock."""
        await self.open()
        assert self._conn is not None
        conn = self._conn

        def run() -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

        async with self._write_lock:
            try:
                return await self._call(run)
            except sqlite3.Error as e:
                raise StoreError(f"database write failed: {e}") from e

    # guild settings

    async def guild_settings(self, guild_id: int) -> dict[str, Any]:
        """Every guild setting, stored values over defaults."""
        values = {name: _copy_default(d.default) for name, d in GUILD_SETTINGS.items()}
        for key, raw in await self._read("SELECT key, value FROM guild_settings WHERE guild_id = ?", (guild_id,)):
            if key in GUILD_SETTINGS:
                values[key] = GUILD_SETTINGS[key].from_json(raw)
        return values

    async def get_guild_setting(self, guild_id: int, name: str) -> Any:
        """One guild setting's value (its default when unset)."""
        d = setting_def("guild", name)
        rows = await self._read("SELECT value FROM guild_settings WHERE guild_id = ? AND key = ?", (guild_id, name))
        return d.from_json(rows[0][0]) if rows else _copy_default(d.default)

    async def set_guild_setting(self, guild_id: int, name: str, value: Any) -> Any:
        """Check and store a typed value; returns it normalised. Storing the default removes the row."""
        d = setting_def("guild", name)
        value = d.check(value)
        await self._write(lambda c: _put_setting(c, "guild_settings", "guild_id = ?", (guild_id,), d, value))
        return value

    async def set_bot_voice(self, guild_id: int, bot_id: int, voice_id: str | None) -> dict[int, str]:
        """Set (or with None remove) one entry of the guild's ``bot_voices`` map; returns the new map."""
        d = GUILD_SETTINGS["bot_voices"]
        if voice_id is not None:
            GUILD_SETTINGS["default_voice"].check(voice_id)

        def run(c: sqlite3.Connection) -> dict[int, str]:
            row = c.execute(
                "SELECT value FROM guild_settings WHERE guild_id = ? AND key = 'bot_voices'", (guild_id,)
            ).fetchone()
            current = dict(d.from_json(row[0])) if row else {}
            if voice_id is None:
                current.pop(bot_id, None)
            else:
                current[bot_id] = voice_id
            _put_setting(c, "guild_settings", "guild_id = ?", (guild_id,), d, current)
            return current

        return await self._write(run)

    # user settings

    async def user_settings(self, user_id: int, guild_id: int | None = None) -> dict[str, Any]:
        """Every user setting: the guild's override (when ``guild_id`` is given) over the global value over defaults.

        ``nickname`` also honours the per-guild nickname table.
        """
        values = {name: _copy_default(d.default) for name, d in USER_SETTINGS.items()}
        rows = await self._read(
            "SELECT guild_id, key, value FROM user_settings WHERE user_id = ? AND guild_id IN (0, ?) ORDER BY guild_id",
            (user_id, guild_id or 0),
        )
        for _gid, key, raw in rows:  # global rows first, the guild's override last
            if key in USER_SETTINGS:
                values[key] = USER_SETTINGS[key].from_json(raw)
        if guild_id:
            nick = await self._read(
                "SELECT nickname FROM nicknames WHERE guild_id = ? AND user_id = ?", (guild_id, user_id)
            )
            if nick:
                values["nickname"] = nick[0][0]
        return values

    async def set_user_setting(self, user_id: int, name: str, value: Any, *, guild_id: int | None = None) -> Any:
        """Check and store a typed value, globally or (``guild_id``) as that guild's override; returns it.

        A ``nickname`` with a ``guild_id`` goes to the per-guild nickname table.
        """
        d = setting_def("user", name)
        value = d.check(value)
        if name == "nickname" and guild_id:
            await self.set_nickname(guild_id, user_id, value)
            return value
        gid = guild_id or 0
        await self._write(
            lambda c: _put_setting(c, "user_settings", "user_id = ? AND guild_id = ?", (user_id, gid), d, value)
        )
        return value

    # nicknames

    async def set_nickname(self, guild_id: int, user_id: int, nickname: str | None) -> None:
        """The name spoken for a user in one guild (None removes it)."""
        if nickname is not None:
            nickname = USER_SETTINGS["nickname"].check(nickname)

        def run(c: sqlite3.Connection) -> None:
            if nickname is None:
                c.execute("DELETE FROM nicknames WHERE guild_id = ? AND user_id = ?", (guild_id, user_id))
            else:
                c.execute(
                    "INSERT INTO nicknames (guild_id, user_id, nickname) VALUES (?, ?, ?) "
                    "ON CONFLICT (guild_id, user_id) DO UPDATE SET nickname = excluded.nickname",
                    (guild_id, user_id, nickname),
                )

        await self._write(run)

    async def spoken_names(self, guild_id: int, user_ids: Iterable[int]) -> dict[int, str]:
        """The names to say for these users in a guild: per-guild nickname, else global nickname (absent: neither)."""
        ids = sorted(set(user_ids))
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        names: dict[int, str] = {}
        for uid, raw in await self._read(
            f"SELECT user_id, value FROM user_settings WHERE key = 'nickname' AND guild_id IN (0, ?) "
            f"AND user_id IN ({marks}) ORDER BY guild_id",
            (guild_id, *ids),
        ):
            value = USER_SETTINGS["nickname"].from_json(raw)
            if value:
                names[int(uid)] = value
        for uid, nick in await self._read(
            f"SELECT user_id, nickname FROM nicknames WHERE guild_id = ? AND user_id IN ({marks})", (guild_id, *ids)
        ):
            names[int(uid)] = nick
        return names

    # voices shared with guilds, guild voices

    async def share_voice(self, voice_id: str, guild_id: int, shared_by: int) -> bool:
        """Let a guild use a voice; False when it was already shared there."""
        return await self._write(
            lambda c: c.execute(
                "INSERT OR IGNORE INTO voice_shares (voice_id, guild_id, shared_by) VALUES (?, ?, ?)",
                (voice_id, guild_id, shared_by),
            ).rowcount
            == 1
        )

    async def unshare_voice(self, voice_id: str, guild_id: int) -> bool:
        """Stop sharing a voice with a guild; False when it was not shared there."""
        return await self._write(
            lambda c: c.execute(
                "DELETE FROM voice_shares WHERE voice_id = ? AND guild_id = ?", (voice_id, guild_id)
            ).rowcount
            == 1
        )

    async def shared_voices(self, guild_id: int) -> list[str]:
        """Ids of the voices members shared with a guild, oldest share first."""
        rows = await self._read("SELECT voice_id FROM voice_shares WHERE guild_id = ? ORDER BY rowid", (guild_id,))
        return [r[0] for r in rows]

    async def voice_guilds(self, voice_id: str) -> list[int]:
        """The guilds a voice is shared with."""
        rows = await self._read("SELECT guild_id FROM voice_shares WHERE voice_id = ? ORDER BY rowid", (voice_id,))
        return [int(r[0]) for r in rows]

    async def add_guild_voice(self, guild_id: int, voice_id: str, added_by: int) -> bool:
        """Make a voice one of the guild's own (server) voices; False when it already was."""
        return await self._write(
            lambda c: c.execute(
                "INSERT OR IGNORE INTO guild_voices (guild_id, voice_id, added_by) VALUES (?, ?, ?)",
                (guild_id, voice_id, added_by),
            ).rowcount
            == 1
        )

    async def remove_guild_voice(self, guild_id: int, voice_id: str) -> bool:
        """Remove a server voice from a guild's list; False when it was not there."""
        return await self._write(
            lambda c: c.execute(
                "DELETE FROM guild_voices WHERE guild_id = ? AND voice_id = ?", (guild_id, voice_id)
            ).rowcount
            == 1
        )

    async def guild_voices(self, guild_id: int) -> list[str]:
        """Ids of a guild's server voices, oldest first."""
        rows = await self._read("SELECT voice_id FROM guild_voices WHERE guild_id = ? ORDER BY rowid", (guild_id,))
        return [r[0] for r in rows]

    # the voice journal (bot.voice_service: a voice's creation and deletion, undone or finished after a crash)

    async def begin_voice_create(self, voice_id: str) -> None:
        """Note that a voice is being created under this id (undone at start-up unless committed)."""
        await self._write(lambda c: c.execute(
            "INSERT INTO voice_journal (voice_id, op, at) VALUES (?, 'create', ?)", (voice_id, time.time())))

    async def commit_voice(self, voice_id: str, owner_id: int, *, guild_id: int | None = None,
                           server: bool = False) -> bool:
        """In one transaction: the new voice's rows (a server voice of ``guild_id``; else the owner's voice when they
        have none yet), and its journal entry gone. Returns whether it became the owner's voice."""

        def run(c: sqlite3.Connection) -> bool:
            chosen = False
            if server and guild_id is not None:
                c.execute("INSERT OR IGNORE INTO guild_voices (guild_id, voice_id, added_by) VALUES (?, ?, ?)",
                          (guild_id, voice_id, owner_id))
            elif not server and owner_id:
                has = c.execute("SELECT 1 FROM user_settings WHERE user_id = ? AND key = 'voice' AND guild_id IN (0, ?)",
                                (owner_id, guild_id or 0)).fetchone()
                if has is None:
                    _put_setting(c, "user_settings", "user_id = ? AND guild_id = ?", (owner_id, 0),
                                 USER_SETTINGS["voice"], voice_id)
                    chosen = True
            c.execute("DELETE FROM voice_journal WHERE voice_id = ?", (voice_id,))
            return chosen

        return await self._write(run)

    async def begin_voice_delete(self, voice_ids: Sequence[str], *, user_id: int | None = None) -> dict[str, int]:
        """In one transaction: journal the voices' deletion and remove every row naming them (and, with
        ``user_id``, every row of that user: forget-me). Counts per table; the files go next, then
        :meth:`end_voice` (a crash in between is finished at start-up)."""
        ids = list(voice_ids)

        def run(c: sqlite3.Connection) -> dict[str, int]:
            now = time.time()
            c.executemany("INSERT OR REPLACE INTO voice_journal (voice_id, op, at) VALUES (?, 'delete', ?)",
                          [(vid, now) for vid in ids])
            counts = _forget_voices(c, ids)
            if user_id is not None:
                _forget_user_rows(c, user_id, counts)
            return counts

        counts = await self._write(run)
        await self._checkpoint()
        return counts

    async def end_voice(self, voice_ids: Sequence[str]) -> None:
        """The voices' creation or deletion is complete: drop their journal entries. After a deletion the WAL is
        checkpointed again: until then the journal line, and so the deleted voice's id, stays readable in it."""
        ids = list(voice_ids)

        def run(c: sqlite3.Connection) -> bool:
            marks = ", ".join("?" * len(ids))
            deleted = c.execute(f"SELECT 1 FROM voice_journal WHERE op = 'delete' AND voice_id IN ({marks})",
                                ids).fetchone() is not None if ids else False
            c.executemany("DELETE FROM voice_journal WHERE voice_id = ?", [(vid,) for vid in ids])
            return deleted

        if await self._write(run):
            await self._checkpoint()

    async def voice_journal(self) -> list[tuple[str, str]]:
        """``(voice id, 'create' | 'delete')`` of every voice whose creation or deletion did not complete."""
        rows = await self._read("SELECT voice_id, op FROM voice_journal ORDER BY rowid")
        return [(r[0], r[1]) for r in rows]

    # guild phrases

    async def add_phrase(self, guild_id: int, text: str) -> bool:
        """Add a common phrase for a guild (precomputed per voice); False when already listed."""
        text = " ".join(text.split())
        if not text or len(text) > MAX_PHRASE_CHARS:
            raise StoreError(f"a phrase must be 1-{MAX_PHRASE_CHARS} characters (this one has {len(text)})")

        def run(c: sqlite3.Connection) -> bool:
            (count,) = c.execute("SELECT COUNT(*) FROM guild_phrases WHERE guild_id = ?", (guild_id,)).fetchone()
            exists = c.execute(
                "SELECT 1 FROM guild_phrases WHERE guild_id = ? AND text = ?", (guild_id, text)
            ).fetchone()
            if exists:
                return False
            if count >= MAX_GUILD_PHRASES:
                raise StoreError(f"this server has {count} phrases, the most allowed: remove one with /phrases remove")
            c.execute("INSERT INTO guild_phrases (guild_id, text) VALUES (?, ?)", (guild_id, text))
            return True

        return await self._write(run)

    async def remove_phrase(self, guild_id: int, text: str) -> bool:
        """Remove a guild phrase; False when it was not listed."""
        text = " ".join(text.split())
        return await self._write(
            lambda c: c.execute(
                "DELETE FROM guild_phrases WHERE guild_id = ? AND text = ?", (guild_id, text)
            ).rowcount
            == 1
        )

    async def phrases(self, guild_id: int) -> list[str]:
        """A guild's phrases in the order they were added."""
        rows = await self._read("SELECT text FROM guild_phrases WHERE guild_id = ? ORDER BY rowid", (guild_id,))
        return [r[0] for r in rows]

    # pronunciation dictionaries

    async def pronunciations(self, scope: str, owner_id: int) -> list[str]:
        """A guild's (``scope`` "guild") or a user's ("user") dictionary entries as JSON, oldest first."""
        _check_scope(scope)
        rows = await self._read("SELECT entry FROM pronunciations WHERE scope = ? AND owner_id = ? ORDER BY rowid",
                                (scope, owner_id))
        return [r[0] for r in rows]

    async def put_pronunciations(self, scope: str, owner_id: int, entries: Sequence[tuple[str, str]], *,
                                 limit: int, replace: bool = False) -> int:
        """Add or update entries ``(key, entry JSON)`` in one transaction (``replace``: the dictionary becomes
        exactly these); returns how many entries the dictionary holds after.

        Raises StoreError, with nothing written, when the dictionary would hold more than ``limit`` entries.
        """
        _check_scope(scope)

        def run(c: sqlite3.Connection) -> int:
            if replace:
                c.execute("DELETE FROM pronunciations WHERE scope = ? AND owner_id = ?", (scope, owner_id))
            for key, entry in entries:  # an updated entry moves to the end: lists show the latest last
                c.execute("DELETE FROM pronunciations WHERE scope = ? AND owner_id = ? AND key = ?",
                          (scope, owner_id, key))
                c.execute("INSERT INTO pronunciations (scope, owner_id, key, entry) VALUES (?, ?, ?, ?)",
                          (scope, owner_id, key, entry))
            (count,) = c.execute("SELECT COUNT(*) FROM pronunciations WHERE scope = ? AND owner_id = ?",
                                 (scope, owner_id)).fetchone()
            if count > limit:  # raising rolls the whole transaction back
                raise StoreError(f"the dictionary would hold {count:,} entries; the limit is {limit:,}: remove some "
                                 "first (or import with replace)")
            return int(count)

        return await self._write(run)

    async def remove_pronunciation(self, scope: str, owner_id: int, key: str) -> bool:
        """Remove one entry by its match key; False when there was none."""
        _check_scope(scope)
        return await self._write(lambda c: c.execute(
            "DELETE FROM pronunciations WHERE scope = ? AND owner_id = ? AND key = ?", (scope, owner_id, key)
        ).rowcount == 1)

    # the block list

    async def block(self, guild_id: int, kind: str, target_id: int) -> bool:
        """Block a member (``kind`` "user") or a role ("role") in a guild; False when already blocked."""
        _check_block_kind(kind)
        return await self._write(lambda c: c.execute(
            "INSERT OR IGNORE INTO guild_blocks (guild_id, kind, target_id) VALUES (?, ?, ?)",
            (guild_id, kind, target_id)).rowcount == 1)

    async def unblock(self, guild_id: int, kind: str, target_id: int) -> bool:
        """Lift a block; False when there was none."""
        _check_block_kind(kind)
        return await self._write(lambda c: c.execute(
            "DELETE FROM guild_blocks WHERE guild_id = ? AND kind = ? AND target_id = ?",
            (guild_id, kind, target_id)).rowcount == 1)

    async def blocks(self, guild_id: int) -> list[tuple[str, int]]:
        """A guild's block list, ``(kind, id)`` in the order added."""
        rows = await self._read("SELECT kind, target_id FROM guild_blocks WHERE guild_id = ? ORDER BY rowid",
                                (guild_id,))
        return [(r[0], int(r[1])) for r in rows]

    # usage statistics (counts only)

    async def add_usage(self, guild_id: int, *, messages: int = 0, characters: int = 0, sentences: int = 0,
                        cache_hits: int = 0) -> None:
        """Add to a guild's usage counters (created at zero, dated now, on first use)."""
        def run(c: sqlite3.Connection) -> None:
            c.execute("INSERT OR IGNORE INTO guild_usage (guild_id, since) VALUES (?, ?)", (guild_id, time.time()))
            c.execute("UPDATE guild_usage SET messages = messages + ?, characters = characters + ?, "
                      "sentences = sentences + ?, cache_hits = cache_hits + ? WHERE guild_id = ?",
                      (messages, characters, sentences, cache_hits, guild_id))

        await self._write(run)

    async def usage(self, guild_id: int) -> dict[str, float] | None:
        """A guild's counters (``messages``, ``characters``, ``sentences``, ``cache_hits``, ``since`` unix
        seconds), or None before anything was spoken."""
        rows = await self._read("SELECT messages, characters, sentences, cache_hits, since FROM guild_usage "
                                "WHERE guild_id = ?", (guild_id,))
        if not rows:
            return None
        return dict(zip(("messages", "characters", "sentences", "cache_hits", "since"), rows[0]))

    # restart journal

    async def write_journal(self, entries: Sequence[JournalEntry]) -> int:
        """Record messages that will not be spoken because the bot is stopping; returns how many."""
        rows = [(e.guild_id, e.author_id, e.summary[:MAX_SUMMARY_CHARS], e.enqueued_at) for e in entries]
        if not rows:
            return 0
        await self._write(
            lambda c: c.executemany(
                "INSERT INTO queue_journal (guild_id, author_id, summary, enqueued_at) VALUES (?, ?, ?, ?)", rows
            )
        )
        return len(rows)

    async def pop_journal(self, guild_id: int) -> list[JournalEntry]:
        """Read and delete a guild's journal (what a previous run dropped), oldest first."""

        def run(c: sqlite3.Connection) -> list[JournalEntry]:
            rows = c.execute(
                "SELECT guild_id, author_id, summary, enqueued_at FROM queue_journal WHERE guild_id = ? ORDER BY id",
                (guild_id,),
            ).fetchall()
            c.execute("DELETE FROM queue_journal WHERE guild_id = ?", (guild_id,))
            return [JournalEntry(int(r[0]), int(r[1]), r[2], float(r[3])) for r in rows]

        return await self._write(run)

    # deletion

    async def forget_voice(self, voice_id: str) -> dict[str, int]:
        """Remove every row that names a voice (shares, server lists, consent, selections); counts per table.

        The deleted rows are overwritten (``secure_delete``) and the WAL is checkpointed and truncated, so no
        copy of them stays readable in the database files.
        """
        counts = await self._write(lambda c: _forget_voices(c, [voice_id]))
        await self._checkpoint()
        return counts

    async def forget_user(self, user_id: int, voice_ids: Iterable[str] = ()) -> dict[str, int]:
        """Remove every row of a user everywhere, and every row naming the user's voices ``voice_ids``.

        Returns the number of rows removed per table. The voices' files are the synthesis layer's to delete.
        """
        ids = list(voice_ids)

        def run(c: sqlite3.Connection) -> dict[str, int]:
            return _forget_user_rows(c, user_id, _forget_voices(c, ids))

        counts = await self._write(run)
        await self._checkpoint()
        log.info("forgot user %d: %s", user_id, counts)
        return counts

    async def _checkpoint(self) -> None:
        """Copy the WAL into the database and empty it: deleted rows leave no copy behind in the WAL file."""
        await self.open()
        assert self._conn is not None
        conn = self._conn
        async with self._write_lock:
            try:
                busy, _, _ = await self._call(lambda: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone())
            except sqlite3.Error as e:
                raise StoreError(f"database checkpoint failed: {e}") from e
        if busy:  # another connection is reading: the copies go at the next checkpoint
            log.warning("database checkpoint after a delete was blocked by a reader; it completes later")


def _check_block_kind(kind: str) -> None:
    if kind not in ("user", "role"):
        raise ValueError(f"a block is of a user or a role, got {kind!r}")


def _check_scope(scope: str) -> None:
    if scope not in ("guild", "user"):
        raise ValueError(f"scope must be guild or user, got {scope!r}")


def _copy_default(value: Any) -> Any:
    """A fresh copy of a mutable default."""
    return dict(value) if isinstance(value, dict) else value


def _put_setting(
    c: sqlite3.Connection, table: str, where: str, key_params: tuple[Any, ...], d: SettingDef, value: Any
) -> None:
    """Upsert one setting row, or delete it when the value is the default."""
    c.execute(f"DELETE FROM {table} WHERE {where} AND key = ?", (*key_params, d.name))
    if value != d.default:
        cols = "guild_id" if table == "guild_settings" else "user_id, guild_id"
        marks = ", ".join("?" * len(key_params))
        c.execute(
            f"INSERT INTO {table} ({cols}, key, value) VALUES ({marks}, ?, ?)", (*key_params, d.name, d.to_json(value))
        )


def _forget_user_rows(c: sqlite3.Connection, user_id: int, counts: dict[str, int]) -> dict[str, int]:
    """Delete every row of a user (settings, nicknames, what they shared or added, their journal lines); adds the
    counts per table to ``counts`` and returns it."""
    for table, column in (
        ("user_settings", "user_id"),
        ("nicknames", "user_id"),
        ("voice_shares", "shared_by"),
        ("guild_voices", "added_by"),
        ("queue_journal", "author_id"),
    ):
        n = c.execute(f"DELETE FROM {table} WHERE {column} = ?", (user_id,)).rowcount
        counts[table] = counts.get(table, 0) + n
    n = c.execute("DELETE FROM pronunciations WHERE scope = 'user' AND owner_id = ?", (user_id,)).rowcount
    counts["pronunciations"] = counts.get("pronunciations", 0) + n
    # the user as a bot with an assigned voice, or ids of theirs inside a guild's map
    counts["guild_settings"] = counts.get("guild_settings", 0) + _drop_from_bot_voices(c, user_id=user_id)
    return counts


def _forget_voices(c: sqlite3.Connection, voice_ids: Sequence[str]) -> dict[str, int]:
    """Delete the rows naming these voices; counts per table."""
    counts = {"voice_shares": 0, "guild_voices": 0, "guild_settings": 0, "user_settings": 0}
    for vid in voice_ids:
        for table in ("voice_shares", "guild_voices"):
            counts[table] += c.execute(f"DELETE FROM {table} WHERE voice_id = ?", (vid,)).rowcount
        as_json = json.dumps(vid)
        counts["guild_settings"] += c.execute(
            "DELETE FROM guild_settings WHERE key = 'default_voice' AND value = ?", (as_json,)
        ).rowcount
        counts["user_settings"] += c.execute(
            "DELETE FROM user_settings WHERE key = 'voice' AND value = ?", (as_json,)
        ).rowcount
    if voice_ids:
        counts["guild_settings"] += _drop_from_bot_voices(c, voice_ids=set(voice_ids))
    return counts


def _drop_from_bot_voices(
    c: sqlite3.Connection, *, user_id: int | None = None, voice_ids: frozenset[str] | set[str] = frozenset()
) -> int:
    """Remove ``bot_voices`` entries keyed by ``user_id`` or pointing at ``voice_ids``; rows changed."""
    d = GUILD_SETTINGS["bot_voices"]
    changed = 0
    for guild_id, raw in c.execute("SELECT guild_id, value FROM guild_settings WHERE key = 'bot_voices'").fetchall():
        current: dict[int, str] = d.from_json(raw)
        kept = {k: v for k, v in current.items() if k != user_id and v not in voice_ids}
        if kept != current:
            _put_setting(c, "guild_settings", "guild_id = ?", (guild_id,), d, kept)
            changed += 1
    return changed
