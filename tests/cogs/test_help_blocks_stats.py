"""/help (what this member can use here), /block add|remove|list (Manage Server), /stats (counts only)."""

from __future__ import annotations

from tests.cogs.conftest import ADMIN, ALICE, BOB, CLONER_ROLE, GUILD_ID
from tests.cogs.test_voices import last_reply


async def _help_text(h, user: int) -> str:
    """Run /help; every message it sent, joined (it is split into pages of at most 2000 characters)."""
    token = await h.slash("help", user)
    pages = []
    for call in h.adapter.for_token(token):
        data = call.payload.get("data", call.payload) if "type" in call.payload else call.payload
        if isinstance(data, dict) and data.get("content"):
            assert data.get("flags", 0) & 64 and len(data["content"]) <= 2000  # ephemeral, within Discord's limit
            pages.append(data["content"])
    return "\n".join(pages)


def _commands(text: str) -> set[str]:
    """The `/name` entries of a /help reply."""
    return {line.split("`")[1] for line in text.splitlines() if line.startswith("`/")}


async def test_help_lists_what_this_member_can_use_here(harness):
    h = harness
    text = await _help_text(h, ALICE)
    member = _commands(text)
    assert {"/say", "/join", "/voice clone", "/set user", "/help", "/phrases list"} <= member
    assert not member & {"/set guild", "/phrases add", "/block add", "/stats", "/ask prompt"}  # Manage Server; no chat
    assert "right-click a message -> Apps -> **Speak with my voice**" in text
    assert "`/say` Say something in your voice in the voice channel" in text.splitlines()
    admin = _commands(await _help_text(h, ADMIN))
    assert admin - member == {"/set guild", "/set bot-voice", "/phrases add", "/phrases remove", "/block add",
                              "/block remove", "/block list", "/stats"}
    store = h.services.store
    await store.set_guild_setting(GUILD_ID, "clone_role", CLONER_ROLE)
    await store.block(GUILD_ID, "user", ALICE)
    text = await _help_text(h, ALICE)
    assert not _commands(text) & {"/voice clone", "/voice enroll", "/say"} and "Speak with my voice" not in text
    assert "/voice clone" in _commands(await _help_text(h, BOB))  # Bob has the cloning role


async def test_block_list_is_for_admins_and_names_each_entry(harness):
    h = harness
    store = h.services.store
    token = await h.slash("block add", ALICE, member=BOB)
    assert last_reply(h, token) == ("You need the Manage Server permission to do that.", True)
    assert last_reply(h, await h.slash("block add", ADMIN, member=BOB)) == (f"Blocked <@{BOB}>.", True)
    assert last_reply(h, await h.slash("block add", ADMIN, member=BOB))[0] == f"<@{BOB}> was already blocked."
    assert last_reply(h, await h.slash("block add", ADMIN, role=CLONER_ROLE))[0] == f"Blocked <@&{CLONER_ROLE}>."
    assert last_reply(h, await h.slash("block add", ADMIN))[0] == "Give one member or one role."
    assert last_reply(h, await h.slash("block add", ADMIN, role=GUILD_ID))[0].startswith("@everyone cannot be blocked")
    assert await store.blocks(GUILD_ID) == [("user", BOB), ("role", CLONER_ROLE)]
    assert last_reply(h, await h.slash("block list", ADMIN))[0] == f"Blocked (2): <@{BOB}>, <@&{CLONER_ROLE}>."
    assert last_reply(h, await h.slash("block remove", ADMIN, member=BOB))[0] == f"Unblocked <@{BOB}>."
    assert last_reply(h, await h.slash("block remove", ADMIN, member=BOB))[0] == f"<@{BOB}> was not blocked."
    assert await store.blocks(GUILD_ID) == [("role", CLONER_ROLE)]


async def test_stats_shows_the_counts_to_admins_only(harness):
    h = harness
    assert last_reply(h, await h.slash("stats", ALICE))[0] == "You need the Manage Server permission to do that."
    assert last_reply(h, await h.slash("stats", ADMIN))[0] == "Nothing has been spoken in this server yet."
    await h.services.store.add_usage(GUILD_ID, messages=3, characters=1234, sentences=8, cache_hits=2)
    text = last_reply(h, await h.slash("stats", ADMIN))[0]
    assert text.endswith(": 3 messages, 1,234 characters spoken in 8 sentences; 25% of sentences came from the "
                         "cache (2). Only these counts are stored, never what was said.")
