"""The real bot under DAVE (Discord's end-to-end encrypted voice) in the local stand-in.

The stand-in speaks DAVE protocol version 1 (``Standin(dave=True)``): it is each channel's MLS delivery service and
external sender (:mod:`tests.standin.dave`). Other people in the channel are :class:`DaveListener` members with their
own ``davey`` session; the bot's RTP payloads reach them as the SFU would forward them, and what a listener decrypts
is what the recording decodes and these tests check: every audio frame end-to-end encrypted once the group exists,
decrypted with the listener's keys, and the speech's length, level and waveform what the synthesizer made.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import davey
import numpy as np
import pytest
import pytest_asyncio

from tests.e2e.conftest import BotEnv, StreamRecord
from tests.e2e.test_bot_e2e import (
    LONG_MESSAGE, MIN_ENVELOPE_CORRELATION, MIN_WAVEFORM_CORRELATION, THREE_SENTENCES, _correlation,
    _envelope_correlation, _mono, _say, _to_48k,
)
from tests.standin import mls
from tests.standin.dave import DaveGroup, DaveListener
from tests.standin.server import Standin
from tests.standin.voice_udp import FRAME_SAMPLES, SAMPLE_RATE, VoiceRecording

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

FRAME_S = FRAME_SAMPLES / SAMPLE_RATE  # 0.02 s per RTP packet
GROUP_TIMEOUT_S = 10.0  # longest wait for an MLS transition on a loaded 2-core machine


@pytest_asyncio.fixture
async def standin() -> AsyncIterator[Standin]:
    """The stand-in speaking DAVE (overrides the plain one of ``conftest.py`` for this module)."""
    async with Standin(dave=True) as server:
        yield server


async def _join(env: BotEnv) -> DaveGroup:
    """/join from alice (in voice); the bot's voice session runs DAVE version 1."""
    standin, lay = env.standin, env.standin.layout
    iid = await standin.invoke_slash(lay.guild_id, lay.admin_id, "join")
    await standin.wait_reply(iid, lambda r: r.kind == "followup", timeout=10)
    assert standin.voice_connections[lay.guild_id].dave is not None
    return standin.dave_groups[lay.guild_id]


async def _listener(env: BotEnv, name: str, *, commits: bool = True, dave: bool = True) -> DaveListener:
    """A new member joins the bot's channel with a davey session; waits until the group includes them."""
    standin = env.standin
    group = standin.dave_groups[standin.layout.guild_id]
    user_id = await standin.add_member(standin.layout.guild_id, name)
    before = len(group.executed())
    listener = await standin.join_listener(user_id, commits=commits, dave=dave)
    await group.wait_for(lambda: len(group.executed()) > before, GROUP_TIMEOUT_S, f"{name} in the group")
    return listener


async def _speak(env: BotEnv, text: str) -> StreamRecord:
    """/say ``text`` (alice's voice) and wait until it has been played out."""
    lay = env.standin.layout
    count = len(env.synth.streams)
    await _say(env, lay.guild_id, lay.admin_id, text)
    record = (await env.synth.wait_streams(count + 1))[count]
    await env.synth.wait_closed(record, timeout=30)
    await env.standin.voice(lay.guild_id).wait_silence(quiet_ms=300, timeout=30)
    return record


def _assert_speech(env: BotEnv, voice: VoiceRecording, record: StreamRecord) -> None:
    """The decoded speech has the synthesized length and level, and its waveform when nothing underran."""
    speaker = env.speech.speaker(env.standin.layout.guild_id)
    decoded = voice.pcm(skip_silence=True)  # [N, 2] int16 @ 48 kHz, as the listener decrypted it
    decoded_s = decoded.shape[0] / SAMPLE_RATE
    underrun_s = speaker.underrun_frames * FRAME_S
    assert np.sqrt(np.mean(_mono(decoded) ** 2)) > 0.01, "the decrypted audio is silent"
    assert abs(decoded_s - underrun_s - record.seconds) <= FRAME_S, (decoded_s, underrun_s, record.seconds)
    if speaker.underrun_frames == 0:  # the decrypted audio lines up with the synthesized one throughout
        reference = _to_48k(record.audio, 32000)
        assert _correlation(_mono(decoded), reference) > MIN_WAVEFORM_CORRELATION
        assert _envelope_correlation(_mono(decoded), reference) > MIN_ENVELOPE_CORRELATION


def _bot_voice_poller_alive(env: BotEnv) -> bool:
    """Whether discord.py still reads the bot's voice WebSocket."""
    guild = env.bot.get_guild(env.standin.layout.guild_id)
    vc = guild.voice_client if guild is not None else None
    runner = getattr(getattr(vc, "_connection", None), "_runner", None)  # white-box: discord.py's poller task
    return runner is not None and not runner.done()


async def test_dave_join_and_speak(env: BotEnv) -> None:
    standin, lay = env.standin, env.standin.layout
    await env.add_voice(lay.admin_id, "alice", 140.0)
    group = await _join(env)
    assert standin.voice_connections[lay.guild_id].identify["max_dave_protocol_version"] == 1
    bob = await _listener(env, "bob")
    [first] = group.executed()
    assert first.epoch == 1 and first.participants == {standin.bot_user.id, bob.user_id}
    assert bob.ready and bob.epoch == 1

    voice = standin.voice(lay.guild_id)
    record = await _speak(env, THREE_SENTENCES)
    assert record.sentences == [
        "The little boat left the harbour early.", "Gulls followed it out past the lighthouse.",
        "By noon the crew could see the island.",
    ]
    audio = voice.audio_packets()
    assert len(audio) > 50 and all(p.e2ee for p in audio), "every audio frame is end-to-end encrypted"
    assert voice.errors == [] and group.errors == []
    assert all(f.opus is not None for f in bob.frames) and len(bob.frames) == len(voice.packets)
    _assert_speech(env, voice, record)


async def test_dave_member_joins_while_the_bot_speaks(env: BotEnv) -> None:
    standin, lay = env.standin, env.standin.layout
    bot_id = standin.bot_user.id
    await env.add_voice(lay.admin_id, "alice", 140.0)
    group = await _join(env)
    bob = await _listener(env, "bob", commits=False)  # only the bot commits: its own commit must carry the group
    voice = standin.voice(lay.guild_id)
    await _say(env, lay.guild_id, lay.admin_id, LONG_MESSAGE)
    await voice.wait_packets(25, timeout=20)
    carol = await _listener(env, "carol", commits=False)
    joined = group.executed()[-1]
    [record] = env.synth.streams
    await env.synth.wait_closed(record, timeout=30)
    await voice.wait_silence(quiet_ms=300, timeout=30)

    assert [t.committer for t in group.executed()] == [bot_id, bot_id]
    assert joined.epoch == 2 and carol.epoch == 2 and bob.epoch == 2
    assert joined.executed_at is not None
    before = [p for p in voice.audio_packets() if p.at < joined.executed_at]
    after = [p for p in voice.audio_packets() if p.at > joined.executed_at]
    assert len(before) >= 25 and len(after) > 10, (len(before), len(after))
    # bob heard every frame, across the epoch change; carol everything sent after the transition
    assert all(p.e2ee for p in voice.audio_packets()) and voice.errors == [] and group.errors == []
    assert all(f.opus is not None for f in bob.frames)
    carol_after = [f for f in carol.frames if f.at > joined.executed_at]
    assert len(carol_after) >= len(after) and all(f.opus is not None for f in carol_after)
    _assert_speech(env, voice, record)
    carol_pcm = carol.pcm()
    assert carol_pcm.shape[0] >= len(after) * FRAME_SAMPLES and np.sqrt(np.mean(_mono(carol_pcm) ** 2)) > 0.01


async def test_dave_member_leaves(env: BotEnv) -> None:
    standin, lay = env.standin, env.standin.layout
    await env.add_voice(lay.admin_id, "alice", 140.0)
    group = await _join(env)
    bob = await _listener(env, "bob")
    carol = await _listener(env, "carol")
    voice = standin.voice(lay.guild_id)
    await _say(env, lay.guild_id, lay.admin_id, LONG_MESSAGE)
    await voice.wait_packets(25, timeout=20)
    executed = len(group.executed())
    await standin.leave_listener(carol)
    await group.wait_for(lambda: len(group.executed()) > executed, GROUP_TIMEOUT_S, "carol removed")
    left = group.executed()[-1]
    [record] = env.synth.streams
    await env.synth.wait_closed(record, timeout=30)
    await voice.wait_silence(quiet_ms=300, timeout=30)

    assert left.epoch == 3 and left.participants == {standin.bot_user.id, bob.user_id}
    assert sorted(group.leaves.values()) == sorted([standin.bot_user.id, bob.user_id])
    assert all(p.e2ee for p in voice.audio_packets()) and voice.errors == [] and group.errors == []
    assert all(f.opus is not None for f in bob.frames)
    _assert_speech(env, voice, record)
    # carol kept her session but cannot open what the bot sent once the group moved on without her
    assert left.executed_at is not None and carol.session is not None
    later = [f for f in bob.frames if f.e2ee and f.at > left.executed_at + 0.1]
    assert len(later) > 5
    for frame in later[:5]:
        with pytest.raises(ValueError):
            carol.session.decrypt(standin.bot_user.id, davey.MediaType.audio, frame.payload)


async def test_dave_downgrade_to_version_0_and_back(env: BotEnv) -> None:
    standin, lay = env.standin, env.standin.layout
    await env.add_voice(lay.admin_id, "alice", 140.0)
    group = await _join(env)
    bob = await _listener(env, "bob")
    voice = standin.voice(lay.guild_id)

    await _speak(env, "First, with everyone on DAVE.")
    assert voice.audio_packets() and all(p.e2ee for p in voice.audio_packets())

    # a client without DAVE joins: the gateway announces a transition to protocol version 0 (op 21, then 22)
    dan = await _listener(env, "dan", dave=False)
    downgrade = group.executed()[-1]
    assert (downgrade.version, downgrade.committer) == (0, None) and group.version == 0
    voice.clear()
    record = await _speak(env, "Then in the clear, for the old client.")
    assert voice.audio_packets() and not any(p.e2ee for p in voice.audio_packets())
    assert len(dan.frames) == len(voice.packets) and all(f.opus is not None for f in dan.frames)
    _assert_speech(env, voice, record)

    # it leaves: op 24 (protocol version 1, epoch 1), a new group, and its transition
    executed = len(group.executed())
    await standin.leave_listener(dan)
    await group.wait_for(lambda: len(group.executed()) > executed, GROUP_TIMEOUT_S, "the upgrade")
    upgrade = group.executed()[-1]
    assert (upgrade.version, upgrade.epoch, group.version) == (1, 1, 1)
    voice.clear()
    bob.frames.clear()
    record = await _speak(env, "And encrypted again once it has gone.")
    assert voice.audio_packets() and all(p.e2ee for p in voice.audio_packets())
    assert voice.errors == [] and group.errors == [] and all(f.opus is not None for f in bob.frames)
    _assert_speech(env, voice, record)


async def test_dave_bot_reconnects_after_the_voice_gateway_drops(env: BotEnv) -> None:
    standin, lay = env.standin, env.standin.layout
    await env.add_voice(lay.admin_id, "alice", 140.0)
    group = await _join(env)
    bob = await _listener(env, "bob")
    voice = standin.voice(lay.guild_id)
    first = standin.voice_connections[lay.guild_id]
    await _say(env, lay.guild_id, lay.admin_id, LONG_MESSAGE)
    await voice.wait_packets(15, timeout=20)

    executed = len(group.executed())
    await standin.disconnect_voice(lay.guild_id, code=4006)  # session no longer valid: discord.py reconnects
    await standin.wait_for(lambda: standin.voice_connections[lay.guild_id] is not first, 10, "a new voice session")
    await group.wait_for(lambda: len(group.executed()) > executed, GROUP_TIMEOUT_S, "the bot back in the group")
    rejoined = group.executed()[-1]
    assert rejoined.epoch == 1 and rejoined.participants == {standin.bot_user.id, bob.user_id}
    [record] = env.synth.streams
    await env.synth.wait_closed(record, timeout=30)
    await voice.wait_silence(quiet_ms=300, timeout=30)
    assert rejoined.executed_at is not None
    after = [p for p in voice.audio_packets() if p.at > rejoined.executed_at + 0.1]
    assert len(after) > 10 and all(p.e2ee and p.pcm for p in after), "the speech went on, encrypted"

    voice.clear()
    bob.frames.clear()
    record = await _speak(env, "Back again after the drop.")
    assert voice.audio_packets() and all(p.e2ee for p in voice.audio_packets())
    assert voice.errors == [] and all(f.opus is not None for f in bob.frames)
    _assert_speech(env, voice, record)


# ---- bad input from the voice gateway ------------------------------------------------------------------------------

async def _unknown_user_proposal(env: BotEnv, group: DaveGroup) -> None:
    """An Add proposal, properly signed by the gateway, for a user who never joined the call."""
    stranger = davey.DaveSession(1, 4242, group.channel_id)
    message, _ = group.sign_proposal(mls.add_proposal(mls.parse_key_package(stranger.get_serialized_key_package())))
    await group.send_raw(env.standin.bot_user.id, 27, bytes([0]) + mls.vector(message))


async def _malformed_proposals(env: BotEnv, group: DaveGroup) -> None:
    """Op 27 whose proposal vector is not an MLSMessage."""
    await group.send_raw(env.standin.bot_user.id, 27, bytes([0]) + b"\x07garbage")


async def _stale_commit(env: BotEnv, group: DaveGroup) -> None:
    """Op 29 with the commit of epoch 0 again, while the group is at epoch 1."""
    await group.send_raw(env.standin.bot_user.id, 29, struct.pack(">H", 77) + group.commits[0].raw)


@pytest.mark.parametrize("inject, resets", [
    (_malformed_proposals, True), (_unknown_user_proposal, False), (_stale_commit, True),
], ids=["malformed-mls", "unknown-user", "stale-epoch-commit"])
async def test_dave_bad_input_from_the_gateway(
    env: BotEnv, inject: Callable[[BotEnv, DaveGroup], Awaitable[None]], resets: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    standin, lay = env.standin, env.standin.layout
    await env.add_voice(lay.admin_id, "alice", 140.0)
    group = await _join(env)
    bob = await _listener(env, "bob")
    voice = standin.voice(lay.guild_id)
    await _say(env, lay.guild_id, lay.admin_id, LONG_MESSAGE)
    await voice.wait_packets(15, timeout=20)
    executed = len(group.executed())
    with caplog.at_level(logging.WARNING, logger="bot.dave_voice"):
        await inject(env, group)
        if resets:  # op 31 and a new key package: the gateway removes and re-adds the bot in one commit
            await group.wait_for(lambda: len(group.executed()) > executed, GROUP_TIMEOUT_S, "the bot re-added")
        [record] = env.synth.streams
        await env.synth.wait_closed(record, timeout=30)
        await voice.wait_silence(quiet_ms=300, timeout=30)
    warnings = [r.getMessage() for r in caplog.records if r.name == "bot.dave_voice"]
    assert len(warnings) == 1, warnings
    assert _bot_voice_poller_alive(env), "the bot stopped reading its voice WebSocket"
    assert record.completed and voice.errors == []
    assert group.epoch == (2 if resets else 1)

    voice.clear()
    bob.frames.clear()
    record = await _speak(env, "Still speaking, and still encrypted.")
    assert voice.audio_packets() and all(p.e2ee for p in voice.audio_packets())
    assert voice.errors == [] and all(f.opus is not None for f in bob.frames)
    _assert_speech(env, voice, record)
