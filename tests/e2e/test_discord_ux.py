"""What users of the best Discord TTS bot expect (issue 34, 4), in the stand-in with the real bot, cogs, speech
service and speaker (the synthesizer is the Discord layer's fake: a sine per sentence): /help, the block list, the
auto-read prefix, attachments, per-server limits, /stats, Stage channels."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import pytest

from tests.e2e.standin_bot import LightEnv, light  # noqa: F401
from tests.standin.model import MUTE_MEMBERS

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def _followup(r: Any) -> bool:
    return r.kind == "followup" or (r.kind == "callback" and r.type == 4)


async def _command(light: LightEnv, user: int, name: str, options: dict[str, Any] | None = None,  # noqa: F811
                   subcommand: str | None = None) -> str:
    """Run a slash command in the first guild; the text of its answer."""
    s = light.standin
    iid = await s.invoke_slash(s.layout.guild_id, user, name, options, subcommand=subcommand)
    return (await s.wait_reply(iid, _followup, timeout=10)).content


async def _autoread(light: LightEnv) -> int:  # noqa: F811
    """Auto-read in #general, a voice for a new member carol who is in the voice channel, the bot there; her id."""
    s, lay = light.standin, light.standin.layout
    carol = await s.add_member(lay.guild_id, "carol")
    await s.move_member(carol, lay.voice_channel_id)
    light.synth.voices.add("carol", carol)
    light.synth.voices.add("alice", lay.admin_id)
    await _command(light, lay.admin_id, "set", {"setting": "autoread_channel", "value": "general"}, "guild")
    assert (await _command(light, lay.admin_id, "join")).startswith("Joined")
    return carol


async def _read(light: LightEnv, count: int) -> list[str]:  # noqa: F811
    """Wait until ``count`` texts were synthesized (then a moment for any extra); the texts."""
    await light.standin.wait_for(lambda: len(light.synth.streamed) >= count, 10, f"{count} texts")
    await asyncio.sleep(0.3)
    return [text for text, _ in light.synth.streamed]


async def _help(light: LightEnv, user: int) -> list[str]:  # noqa: F811
    """Every message of a /help answer (it is split into messages of at most 2000 characters)."""
    s = light.standin
    iid = await s.invoke_slash(s.layout.guild_id, user, "help")
    await s.wait_reply(iid, _followup, timeout=10)
    await asyncio.sleep(0.3)  # the rest of the pages
    return [r.content for r in s.replies_for(iid) if _followup(r) and r.content]


async def test_help_lists_the_commands_of_this_member(light: LightEnv):  # noqa: F811
    lay = light.standin.layout
    pages = await _help(light, lay.member_id)
    member = "\n".join(pages)
    assert all(len(p) <= 2000 for p in pages) and pages[0].startswith("**Commands you can use here**")
    assert "`/say` Say something in your voice in the voice channel" in member.splitlines()
    assert "/stats" not in member and "/block add" not in member and "/set guild" not in member
    admin_pages = await _help(light, lay.admin_id)
    admin = "\n".join(admin_pages)
    assert len(admin_pages) > len(pages) or len(admin) > len(member)
    assert "`/stats` What the bot has spoken in this server (Manage Server)" in admin.splitlines()
    assert admin.splitlines()[-1] == "right-click a message -> Apps -> **Speak with my voice**"


async def test_blocked_members_and_roles_are_not_read_and_cannot_say(light: LightEnv):  # noqa: F811
    s, lay = light.standin, light.standin.layout
    carol = await _autoread(light)
    assert await _command(light, lay.admin_id, "block", {"member": carol}, "add") == f"Blocked <@{carol}>."
    await s.send_message(lay.text_channel_id, carol, "I am blocked.")
    refusal = await _command(light, carol, "say", {"text": "Let me speak."})
    assert refusal == ("You are on this server's block list, so I don't read your messages; ask a server admin if "
                       "that is a mistake")
    await s.send_message(lay.text_channel_id, lay.admin_id, "Alice is read.")
    assert await _read(light, 1) == ["Alice is read."]
    await _command(light, lay.admin_id, "block", {"member": carol}, "remove")
    assert await _command(light, lay.admin_id, "block", {"role": lay.admin_role_id}, "add") == (
        f"Blocked <@&{lay.admin_role_id}>.")
    await s.send_message(lay.text_channel_id, lay.admin_id, "Alice has the blocked role.")
    await s.send_message(lay.text_channel_id, carol, "Carol is read again.")
    assert await _read(light, 2) == ["Alice is read.", "Carol is read again."]


async def test_autoread_prefix_is_required_and_stripped(light: LightEnv):  # noqa: F811
    s, lay = light.standin, light.standin.layout
    await _autoread(light)
    reply = await _command(light, lay.admin_id, "set", {"setting": "autoread_prefix", "value": "!tts"}, "guild")
    assert reply == "`autoread_prefix` is now !tts."
    await s.send_message(lay.text_channel_id, lay.admin_id, "Chatting without the prefix.")
    await s.send_message(lay.text_channel_id, lay.admin_id, "!tts  Read this one.")
    assert await _read(light, 1) == ["Read this one."]
    await _command(light, lay.admin_id, "say", {"text": "Slash commands need no prefix."})
    assert await _read(light, 2) == ["Read this one.", "Slash commands need no prefix."]


async def test_attachments_are_read_as_who_sent_what(light: LightEnv):  # noqa: F811
    s, lay = light.standin, light.standin.layout
    await _autoread(light)
    image = s.add_attachment("cat.png", b"\x89PNG....", "image/png")
    files = [s.add_attachment(f"notes{i}.txt", b"x", "text/plain") for i in range(3)]
    await s.send_message(lay.text_channel_id, lay.admin_id, "", attachments=[image])
    await s.send_message(lay.text_channel_id, lay.admin_id, "", attachments=files)
    await s.send_message(lay.text_channel_id, lay.admin_id, "Look at this", attachments=[image])
    assert await _read(light, 3) == ["alice sent an image", "alice sent 3 files", "Look at this. Sent an image."]


async def test_message_length_and_voice_speed_limits(light: LightEnv):  # noqa: F811
    s, lay = light.standin, light.standin.layout
    carol = await _autoread(light)
    speeds: list[float] = []
    real = light.synth.stream

    def recording(text: Any, voice: Any, params: Any = None, **kwargs: Any) -> Any:
        speeds.append(params.speed)
        return real(text, voice, params, **kwargs)

    light.synth.stream = recording  # type: ignore[method-assign]
    await _command(light, lay.admin_id, "set", {"setting": "max_message_chars", "value": "24"}, "guild")
    await _command(light, lay.admin_id, "set", {"setting": "speed_max", "value": "1.5"}, "guild")
    await _command(light, lay.admin_id, "set", {"setting": "speed_min", "value": "0.8"}, "guild")
    await _command(light, carol, "set", {"setting": "speed", "value": "3"}, "user")
    await _command(light, lay.admin_id, "set", {"setting": "speed", "value": "0.5"}, "user")
    await s.send_message(lay.text_channel_id, carol, "This message is far longer than the server allows.")
    await s.send_message(lay.text_channel_id, lay.admin_id, "Short one.")
    texts = await _read(light, 2)
    assert texts[0] == "This message is far", texts  # cut at the last word boundary within 24 characters
    assert texts[1] == "Short one." and speeds == [1.5, 0.8]


async def test_stats_count_what_was_spoken_without_the_text(light: LightEnv):  # noqa: F811
    s, lay = light.standin, light.standin.layout
    await _autoread(light)
    assert await _command(light, lay.admin_id, "stats") == "Nothing has been spoken in this server yet."
    await s.send_message(lay.text_channel_id, lay.admin_id, "One sentence. Two sentences.")
    await s.send_message(lay.text_channel_id, lay.admin_id, "Three.")
    await _read(light, 2)
    await s.wait_for(lambda: light.speech.speaker(lay.guild_id)._current is None, 10, "speech done")
    usage = await light.store.usage(lay.guild_id)
    assert usage is not None and (usage["messages"], usage["characters"], usage["sentences"]) == (2, 34, 3)
    reply = await _command(light, lay.admin_id, "stats")
    assert ": 2 messages, 34 characters spoken in 3 sentences; 0% of sentences came from the cache (0)." in reply
    assert await _command(light, lay.member_id, "stats") == "You need the Manage Server permission to do that."
    conn = sqlite3.connect(f"file:{light.store.path}?mode=ro", uri=True)
    try:
        dump = "\n".join(conn.iterdump())
    finally:
        conn.close()
    assert "One sentence" not in dump and "Three" not in dump  # counts only: what was said is not stored


async def test_stage_channels_need_a_speaker_and_their_audience_is_not_read(light: LightEnv):  # noqa: F811
    s, lay = light.standin, light.standin.layout
    carol = await _autoread(light)  # the bot joins the voice channel; then everyone moves to a Stage
    await _command(light, lay.admin_id, "leave")
    stage = await s.add_stage_channel(lay.guild_id)
    await s.move_member(lay.admin_id, stage)
    await s.move_member(carol, stage)
    refusal = await _command(light, lay.admin_id, "join")
    assert refusal == (f"<#{stage}> is a Stage: I would join its audience, where I cannot be heard; give me the Mute "
                       "Members permission there (a Stage moderator), or use a voice channel")
    await s.set_member_overwrite(stage, s.bot_user.id, allow=MUTE_MEMBERS)
    await asyncio.sleep(0.1)
    assert (await _command(light, lay.admin_id, "join")).startswith(f"Joined <#{stage}>")
    bot_state = s.guilds[lay.guild_id].voice_states[s.bot_user.id]
    assert bot_state.channel_id == stage and not bot_state.suppress  # a speaker, heard
    (patch,) = s.requests_matching("PATCH", rf"/guilds/{lay.guild_id}/voice-states/@me")
    assert (patch.json["suppress"], patch.json["channel_id"], patch.status) == (False, stage, 204)
    await s.set_stage_speaker(lay.admin_id, lay.guild_id)
    await asyncio.sleep(0.1)
    await s.send_message(lay.text_channel_id, carol, "Carol listens in the audience.")
    await s.send_message(lay.text_channel_id, lay.admin_id, "Alice speaks on the Stage.")
    assert await _read(light, 1) == ["Alice speaks on the Stage."]
    refusal = await _command(light, carol, "say", {"text": "Let me on stage."})
    assert refusal == "You are in the Stage audience: I only read the Stage's speakers"
