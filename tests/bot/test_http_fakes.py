"""Shared support for the HTTP API tests (no tests here): a fake synthesizer that isolates the protocol layer,
a running server on a loopback port, and decoders for what comes back.

The fake speaks each sentence as ``SENTENCE_S`` seconds of a sine whose frequency identifies the voice, after
``delay_s`` of "synthesis", so durations, voice separation and chunk timing can be measured on decoded audio.
"""

from __future__ import annotations

import asyncio
import io
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, AsyncIterator

import av
import numpy as np

from bot.config import config_from_dict
from bot.http import start_server
from bot.voice_service import VoiceService
from engines.base import SAMPLE_RATE
from synthesis.types import AudioChunk, BusyError, SynthesisParams, Voice
from tests.fake_voices import FakeVoices, make_voice

SENTENCE_S = 0.5  # seconds of audio per sentence
AMPLITUDE = 0.5
VOICE_FREQS = {"alice": 440.0, "bob": 660.0, "carol": 990.0}  # Hz, one tone per voice
_SPLIT = re.compile(r"(?<=[.!?])\s+")


@dataclass
class Call:
    text: Any  # str, or "<stream>" for an async iterator
    voice: Voice
    params: SynthesisParams
    pieces: list[str] = field(default_factory=list)
    started: float = 0.0
    finished: float | None = None  # monotonic time the last sentence was produced
    closed_early: bool = False
    sentences_done: int = 0


class FakeSynth:
    """Sentence-by-sentence sine "speech" with a delay per sentence; records every call."""

    engine_name, device, precision = "fake", "cpu", "fp32"
    sample_rate = SAMPLE_RATE  # Hz of every chunk it yields (the doors encode from it)

    def __init__(self, voices: FakeVoices, delay_s: float = 0.02) -> None:
        self.voices = voices
        self.delay_s = delay_s
        self.early_chunk = False  # True: the first sentence comes as two chunks (early + rest), as the pipeline's
        self.busy = False
        self.calls: list[Call] = []

    def freq(self, voice: Voice) -> float:
        return VOICE_FREQS[voice.name]

    async def stream(self, text: str | AsyncIterator[str], voice: Voice | str,
                     params: SynthesisParams | None = None, *, deadline: float | None = None
                     ) -> AsyncIterator[AudioChunk]:
        if self.busy:
            raise BusyError("the speech queue is full (1 requests); try again in a moment")
        v = voice if isinstance(voice, Voice) else self.voices.get(voice)
        call = Call(text if isinstance(text, str) else "<stream>", v, params or SynthesisParams(),
                    started=time.monotonic())
        self.calls.append(call)
        completed = False
        try:
            index = 0
            async for sentence in self._sentences(text, call):
                await asyncio.sleep(self.delay_s)
                t = np.arange(int(SENTENCE_S * SAMPLE_RATE)) / SAMPLE_RATE
                audio = (AMPLITUDE * np.sin(2 * np.pi * self.freq(v) * t)).astype(np.float32)
                call.sentences_done += 1
                if index == 0 and self.early_chunk:
                    split = audio.size // 4
                    yield AudioChunk(audio[:split], sentence, index)
                    audio = audio[split:]
                yield AudioChunk(audio, sentence, index)
                index += 1
            completed = True
        finally:
            call.finished = time.monotonic()
            call.closed_early = not completed

    async def _sentences(self, text: str | AsyncIterator[str], call: Call) -> AsyncIterator[str]:
        if isinstance(text, str):
            for s in _SPLIT.split(text.strip()):
                if re.search(r"\w", s):
                    yield s
            return
        pending = ""
        async for piece in text:
            call.pieces.append(piece)
            pending += piece
            parts = _SPLIT.split(pending)
            for s in parts[:-1]:
                yield s
            pending = parts[-1]
        if pending.strip():
            yield pending.strip()

    def metrics(self) -> dict[str, Any]:
        return {"queue_depth": 3, "requests": len(self.calls), "prosody_hits": 2, "prosody_misses": 6,
                "prosody_hit_ratio": 0.25, "ttfa_s": [0.1, 0.2, 0.3], "rtf": [0.5],
                "engine": "fake", "device": "cpu", "precision": "fp32"}


@dataclass
class Server:
    url: str
    synth: FakeSynth
    voices: dict[str, Voice]
    config: Any
    runner: Any
    root: Path

    async def close(self) -> None:
        await self.runner.cleanup()


async def start(tmp_path: Path, *, http: dict[str, Any] | None = None, delay_s: float = 0.02,
                host: str = "127.0.0.1") -> Server:
    """A real server (``bot.http.start_server``) on a free loopback port, over the fake synthesizer."""
    root = tmp_path / "voices"
    root.mkdir(parents=True, exist_ok=True)
    config = config_from_dict({"voices": {"dir": str(root)}, "http": {"port": 0, **(http or {})}},
                              base_dir=tmp_path)
    voices = {name: make_voice(name) for name in VOICE_FREQS}
    synth = FakeSynth(FakeVoices(voices.values(), root), delay_s=delay_s)
    services = SimpleNamespace(config=config, synthesizer=synth, store=None, speech=None,
                               voices=VoiceService(None, synth))  # type: ignore[arg-type]
    runner = await start_server(services, host, 0)  # type: ignore[arg-type]
    port = runner.addresses[0][1]
    return Server(f"http://127.0.0.1:{port}", synth, voices, config, runner, root)


# ---- decoding ----------------------------------------------------------------------------------------------------

def wav_samples(data: bytes) -> tuple[np.ndarray, int]:
    """A WAV body (exact or streamed with an unknown data length) -> float samples and rate."""
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE", data[:16]
    pos, rate = 12, 0
    while pos + 8 <= len(data):
        cid, size = data[pos:pos + 4], int.from_bytes(data[pos + 4:pos + 8], "little")
        if cid == b"fmt ":
            rate = int.from_bytes(data[pos + 12:pos + 16], "little")
        if cid == b"data":
            pcm = data[pos + 8:]
            return pcm_samples(pcm[: len(pcm) // 2 * 2]), rate
        pos += 8 + size
    raise AssertionError("no data chunk")


def pcm_samples(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def av_samples(data: bytes) -> tuple[np.ndarray, int]:
    """Any compressed stream PyAV reads -> mono float samples and rate."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        parts, rate = [], 0
        for frame in container.decode(stream):
            rate = frame.sample_rate
            parts.append(frame.to_ndarray().astype(np.float32).reshape(len(frame.layout.channels), -1)[0])
    return np.concatenate(parts), rate


def decode(data: bytes, fmt: str, pcm_rate: int = SAMPLE_RATE) -> tuple[np.ndarray, int]:
    if fmt == "wav":
        return wav_samples(data)
    if fmt in ("raw", "pcm"):
        return pcm_samples(data), pcm_rate
    return av_samples(data)


def dominant_freq(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.fft.rfftfreq(x.size, 1.0 / rate)[int(np.argmax(spectrum))])


def sentence_freqs(x: np.ndarray, rate: int, n: int) -> list[float]:
    """The dominant frequency of the middle of each of ``n`` consecutive sentences."""
    per = int(SENTENCE_S * rate)
    return [dominant_freq(x[i * per + per // 4: i * per + 3 * per // 4], rate) for i in range(n)]


# Which decoders read which format: every format is checked with each common decoder that can read it (soundfile
# cannot read ADTS AAC; `wave` reads only WAV).
SOUNDFILE_RAW = {"raw": "PCM_16", "pcm": "PCM_16", "ulaw": "ULAW", "alaw": "ALAW"}


def decode_everywhere(data: bytes, fmt: str, pcm_rate: int = SAMPLE_RATE) -> dict[str, tuple[np.ndarray, int]]:
    """``data`` decoded by soundfile, ``wave`` and PyAV where each can: decoder name -> (mono float, rate)."""
    import soundfile
    import wave

    out: dict[str, tuple[np.ndarray, int]] = {}
    if fmt in SOUNDFILE_RAW:
        x, rate = soundfile.read(io.BytesIO(data), format="RAW", subtype=SOUNDFILE_RAW[fmt], samplerate=pcm_rate,
                                 channels=1, dtype="float32")
        out["soundfile"] = (x, rate)
        if fmt in ("raw", "pcm"):
            out["numpy"] = (pcm_samples(data), pcm_rate)
        return out
    if fmt != "aac":
        x, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
        out["soundfile"] = (x[:, 0], rate)
    if fmt == "wav":
        with wave.open(io.BytesIO(data)) as w:
            frames = w.readframes(w.getnframes())  # a streamed header says "to the end"
            out["wave"] = (pcm_samples(frames), w.getframerate())
    out["pyav"] = av_samples(data)
    return out
