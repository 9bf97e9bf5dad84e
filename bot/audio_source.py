"""The voice AudioSource: synthesized speech handed to discord.py's player thread 20 ms at a time.

An asyncio task (the synthesis stream) feeds float32 mono chunks at the model's rate; they are resampled to 48 kHz
(a 48 kHz model's audio goes out sample for sample) with one streaming resampler per source (``synthesis.audio.StreamResampler``: soxr keeps the filter state, so chunk
joins have no clicks), converted to stereo s16le and put into a bounded, thread-safe byte buffer. discord.py's
``AudioPlayer`` calls :meth:`StreamAudioSource.read` from its own thread every 20 ms. The contract
(``discord/player.py``): every read returns one 20 ms frame of 16-bit 48 kHz stereo (3,840 bytes), and an empty
read ends playback. So: real audio when there is a frame; silence when the producer is behind (an underrun must
never end playback early); ``b""`` only once the producer has marked the end and the buffer is drained, or right
after :meth:`stop`. The resampler holds back about 15 ms of audio until more arrives or the end flushes it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import discord
import numpy as np

from synthesis.audio import StreamResampler
from synthesis.types import to_pcm16

log = logging.getLogger(__name__)

DISCORD_SAMPLE_RATE = 48000  # Hz, what discord.py's Opus encoder takes
DISCORD_CHANNELS = 2  # stereo
FRAME_MS = 20  # one read
SAMPLES_PER_FRAME = DISCORD_SAMPLE_RATE * FRAME_MS // 1000  # 960 samples per channel
FRAME_BYTES = SAMPLES_PER_FRAME * DISCORD_CHANNELS * 2  # 3,840 bytes of s16le stereo
SILENCE_FRAME = bytes(FRAME_BYTES)
DEFAULT_BUFFER_S = 10.0  # seconds of audio buffered ahead of playback before the producer waits


class StreamAudioSource(discord.AudioSource):
    """A ``discord.AudioSource`` fed from asyncio: :meth:`feed` chunks, :meth:`end` once, discord.py reads frames.

    Parameters
    ----------
    buffer_s:
        Seconds of 48 kHz audio held at most; :meth:`feed` waits (without blocking the loop) while the buffer is full.

    Attributes
    ----------
    frames_real, frames_silence:
        Frames of audio / of underrun silence handed out so far.
    first_frame_at:
        ``time.monotonic()`` of the first real frame read (None before), for time-to-first-audio.
    created_at:
        ``time.monotonic()`` at construction.
    """

    def __init__(self, *, buffer_s: float = DEFAULT_BUFFER_S) -> None:
        if buffer_s <= 0:
            raise ValueError(f"buffer_s must be positive, got {buffer_s}")
        self._capacity = int(buffer_s * DISCORD_SAMPLE_RATE) * DISCORD_CHANNELS * 2  # bytes
        self._buf = bytearray()  # s16le stereo @ 48 kHz, guarded by _lock
        self._lock = threading.Lock()
        self._ended = False  # the producer marked the end
        self._stopped = False  # stop() was called
        self._finished = threading.Event()  # a read returned b""
        self._resampler: StreamResampler | None = None
        self._rate_in = 0
        self._loop: asyncio.AbstractEventLoop | None = _running_loop()  # where feed/wait_ready run
        self._space = asyncio.Event()  # set from the player thread when a waiting producer may continue
        self._waiting = False
        self._ready = asyncio.Event()  # a first frame is buffered, or the end is marked
        self.frames_real = 0
        self.frames_silence = 0
        self.first_frame_at: float | None = None
        self.created_at = time.monotonic()

    # producer side (event loop) ------------------------------------------------------------------------------------

    async def feed(self, audio: np.ndarray, sample_rate: int) -> bool:
        """Resample a chunk and buffer it, waiting while the buffer is full; False once the source is stopped.

        Parameters
        ----------
        audio:
            ``[N]`` float32 mono in [-1, 1].
        sample_rate:
            Hz of ``audio`` (32,000 for SoVITS v2; 48,000 for v4/v5, taken as it is). A change of rate flushes the
            previous resampler first.
        """
        if self._ended:
            raise RuntimeError("feed() after end()")
        if self._stopped:
            return False
        self._loop = asyncio.get_running_loop()
        pcm = self._convert(np.asarray(audio, dtype=np.float32).reshape(-1), sample_rate, last=False)
        return await self._put(pcm)

    def end(self) -> None:
        """Mark the end of the stream: flush the resampler; reads return b"" once the buffer is drained."""
        if self._ended:
            return
        tail = b""
        if self._resampler is not None:
            tail = self._convert(np.zeros(0, dtype=np.float32), self._rate_in, last=True)
            self._resampler = None  # flushed; release the native filter state now
        with self._lock:
            if not self._stopped:
                self._buf += tail
            self._ended = True
        self._ready.set()

    async def wait_ready(self) -> None:
        """Return once a first frame is buffered (playback may start) or the end is marked."""
        self._loop = asyncio.get_running_loop()
        await self._ready.wait()

    def _convert(self, x: np.ndarray, sample_rate: int, *, last: bool) -> bytes:
        """float32 mono at ``sample_rate`` -> s16le stereo bytes @ 48 kHz, continuing the resampler's state."""
        out: list[np.ndarray] = []
        if sample_rate != self._rate_in:
            if self._resampler is not None:  # finish the old rate before switching
                out.append(self._resampler.process(np.zeros(0, dtype=np.float32), last=True))
            # Discord's own rate needs no filter (and gets no filter delay)
            self._resampler = StreamResampler(sample_rate, DISCORD_SAMPLE_RATE) \
                if sample_rate != DISCORD_SAMPLE_RATE else None
            self._rate_in = sample_rate
        out.append(self._resampler.process(x, last=last) if self._resampler is not None else x)
        mono = np.concatenate(out) if len(out) > 1 else out[0]  # [M] float32 @ 48 kHz
        s16 = to_pcm16(mono).astype("<i2", copy=False)
        return np.repeat(s16, DISCORD_CHANNELS).tobytes()  # interleaved L R L R ...

    async def _put(self, pcm: bytes) -> bool:
        """Append to the buffer in slices, waiting for space; False if stopped meanwhile."""
        view = memoryview(pcm)
        while view:
            with self._lock:
                if self._stopped:
                    return False
                room = self._capacity - len(self._buf)
                if room > 0:
                    take = min(room, len(view))
                    self._buf += view[:take]
                    view = view[take:]
                    if len(self._buf) >= FRAME_BYTES:
                        self._ready.set()
                    continue
                self._space.clear()
                self._waiting = True
            await self._space.wait()
        return True

    # consumer side (discord.py's player thread) --------------------------------------------------------------------

    def read(self) -> bytes:
        """One 20 ms frame (3,840 bytes): audio, silence on underrun, or b"" at the end / after stop()."""
        with self._lock:
            if self._stopped:
                self._finished.set()
                return b""
            n = len(self._buf)
            if n >= FRAME_BYTES or (self._ended and n > 0):
                frame = bytes(self._buf[:FRAME_BYTES])
                del self._buf[:FRAME_BYTES]
                if len(frame) < FRAME_BYTES:  # the very last partial frame: pad with silence
                    frame += bytes(FRAME_BYTES - len(frame))
                self.frames_real += 1
                if self.first_frame_at is None:
                    self.first_frame_at = time.monotonic()
                wake = self._waiting
                self._waiting = False
            elif self._ended:
                self._finished.set()
                return b""
            else:
                self.frames_silence += 1
                return SILENCE_FRAME
        if wake:
            self._wake_producer()
        return frame

    def _wake_producer(self) -> None:
        """Tell a producer waiting for space (on the event loop) that a frame was taken."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._space.set)
            except RuntimeError:  # the loop closed between the check and the call
                pass

    def is_opus(self) -> bool:
        """PCM, not Opus: discord.py encodes it."""
        return False

    def cleanup(self) -> None:
        """Called by discord.py when a player ends; keeps the buffer so a reconnect can resume this source."""

    # control -------------------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop now: the next read returns b"" and a waiting producer gets False. Thread-safe."""
        with self._lock:
            self._stopped = True
            self._buf.clear()
            wake = self._waiting
            self._waiting = False
        self._ready_set_threadsafe()
        if wake:
            self._wake_producer()

    def _ready_set_threadsafe(self) -> None:
        """Release wait_ready() from any thread."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._ready.set)
                return
            except RuntimeError:
                pass
        self._ready.set()

    @property
    def ended(self) -> bool:
        """The producer marked the end."""
        return self._ended

    @property
    def stopped(self) -> bool:
        """stop() was called."""
        return self._stopped

    @property
    def finished(self) -> bool:
        """A read returned b"": playback of this source is over."""
        return self._finished.is_set()

    @property
    def exhausted(self) -> bool:
        """Nothing more will ever be read: stopped, or ended with an empty buffer."""
        with self._lock:
            return self._stopped or (self._ended and not self._buf)

    @property
    def buffered_s(self) -> float:
        """Seconds of audio waiting in the buffer."""
        with self._lock:
            return len(self._buf) / (DISCORD_SAMPLE_RATE * DISCORD_CHANNELS * 2)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The running event loop, or None outside one."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
