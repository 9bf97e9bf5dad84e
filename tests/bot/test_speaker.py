"""bot.speaker.GuildSpeaker and bot.speech.SpeechService against a fake synthesizer and a fake voice client.

The fake synthesizer yields sine chunks whose frequency identifies the voice; the fake voice client reads the source
on its own thread every 20 ms, as discord.py's AudioPlayer does, and keeps every frame, so the tests measure the
audio that would have gone out: its frequency, its length, when it stopped.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

import numpy as np
import pytest

from bot.audio_source import FRAME_BYTES, SILENCE_FRAME
from bot.config import Config, DiscordConfig
from bot.speaker import GuildSpeaker, NotInVoice, QueueFull, SpeechItem
from bot.speech import NothingToSay, NoVoice, SpeechRefused, SpeechService
from bot.store import Store
from bot.voice_service import VoiceService
from engines.base import SpeechError
from synthesis.types import AudioChunk, SynthesisParams, Voice
from tests.fake_voices import FakeVoices, make_voice

SR = 32000
G1, G2 = 100000000000000001, 100000000000000002
ALICE, BOB, CAROL, ME, OTHER_BOT = (200000000000000001, 200000000000000002, 200000000000000003,
                                   900000000000000001, 300000000000000001)


# --- fakes ----------------------------------------------------------------------------------------------------------


def _voice(vid: str, owner: int, freq: float) -> Voice:
    return make_voice(vid, owner, voice_id=vid, model_id=f"{freq:g}")  # the fake synthesizer reads the tone here


@dataclass
class Call:
    text: str
    voice: Voice
    params: SynthesisParams | None
    deadline: float | None = None
    closed: float | None = None  # monotonic time the stream's finally ran
    chunks: int = 0
    held: bool = False  # the stream waited for FakeSynth.hold before its second chunk


HOLD_GUARD_S = 10.0  # a held stream gives up waiting after this long (the test then fails on ``held``), never hangs


class FakeSynth:
    """Yields ``sentence_s`` of a sine per sentence (split on '.'), in ``chunk_s`` pieces, ``delay_s`` apart.

    ``hold``: a condition the stream waits for after its first chunk, so a test can order events ("the first frame
    went out before the synthesis went on") instead of timing them.
    """

    def __init__(self, voices: list[Voice], *, sentence_s: float = 0.2, chunk_s: float = 0.1, delay_s: float = 0.0,
                 fail_after: int | None = None, hold: Any = None) -> None:
        self.voices = FakeVoices(voices)
        self.busy = False  # SpeechBackend.busy: True as when every admission place is taken
        self.sentence_s, self.chunk_s, self.delay_s = sentence_s, chunk_s, delay_s
        self.fail_after = fail_after
        self.hold = hold
        self.calls: list[Call] = []

    async def stream(self, text: str | AsyncIterator[str], voice: Voice | str,
                     params: SynthesisParams | None = None, *, deadline: float | None = None
                     ) -> AsyncIterator[AudioChunk]:
        v = voice if isinstance(voice, Voice) else self.voices.get(voice)
        if not isinstance(text, str):
            text = "".join([p async for p in text])
        call = Call(text, v, params, deadline)
        self.calls.append(call)
        freq = float(v.model_id)
        sentences = [s for s in text.split(".") if s.strip()] or [text]
        phase = 0
        try:
            for i, sentence in enumerate(sentences):
                n = int(self.sentence_s * SR)
                step = int(self.chunk_s * SR)
                for start in range(0, n, step):
                    if self.fail_after is not None and call.chunks >= self.fail_after:
                        raise SpeechError("the model ran out of patience")
                    await asyncio.sleep(self.delay_s)
                    if self.hold is not None and call.chunks == 1:
                        end = time.monotonic() + HOLD_GUARD_S
                        while not self.hold() and time.monotonic() < end:
                            await asyncio.sleep(0.005)
                        call.held = bool(self.hold())
                    t = (phase + np.arange(min(step, n - start))) / SR
                    phase += len(t)
                    call.chunks += 1
                    yield AudioChunk((0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32), sentence, i)
        finally:
            call.closed = time.monotonic()


class FakeVoiceClient:
    """discord.VoiceClient's playing surface; the player thread reads a frame every 20 ms."""

    def __init__(self, channel: FakeChannel) -> None:
        self.channel = channel
        self.connected = True
        self.frames: list[tuple[float, bytes]] = []  # (monotonic time, frame) of real and silent frames sent
        self.disconnects = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def play(self, source: Any, *, after: Any = None) -> None:
        if not self.connected:
            raise RuntimeError("Not connected to voice.")
        if self.is_playing():
            raise RuntimeError("Already playing audio.")
        self._stop = threading.Event()
        stop = self._stop

        def run() -> None:
            start, loops = time.perf_counter(), 0
            try:
                while not stop.is_set():
                    data = source.read()
                    if not data:
                        break
                    if not self.connected:  # discord.py waits for a reconnect, then gives up: the frame is lost
                        break
                    assert len(data) == FRAME_BYTES
                    self.frames.append((time.monotonic(), data))
                    loops += 1
                    time.sleep(max(0.0, start + 0.02 * loops - time.perf_counter()))
            finally:
                if after is not None:
                    after(None)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def is_playing(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    def is_connected(self) -> bool:
        return self.connected

    async def move_to(self, channel: FakeChannel) -> None:
        self.channel = channel

    async def disconnect(self, *, force: bool = False) -> None:
        self.stop()
        self.connected = False
        self.disconnects += 1

    # test controls
    def drop(self) -> None:
        self.connected = False

    def audio(self) -> np.ndarray:
        pcm = np.frombuffer(b"".join(f for _, f in self.frames if f != SILENCE_FRAME), "<i2").reshape(-1, 2)
        return pcm[:, 0].astype(np.float32) / 32767.0

    def real_frames(self) -> list[float]:
        return [t for t, f in self.frames if f != SILENCE_FRAME]


@dataclass
class Member:
    id: int
    display_name: str
    bot: bool = False
    roles: list[Any] = field(default_factory=list)
    voice: Any = None
    guild: Any = None
    guild_permissions: Any = None


@dataclass
class FakeChannel:
    id: int
    name: str = "Voice"
    members: list[Member] = field(default_factory=list)
    guild: Any = None
    clients: list[FakeVoiceClient] = field(default_factory=list)
    fail_connect: bool = False

    async def connect(self, *, timeout: float, reconnect: bool, self_deaf: bool, cls: Any = None) -> FakeVoiceClient:
        await asyncio.sleep(0.005)
        if self.fail_connect:
            raise RuntimeError("Missing Permissions")
        vc = FakeVoiceClient(self)
        self.clients.append(vc)
        return vc


def _dominant_hz(x: np.ndarray, rate: int = 48000) -> float:
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spec)) * rate / len(x)


async def _until(cond: Any, timeout: float = 3.0, step: float = 0.005) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(step)


async def _drain(spk: GuildSpeaker, timeout: float = 5.0) -> None:
    await _until(lambda: spk.current is None and not spk.queued, timeout)


def _speaker(synth: FakeSynth, **kw: Any) -> tuple[GuildSpeaker, list[str]]:
    errors: list[str] = []
    kw.setdefault("reconnect_wait_s", 0.1)
    spk = GuildSpeaker(G1, synth, on_error=lambda gid, msg: errors.append(msg), **kw)
    return spk, errors


V300 = _voice("v300", ALICE, 300.0)
V700 = _voice("v700", BOB, 700.0)


# --- GuildSpeaker -----------------------------------------------------------------------------------------------------


async def test_speaks_an_item_with_its_voice_and_starts_with_the_first_chunk() -> None:
    channel = FakeChannel(1)
    # the stream makes its second chunk only once the first frame has gone out: a speaker that waited for more than
    # the first chunk before playing would never see the rest (the hold gives up, ``held`` stays False)
    synth = FakeSynth([V300], sentence_s=0.3, chunk_s=0.1,
                      hold=lambda: bool(channel.clients and channel.clients[0].real_frames()))
    spk, errors = _speaker(synth)
    await spk.join(channel)
    assert spk.enqueue(SpeechItem("Hello there. General Kenobi.", V300)) == 0
    await _until(lambda: spk.items_spoken == 1)
    vc = channel.clients[0]
    audio = vc.audio()
    assert len(audio) == pytest.approx(0.6 * 48000, abs=960)  # two 0.3 s sentences, within a frame
    assert _dominant_hz(audio) == pytest.approx(300.0, abs=3)
    assert synth.calls[0].held and synth.calls[0].chunks == 6  # playback began after the first of 6 chunks
    assert spk.last_ttfa_s is not None  # measured (how fast is for the benchmark to say)
    assert errors == []
    await spk.close()


def _tones(frames: list[tuple[float, bytes]]) -> list[int]:
    """The tone of each real (non-silent) 20 ms frame, to the nearest 100 Hz (the fake voices are 300 and 700)."""
    out = []
    for _, f in frames:
        if f != SILENCE_FRAME:
            left = np.frombuffer(f, "<i2").reshape(-1, 2)[:, 0].astype(np.float32)
            out.append(int(round(_dominant_hz(left) / 100.0)) * 100)
    return out


async def test_skip_stops_audio_and_synthesis_at_once() -> None:
    synth = FakeSynth([V300, V700], sentence_s=5.0, chunk_s=0.1, delay_s=0.02)
    spk, _ = _speaker(synth)
    channel = FakeChannel(1)
    await spk.join(channel)
    spk.enqueue(SpeechItem("A very long message.", V300))
    spk.enqueue(SpeechItem("Next.", V700))
    vc = channel.clients[0]
    await _until(lambda: len(vc.real_frames()) >= 10)
    chunks_before = synth.calls[0].chunks
    assert spk.skip() is True
    frames_before = len(vc.frames)  # from here on every read returns b"", save one the player thread had begun
    await _until(lambda: synth.calls[0].closed is not None, timeout=3.0)
    # aclose reached the model work: at most the chunk being made when skip() ran came after it (of 50)
    assert synth.calls[0].chunks <= chunks_before + 1, (chunks_before, synth.calls[0].chunks)
    await _until(lambda: len(synth.calls) == 2)  # the queue moves on
    await _until(lambda: _tones(vc.frames[frames_before:]).count(700) >= 15)  # the next item is playing
    after = _tones(vc.frames[frames_before:])
    # no audio of the skipped item after skip(), but the one frame the player thread may have been reading
    assert after[:1] in ([300], [700]) and after[1:] == [700] * (len(after) - 1), after
    await spk.close()


async def test_queue_bound_clear_and_stop() -> None:
    synth = FakeSynth([V300], sentence_s=2.0, delay_s=0.01)
    spk, _ = _speaker(synth, queue_size=2)
    await spk.join(FakeChannel(1))
    spk.enqueue(SpeechItem("one.", V300))
    await _until(lambda: spk.current is not None)
    assert spk.enqueue(SpeechItem("two.", V300)) == 1
    assert spk.enqueue(SpeechItem("three.", V300)) == 2
    with pytest.raises(QueueFull, match=r"queue is full \(2 messages waiting\).*/clear"):
        spk.enqueue(SpeechItem("four.", V300))
    assert spk.clear() == 2
    assert spk.queued == []
    spk.enqueue(SpeechItem("five.", V300))
    assert spk.stop() == 2  # the queued one and the current one
    await _drain(spk)
    assert [c.text for c in synth.calls] == ["one."]
    await spk.close()


async def test_two_guilds_speak_at_once_with_their_own_audio() -> None:
    synth = FakeSynth([V300, V700], sentence_s=0.6, chunk_s=0.1, delay_s=0.01)
    a = GuildSpeaker(G1, synth)
    b = GuildSpeaker(G2, synth)
    ca, cb = FakeChannel(1), FakeChannel(2)
    await asyncio.gather(a.join(ca), b.join(cb))
    a.enqueue(SpeechItem("guild one.", V300))
    b.enqueue(SpeechItem("guild two.", V700))
    await _until(lambda: a.items_spoken == 1 and b.items_spoken == 1)
    va, vb = ca.clients[0], cb.clients[0]
    assert _dominant_hz(va.audio()) == pytest.approx(300.0, abs=3)
    assert _dominant_hz(vb.audio()) == pytest.approx(700.0, abs=3)
    ta, tb = va.real_frames(), vb.real_frames()
    assert max(ta[0], tb[0]) < min(ta[-1], tb[-1])  # the two played at the same time
    await asyncio.gather(a.close(), b.close())


async def test_idle_disconnect() -> None:
    synth = FakeSynth([V300], sentence_s=0.1)
    spk, errors = _speaker(synth, idle_disconnect_s=0.3)
    channel = FakeChannel(1)
    await spk.join(channel)
    spk.enqueue(SpeechItem("hi.", V300))
    await _until(lambda: spk.items_spoken == 1)
    await _until(lambda: channel.clients[0].disconnects == 1, timeout=2.0)
    assert spk.voice_client is None and spk.channel is None
    spk.enqueue(SpeechItem("hello?", V300))  # nothing to reconnect to: the item fails with the fix
    await _until(lambda: bool(errors))
    assert errors == ["I could not read a message: I'm not in a voice channel: join one and use /join"]
    assert len(channel.clients) == 1
    await spk.close()


async def test_stays_until_the_idle_time_has_passed() -> None:
    synth = FakeSynth([V300], sentence_s=0.1)
    spk, errors = _speaker(synth, idle_disconnect_s=600.0)
    channel = FakeChannel(1)
    await spk.join(channel)
    spk.enqueue(SpeechItem("hi.", V300))
    await _until(lambda: spk.items_spoken == 1)
    await asyncio.sleep(0.3)  # as long as test_idle_disconnect's speaker (0.3 s idle time) waits before it leaves
    spk.enqueue(SpeechItem("again.", V300))
    await _until(lambda: spk.items_spoken == 2)
    assert len(channel.clients) == 1 and channel.clients[0].disconnects == 0 and errors == []
    await spk.close()


async def test_leaves_when_alone_and_stays_with_company() -> None:
    synth = FakeSynth([V300])
    spk, _ = _speaker(synth, alone_disconnect_s=0.1)
    human = Member(ALICE, "Alice")
    channel = FakeChannel(1, members=[Member(ME, "bot", bot=True), human])
    await spk.join(channel)
    spk.check_alone()
    await asyncio.sleep(0.2)
    assert spk.is_connected
    channel.members.remove(human)
    spk.check_alone()
    spk.check_alone()  # repeated events start one timer
    channel.members.append(human)  # came back within the grace time
    spk.check_alone()
    await asyncio.sleep(0.2)
    assert spk.is_connected
    channel.members.remove(human)
    spk.check_alone()
    await _until(lambda: not spk.is_connected, timeout=1.0)
    assert channel.clients[0].disconnects == 1
    await spk.close()


async def test_dropped_connection_reconnects_and_continues() -> None:
    synth = FakeSynth([V300, V700], sentence_s=1.0, chunk_s=0.1, delay_s=0.01)
    spk, errors = _speaker(synth, reconnect_wait_s=0.1)
    channel = FakeChannel(1)
    await spk.join(channel)
    spk.enqueue(SpeechItem("long one.", V300))
    spk.enqueue(SpeechItem("after.", V700))
    first = channel.clients[0]
    await _until(lambda: len(first.real_frames()) >= 15)
    first.drop()
    await _until(lambda: spk.items_spoken == 2, timeout=5.0)
    assert len(channel.clients) == 2  # one reconnection
    second = channel.clients[1]
    tones = _tones(first.frames) + _tones(second.frames)
    assert tones == sorted(tones)  # the first item (300 Hz) was resumed, then the queue (700 Hz): never mixed
    assert 48 <= tones.count(300) <= 50  # of its 50 frames, at most the in-flight one or two are lost
    assert _dominant_hz(second.audio()[: 20 * 960]) == pytest.approx(300.0, abs=5)  # resumed the same item
    assert _dominant_hz(second.audio()[-20 * 960 :]) == pytest.approx(700.0, abs=5)  # then the queue
    assert errors == []
    await spk.close()


async def test_kick_clears_state_without_stuck_tasks() -> None:
    synth = FakeSynth([V300], sentence_s=3.0, delay_s=0.01)
    spk, errors = _speaker(synth, reconnect_wait_s=0.1)
    channel = FakeChannel(1)
    await spk.join(channel)
    spk.enqueue(SpeechItem("one.", V300))
    spk.enqueue(SpeechItem("two.", V300))
    await _until(lambda: len(channel.clients[0].real_frames()) >= 5)
    channel.clients[0].drop()  # discord.py disconnects the client...
    spk.on_voice_left()  # ...and the bot's voice state shows no channel, and it stays so
    await _until(lambda: spk.voice_client is None, timeout=2.0)
    assert spk.channel is None and spk.current is None and spk.queued == []
    assert synth.calls[0].closed is not None
    assert len(channel.clients) == 1  # no rejoin after a kick
    assert errors == ["I was disconnected from the voice channel, so 2 messages will not be read."]
    await asyncio.sleep(0.05)
    assert spk._player is None or spk._player.done()
    assert spk._item_task is None


async def test_voice_state_blip_during_reconnect_is_not_a_kick() -> None:
    synth = FakeSynth([V300], sentence_s=0.5)
    spk, errors = _speaker(synth, reconnect_wait_s=0.2)
    channel = FakeChannel(1)
    await spk.join(channel)
    spk.on_voice_left()  # discord.py leaves and rejoins while reconnecting
    await asyncio.sleep(0.05)
    spk.on_voice_joined(channel)
    await asyncio.sleep(0.3)
    assert spk.is_connected and errors == []
    spk.enqueue(SpeechItem("still here.", V300))
    await _until(lambda: spk.items_spoken == 1)
    await spk.close()


async def test_stream_error_is_reported_and_the_queue_goes_on() -> None:
    synth = FakeSynth([V300], sentence_s=0.3, chunk_s=0.1, fail_after=2)
    spk, errors = _speaker(synth)
    channel = FakeChannel(1)
    await spk.join(channel)
    spk.enqueue(SpeechItem("breaks.", V300, summary="Alice's message"))
    await _until(lambda: len(errors) == 1)
    assert errors == ["I could not read Alice's message: the model ran out of patience"]
    assert len(channel.clients[0].real_frames()) >= 8  # the 0.2 s made before the failure was still played
    synth.fail_after = None
    spk.enqueue(SpeechItem("works.", V300))
    await _until(lambda: spk.items_spoken == 1)
    await spk.close()


async def test_connect_failure_is_clear() -> None:
    spk, _ = _speaker(FakeSynth([V300]))
    with pytest.raises(SpeechError, match="check my Connect and Speak permissions"):
        await spk.join(FakeChannel(1, name="Lounge", fail_connect=True))
    await spk.close()


async def test_announce_once_per_author_per_minute() -> None:
    synth = FakeSynth([V300], sentence_s=0.04, chunk_s=0.04)
    spk, _ = _speaker(synth)
    await spk.join(FakeChannel(1))
    for author, name, text in [(ALICE, "Alice", "one"), (ALICE, "Alice", "two"), (BOB, "Bob", "three"),
                               (ALICE, "Alice", "four")]:
        spk.enqueue(SpeechItem(text, V300, author_id=author, announce=f"{name} said: "))
    await _until(lambda: spk.items_spoken == 4)
    assert [c.text for c in synth.calls] == ["Alice said: one", "two", "Bob said: three", "Alice said: four"]
    await spk.close()


async def test_close_returns_pending_and_leaves_no_tasks() -> None:
    synth = FakeSynth([V300], sentence_s=3.0, delay_s=0.01)
    spk, _ = _speaker(synth)
    channel = FakeChannel(1)
    await spk.join(channel)
    spk.enqueue(SpeechItem("a.", V300, summary="a"))
    spk.enqueue(SpeechItem("b.", V300, summary="b"))
    await _until(lambda: spk.current is not None and synth.calls)
    pending = await spk.close()
    assert [p.summary for p in pending] == ["a", "b"]
    assert synth.calls[0].closed is not None
    assert channel.clients[0].disconnects == 1
    with pytest.raises(SpeechError, match="shutting down"):
        spk.enqueue(SpeechItem("c.", V300))


# --- SpeechService ----------------------------------------------------------------------------------------------------


@dataclass
class Role:
    id: int


@dataclass
class Perms:
    manage_guild: bool = False


@dataclass
class VoiceState:
    channel: Any


class FakeGuild:
    def __init__(self, gid: int, members: list[Member]) -> None:
        self.id = gid
        self._members = {m.id: m for m in members}
        self.me = Member(ME, "voicebot", bot=True)
        for m in members:
            m.guild = self
        self.me.guild = self

    def get_member(self, uid: int) -> Member | None:
        return self._members.get(uid)

    def get_channel(self, cid: int) -> Any:
        return None

    def get_role(self, rid: int) -> Any:
        return None


@pytest.fixture
async def service(tmp_path: Path):
    voices = [
        _voice("alice-own", ALICE, 300.0),
        _voice("bob-own", BOB, 700.0),
        _voice("server", 555, 500.0),
        _voice("operator", 0, 900.0),
    ]
    synth = FakeSynth(voices, sentence_s=0.04, chunk_s=0.04)
    store = Store(tmp_path / "bot.sqlite3")
    config = Config(discord=DiscordConfig(reconnect_wait_s=0.1, alone_disconnect_s=5.0, guild_queue_size=5))
    svc = SpeechService(synth, store, config)
    channel = FakeChannel(1)
    alice = Member(ALICE, "Alice", voice=VoiceState(channel))
    bob = Member(BOB, "Bob", voice=VoiceState(channel))
    carol = Member(CAROL, "Carol")  # not in voice
    other_bot = Member(OTHER_BOT, "Helper", bot=True)
    guild = FakeGuild(G1, [alice, bob, carol, other_bot])
    channel.members = [alice, bob]
    yield svc, synth, store, guild, channel
    await svc.shutdown()
    await store.close()


async def test_say_joins_cleans_text_and_uses_own_voice(service: Any) -> None:
    svc, synth, store, guild, channel = service
    alice = guild.get_member(ALICE)
    await store.set_user_setting(ALICE, "speed", 1.5)
    await store.set_guild_setting(G1, "default_language", "en")
    asked_at = time.monotonic()
    res = await svc.say(guild, alice, f"sooooo <@{BOB}> look https://x.com **now**", source="slash")
    await _until(lambda: bool(synth.calls))
    answered_at = time.monotonic()
    assert res.text == "sooo Bob look a link now" and res.voice.id == "alice-own" and res.ahead == 0
    await _until(lambda: svc.speaker(G1).items_spoken == 1)
    call = synth.calls[0]
    assert call.text == "sooo Bob look a link now"
    assert call.params is not None and call.params.speed == 1.5 and call.params.language == "en"
    # the deadline covers the pipeline's 120 s plus the playback the 30 s cap allows, counted from the request
    assert call.deadline is not None and asked_at + 180.0 <= call.deadline <= answered_at + 180.0
    assert len(channel.clients) == 1  # joined the member's channel


async def test_voice_choice_order(service: Any) -> None:
    svc, _, store, guild, _ = service
    carol = guild.get_member(CAROL)
    with pytest.raises(NoVoice, match="/voice clone"):  # no own voice, no server voice... but the operator's
        svc.synthesizer.voices.by_id.pop("operator")
        await svc.resolve_voice(guild, carol)
    svc.synthesizer.voices.by_id["operator"] = _voice("operator", 0, 900.0)
    assert (await svc.resolve_voice(guild, carol)).id == "operator"
    await store.add_guild_voice(G1, "server", 555)
    assert (await svc.resolve_voice(guild, carol)).id == "server"
    await store.set_guild_setting(G1, "default_voice", "operator")
    assert (await svc.resolve_voice(guild, carol)).id == "operator"
    # Bob's shared voice is never a silent fallback, only when Carol selects it
    await store.share_voice("bob-own", G1, BOB)
    assert (await svc.resolve_voice(guild, carol)).id == "operator"
    await store.set_user_setting(CAROL, "voice", "bob-own")
    assert (await svc.resolve_voice(guild, carol)).id == "bob-own"
    await store.unshare_voice("bob-own", G1)  # no longer usable here: falls back
    assert (await svc.resolve_voice(guild, carol)).id == "operator"
    # the member's own voice beats the guild default
    assert (await svc.resolve_voice(guild, guild.get_member(ALICE))).id == "alice-own"
    # what the voice service offers her to select (bob-own is no longer shared here)
    ids = {v.id for v, _ in await VoiceService(store, svc.synthesizer).usable(G1, ALICE)}
    assert ids == {"alice-own", "server", "operator"}


async def test_policy_refusals_say_what_to_do(service: Any) -> None:
    svc, synth, store, guild, channel = service
    with pytest.raises(SpeechRefused, match="join a voice channel first"):
        await svc.say(guild, guild.get_member(CAROL), "hello", source="autoread")
    with pytest.raises(SpeechRefused, match="don't read other bots"):
        await svc.say(guild, guild.get_member(OTHER_BOT), "beep", source="autoread")
    await store.set_guild_setting(G1, "required_role", 777777777777777777)
    with pytest.raises(SpeechRefused, match="<@&777777777777777777> role"):
        await svc.say(guild, guild.get_member(ALICE), "hello", source="autoread")
    guild.get_member(ALICE).guild_permissions = Perms(manage_guild=True)  # admins are never locked out
    with pytest.raises(NotInVoice, match="autojoin"):  # auto-read does not join unless autojoin is on
        await svc.say(guild, guild.get_member(ALICE), "hello", source="autoread")
    await store.set_guild_setting(G1, "autojoin", True)
    await svc.say(guild, guild.get_member(ALICE), "hello", source="autoread")
    with pytest.raises(NothingToSay):
        await svc.say(guild, guild.get_member(ALICE), "😀😀", source="autoread")
    # a bot with an assigned voice is read, in that voice
    await store.set_bot_voice(G1, OTHER_BOT, "server")
    res = await svc.say(guild, guild.get_member(OTHER_BOT), "beep", source="autoread")
    assert res.voice.id == "server"
    await _until(lambda: svc.speaker(G1).items_spoken == 2)


async def test_announce_author_in_service(service: Any) -> None:
    svc, synth, store, guild, _ = service
    await store.set_guild_setting(G1, "announce_author", True)
    await store.set_nickname(G1, ALICE, "Ally")
    from bot.textrules import FileInfo

    await svc.say(guild, guild.get_member(ALICE), "hi all")
    await svc.say(guild, guild.get_member(BOB), "", attachments=[FileInfo("cat.png", "image/png")])
    await _until(lambda: svc.speaker(G1).items_spoken == 2)
    assert [c.text for c in synth.calls] == ["Ally said: hi all", "Bob sent an image"]


async def test_say_stream_passes_an_async_iterator(service: Any) -> None:
    svc, synth, store, guild, _ = service
    await store.add_guild_voice(G1, "server", 555)
    seen: list[str] = []

    async def reply() -> AsyncIterator[str]:
        for piece in ["The **answer** ", "is `x` forty", "-two. ", "Done."]:
            seen.append(piece)
            yield piece

    res = await svc.say_stream(guild, guild.get_member(ALICE), reply())
    assert res.voice.id == "server" and res.text is None  # the bot's answer speaks in the server's voice
    await _until(lambda: svc.speaker(G1).items_spoken == 1)
    assert synth.calls[0].text == "The answer is forty-two. Done."
    assert len(seen) == 4


async def test_shutdown_journals_unread_messages(tmp_path: Path) -> None:
    voices = [_voice("alice-own", ALICE, 300.0)]
    synth = FakeSynth(voices, sentence_s=3.0, delay_s=0.01)
    path = tmp_path / "j.sqlite3"
    store = Store(path)
    svc = SpeechService(synth, store, Config())
    channel = FakeChannel(1)
    alice = Member(ALICE, "Alice", voice=VoiceState(channel))
    guild = FakeGuild(G1, [alice])
    channel.members = [alice]
    await svc.say(guild, alice, "first message")
    await svc.say(guild, alice, "second message")
    await _until(lambda: bool(synth.calls))
    assert await svc.shutdown() == 2
    with pytest.raises(SpeechError, match="shutting down"):
        svc.speaker(G2)
    await store.close()

    store2 = Store(path)
    svc2 = SpeechService(synth, store2, Config())
    dropped = await svc2.dropped_after_restart(G1)
    assert [(d.author_id, d.summary) for d in dropped] == [
        (ALICE, 'Alice\'s message "first message"'),
        (ALICE, 'Alice\'s message "second message"'),
    ]
    assert await svc2.dropped_after_restart(G1) == []
    await svc2.shutdown()
    await store2.close()


async def test_bot_kicked_and_channel_deleted_events(service: Any) -> None:
    svc, synth, store, guild, channel = service
    alice = guild.get_member(ALICE)
    await svc.join(guild, alice)
    spk = svc.speaker(G1)
    before, gone = VoiceState(channel), VoiceState(None)
    await svc.on_voice_state_update(guild.me, gone, before)  # our own join echo
    assert spk.is_connected
    await svc.on_voice_state_update(guild.me, before, gone)  # kicked
    channel.clients[0].drop()
    await _until(lambda: spk.voice_client is None, timeout=2.0)
    # rejoin, then the channel is deleted
    await svc.join(guild, alice)
    channel.guild = guild
    await svc.on_channel_delete(channel)
    assert spk.voice_client is None and spk.channel is None
    assert await svc.leave(G1) == 0
    assert svc.skip(G1) is False and svc.clear(G1) == 0


async def test_say_answers_busy_before_queueing_when_the_synthesizer_is_full(service: Any) -> None:
    """Item 1 of issue 16: a full synthesizer is a "busy" reply to the command, not a later channel message."""
    from synthesis.types import BusyError

    svc, synth, _, guild, _ = service
    alice = guild.get_member(ALICE)
    synth.busy = True  # the real Synthesizer.busy: limits.queue_size requests are admitted
    with pytest.raises(BusyError, match="try again"):
        await svc.say(guild, alice, "Are you there?", source="slash")
    assert not synth.calls and not svc.speaker(G1).queued
    synth.busy = False
    await svc.say(guild, alice, "Are you there?", source="slash")
    await _until(lambda: svc.speaker(G1).items_spoken == 1)
    assert len(synth.calls) == 1


async def test_voices_are_read_through_the_voice_service(tmp_path: Path) -> None:
    """Issue 14, 3: the speech service reads voices through the voice service it is given, never through the
    synthesizer's store (here the two hold different voices, so the answer shows which one was asked)."""
    synth = FakeSynth([_voice("alice-in-synth", ALICE, 300.0)])
    reads: list[str] = []

    class CountedVoices(FakeVoices):
        def get(self, voice_id: str) -> Voice:
            reads.append(f"get {voice_id}")
            return super().get(voice_id)

        def list(self, owner_id: int | None = None) -> list[Voice]:
            reads.append(f"list {owner_id}")
            return super().list(owner_id)

    store = Store(tmp_path / "bot.sqlite3")
    owned = CountedVoices([_voice("alice-in-service", ALICE, 300.0), _voice("operator", 0, 900.0)])
    svc = SpeechService(synth, store, Config(), voices=VoiceService(store, voices=owned))  # type: ignore[arg-type]
    guild = FakeGuild(G1, [Member(ALICE, "Alice"), Member(CAROL, "Carol")])
    assert (await svc.resolve_voice(guild, guild.get_member(ALICE))).id == "alice-in-service"
    assert (await svc.resolve_voice(guild, guild.get_member(CAROL))).id == "operator"
    await store.set_user_setting(ALICE, "voice", "operator")
    assert (await svc.resolve_voice(guild, guild.get_member(ALICE))).id == "operator"
    assert reads == [f"list {ALICE}", f"list {CAROL}", "list 0", "get operator"]
    await svc.shutdown()
    await store.close()
