"""/phrases add|list|remove: permissions, background precompute for the guild's voices, autocomplete."""

from __future__ import annotations

import asyncio

from tests.cogs.conftest import ADMIN, ALICE, BOB, GUILD_ID, OTHER_BOT_ID
from tests.cogs.test_voices import last_reply


async def test_add_precomputes_for_the_guilds_voices(harness):
    h = harness
    voices, store = h.services.synthesizer.voices, h.services.store
    server = voices.add("narrator", ADMIN)
    shared = voices.add("bobby", BOB)
    botv = voices.add("robot", ADMIN)
    voices.add("private", ALICE)  # not used by the guild
    await store.add_guild_voice(GUILD_ID, server.id, ADMIN)
    await store.share_voice(shared.id, GUILD_ID, BOB)
    await store.set_bot_voice(GUILD_ID, OTHER_BOT_ID, botv.id)
    token = await h.slash("phrases add", ADMIN, text="  Good   game, everyone! ")
    assert last_reply(h, token) == ("Added “Good game, everyone!”. Preparing it for 3 voice(s) in the background.", True)
    assert sorted(h.services.synthesizer.precomputed) == sorted(
        [(v.id, ("Good game, everyone!",)) for v in (server, shared, botv)])
    await asyncio.gather(*h.bot.get_cog("PhrasesCog")._background)
    assert await store.phrases(GUILD_ID) == ["Good game, everyone!"]
    token = await h.slash("phrases add", ADMIN, text="Good game, everyone!")
    assert last_reply(h, token)[0] == "That phrase is already on the list."


async def test_members_list_admins_edit(harness):
    h = harness
    token = await h.slash("phrases add", ALICE, text="hi")
    assert last_reply(h, token) == ("You need the Manage Server permission to do that.", True)
    token = await h.slash("phrases list", ALICE)
    assert "No phrases yet" in last_reply(h, token)[0]
    for text in ("Welcome back!", "Well played.", "Brb"):
        await h.slash("phrases add", ADMIN, text=text)
    assert [c["value"] for c in await h.autocomplete("phrases remove", "text", ADMIN, text="wel")] == [
        "Welcome back!", "Well played."]
    token = await h.slash("phrases remove", ADMIN, text="Well played.")
    assert last_reply(h, token)[0] == "Removed “Well played.”."
    token = await h.slash("phrases remove", ADMIN, text="Well played.")
    assert "is not on this server's list; see /phrases list" in last_reply(h, token)[0]
    token = await h.slash("phrases list", ALICE)
    assert last_reply(h, token)[0] == "**2 phrase(s)**\n1. Welcome back!\n2. Brb"


async def test_phrase_too_long(harness):
    token = await harness.slash("phrases add", ADMIN, text="x" * 250)
    assert "a phrase must be 1-200 characters" in last_reply(harness, token)[0].lower()
