"""bot.store: migrations, typed settings, round trips, forget_user."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from bot.store import (
    GUILD_SETTINGS,
    MAX_GUILD_PHRASES,
    SCHEMA_VERSION,
    USER_SETTINGS,
    JournalEntry,
    SettingError,
    Store,
    StoreError,
    migrate,
    setting_def,
)

G1, G2 = 100000000000000001, 100000000000000002
ALICE, BOB, HELPER_BOT = 200000000000000001, 200000000000000002, 300000000000000001
ROLE = 400000000000000001


@pytest.fixture
async def store(tmp_path: Path):
    s = Store(tmp_path / "db" / "voicebot.sqlite3")
    await s.open()
    yield s
    await s.close()


async def test_new_database_is_wal_and_current(store: Store, tmp_path: Path) -> None:
    assert await store.schema_version() == SCHEMA_VERSION == 5
    conn = sqlite3.connect(tmp_path / "db" / "voicebot.sqlite3")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"schema_version", "guild_settings", "user_settings", "nicknames", "voice_shares", "guild_voices",
            "guild_phrases", "queue_journal", "voice_journal"} <= tables
    assert "consent" not in tables  # consent is kept once, in the voice's row of the voice store (voices.sqlite3)
    conn.close()


async def test_v1_database_migrates_and_keeps_its_data(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrate(conn, upto=1) == 1
    conn.execute("INSERT INTO user_settings (user_id, key, value) VALUES (?, 'speed', '1.5')", (ALICE,))
    conn.execute("INSERT INTO voice_shares (voice_id, guild_id) VALUES ('v1', ?)", (G1,))
    conn.execute("INSERT INTO guild_settings (guild_id, key, value) VALUES (?, 'repeat_cap', '5')", (G1,))
    conn.execute("INSERT INTO consent (voice_id, user_id, text, at) VALUES ('v1', ?, 'mine', 1.0)", (ALICE,))
    conn.close()

    async with Store(path) as s:
        assert await s.schema_version() == 5
        assert await s._read("SELECT name FROM sqlite_master WHERE name = 'consent'") == []  # v3: kept once, elsewhere
        assert await s.voice_journal() == []
        assert (await s.user_settings(ALICE))["speed"] == 1.5  # moved into the global (guild 0) rows
        assert (await s.user_settings(ALICE, G1))["speed"] == 1.5
        assert await s.shared_voices(G1) == ["v1"]
        assert await s.get_guild_setting(G1, "repeat_cap") == 5
        await s.write_journal([JournalEntry(G1, ALICE, "hello", 1.0)])  # the v2 table exists
        assert [e.summary for e in await s.pop_journal(G1)] == ["hello"]


async def test_failed_migration_rolls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import bot.store as store_mod

    path = tmp_path / "bad.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, upto=1)
    broken = (store_mod.MIGRATIONS[0], "CREATE TABLE half_done (x INTEGER); SELECT * FROM no_such_table;")
    monkeypatch.setattr(store_mod, "MIGRATIONS", broken)
    with pytest.raises(StoreError, match="migration to version 2 failed"):
        migrate(conn)
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == 1
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'half_done'").fetchone() is None
    conn.close()


async def test_newer_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn)
    conn.execute("UPDATE schema_version SET version = 99")
    conn.close()
    with pytest.raises(StoreError, match="newer than this program"):
        await Store(path).open()


async def test_guild_settings_defaults_and_round_trip(store: Store) -> None:
    settings = await store.guild_settings(G1)
    assert set(settings) == set(GUILD_SETTINGS)
    assert settings["max_seconds"] == 30.0 and settings["repeat_cap"] == 3 and settings["emoji_mode"] == "name"
    assert settings["autoread_channel"] is None and settings["bot_voices"] == {}

    assert await store.set_guild_setting(G1, "max_seconds", 12) == 12.0
    await store.set_guild_setting(G1, "autoread_channel", 555555555555555555)
    await store.set_guild_setting(G1, "announce_author", True)
    await store.set_bot_voice(G1, HELPER_BOT, "voiceA")
    settings = await store.guild_settings(G1)
    assert settings["max_seconds"] == 12.0
    assert settings["autoread_channel"] == 555555555555555555
    assert settings["announce_author"] is True
    assert settings["bot_voices"] == {HELPER_BOT: "voiceA"}  # int keys survive JSON
    assert (await store.guild_settings(G2))["max_seconds"] == 30.0  # other guilds untouched

    await store.set_guild_setting(G1, "max_seconds", 30.0)  # back to the default: row removed
    rows = await store._read("SELECT key FROM guild_settings WHERE guild_id = ?", (G1,))
    assert "max_seconds" not in {r[0] for r in rows}
    assert await store.set_bot_voice(G1, HELPER_BOT, None) == {}


async def test_settings_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "persist.sqlite3"
    async with Store(path) as s:
        await s.set_guild_setting(G1, "emoji_mode", "skip")
        await s.set_user_setting(ALICE, "voice", "abc123")
    async with Store(path) as s:
        assert await s.get_guild_setting(G1, "emoji_mode") == "skip"
        assert (await s.user_settings(ALICE))["voice"] == "abc123"


@pytest.mark.parametrize(
    ("scope", "name", "raw", "expected"),
    [
        ("guild", "read_voice_chat", "yes", True),
        ("guild", "autojoin", "off", False),
        ("guild", "max_seconds", "45.5", 45.5),
        ("guild", "repeat_cap", "4", 4),
        ("guild", "autoread_channel", "<#555555555555555555>", 555555555555555555),
        ("guild", "required_role", "<@&400000000000000001>", ROLE),
        ("guild", "required_role", "none", None),
        ("guild", "default_language", "ZH", "zh"),
        ("guild", "default_voice", "0f3a9c", "0f3a9c"),
        ("user", "speed", "1.25", 1.25),
        ("user", "speed", "none", None),
        ("user", "language", "en", "en"),
        ("user", "nickname", "  Al  ", "Al"),
    ],
)
def test_parse_user_input(scope: str, name: str, raw: str, expected: object) -> None:
    assert setting_def(scope, name).parse(raw) == expected


@pytest.mark.parametrize(
    ("scope", "name", "raw", "message"),
    [
        ("guild", "autojoin", "maybe", "use true or false"),
        ("guild", "max_seconds", "0.5", "between 1 and 300"),
        ("guild", "max_seconds", "lots", "must be a number"),
        ("guild", "repeat_cap", "2.5", "must be a number"),
        ("guild", "emoji_mode", "loud", "one of name, skip"),
        ("guild", "autoread_channel", "#general", "mention it or paste its id"),
        ("guild", "default_language", "klingon", "must be one of auto"),
        ("user", "speed", "9", "between 0.25 and 4"),
        ("user", "nickname", "x" * 40, "1-32 characters"),
        ("guild", "bot_voices", "x", "entry by entry"),
    ],
)
def test_parse_errors_say_the_fix(scope: str, name: str, raw: str, message: str) -> None:
    with pytest.raises(SettingError, match=message):
        setting_def(scope, name).parse(raw)


async def test_unknown_setting_lists_names(store: Store) -> None:
    with pytest.raises(SettingError, match="use one of autoread_channel"):
        await store.set_guild_setting(G1, "volume", 3)
    with pytest.raises(SettingError, match="must be an integer"):
        await store.set_guild_setting(G1, "repeat_cap", 2.5)
    assert set(USER_SETTINGS) == {"voice", "speed", "nickname", "language"}


async def test_user_settings_global_and_guild_override(store: Store) -> None:
    await store.set_user_setting(ALICE, "speed", 1.5)
    await store.set_user_setting(ALICE, "speed", 0.8, guild_id=G1)
    await store.set_user_setting(ALICE, "language", "ja")
    assert (await store.user_settings(ALICE))["speed"] == 1.5
    assert (await store.user_settings(ALICE, G1))["speed"] == 0.8
    assert (await store.user_settings(ALICE, G2))["speed"] == 1.5
    assert (await store.user_settings(ALICE, G1))["language"] == "ja"
    assert (await store.user_settings(BOB, G1))["speed"] is None


async def test_nicknames(store: Store) -> None:
    await store.set_user_setting(ALICE, "nickname", "Ally")  # global
    await store.set_user_setting(ALICE, "nickname", "Captain", guild_id=G1)  # per-guild table
    assert await store.spoken_names(G1, [ALICE, BOB]) == {ALICE: "Captain"}
    assert await store.spoken_names(G2, [ALICE]) == {ALICE: "Ally"}
    assert (await store.user_settings(ALICE, G1))["nickname"] == "Captain"
    await store.set_nickname(G1, ALICE, None)
    assert await store.spoken_names(G1, [ALICE]) == {ALICE: "Ally"}


async def test_shares_guild_voices_consent_phrases(store: Store) -> None:
    assert await store.share_voice("v1", G1, ALICE) is True
    assert await store.share_voice("v1", G1, ALICE) is False
    await store.share_voice("v1", G2, ALICE)
    assert await store.voice_guilds("v1") == [G1, G2]
    assert await store.unshare_voice("v1", G2) is True
    assert await store.unshare_voice("v1", G2) is False
    assert await store.shared_voices(G1) == ["v1"]

    assert await store.add_guild_voice(G1, "srv", BOB) is True
    assert await store.guild_voices(G1) == ["srv"]

    assert await store.add_phrase(G1, "  Good   game!  ") is True
    assert await store.add_phrase(G1, "Good game!") is False
    assert await store.phrases(G1) == ["Good game!"]
    assert await store.remove_phrase(G1, "Good game!") is True
    with pytest.raises(StoreError, match="1-200 characters"):
        await store.add_phrase(G1, "x" * 201)


async def test_phrase_limit(store: Store) -> None:
    for i in range(MAX_GUILD_PHRASES):
        await store.add_phrase(G1, f"phrase {i}")
    with pytest.raises(StoreError, match="remove one with /phrases remove"):
        await store.add_phrase(G1, "one too many")
    assert len(await store.phrases(G1)) == MAX_GUILD_PHRASES


async def test_journal_pops_once_per_guild(store: Store) -> None:
    await store.write_journal(
        [
            JournalEntry(G1, ALICE, "first", 10.0),
            JournalEntry(G2, BOB, "other", 11.0),
            JournalEntry(G1, BOB, "second", 12.0),
        ]
    )
    assert [(e.author_id, e.summary) for e in await store.pop_journal(G1)] == [(ALICE, "first"), (BOB, "second")]
    assert await store.pop_journal(G1) == []
    assert [e.summary for e in await store.pop_journal(G2)] == ["other"]


async def test_forget_user_removes_every_row(store: Store) -> None:
    # Alice's data everywhere, plus Bob's to prove it survives
    await store.set_user_setting(ALICE, "speed", 1.2)
    await store.set_user_setting(ALICE, "speed", 1.4, guild_id=G1)
    await store.set_user_setting(ALICE, "voice", "alice-v")
    await store.set_nickname(G1, ALICE, "Al")
    await store.set_nickname(G2, ALICE, "Ally")
    await store.share_voice("alice-v", G1, ALICE)
    await store.share_voice("alice-v", G2, ALICE)
    await store.add_guild_voice(G1, "alice-srv", ALICE)
    await store.set_guild_setting(G2, "default_voice", "alice-v")
    await store.set_bot_voice(G1, HELPER_BOT, "alice-v")
    await store.write_journal([JournalEntry(G1, ALICE, "hi", 1.0), JournalEntry(G1, BOB, "yo", 2.0)])
    await store.set_user_setting(BOB, "voice", "alice-v")  # Bob selected Alice's shared voice
    await store.set_user_setting(BOB, "speed", 0.9)
    await store.share_voice("bob-v", G1, BOB)

    counts = await store.forget_user(ALICE, voice_ids=["alice-v"])
    assert counts["user_settings"] == 4  # Alice's 3 rows + Bob's selection of her voice
    assert counts["nicknames"] == 2
    assert counts["voice_shares"] == 2
    assert counts["guild_voices"] == 1
    assert counts["queue_journal"] == 1
    assert counts["guild_settings"] == 2  # G2's default_voice, G1's bot_voices entry

    dump = await store._read(
        "SELECT 'us', user_id, value FROM user_settings UNION ALL SELECT 'n', user_id, nickname FROM nicknames "
        "UNION ALL SELECT 'vs', shared_by, voice_id FROM voice_shares UNION ALL SELECT 'gv', added_by, voice_id "
        "FROM guild_voices UNION ALL SELECT 'j', author_id, "
        "summary FROM queue_journal UNION ALL SELECT 'gs', guild_id, value FROM guild_settings"
    )
    text = json.dumps(dump)
    assert str(ALICE) not in text and "alice" not in text
    assert (await store.user_settings(BOB))["speed"] == 0.9
    assert await store.shared_voices(G1) == ["bob-v"]


async def test_forget_voice(store: Store) -> None:
    await store.share_voice("gone", G1, ALICE)
    await store.add_guild_voice(G2, "gone", BOB)
    await store.set_guild_setting(G1, "default_voice", "gone")
    await store.set_user_setting(BOB, "voice", "gone", guild_id=G1)
    counts = await store.forget_voice("gone")
    assert counts == {"voice_shares": 1, "guild_voices": 1, "guild_settings": 1, "user_settings": 1}
    assert await store.get_guild_setting(G1, "default_voice") is None


async def test_concurrent_writes_are_serialised(store: Store) -> None:
    await asyncio.gather(*(store.add_phrase(G1, f"p{i}") for i in range(40)))
    assert sorted(await store.phrases(G1)) == sorted(f"p{i}" for i in range(40))


async def test_failed_write_rolls_back(store: Store) -> None:
    def half_then_fail(c: sqlite3.Connection) -> None:
        c.execute("INSERT INTO guild_phrases (guild_id, text) VALUES (?, 'kept?')", (G1,))
        raise sqlite3.IntegrityError("boom")

    with pytest.raises(StoreError, match="boom"):
        await store._write(half_then_fail)
    assert await store.phrases(G1) == []


async def test_corrupt_stored_value_falls_back_to_default(store: Store) -> None:
    await store._write(
        lambda c: c.execute("INSERT INTO guild_settings VALUES (?, 'repeat_cap', '\"lots\"')", (G1,))
    )
    assert await store.get_guild_setting(G1, "repeat_cap") == 3


@pytest.mark.parametrize("how", ["voice", "user"])
async def test_deleted_rows_leave_no_bytes_in_the_database_or_its_wal(store: Store, tmp_path: Path, how: str) -> None:
    """Issue 16, 5: after a delete or /forget-me the rows are in neither the database nor the WAL."""
    words = "AGREE-7f3a-SPEAKS-MY-VOICE"
    voice_id = "ab" * 16
    await store.set_nickname(G1, ALICE, words)
    await store.share_voice(voice_id, G1, ALICE)
    await store.set_user_setting(BOB, "voice", voice_id, guild_id=G1)
    files = lambda: b"".join(p.read_bytes() for p in (tmp_path / "db").glob("voicebot.sqlite3*"))  # noqa: E731
    assert words.encode() in files() and voice_id.encode() in files()  # (the test can see the rows)
    if how == "voice":
        await store.forget_voice(voice_id)
        assert voice_id.encode() not in files()
    else:
        await store.forget_user(ALICE, [voice_id])
        assert words.encode() not in files() and voice_id.encode() not in files()
    assert (tmp_path / "db" / "voicebot.sqlite3-wal").stat().st_size == 0  # checkpointed and truncated


async def test_voice_journal_commits_a_creation_in_one_step(store: Store) -> None:
    vid = "cd" * 16
    await store.begin_voice_create(vid)
    assert await store.voice_journal() == [(vid, "create")]
    assert await store.commit_voice(vid, ALICE, guild_id=G1) is True  # Alice had no voice: it is hers now
    assert await store.voice_journal() == [] and (await store.user_settings(ALICE))["voice"] == vid
    other = "ef" * 16
    await store.begin_voice_create(other)
    assert await store.commit_voice(other, ALICE, guild_id=G1) is False  # she has one: it stays
    assert (await store.user_settings(ALICE))["voice"] == vid
    server = "12" * 16
    await store.begin_voice_create(server)
    assert await store.commit_voice(server, BOB, guild_id=G2, server=True) is False
    assert await store.guild_voices(G2) == [server] and (await store.user_settings(BOB))["voice"] is None


async def test_voice_journal_deletes_rows_first_and_remembers_until_the_end(store: Store) -> None:
    vid = "cd" * 16
    await store.share_voice(vid, G1, ALICE)
    await store.set_user_setting(BOB, "voice", vid)
    await store.set_nickname(G1, ALICE, "Al")
    counts = await store.begin_voice_delete([vid], user_id=ALICE)
    assert counts["voice_shares"] == 1 and counts["user_settings"] == 1 and counts["nicknames"] == 1
    assert await store.voice_journal() == [(vid, "delete")]  # until the files are gone too
    assert await store.shared_voices(G1) == [] and (await store.user_settings(BOB))["voice"] is None
    await store.end_voice([vid])
    assert await store.voice_journal() == []


async def test_v4_database_gains_the_block_list_and_usage_counters(tmp_path: Path) -> None:
    path = tmp_path / "v4.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrate(conn, upto=4) == 4
    conn.execute("INSERT INTO guild_settings (guild_id, key, value) VALUES (?, 'repeat_cap', '5')", (G1,))
    conn.close()
    async with Store(path) as s:
        assert await s.schema_version() == 5 and await s.get_guild_setting(G1, "repeat_cap") == 5
        assert await s.block(G1, "user", ALICE) and not await s.block(G1, "user", ALICE)
        assert await s.block(G1, "role", 42)
        assert await s.blocks(G1) == [("user", ALICE), ("role", 42)] and await s.blocks(999) == []
        assert await s.unblock(G1, "user", ALICE) and not await s.unblock(G1, "user", ALICE)
        assert await s.usage(G1) is None
        await s.add_usage(G1, messages=1, characters=11, sentences=2, cache_hits=1)
        await s.add_usage(G1, messages=1, characters=4, sentences=1)
        usage = await s.usage(G1)
        assert usage is not None and {k: usage[k] for k in ("messages", "characters", "sentences", "cache_hits")} == {
            "messages": 2, "characters": 15, "sentences": 3, "cache_hits": 1}
        texts = [r[0] for r in await s._read("SELECT sql FROM sqlite_master WHERE name = 'guild_usage'")]
        assert "TEXT" not in texts[0]  # counters only: no column could hold message text
