"""bot.audio_source.StreamAudioSource: discord.py's read() contract, resampling fidelity, joins, backpressure."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
import soxr

from bot.audio_source import FRAME_BYTES, SAMPLES_PER_FRAME, SILENCE_FRAME, StreamAudioSource

SR = 32000


def _tone(seconds: float, freqs: tuple[float, ...] = (440.0, 3000.0), amp: float = 0.3) -> np.ndarray:
    t = np.arange(int(round(seconds * SR))) / SR
    return (amp * sum(np.sin(2 * np.pi * f * t + i) for i, f in enumerate(freqs))).astype(np.float32)


def _split(x: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    out, i, k = [], 0, 0
    while i < len(x):
        n = sizes[k % len(sizes)]
        out.append(x[i : i + n])
        i += n
        k += 1
    return out


def _read_all(src: StreamAudioSource, limit: int = 100000) -> list[bytes]:
    frames = []
    for _ in range(limit):
        f = src.read()
        if not f:
            return frames
        frames.append(f)
    raise AssertionError("the source never ended")


def _left(frames: list[bytes]) -> np.ndarray:
    pcm = np.frombuffer(b"".join(frames), dtype="<i2").reshape(-1, 2)
    assert np.array_equal(pcm[:, 0], pcm[:, 1])  # mono duplicated to both channels
    return pcm[:, 0].astype(np.float32) / 32767.0


async def test_frames_are_exact_and_round_trip_to_the_input() -> None:
    x = _tone(1.013)  # 32,416 samples -> 48,624 @ 48 kHz -> 50.65 frames
    src = StreamAudioSource()
    for chunk in _split(x, [1, 7, 320, 4096, 999, 12345]):  # ragged sizes, including 1 sample
        assert await src.feed(chunk, SR)
    src.end()
    frames = _read_all(src)
    assert all(len(f) == FRAME_BYTES == 3840 for f in frames)
    assert len(frames) == 51  # ceil(48,624 / 960); the last one padded with silence
    assert src.frames_real == 51 and src.frames_silence == 0
    assert src.read() == b""  # stays ended
    y48 = _left(frames)[:48624]
    assert np.abs(y48[48624 - 960 * 50 :]).max() > 0  # the padded last frame still carries the tail
    back = soxr.resample(y48, 48000, SR, quality="HQ")
    assert len(back) == len(x)
    lag = _best_lag(back, x)
    assert lag == 0  # soxr's streaming mode is delay-compensated
    inner = slice(200, len(x) - 200)  # filter edges at the very start and end
    assert np.abs(back[inner] - x[inner]).max() < 1e-3


def _best_lag(a: np.ndarray, b: np.ndarray, span: int = 20) -> int:
    errs = {k: np.abs(np.roll(a, -k)[1000:-1000] - b[1000:-1000]).mean() for k in range(-span, span + 1)}
    return min(errs, key=errs.__getitem__)


async def test_chunked_equals_one_shot_and_joins_are_smooth() -> None:
    x = _tone(0.5, freqs=(220.0,), amp=0.8)
    one = StreamAudioSource()
    await one.feed(x, SR)
    one.end()
    many = StreamAudioSource()
    for chunk in _split(x, [333, 17, 2000, 5]):
        await many.feed(chunk, SR)
    many.end()
    a, b = _left(_read_all(one)), _left(_read_all(many))
    assert np.abs(a - b).max() <= 2 / 32767  # identical up to s16 rounding
    # 220 Hz at 0.8 @ 48 kHz moves at most 2*pi*220*0.8/48000 = 0.023 per sample; a click at a join would jump
    assert np.abs(np.diff(b[:24000])).max() < 0.03


async def test_underrun_gives_silence_never_eof() -> None:
    src = StreamAudioSource()
    assert src.read() == SILENCE_FRAME  # nothing yet: silence, not the end
    await src.feed(_tone(0.06), SR)  # 2,880 samples @ 48 kHz; the resampler holds ~15 ms back until the end
    real = 0
    while (f := src.read()) != SILENCE_FRAME:
        assert len(f) == FRAME_BYTES
        real += 1
    assert real == 2
    for _ in range(5):
        assert src.read() == SILENCE_FRAME  # a partial frame waits for more audio
    assert src.frames_silence == 7 and src.frames_real == 2
    src.end()
    last = src.read()
    assert len(last) == FRAME_BYTES and last != SILENCE_FRAME  # the held tail comes out, padded
    assert src.read() == b""
    assert src.frames_real == 3  # exactly ceil(2,880 / 960)
    assert src.finished


async def test_stop_ends_within_one_read_and_refuses_more() -> None:
    src = StreamAudioSource()
    await src.feed(_tone(1.0), SR)
    assert len(src.read()) == FRAME_BYTES
    src.stop()
    assert src.read() == b""
    assert await src.feed(_tone(0.1), SR) is False
    assert src.exhausted and src.stopped


async def test_feed_waits_for_space_then_resumes_from_reader_thread() -> None:
    src = StreamAudioSource(buffer_s=0.1)  # 5 frames of room
    x = _tone(0.5)  # 25 frames
    reader_frames: list[bytes] = []
    start = threading.Event()

    def player() -> None:  # like discord.py's AudioPlayer: a read every 20 ms on its own thread
        start.wait()
        while True:
            f = src.read()
            if not f:
                return
            reader_frames.append(f)
            time.sleep(0.02 if f != SILENCE_FRAME else 0.002)

    thread = threading.Thread(target=player, daemon=True)
    thread.start()
    feeder = asyncio.create_task(src.feed(x, SR))
    await asyncio.sleep(0.1)
    assert not feeder.done()  # blocked on the full buffer, the loop still runs
    assert src.buffered_s == pytest.approx(0.1, abs=0.001)
    assert src.first_frame_at is None  # buffered audio is not "first audio": that is the player's first read
    before_reads = time.monotonic()
    start.set()
    assert await asyncio.wait_for(feeder, 2.0) is True
    src.end()
    await asyncio.to_thread(thread.join, 5.0)
    real = [f for f in reader_frames if f != SILENCE_FRAME]
    assert len(real) == 25
    assert src.first_frame_at is not None and src.first_frame_at >= before_reads


async def test_stop_releases_a_waiting_producer() -> None:
    src = StreamAudioSource(buffer_s=0.04)
    feeder = asyncio.create_task(src.feed(_tone(1.0), SR))
    await asyncio.sleep(0.02)
    assert not feeder.done()
    await asyncio.to_thread(src.stop)  # from another thread, as skip might
    assert await asyncio.wait_for(feeder, 1.0) is False


async def test_wait_ready_after_first_frame_or_end() -> None:
    src = StreamAudioSource()
    waiter = asyncio.create_task(src.wait_ready())
    await src.feed(np.zeros(600, np.float32), SR)  # 900 samples @ 48 kHz at most: less than a frame
    await asyncio.sleep(0.01)
    assert not waiter.done()
    await src.feed(np.zeros(2 * SAMPLES_PER_FRAME, np.float32), SR)
    await asyncio.wait_for(waiter, 1.0)
    empty = StreamAudioSource()
    empty.end()
    await asyncio.wait_for(empty.wait_ready(), 1.0)
    assert empty.exhausted and empty.read() == b""


async def test_48k_input_passes_through_and_clips() -> None:
    src = StreamAudioSource()
    x = np.full(SAMPLES_PER_FRAME, 2.0, np.float32)  # out of range: clipped, not wrapped
    x[:10] = -0.5
    await src.feed(x, 48000)
    src.end()
    pcm = np.frombuffer(src.read(), dtype="<i2")
    assert pcm[0] == pcm[1] == round(-0.5 * 32767)
    assert pcm[-1] == 32767
    assert not src.is_opus()


async def test_feed_after_end_is_a_bug() -> None:
    src = StreamAudioSource()
    src.end()
    with pytest.raises(RuntimeError):
        await src.feed(np.zeros(10, np.float32), SR)


async def test_48k_chunks_make_no_resampler_and_go_out_sample_for_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    import bot.audio_source
    from synthesis.types import to_pcm16

    made: list[tuple[int, int]] = []
    real = bot.audio_source.StreamResampler

    def spy(sr_in: int, sr_out: int) -> object:
        made.append((sr_in, sr_out))
        return real(sr_in, sr_out)

    monkeypatch.setattr(bot.audio_source, "StreamResampler", spy)
    rng = np.random.default_rng(3)
    x = (0.3 * rng.standard_normal(48000 + 517)).astype(np.float32)  # a v4/v5 model's 48 kHz audio
    src = StreamAudioSource()
    for piece in _split(x, [4800, 777, 13]):
        await src.feed(piece, 48000)
    src.end()
    frames = _read_all(src)
    assert made == []
    got = np.frombuffer(b"".join(frames), dtype="<i2").reshape(-1, 2)[:, 0]
    assert got.size == -(-x.size // SAMPLES_PER_FRAME) * SAMPLES_PER_FRAME  # the last frame padded with silence
    assert np.array_equal(got[: x.size], to_pcm16(x))
    assert not got[x.size:].any()

    # a 32 kHz chunk after 48 kHz ones gets a resampler (and a 48 kHz one after it none again)
    src = StreamAudioSource()
    await src.feed(x[:4800], 48000)
    await src.feed(_tone(0.5), SR)
    await src.feed(x[:4800], 48000)
    src.end()
    assert made == [(SR, 48000)]
    assert abs(len(_read_all(src)) - (4800 + 24000 + 4800) / SAMPLES_PER_FRAME) <= 1
