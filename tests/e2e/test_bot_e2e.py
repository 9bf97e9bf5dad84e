"""The real bot against the local Discord stand-in, with the tiny real models: commands, cloning, speech over RTP.

Everything the bot does is observed where Discord would see it: the stand-in records each REST call and interaction
reply, and receives the bot's voice UDP, decrypts each RTP packet and Opus-decodes it. The text the synthesizer was
given and when each sentence was ready come from the observing wrapper in ``conftest.py``.
Run with ``-s`` to see the measured interaction -> first RTP packet times.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import soxr

from cogs.voices import CONSENT_LABEL
from tests.audio_samples import speech_like_wav
from tests.e2e.conftest import CHAT_REPLY, COMMANDS, BotEnv
from tests.standin.model import EPHEMERAL
from tests.standin.voice_udp import FRAME_SAMPLES, SAMPLE_RATE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

FRAME_S = FRAME_SAMPLES / SAMPLE_RATE  # 0.02 s per RTP packet
MB = 1024 * 1024  # bytes
THREE_SENTENCES = (
    "The little boat left the harbour early. Gulls followed it out past the lighthouse. "
    "By noon the crew could see the island."
)
LONG_MESSAGE = " ".join(
    f"This is sentence number {n} of a long story that keeps going." for n in
    ("one", "two", "three", "four", "five", "six", "seven", "eight")
)
OPUS_DELAY_MAX = 2 * FRAME_SAMPLES  # samples of codec delay searched when lining decoded audio up with a reference
ENVELOPE_SAMPLES = SAMPLE_RATE // 100  # 10 ms windows of the loudness envelope
# The tiny random-weight models make noise-like audio (spectral centroid ~8 kHz); through Opus at discord.py's
# 128 kb/s its waveform keeps a correlation of ~0.74 with the input, while its loudness envelope keeps ~0.999.
# Another voice saying the same text scores ~0.22 and ~0.84.
MIN_WAVEFORM_CORRELATION = 0.6
MIN_ENVELOPE_CORRELATION = 0.97


def _followup(r: Any) -> bool:
    """A reply that is a followup message."""
    return r.kind == "followup"


def _mono(pcm: np.ndarray) -> np.ndarray:
    """``[N, 2]`` int16 -> ``[N]`` float64 in [-1, 1] (the bot sends the same signal on both channels)."""
    return pcm[:, 0].astype(np.float64) / 32767.0


def _best_lag(decoded: np.ndarray, reference: np.ndarray) -> int:
    """The lag (0..OPUS_DELAY_MAX samples of ``decoded``) at which the two signals line up best."""
    n = min(decoded.size, reference.size + OPUS_DELAY_MAX)
    size = 1 << int(np.ceil(np.log2(2 * n)))
    spectrum = np.fft.rfft(decoded[:n], size) * np.conj(np.fft.rfft(reference[:n], size))
    return int(np.argmax(np.fft.irfft(spectrum, size)[: OPUS_DELAY_MAX + 1]))


def _correlation(decoded: np.ndarray, reference: np.ndarray) -> float:
    """Normalised correlation of the waveforms, lined up at the best lag."""
    lag = _best_lag(decoded, reference)
    n = min(decoded.size - lag, reference.size)
    a, b = decoded[lag : lag + n], reference[:n]
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def _envelope_correlation(decoded: np.ndarray, reference: np.ndarray) -> float:
    """Correlation of the 10 ms RMS envelopes, lined up at the best lag (what a lossy codec keeps best)."""
    lag = _best_lag(decoded, reference)

    def envelope(x: np.ndarray) -> np.ndarray:
        n = x.size // ENVELOPE_SAMPLES
        return np.sqrt(np.mean(x[: n * ENVELOPE_SAMPLES].reshape(n, ENVELOPE_SAMPLES) ** 2, axis=1))

    a, b = envelope(decoded[lag:]), envelope(reference)
    n = min(a.size, b.size)
    return float(np.corrcoef(a[:n], b[:n])[0, 1])


def _to_48k(audio: np.ndarray, rate: int) -> np.ndarray:
    """``[N]`` float32 @ ``rate`` -> float64 @ 48 kHz."""
    return soxr.resample(audio.astype(np.float32), rate, SAMPLE_RATE).astype(np.float64)


async def _say(env: BotEnv, guild_id: int, user_id: int, text: str) -> int:
    """/say ``text`` and wait for the acknowledgement; returns the interaction id."""
    iid = await env.standin.invoke_slash(guild_id, user_id, "say", {"text": text})
    ack = await env.standin.wait_reply(iid, _followup, timeout=15)
    assert ack.content == "Speaking." and ack.ephemeral, ack.content
    return iid


# ---- commands ------------------------------------------------------------------------------------------------------

async def test_slash_commands_round_trip(env: BotEnv) -> None:
    standin, lay = env.standin, env.standin.layout
    assert {key[1] for key in standin.commands} == set(COMMANDS)
    voice_cmd = next(c for k, c in standin.commands.items() if k[1] == "voice")
    assert {o["name"] for o in voice_cmd["options"]} >= {"enroll", "clone", "use", "preview", "list", "delete"}

    # a plain ephemeral reply (response type 4)
    iid = await standin.invoke_slash(lay.guild_id, lay.member_id, "voice", {"language": "en"}, subcommand="enroll")
    reply = await standin.wait_reply(iid)
    assert (reply.kind, reply.type, reply.ephemeral) == ("callback", 4, True)
    assert reply.content is not None and reply.content.startswith("Record yourself reading this sentence")

    # a refusal before any work: ephemeral, says what to do
    iid = await standin.invoke_slash(lay.guild_id, lay.member_id, "join")
    reply = await standin.wait_reply(iid)
    assert (reply.type, reply.ephemeral) == (4, True)
    assert reply.content == "Join a voice channel first, then run /join again."

    # a refusal after a deferral: the followup replaces the "thinking" message, still ephemeral
    iid = await standin.invoke_slash(lay.guild_id, lay.member_id, "say", {"text": "hello there"})
    refusal = await standin.wait_reply(iid, _followup)
    first = standin.replies_for(iid)[0]
    assert (first.type, first.ephemeral) == (5, True)
    assert refusal.ephemeral and refusal.content == "Join a voice channel first: I only read members who are in it"
    assert env.synth.streams == []

    # a deferral and a followup that reports success
    iid = await standin.invoke_slash(lay.guild_id, lay.admin_id, "join")
    joined = await standin.wait_reply(iid, _followup, timeout=10)
    assert joined.ephemeral and joined.content == (
        f"Joined <#{lay.voice_channel_id}>. Use /say, or write in the auto-read channel."
    )
    assert standin.bot_voice_channel(lay.guild_id) == lay.voice_channel_id
    assert standin.voice_connections[lay.guild_id].secret_key is not None

    # a permission check of discord.py's, translated by the cog's error handler
    iid = await standin.invoke_slash(lay.guild_id, lay.member_id, "set", {"setting": "autojoin", "value": "true"},
                                     subcommand="guild")
    reply = await standin.wait_reply(iid)
    assert (reply.ephemeral, reply.content) == (True, "You need the Manage Server permission to do that.")
    assert (await env.store.guild_settings(lay.guild_id))["autojoin"] is False

    iid = await standin.invoke_slash(lay.guild_id, lay.admin_id, "skip")
    assert (await standin.wait_reply(iid)).content == "Nothing is being spoken right now."
    assert all(r.status < 400 for r in standin.requests), [(r.method, r.path, r.status) for r in standin.requests]


async def test_voice_clone_needs_consent_and_refuses_bad_files(env: BotEnv) -> None:
    standin, lay = env.standin, env.standin.layout
    voices = env.synth.real.voices

    async def refused(name: str, data: bytes, content_type: str) -> str:
        attachment = standin.add_attachment(name, data, content_type)
        iid = await standin.invoke_slash(lay.guild_id, lay.admin_id, "voice", {"clip": attachment, "name": "mine"},
                                         subcommand="clone")
        reply = await standin.wait_reply(iid)
        assert (reply.type, reply.ephemeral) == (4, True)
        assert not (reply.message or {}).get("components"), "a refusal must not offer the consent buttons"
        return reply.content or ""

    text = await refused("notes.txt", b"just some text, not a recording\n" * 10, "text/plain")
    assert text.startswith("`notes.txt` (text/plain) is not a recording; upload an audio file"), text
    text = await refused("huge.wav", bytes(26 * MB), "audio/wav")
    assert text.startswith("That file is 26.0 MB; the limit is 25 MB."), text
    assert voices.list(owner_id=lay.admin_id) == []

    clip = speech_like_wav(4.0, 150.0, 3)
    attachment = standin.add_attachment("me.wav", clip, "audio/wav")
    iid = await standin.invoke_slash(lay.guild_id, lay.admin_id, "voice", {"clip": attachment, "name": "Alice Voice"},
                                     subcommand="clone")
    ask = await standin.wait_reply(iid)
    assert (ask.type, ask.ephemeral) == (4, True)
    assert ask.content is not None and "Nothing is downloaded until you agree." in ask.content
    buttons = [b for row in ask.message["components"] for b in row["components"]]
    consent = next(b for b in buttons if b.get("label") == CONSENT_LABEL)
    await asyncio.sleep(0.2)
    assert voices.list(owner_id=lay.admin_id) == [], "a voice was stored before consent"

    click = await standin.click_button(ask.message, consent["custom_id"], lay.admin_id)
    assert (await standin.wait_reply(click)).type == 7
    done = await standin.wait_reply(iid, lambda r: r.kind == "edit_original" and "is ready" in (r.content or ""),
                                    timeout=20)
    assert done.content.startswith("**Alice Voice** is ready as your voice."), done.content
    [voice] = voices.list(owner_id=lay.admin_id)
    assert voice.name == "Alice Voice"
    record = await env.services.voices.consent(voice.id)  # kept once, with the voice
    assert record["user_id"] == lay.admin_id and record["text"].startswith("I confirm this recording is my own voice")
    assert await env.store.voice_journal() == []  # its creation committed
    assert (await env.store.user_settings(lay.admin_id, lay.guild_id))["voice"] == voice.id


# ---- speech ------------------------------------------------------------------------------------------------------

async def test_say_three_sentences_over_rtp(env: BotEnv) -> None:
    standin, lay = env.standin, env.standin.layout
    await env.add_voice(lay.admin_id, "alice", 140.0)
    voice = standin.voice(lay.guild_id)
    # the synthesis hands its second chunk over only once the first RTP packet has reached Discord: a bot that
    # waited for more than the first chunk before playing would never get it (the hold gives up, held is False)
    env.synth.hold = lambda: bool(voice.packets)
    iid = await _say(env, lay.guild_id, lay.admin_id, THREE_SENTENCES)
    first = await voice.wait_first_packet(timeout=15)
    [record] = await env.synth.wait_streams(1)
    await env.synth.wait_closed(record, 30)
    await voice.wait_silence(quiet_ms=300, timeout=15)

    assert record.text == THREE_SENTENCES and record.completed
    assert record.sentences == [
        "The little boat left the harbour early.", "Gulls followed it out past the lighthouse.",
        "By noon the crew could see the island.",
    ]
    assert voice.errors == []
    last_sentence_at = record.chunks[-1][0]
    ttfp_ms = 1000 * (first.at - standin.interactions[iid].created_at)
    print(f"\n/say (joining voice): interaction -> first RTP packet {ttfp_ms:.0f} ms; "
          f"first packet {1000 * (last_sentence_at - first.at):.0f} ms before the last sentence was synthesized")
    assert record.held, "playback should start with the first chunk, before the rest is synthesized"

    speaker = env.speech.speaker(lay.guild_id)
    decoded = voice.pcm(skip_silence=True)  # [N, 2] int16 @ 48 kHz
    decoded_s = decoded.shape[0] / SAMPLE_RATE
    underrun_s = speaker.underrun_frames * FRAME_S  # silence the player inserted while synthesis lagged
    print(f"/say: {decoded_s:.3f} s decoded, {record.seconds:.3f} s synthesized, {speaker.underrun_frames} underrun "
          "frames")
    assert np.sqrt(np.mean(_mono(decoded) ** 2)) > 0.01, "the decoded audio is silent"
    assert abs(decoded_s - underrun_s - record.seconds) <= FRAME_S, (decoded_s, underrun_s, record.seconds)
    if speaker.underrun_frames == 0:  # then the decoded audio lines up with the synthesized one throughout
        reference = _to_48k(record.audio, 32000)
        assert _correlation(_mono(decoded), reference) > MIN_WAVEFORM_CORRELATION
        assert _envelope_correlation(_mono(decoded), reference) > MIN_ENVELOPE_CORRELATION
    packets = voice.packets
    assert len({p.ssrc for p in packets}) == 1
    assert [(b.seq - a.seq) % 65536 for a, b in zip(packets, packets[1:])] == [1] * (len(packets) - 1)

    # the bot is in voice now: the same measurement without the join
    voice.clear()
    iid = await _say(env, lay.guild_id, lay.admin_id, "Once more with feeling. And then we stop.")
    first = await voice.wait_first_packet(timeout=15)
    print(f"/say (already in voice): interaction -> first RTP packet "
          f"{1000 * (first.at - standin.interactions[iid].created_at):.0f} ms")
    again = (await env.synth.wait_streams(2))[1]
    await env.synth.wait_closed(again, 30)  # a pause in speech on a loaded machine is no end of it
    await voice.wait_silence(quiet_ms=300, timeout=15)


async def _autoread_setup(env: BotEnv) -> None:
    """A voice for alice, the auto-read channel set to #general with /set guild, the bot in alice's channel."""
    standin, lay = env.standin, env.standin.layout
    await env.add_voice(lay.admin_id, "alice", 140.0)
    iid = await standin.invoke_slash(lay.guild_id, lay.admin_id, "set",
                                     {"setting": "autoread_channel", "value": "general"}, subcommand="guild")
    assert (await standin.wait_reply(iid)).content == f"`autoread_channel` is now <#{lay.text_channel_id}>."
    iid = await standin.invoke_slash(lay.guild_id, lay.admin_id, "join")
    await standin.wait_reply(iid, _followup, timeout=10)


async def test_autoread_applies_the_text_rules(env: BotEnv) -> None:
    standin, lay = env.standin, env.standin.layout
    await _autoread_setup(env)
    carol = await standin.add_member(lay.guild_id, "carol")
    await standin.move_member(carol, lay.voice_channel_id)  # in voice, so the bot's member cache knows her

    await standin.send_message(
        lay.text_channel_id, lay.admin_id,
        f"Hey <@{carol}>, look at https://example.com/x ||the ending|| **right now**, it is soooooo good!!!!!! "
        "`code`",
    )
    [record] = await env.synth.wait_streams(1)
    assert record.text == "Hey carol, look at a link spoiler right now, it is sooo good!!!"
    voice = standin.voice(lay.guild_id)
    await voice.wait_first_packet(timeout=15)
    await env.synth.wait_closed(record, 30)  # a pause in speech on a loaded machine is no end of it
    await voice.wait_silence(quiet_ms=300, timeout=15)
    assert voice.errors == [] and len(voice.audio_packets()) > 10

    await standin.send_message(lay.text_channel_id, lay.admin_id, "🎉🎉 !!! ``nothing to read``")
    await standin.send_message(lay.text_channel_id, lay.member_id, "bob is not in voice, so this is not read.")
    await standin.send_message(lay.text_channel_id, lay.admin_id, "Second message\nwith a line break")
    await env.synth.wait_streams(2)
    await asyncio.sleep(0.2)
    assert [r.text for r in env.synth.streams] == [record.text, "Second message. with a line break"]


async def test_autoread_names_a_mentioned_member_outside_voice(env: BotEnv) -> None:
    standin, lay = env.standin, env.standin.layout
    await _autoread_setup(env)
    await standin.send_message(lay.text_channel_id, lay.admin_id, f"Thanks <@{lay.member_id}>!")
    [record] = await env.synth.wait_streams(1)
    assert record.text == "Thanks bob!"


async def test_skip_stops_packets_at_once(env: BotEnv) -> None:
    standin, lay = env.standin, env.standin.layout
    await env.add_voice(lay.admin_id, "alice", 140.0)
    await _say(env, lay.guild_id, lay.admin_id, LONG_MESSAGE)
    voice = standin.voice(lay.guild_id)
    await voice.wait_packets(15, timeout=15)
    [record] = env.synth.streams

    speaker = env.speech.speaker(lay.guild_id)
    at_skip: dict[str, Any] = {}
    skip = speaker.skip

    def observed_skip() -> bool:
        source = speaker._source  # white-box: the playing item's audio source, to count what it hands out
        stopped = skip()
        at_skip.update(source=source, frames=source.frames_real + source.frames_silence if source else None)
        return stopped

    speaker.skip = observed_skip  # type: ignore[method-assign]
    iid = await standin.invoke_slash(lay.guild_id, lay.admin_id, "skip")
    skipped_at = standin.interactions[iid].created_at
    assert (await standin.wait_reply(iid)).content == "Skipped."
    await voice.wait_silence(quiet_ms=300, timeout=5)
    await env.synth.wait_closed(record, timeout=5)

    audio = voice.audio_packets()
    source = at_skip["source"]
    print(f"\n/skip: last audio packet {1000 * (audio[-1].at - skipped_at):+.0f} ms from the interaction; "
          f"{len(audio) * FRAME_S:.2f} s played of a {len(LONG_MESSAGE.split('. '))}-sentence message")
    # not one frame was read from the source after skip(), and Discord got no audio beyond what had been read
    assert source is not None and source.frames_real + source.frames_silence == at_skip["frames"]
    assert len(audio) <= at_skip["frames"], (len(audio), at_skip["frames"])
    # the synthesis was stopped early: the stream was closed before its end, sentences short of the message's 8
    assert not record.completed and len(record.sentences) < len(LONG_MESSAGE.split(". "))
    assert voice.packets[-1].is_silence  # discord.py's end-of-speech frames follow
    assert not speaker.current


@pytest.mark.parametrize("standin", [2], indirect=True)
async def test_two_guilds_speak_at_once_in_their_own_voices(env: BotEnv) -> None:
    standin = env.standin
    one, two = standin.layouts
    voice_one = await env.add_voice(one.admin_id, "alice", 120.0, seed=1)
    voice_two = await env.add_voice(two.admin_id, "alice", 240.0, seed=2)
    text = "Two servers are talking right now. Each one hears its own voice."

    solo: dict[int, np.ndarray] = {}
    for lay in (one, two):
        await _say(env, lay.guild_id, lay.admin_id, text)
        rec = standin.voice(lay.guild_id)
        await rec.wait_first_packet(timeout=15)
        await env.synth.wait_closed(env.synth.streams[-1], 30)  # (a pause in speech on a loaded machine is no end)
        await rec.wait_silence(quiet_ms=300, timeout=15)
        solo[lay.guild_id] = _mono(rec.pcm(skip_silence=True))
        rec.clear()
    assert [r.voice for r in env.synth.streams] == [voice_one, voice_two]

    await env.synth.real.cache.drain()  # (the writes are queued: all of them in before the removal)
    for v in (voice_one, voice_two):  # synthesize afresh, concurrently (no cached audio)
        env.synth.real.cache.store.invalidate_voice(v.id)
    env.synth.hold = lambda: len(env.synth.streams) >= 4  # each holds its second chunk until both have started
    await asyncio.gather(*(_say(env, lay.guild_id, lay.admin_id, text) for lay in (one, two)))
    for record in (await env.synth.wait_streams(4))[2:]:
        await env.synth.wait_closed(record, 30)
    for lay in (one, two):
        await standin.voice(lay.guild_id).wait_silence(quiet_ms=300, timeout=15)
    concurrent = {lay.guild_id: _mono(standin.voice(lay.guild_id).pcm(skip_silence=True)) for lay in (one, two)}
    both = env.synth.streams[2:]
    assert sorted(r.voice.id for r in both) == sorted([voice_one.id, voice_two.id])
    assert all(r.chunks[0][1].timings["audio_hit"] == 0.0 for r in both)
    assert all(r.held for r in both), "the two syntheses should have run at the same time"

    own = {g: _correlation(concurrent[g], solo[g]) for g in concurrent}
    crossed = {g: _correlation(concurrent[g], solo[h]) for g, h in ((one.guild_id, two.guild_id),
                                                                   (two.guild_id, one.guild_id))}
    print(f"\ntwo guilds: correlation with own solo run {own}, with the other guild's {crossed}")
    for g in concurrent:
        assert own[g] > 0.95 and crossed[g] < own[g] - 0.2, (own, crossed)


# ---- the chat model ------------------------------------------------------------------------------------------------

async def test_ask_speaks_before_the_chat_model_finishes(env: BotEnv) -> None:
    standin, lay = env.standin, env.standin.layout
    await env.add_voice(lay.admin_id, "alice", 140.0)
    join = await standin.invoke_slash(lay.guild_id, lay.admin_id, "join")
    await standin.wait_reply(join, _followup, timeout=10)
    model = env.chat_model
    model.pace()
    model.allow(len(model.pieces) - 2)  # everything but the last word; that one waits for the first RTP packet
    iid = await standin.invoke_slash(lay.guild_id, lay.admin_id, "ask", {"text": "What is the weather like?"},
                                     subcommand="prompt")
    voice = standin.voice(lay.guild_id)
    first = await voice.wait_first_packet(timeout=15)
    # the bot spoke while the model was still writing: its last word had not been sent yet (it waits for this)
    assert model.sent < len(model.pieces) and not model.finished
    model.allow()
    await standin.wait_for(lambda: model.finished_at is not None, 10, "the chat model finished")
    asked_at = standin.interactions[iid].created_at
    assert model.first_piece_at is not None
    print(f"\n/ask: interaction -> first RTP packet {1000 * (first.at - asked_at):.0f} ms (the model's first piece "
          f"came at {1000 * (model.first_piece_at - asked_at):.0f} ms)")
    assert model.requests[0]["messages"][-1] == {"role": "user", "content": "What is the weather like?"}

    [record] = await env.synth.wait_streams(1)
    await env.synth.wait_closed(record, 30)
    assert record.streamed and record.text.strip() == CHAT_REPLY
    assert record.sentences == [  # cut5 also cuts at commas, streamed or not
        "Sure,", "here is a short answer for you.", "The weather today looks calm and mild.",
        "Take a light jacket when you go out tonight.",
    ]
    final = await standin.wait_reply(iid, lambda r: r.kind == "edit_original" and CHAT_REPLY in (r.content or ""),
                                     timeout=10)
    assert final.content == f"> What is the weather like?\n{CHAT_REPLY}"
    assert not final.message["flags"] & EPHEMERAL
    await voice.wait_silence(quiet_ms=300, timeout=15)
