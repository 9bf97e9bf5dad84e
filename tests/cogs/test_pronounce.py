"""/pronounce add|remove|list|check|export|import: permissions, what the reply says will be read, the preview in
voice, atomic imports from an attachment."""

from __future__ import annotations

import json

from bot.pronunciations import Pronunciations
from tests.cogs.conftest import ADMIN, ALICE, BOB, GUILD_ID, VOICE_ID
from tests.cogs.test_voices import last_reply


def entries_file(entries: list[dict]) -> bytes:
    return json.dumps({"format": "voicebot-pronunciations/1", "entries": entries}).encode()


async def test_admin_adds_for_the_server_and_hears_how_it_reads(harness):
    h = harness
    token = await h.slash("pronounce add", ADMIN, word="Nguyen", phones="W IH1 N")
    text, ephemeral = last_reply(h, token)
    assert ephemeral and text.startswith("Added in this server's dictionary: Nguyen → W IH1 N (en).")
    assert text.endswith("It will be read as: `, . W IH1 N .`")  # the short-text retry's mark, the entry, the end
    assert "Playing" not in text and not [c for c in h.services.speech.calls if c[0] == "say"]
    lexicon = await Pronunciations(h.services.store).lexicon("guild", GUILD_ID)
    assert lexicon.get("nguyen").phones == ("W", "IH1", "N")
    token = await h.slash("pronounce add", ADMIN, word="nguyen", say="win")
    assert last_reply(h, token)[0].startswith("Updated in this server's dictionary: nguyen → “win”.")


async def test_members_need_manage_server_for_the_server_but_not_for_their_own(harness):
    h = harness
    token = await h.slash("pronounce add", ALICE, word="GIF", say="jif")
    assert "needs Manage Server; add mine:True" in last_reply(h, token)[0]
    assert len(await Pronunciations(h.services.store).lexicon("guild", GUILD_ID)) == 0
    token = await h.slash("pronounce add", ALICE, word="GIF", say="jif", mine=True)
    assert last_reply(h, token)[0].startswith("Added in your dictionary: GIF → “jif”. It will be read as: `")
    token = await h.slash("pronounce list", ALICE, mine=True)
    assert last_reply(h, token)[0] == "**1 fix(es)**\n1. GIF → “jif”"
    token = await h.slash("pronounce list", BOB)
    assert "This server has no pronunciation fixes yet" in last_reply(h, token)[0]
    assert [c["value"] for c in await h.autocomplete("pronounce remove", "word", ALICE, word="g", mine=True)] == [
        "GIF"]
    token = await h.slash("pronounce remove", ALICE, word="gif", mine=True)
    assert last_reply(h, token)[0] == "Removed “gif” from your dictionary."
    token = await h.slash("pronounce remove", ALICE, word="gif", mine=True)
    assert "is not in your dictionary" in last_reply(h, token)[0]


async def test_bad_phones_are_one_line_and_nothing_is_stored(harness):
    h = harness
    token = await h.slash("pronounce add", ADMIN, word="长城", phones="chang7 cheng2", lang="zh")
    text = last_reply(h, token)[0]
    assert "'长城': unknown zh phone 'chang7'; Chinese phones are pinyin syllables" in text and "\n" not in text
    assert len(await Pronunciations(h.services.store).lexicon("guild", GUILD_ID)) == 0


async def test_add_plays_a_preview_when_the_bot_is_in_the_members_channel(harness):
    h = harness
    speaker = h.services.speech.speaker(GUILD_ID)
    speaker.channel, speaker.is_connected = h.guild.get_channel(VOICE_ID), True
    token = await h.slash("pronounce add", ALICE, word="Nguyen", say="win", mine=True)
    assert last_reply(h, token)[0].endswith("Playing it in the voice channel.")
    assert ("say", ALICE, "Nguyen", "slash", (), None) in h.services.speech.calls


async def test_import_is_checked_whole_and_export_round_trips(harness):
    h = harness
    d = Pronunciations(h.services.store)
    await d.add("guild", GUILD_ID, "GIF", say="jif")
    bad = [{"word": f"w{i}", "say": "x"} for i in range(500)] + [{"word": "Nguyen", "phones": "W IH9 N"}]
    token = await h.slash("pronounce import", ADMIN, file=h.attachment("p.json", entries_file(bad), "application/json"))
    assert "Entry 501: 'Nguyen'" in last_reply(h, token)[0] and "nothing was imported" in last_reply(h, token)[0]
    assert [e.word for e in (await d.lexicon("guild", GUILD_ID)).entries] == ["GIF"]
    token = await h.slash("pronounce import", ADMIN, file=h.attachment("big.json", None, "application/json",
                                                                        size=5_000_000))
    assert "is 5,000,000 bytes; a dictionary file is at most 1,048,576" in last_reply(h, token)[0]
    good = entries_file([{"word": "Nguyen", "say": "win"}])
    token = await h.slash("pronounce import", ADMIN, file=h.attachment("p.json", good, "application/json"))
    assert last_reply(h, token)[0] == "Imported 1 entry into this server's dictionary; it now holds 2."
    token = await h.slash("pronounce export", BOB)
    (name, data), = [c for c in h.adapter.for_token(token) if c.files][-1].files
    assert name == "server-pronunciations.json"
    assert json.loads(data)["entries"] == [{"word": "GIF", "say": "jif"}, {"word": "Nguyen", "say": "win"}]


async def test_check_shows_what_will_be_said(harness):
    h = harness
    await Pronunciations(h.services.store).add("user", ALICE, "Nguyen", phones="W IH1 N")
    token = await h.slash("pronounce check", ALICE, text="Hi Nguyen!")
    text = last_reply(h, token)[0]
    assert "dictionary: Nguyen → W IH1 N (en)" in text and "'Nguyen!' (dictionary): W IH1 N !" in text
    token = await h.slash("pronounce check", BOB, text="Hi Nguyen!")  # Bob's messages: no entry applies
    assert "dictionary" not in last_reply(h, token)[0]
