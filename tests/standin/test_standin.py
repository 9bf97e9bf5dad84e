"""Self-test of the stand-in: a minimal, unmodified discord.py ``commands.Bot`` logs in, answers and speaks."""

from __future__ import annotations

import asyncio
import hashlib
import io
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import discord
import discord.gateway
import discord.http
import numpy as np
import pytest
import pytest_asyncio
import yarl
from discord import app_commands
from discord.ext import commands

from .fixtures import standin  # noqa: F401  (the fixture)
from .server import Standin
from .voice_udp import CHANNELS, FRAME_SAMPLES, SAMPLE_RATE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(30)]

TONE_HZ = 440.0
TONE_S = 1.0
TONE_FRAMES = int(TONE_S * SAMPLE_RATE) // FRAME_SAMPLES  # 50 frames of 20 ms


def point_discord_at(standin: Standin, monkeypatch: pytest.MonkeyPatch) -> aiohttp.TCPConnector:
    """Aim discord.py at the stand-in (REST base, gateway URL) and return a connector that trusts its CA.

    The project's bot does the same from its config (``discord.api_base``, ``discord.gateway_url``); this helper
    is for the self-test's minimal bot only. Call it inside the running loop (the connector binds to it).
    """
    monkeypatch.setattr(discord.http.Route, "BASE", standin.api_base)
    monkeypatch.setattr(discord.gateway.DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(standin.gateway_url))
    return aiohttp.TCPConnector(limit=0, ssl=standin.ssl_context_for_clients())


def _tone_pcm() -> bytes:
    """1 s of a 440 Hz sine, 48 kHz stereo s16le, half scale."""
    t = np.arange(int(TONE_S * SAMPLE_RATE)) / SAMPLE_RATE
    mono = (0.5 * 32767 * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.int16)
    return np.repeat(mono[:, None], CHANNELS, axis=1).tobytes()


class _PressView(discord.ui.View):
    """One button; pressing it edits the message (response type 7)."""

    @discord.ui.button(label="Press", custom_id="press")
    async def press(self, interaction: discord.Interaction, button: discord.ui.Button[Any]) -> None:
        await interaction.response.edit_message(content=f"pressed by {interaction.user.name}", view=None)


class _MiniBot(commands.Bot):
    """The smallest bot that exercises what the project's bot needs from Discord."""

    def __init__(self, connector: aiohttp.TCPConnector) -> None:
        intents = discord.Intents.default()
        super().__init__(command_prefix="!", intents=intents, connector=connector, guild_ready_timeout=0.05)
        self.seen_messages: list[discord.Message] = []
        self.late_errors: list[int] = []

    async def on_message(self, message: discord.Message) -> None:
        self.seen_messages.append(message)

    async def setup_hook(self) -> None:
        tree = self.tree

        @tree.command(description="Answer pong")
        async def ping(interaction: discord.Interaction) -> None:
            await interaction.response.send_message("pong")

        @tree.command(description="Say a tone in your voice channel")
        async def speak(interaction: discord.Interaction) -> None:
            await interaction.response.defer(thinking=True)
            member = interaction.user
            assert isinstance(member, discord.Member) and member.voice and member.voice.channel
            vc = await member.voice.channel.connect()
            done = asyncio.Event()
            vc.play(discord.PCMAudio(io.BytesIO(_tone_pcm())), after=lambda e: self.loop.call_soon_threadsafe(done.set))
            await done.wait()
            await interaction.followup.send("spoke")
            await vc.disconnect()

        @tree.command(description="Answer slowly")
        async def slow(interaction: discord.Interaction) -> None:
            await asyncio.sleep(0.3)
            try:
                await interaction.response.send_message("too late")
            except discord.NotFound as e:
                self.late_errors.append(e.code)

        @tree.command(description="Every way to answer, edit and delete")
        async def lifecycle(interaction: discord.Interaction) -> None:
            await interaction.response.send_message("one")
            await interaction.edit_original_response(content="two")
            original = await interaction.original_response()
            channel = interaction.channel
            assert isinstance(channel, discord.TextChannel)
            posted = await channel.send("posted", file=discord.File(io.BytesIO(b"abc"), filename="a.txt"))
            await posted.edit(content="posted!")
            async with channel.typing():
                pass
            await interaction.followup.send(f"original was {original.content}")
            await interaction.delete_original_response()
            await posted.delete()

        @tree.command(description="Join your voice channel and stay")
        async def join(interaction: discord.Interaction) -> None:
            member = interaction.user
            assert isinstance(member, discord.Member) and member.voice and member.voice.channel
            await interaction.response.defer(ephemeral=True)
            await member.voice.channel.connect()
            await interaction.followup.send("joined", ephemeral=True)

        @tree.command(description="Reverse an uploaded file")
        async def reverse(interaction: discord.Interaction, file: discord.Attachment) -> None:
            await interaction.response.defer()
            data = await file.read()
            reply = discord.File(io.BytesIO(data[::-1]), filename="reversed.bin")
            await interaction.followup.send(hashlib.sha256(data).hexdigest(), file=reply)

        @tree.command(description="Show a button")
        async def button(interaction: discord.Interaction) -> None:
            await interaction.response.send_message("press it", view=_PressView(timeout=10))

        @tree.command(description="Pick a colour")
        async def colour(interaction: discord.Interaction, name: str) -> None:
            await interaction.response.send_message(f"colour {name}", ephemeral=True)

        @colour.autocomplete("name")
        async def _colours(interaction: discord.Interaction, current: str) -> list[app_commands.Choice[str]]:
            names = ["red", "green", "blue", "grey"]
            return [app_commands.Choice(name=n, value=n) for n in names if n.startswith(current)]

        @tree.context_menu(name="Read aloud")
        async def read_aloud(interaction: discord.Interaction, message: discord.Message) -> None:
            await interaction.response.send_message(f"reading {message.content!r} by {message.author.name}")

        await tree.sync()


@pytest_asyncio.fixture
async def bot(standin: Standin, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[_MiniBot]:  # noqa: F811
    """The mini bot, logged in to the stand-in, commands synced, ready."""
    client = _MiniBot(point_discord_at(standin, monkeypatch))
    task = asyncio.create_task(client.start(standin.token))
    try:
        await asyncio.wait_for(client.wait_until_ready(), 5)
        await standin.wait_commands(
            "ping", "speak", "join", "slow", "lifecycle", "reverse", "button", "colour", "Read aloud"
        )
        yield client
    finally:
        await client.close()
        await asyncio.wait_for(task, 5)


async def test_login_ping_and_speak_tone(standin: Standin, bot: _MiniBot) -> None:  # noqa: F811
    lay = standin.layout
    assert standin.identify_payload is not None and standin.identify_payload["token"] == standin.token
    assert bot.user is not None and bot.user.id == standin.bot_user.id
    guild = bot.get_guild(lay.guild_id)
    assert guild is not None and guild.get_channel(lay.voice_channel_id).type is discord.ChannelType.voice

    ping = await standin.invoke_slash(lay.guild_id, lay.admin_id, "ping")
    reply = await standin.wait_reply(ping)
    assert (reply.kind, reply.type, reply.content) == ("callback", 4, "pong")

    speak = await standin.invoke_slash(lay.guild_id, lay.admin_id, "speak")
    deferred = await standin.wait_reply(speak)
    assert (deferred.kind, deferred.type) == ("callback", 5)
    voice = standin.voice(lay.guild_id)
    await voice.wait_first_packet(timeout=5)
    assert standin.bot_voice_channel(lay.guild_id) == lay.voice_channel_id
    followup = await standin.wait_reply(speak, lambda r: r.kind == "followup", timeout=5)
    await voice.wait_silence(quiet_ms=150, timeout=5)

    assert followup.content == "spoke"
    assert followup.message is not None and int(followup.message["id"]) == standin.interactions[speak].original_message_id
    assert voice.errors == []
    packets = voice.packets
    audio = voice.audio_packets()
    assert len(audio) == TONE_FRAMES
    assert len(packets) == TONE_FRAMES + 5  # discord.py appends 5 silence frames
    assert len({p.ssrc for p in packets}) == 1
    assert [(b.seq - a.seq) % 65536 for a, b in zip(packets, packets[1:])] == [1] * (len(packets) - 1)
    assert [(b.timestamp - a.timestamp) % 2**32 for a, b in zip(packets, packets[1:])] == [960] * (len(packets) - 1)
    # paced, not sent in a burst: discord.py sleeps to a 20 ms clock, so the packets cannot come faster than that
    # (no upper bound: how late a loaded machine's player thread wakes is not this test's verdict)
    span = packets[-1].at - packets[0].at
    assert span >= 0.8, f"packets were not paced at 20 ms: {span:.3f} s for {len(packets)}"

    pcm = voice.pcm(skip_silence=True)  # [samples, 2] int16 @ 48 kHz
    assert abs(pcm.shape[0] - TONE_S * SAMPLE_RATE) <= FRAME_SAMPLES
    left = pcm[:, 0].astype(np.float64)
    spectrum = np.abs(np.fft.rfft(left * np.hanning(left.size)))
    peak_hz = np.fft.rfftfreq(left.size, 1 / SAMPLE_RATE)[int(np.argmax(spectrum))]
    assert abs(peak_hz - TONE_HZ) <= 5, peak_hz
    assert np.sqrt(np.mean(left[FRAME_SAMPLES:-FRAME_SAMPLES] ** 2)) > 0.3 * 32767 / np.sqrt(2)
    assert [s for _, s in voice.speaking][:1] == [0] and 1 in [s for _, s in voice.speaking]

    await standin.wait_for(lambda: standin.bot_voice_channel(lay.guild_id) is None, 5, "the bot left voice")


async def test_attachment_download_round_trip(standin: Standin, bot: _MiniBot) -> None:  # noqa: F811
    lay = standin.layout
    data = bytes(range(256)) * 40
    attachment = standin.add_attachment("clip.ogg", data, "audio/ogg")
    iid = await standin.invoke_slash(lay.guild_id, lay.member_id, "reverse", {"file": attachment})
    reply = await standin.wait_reply(iid, lambda r: r.kind == "followup")
    assert reply.content == hashlib.sha256(data).hexdigest()
    assert [(f.filename, f.data) for f in reply.files] == [("reversed.bin", data[::-1])]
    assert reply.message is not None and standin.attachment_bytes(reply.message["attachments"][0]) == data[::-1]
    assert standin.requests_matching("POST", rf"/webhooks/{standin.application_id}/[^/]+")[0].files[0].data == data[::-1]


async def test_button_click_round_trip(standin: Standin, bot: _MiniBot) -> None:  # noqa: F811
    lay = standin.layout
    iid = await standin.invoke_slash(lay.guild_id, lay.admin_id, "button")
    reply = await standin.wait_reply(iid)
    assert reply.message is not None and reply.message["components"][0]["components"][0]["custom_id"] == "press"
    click = await standin.click_button(reply.message, "press", lay.member_id)
    answer = await standin.wait_reply(click)
    assert (answer.kind, answer.type) == ("callback", 7)
    edited = standin.messages[int(reply.message["id"])]
    assert edited["content"] == "pressed by bob" and edited["components"] == []


async def test_autocomplete_context_menu_and_late_answer(standin: Standin, bot: _MiniBot) -> None:  # noqa: F811
    lay = standin.layout
    choices = await standin.autocomplete(lay.guild_id, lay.admin_id, "colour", {"name": "gr"}, focused="name")
    assert [c["value"] for c in choices] == ["green", "grey"]
    iid = await standin.invoke_slash(lay.guild_id, lay.admin_id, "colour", {"name": "blue"})
    reply = await standin.wait_reply(iid)
    assert reply.content == "colour blue" and reply.ephemeral

    message = await standin.send_message(lay.text_channel_id, lay.member_id, "hello there")
    iid = await standin.invoke_message_command(lay.guild_id, lay.admin_id, "Read aloud", int(message["id"]))
    assert (await standin.wait_reply(iid)).content == "reading 'hello there' by bob"

    with pytest.raises(Exception, match="no synced command"):
        await standin.invoke_slash(lay.guild_id, lay.admin_id, "nope")

    standin.interaction_ack_window_s = 0.2
    iid = await standin.invoke_slash(lay.guild_id, lay.admin_id, "slow")
    await asyncio.wait_for(_until(lambda: bot.late_errors), 5)
    assert bot.late_errors == [10062] and standin.replies_for(iid) == []


async def test_reply_edit_delete_and_channel_messages(standin: Standin, bot: _MiniBot) -> None:  # noqa: F811
    lay = standin.layout
    iid = await standin.invoke_slash(lay.guild_id, lay.admin_id, "lifecycle")
    await standin.wait_reply(iid, lambda r: r.kind == "delete_original")
    await standin.wait_for(lambda: not standin.messages_in(lay.text_channel_id)[1:], 5, "the posted message deleted")
    replies = standin.replies_for(iid)
    assert [(r.kind, r.content) for r in replies] == [
        ("callback", "one"), ("edit_original", "two"), ("followup", "original was two"), ("delete_original", "two"),
    ]
    assert [m["content"] for m in standin.messages_in(lay.text_channel_id)] == ["original was two"]
    posts = standin.requests_matching("POST", rf"/channels/{lay.text_channel_id}/messages")
    assert [(p.json["content"], p.files[0].filename, p.files[0].data) for p in posts] == [("posted", "a.txt", b"abc")]
    edits = standin.requests_matching("PATCH", rf"/channels/{lay.text_channel_id}/messages/\d+")
    assert [e.json["content"] for e in edits] == ["posted!"]
    assert len(standin.requests_matching("POST", rf"/channels/{lay.text_channel_id}/typing")) == 1
    assert [r.status for r in standin.requests_matching("DELETE", r".*")] == [204, 204]


async def test_unknown_token_is_refused(standin: Standin, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    client = _MiniBot(point_discord_at(standin, monkeypatch))
    with pytest.raises(discord.LoginFailure):
        await client.start("wrong-token")
    await client.close()
    assert [r.status for r in standin.requests] == [401]  # refused at the first request, never retried


async def test_messages_reach_the_bot_as_its_intents_allow(standin: Standin, bot: _MiniBot) -> None:  # noqa: F811
    lay = standin.layout
    plain = await standin.send_message(lay.text_channel_id, lay.member_id, "read me")
    direct = await standin.send_message(lay.text_channel_id, lay.member_id, f"<@{standin.bot_user.id}> read me")
    await asyncio.wait_for(_until(lambda: len(bot.seen_messages) == 2), 5)
    first, second = bot.seen_messages
    assert (first.id, first.content) == (int(plain["id"]), "")  # no message_content intent: Discord empties it
    assert second.content == f"<@{standin.bot_user.id}> read me" and second.mentions[0].id == standin.bot_user.id
    assert second.author.id == lay.member_id and isinstance(second.author, discord.Member)
    assert int(direct["id"]) == second.id


async def test_voice_drops_moves_and_deleted_channel(standin: Standin, bot: _MiniBot) -> None:  # noqa: F811
    lay = standin.layout
    guild = bot.get_guild(lay.guild_id)
    assert guild is not None

    async def join() -> None:
        iid = await standin.invoke_slash(lay.guild_id, lay.admin_id, "join")
        reply = await standin.wait_reply(iid, lambda r: r.kind == "followup")
        assert reply.content == "joined" and reply.ephemeral
        assert guild.voice_client is not None and guild.voice_client.is_connected()

    await join()
    first = standin.voice_connections[lay.guild_id]
    await standin.disconnect_voice(lay.guild_id, code=4006)  # session invalid: discord.py reconnects
    await standin.wait_for(
        lambda: standin.voice_connections[lay.guild_id] is not first
        and standin.voice_connections[lay.guild_id].secret_key is not None, 6, "a new voice session",
    )
    await asyncio.wait_for(_until(lambda: guild.voice_client is not None and guild.voice_client.is_connected()), 5)

    second = standin.voice_connections[lay.guild_id]
    await standin.disconnect_voice(lay.guild_id, code=4015)  # voice server crashed: discord.py resumes (op 7)
    await standin.wait_for(
        lambda: standin.voice_connections[lay.guild_id] is not second
        and standin.voice_connections[lay.guild_id].secret_key == second.secret_key, 6, "a resumed voice session",
    )
    await asyncio.wait_for(_until(lambda: guild.voice_client is not None and guild.voice_client.is_connected()), 5)

    await standin.disconnect_voice(lay.guild_id, code=4014)  # kicked: discord.py gives up
    await asyncio.wait_for(_until(lambda: guild.voice_client is None), 5)
    assert standin.bot_voice_channel(lay.guild_id) is None

    await standin.move_member(lay.admin_id, lay.other_voice_channel_id)
    await asyncio.wait_for(_until(lambda: _voice_channel_id(guild, lay.admin_id) == lay.other_voice_channel_id), 5)
    await standin.move_member(lay.admin_id, lay.voice_channel_id)
    await asyncio.wait_for(_until(lambda: _voice_channel_id(guild, lay.admin_id) == lay.voice_channel_id), 5)

    await join()
    await standin.delete_channel(lay.voice_channel_id)
    gone = lambda: guild.voice_client is None and guild.get_channel(lay.voice_channel_id) is None  # noqa: E731
    await asyncio.wait_for(_until(gone), 5)
    assert _voice_channel_id(guild, lay.admin_id) is None


def _voice_channel_id(guild: discord.Guild, user_id: int) -> int | None:
    """The voice channel id the bot believes a member is in."""
    member = guild.get_member(user_id)
    return None if member is None or member.voice is None or member.voice.channel is None else member.voice.channel.id


async def _until(condition: Any) -> None:
    """Poll a bot-side condition every 10 ms."""
    while not condition():
        await asyncio.sleep(0.01)
