"""/settings, /set guild, /set user, /set bot-voice: permissions, parsing, validation, autocomplete."""

from __future__ import annotations

from tests.cogs.conftest import ADMIN, ALICE, AUTOREAD_ID, BOB, CLONER_ROLE, GUILD_ID, OTHER_BOT_ID
from tests.cogs.test_voices import last_reply


async def test_set_guild_needs_manage_server(harness):
    h = harness
    token = await h.slash("set guild", ALICE, setting="autoread_channel", value="#tts")
    text, ephemeral = last_reply(h, token)
    assert ephemeral and text == "You need the Manage Server permission to do that."
    assert (await h.services.store.guild_settings(GUILD_ID))["autoread_channel"] is None


async def test_set_guild_parses_names_mentions_and_ids(harness):
    h = harness
    store = h.services.store
    token = await h.slash("set guild", ADMIN, setting="autoread_channel", value="#tts")
    assert last_reply(h, token) == (f"`autoread_channel` is now <#{AUTOREAD_ID}>.", True)
    await h.slash("set guild", ADMIN, setting="clone_role", value=f"<@&{CLONER_ROLE}>")
    await h.slash("set guild", ADMIN, setting="cloning_enabled", value="off")
    await h.slash("set guild", ADMIN, setting="max_seconds", value="12.5")
    s = await store.guild_settings(GUILD_ID)
    assert (s["autoread_channel"], s["clone_role"], s["cloning_enabled"], s["max_seconds"]) == (
        AUTOREAD_ID, CLONER_ROLE, False, 12.5)
    await h.slash("set guild", ADMIN, setting="autoread_channel", value="none")
    assert (await store.guild_settings(GUILD_ID))["autoread_channel"] is None


async def test_set_guild_validation_errors_say_the_fix(harness):
    h = harness
    cases = {
        ("max_seconds", "abc"): "must be a number between 1 and 300",
        ("max_seconds", "900"): "must be between 1 and 300, got 900",
        ("cloning_enabled", "maybe"): "use true or false",
        ("emoji_mode", "shout"): "must be one of name, skip",
        ("autoread_channel", "#nope"): "mention it or paste its id",
        ("autoread_channel", "123456789012345678"): "must be a text channel of this server",
        ("default_voice", "ghost"): "/voice list",
    }
    for (setting, value), fix in cases.items():
        token = await h.slash("set guild", ADMIN, setting=setting, value=value)
        text, ephemeral = last_reply(h, token)
        assert ephemeral and fix in text, (setting, value, text)
    assert await h.services.store.guild_settings(GUILD_ID) == await h.services.store.guild_settings(999)


async def test_default_voice_must_be_available_to_everyone(harness):
    h = harness
    voices, store = h.services.synthesizer.voices, h.services.store
    private = voices.add("mine", ADMIN)
    server = voices.add("narrator", BOB)
    await store.add_guild_voice(GUILD_ID, server.id, BOB)
    token = await h.slash("set guild", ADMIN, setting="default_voice", value="mine")
    assert "is your private voice: share it first with /voice share" in last_reply(h, token)[0]
    token = await h.slash("set guild", ADMIN, setting="default_voice", value="narrator")
    assert last_reply(h, token)[0] == "`default_voice` is now **narrator**."
    assert (await store.guild_settings(GUILD_ID))["default_voice"] == server.id
    assert private.id not in (await store.guild_settings(GUILD_ID)).values()


async def test_set_user_settings(harness):
    h = harness
    store = h.services.store
    token = await h.slash("set user", ALICE, setting="speed", value="1.5")
    assert last_reply(h, token) == ("Your `speed` is now 1.5 everywhere.", True)
    token = await h.slash("set user", ALICE, setting="speed", value="9")
    assert "Speed must be between 0.25 and 4, got 9.0" == last_reply(h, token)[0]
    await h.slash("set user", ALICE, setting="nickname", value="Ali", here=True)
    own = h.services.synthesizer.voices.add("alto", ALICE)
    await h.slash("set user", ALICE, setting="voice", value="alto")
    assert (await store.user_settings(ALICE))["speed"] == 1.5
    assert (await store.user_settings(ALICE, GUILD_ID))["nickname"] == "Ali"
    assert (await store.user_settings(ALICE))["nickname"] is None
    assert (await store.user_settings(ALICE))["voice"] == own.id


async def test_settings_shows_every_setting_with_values(harness):
    h = harness
    await h.services.store.set_guild_setting(GUILD_ID, "autoread_channel", AUTOREAD_ID)
    await h.services.store.set_user_setting(ALICE, "speed", 1.25)
    token = await h.slash("settings", ALICE)
    text, ephemeral = last_reply(h, token)
    from bot.store import GUILD_SETTINGS, USER_SETTINGS

    assert ephemeral
    for name in [*GUILD_SETTINGS, *USER_SETTINGS]:
        assert f"`{name}` = " in text
    assert f"`autoread_channel` = <#{AUTOREAD_ID}>" in text
    assert "`speed` = 1.25" in text and "`ignore_bots` = on" in text and "`required_role` = none" in text


async def test_value_autocomplete_follows_the_setting(harness):
    h = harness
    choices = await h.autocomplete("set guild", "value", ADMIN, setting="cloning_enabled", value="")
    assert [c["value"] for c in choices] == ["true", "false"]
    choices = await h.autocomplete("set guild", "value", ADMIN, setting="autoread_channel", value="#t")
    assert choices == [{"name": "#tts", "value": str(AUTOREAD_ID)}]
    choices = await h.autocomplete("set guild", "value", ADMIN, setting="clone_role", value="")
    assert choices == [{"name": "@cloners", "value": str(CLONER_ROLE)}, {"name": "none", "value": "none"}]
    choices = await h.autocomplete("set guild", "value", ADMIN, setting="emoji_mode", value="")
    assert [c["value"] for c in choices] == ["name", "skip"]
    choices = await h.autocomplete("set user", "value", ALICE, setting="language", value="j")
    assert [c["value"] for c in choices] == ["all_ja"] or "ja" in [c["value"] for c in choices]


async def test_bot_voice(harness):
    h = harness
    voices, store = h.services.synthesizer.voices, h.services.store
    server = voices.add("narrator", BOB)
    await store.add_guild_voice(GUILD_ID, server.id, BOB)
    token = await h.slash("set bot-voice", ADMIN, bot=OTHER_BOT_ID, voice="narrator")
    assert last_reply(h, token)[0] == f"`bot_voices` is now <@{OTHER_BOT_ID}> → **narrator**."
    assert (await store.guild_settings(GUILD_ID))["bot_voices"] == {OTHER_BOT_ID: server.id}
    token = await h.slash("set bot-voice", ADMIN, bot=ALICE, voice="narrator")
    assert "Alice is not a bot" in last_reply(h, token)[0]
    await h.slash("set guild", ADMIN, setting="bot_voices", value=f"<@{OTHER_BOT_ID}> none")
    assert (await store.guild_settings(GUILD_ID))["bot_voices"] == {}
    token = await h.slash("set bot-voice", ALICE, bot=OTHER_BOT_ID, voice="narrator")
    assert "Manage Server" in last_reply(h, token)[0]
