"""Audio at the edges of the pipeline: decoding uploads, resampling, reference preparation, encoding.

Uploads arrive in whatever format a user's device produces (wav, flac, mp3, ogg vorbis, ogg opus voice messages,
m4a/aac, webm). They are decoded with PyAV (FFmpeg's libraries, no ffmpeg binary), the container detected from
the bytes rather than the file name, and every way a file can be unusable becomes an :class:`AudioInputError`
whose message tells the user what to send instead. :func:`prepare_reference` turns a decoded upload into the
3-10 s reference GPT-SoVITS wants; the encoders turn synthesized float audio into the formats the HTTP API serves.
"""

from __future__ import annotations

import io
import logging
import math
import os
import stat
import struct
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import av.error
import numpy as np
import soxr  # pyright: ignore[reportMissingTypeStubs]  # untyped; its source gives the types

from engines.base import SAMPLE_RATE, SSL_SAMPLE_RATE
from synthesis.speakers import speaker_turns
from synthesis.types import PCM16_SCALE, AudioInputError, to_pcm16
from synthesis.vad import VAD_FRAME_S, VAD_RATE, speech_probability

log = logging.getLogger(__name__)

# --- decoding limits -------------------------------------------------------------------------------------------
MAX_INPUT_RATE = 384_000  # Hz, highest sample rate an upload may declare
MIN_INPUT_RATE = 8_000  # Hz, lowest sample rate that still carries usable speech
MAX_DECODE_RATE = 48_000  # Hz, uploads above this are downsampled while decoding (bounds memory)
MAX_CHANNELS = 64  # channels an upload may declare
TRUNCATION_TOLERANCE = 0.95  # decoded/declared duration below this (and > 0.1 s short) means a cut-off file
TRUNCATION_SLACK_S = 0.1  # s, declared-vs-decoded difference always tolerated (codec padding)
ACCEPTED_FORMATS = "wav/flac/mp3/ogg/opus/m4a/webm"
# Demuxers an upload may be read with. Anything else (playlists, SDP, concat scripts, image formats) is refused
# before FFmpeg acts on it: some of those open other files or network sockets.
DEMUXERS = "wav,w64,rf64,aiff,caf,au,flac,mp3,ogg,mov,matroska,aac"
# Containers whose header states the exact length, so a shorter decode means the file is cut off.
_EXACT_LENGTH_FORMATS = ("flac", "mov", "matroska", "ogg")

# --- reference preparation -------------------------------------------------------------------------------------
FRAME_S = 0.02  # s, analysis frame (and cut granularity) for voice activity
SILENCE_DBFS = -60.0  # dBFS, a clip whose loudest frame is quieter than this is silent
MIN_DYNAMIC_DB = 6.0  # dB, loud frames must stand this far above the floor to count as speech at all
VAD_THRESHOLD = 0.5  # Silero VAD probability at or above which a frame is voiced (the model's own default)
# s, voiced frames are widened by this each side: the detector's probability rises a frame after a voice starts
# (measured on the committed speech: the first 20 ms of a word after silence), so without it a cut lands in the
# word's first sound. Silero's own timestamps pad by 30 ms; this is the next whole frame.
VAD_PAD_S = 0.04
# s of voice (padded frames) the detector must hear in a clip for it to hold speech at all: music, tones and noise
# give none or a stray frame (0.0 s for every fixture in tests/audio_samples.NOT_A_VOICE), a word or two of real
# speech gives about this much. Below it the clip is refused as music, tones or noise; above it and under ``min_s``
# of speech, as too little speech.
MIN_VOICE_S = 0.5
SPEECH_FRACTION = 0.35  # speech threshold sits this fraction of the way from the noise floor to the loud level
GAP_FILL_S = 0.4  # s, pauses this short inside speech count as speech (between words)
MIN_ISLAND_S = 0.1  # s, louder bursts shorter than this are clicks, not speech
EDGE_PAD_S = 0.1  # s, silence kept before and after the chosen speech when it fits
PAUSE_WEIGHT = 1.5  # score cost per second of long pause inside a candidate stretch
CUT_COST_S = 0.5  # score cost (in seconds of speech) of cutting through full-level speech at a stretch edge
NOISY_SNR_DB = 15.0  # dB, speech-to-noise ratio below which a noise warning is given
TURN_MARGIN_S = 0.5  # s, speech this close to a change of speaker is left out of the reference (see _one_speaker)
# s of speech the kept stretch may leave out and still keep the clip's transcript. A transcript covers the whole
# upload; once a word of it lies outside the kept audio, GPT-SoVITS is told words the reference does not say, and
# a real voice garbles or repeats them. A word said on its own lasts 0.15 s or more; under that the left-out
# "speech" is a stray island of the mask (a breath or lip noise the detector hears, at least MIN_ISLAND_S long).
MAX_LEFT_OUT_S = 0.15
# What the person is told when the detector is missing (synthesis.vad.model_path() None, or its model failed to load)
NO_DETECTOR_WARNING = (
    "this bot's voice detector (silero-vad) is not installed, so speech was told from music and noise by loudness "
    "alone; listen to the voice with a preview, and ask the bot's operator to install silero-vad"
)
MIN_NOISE_S = 0.2  # s of pause inside the kept stretch needed to measure its noise floor from pauses alone
NOISE_PERCENTILE = 10.0  # %, without enough pause, the floor is this percentile of the stretch's frame levels
FULL_SCALE = 0.999  # |x| at or above this is a full-scale (clipped) sample
NEAR_PEAK = 0.99  # samples within 1 % of the clip's own peak count as flat-topped (clipped after attenuation)
CLIP_WARN_FRACTION = 0.005  # fraction of speech samples clipped above which a clipping warning is given
TARGET_RMS_DBFS = -20.0  # dBFS, loudness of speech frames after normalisation
PEAK_CEILING = 0.95  # linear, peak after normalisation never exceeds this (no clipping introduced)
MAX_GAIN_DB = 40.0  # dB, most a quiet clip is amplified
# s, the raised-cosine fade at every cut: a reference's cut points and each synthesized sentence's edges. Under
# about 3 ms a cut through loud audio still clicks (the ramp's spectrum reaches into the kHz range); past about
# 10 ms the fade starts to soften the burst of a plosive that opens a sentence. 5 ms sits between.
FADE_S = 0.005

# --- encoding --------------------------------------------------------------------------------------------------
ENCODE_FORMATS = ("wav", "raw", "pcm", "ogg", "opus", "mp3", "aac", "flac")
CONTENT_TYPES = {
    "wav": "audio/wav",
    "raw": "audio/raw",  # s16le mono, upstream api_v2's media type name
    "pcm": "audio/raw",
    "ogg": "audio/ogg",
    "opus": "audio/ogg",
    "mp3": "audio/mpeg",
    "aac": "audio/aac",
    "flac": "audio/flac",
}
WAV_HEADER_BYTES = 44  # canonical PCM RIFF header
FALLBACK_ENCODE_RATE = 48_000  # Hz, used when a codec does not take the input rate (opus at 32 kHz)
# container format, codec, sample format fed to the codec
_AV_CODECS: dict[str, tuple[str, str, str]] = {
    "ogg": ("ogg", "libopus", "flt"),
    "opus": ("opus", "libopus", "flt"),
    "mp3": ("mp3", "libmp3lame", "fltp"),
    "aac": ("adts", "aac", "fltp"),
    "flac": ("flac", "flac", "s16"),
}
OGG_PAGE_US = 20_000  # µs, ogg page duration when streaming (low latency instead of 1 s pages)


@dataclass(frozen=True)
class Decoded:
    """A decoded upload.

    Attributes
    ----------
    samples: ``[N]`` float32 mono (channels averaged), nominally in [-1, 1].
    sample_rate: Hz; the source rate, or :data:`MAX_DECODE_RATE` when the source was higher.
    duration_s: seconds of audio (``N / sample_rate``).
    """

    samples: np.ndarray
    sample_rate: int
    duration_s: float


@dataclass(frozen=True)
class Reference:
    """A reference clip ready for the model: trimmed, the best stretch of speech, loudness-normalised.

    Attributes
    ----------
    wav32k: ``[N]`` float32 @ 32 kHz (SoVITS rate, for ``ge``), peak <= :data:`PEAK_CEILING`.
    wav16k: ``[M]`` float32 @ 16 kHz (HuBERT rate, for the prompt tokens), the same audio.
    duration_s: seconds of ``wav32k``.
    warnings: human-readable problems of the kept audio that did not prevent use (clipping, noise, very quiet, a
        second speaker in it, speech found by loudness alone).
    start_s, end_s: where the stretch lies in the decoded upload, seconds.
    clip_s: seconds of the decoded upload.
    left_out_s: seconds of the upload's speech outside the stretch (another speaker's, or past ``max_s``).
    kept: one line for the person, saying which seconds were kept and why, when more than
        :data:`MAX_LEFT_OUT_S` of speech was left out; "" when only silence or non-speech sound was trimmed.
    """

    wav32k: np.ndarray
    wav16k: np.ndarray
    duration_s: float
    warnings: list[str] = field(default_factory=lambda: [])
    start_s: float = 0.0
    end_s: float = 0.0
    clip_s: float = 0.0
    left_out_s: float = 0.0
    kept: str = ""

    @property
    def speech_left_out(self) -> bool:
        """More than :data:`MAX_LEFT_OUT_S` of the upload's speech lies outside the kept audio, so a transcript of
        the upload says words the reference does not."""
        return self.left_out_s > MAX_LEFT_OUT_S


# =============================================================================================================
# Decoding
# =============================================================================================================


def read_upload_file(path: str | os.PathLike[str], *, max_bytes: int) -> bytes:
    """The bytes of a clip on disk, after checking that it is a regular file of at most ``max_bytes``.

    The checks come before any read: a symlink to ``/dev/zero``, a FIFO or a device would otherwise be read
    without end (or block forever), and a directory or a missing path would be a traceback.

    Raises
    ------
    AudioInputError: missing, not a regular file, unreadable, empty or larger than ``max_bytes``; the message
        names the path and the fix.
    """
    p = Path(path)
    try:
        st = p.stat()  # follows symlinks: what matters is what would be read
    except FileNotFoundError:
        raise AudioInputError(f"there is no file at {str(p)!r}; give the path of a voice recording") from None
    except (OSError, ValueError) as e:
        raise AudioInputError(f"cannot open {str(p)!r} ({_os_reason(e)}); give the path of a voice recording"
                              ) from None
    if stat.S_ISDIR(st.st_mode):
        raise AudioInputError(f"{str(p)!r} is a folder; give the path of one audio file in it")
    if not stat.S_ISREG(st.st_mode):
        raise AudioInputError(f"{str(p)!r} is not a regular file (a device, pipe or socket); give the path of an "
                              "audio file")
    if st.st_size > max_bytes:
        raise AudioInputError(f"{str(p)!r} is {_format_bytes(st.st_size)}; use at most {_format_bytes(max_bytes)} "
                              "(a 10 s voice clip is well under 1 MB)")
    try:
        # O_NONBLOCK: if the path was swapped for a FIFO after the check, opening it must not block
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise AudioInputError(f"{str(p)!r} is not a regular file; give the path of an audio file")
            data = f.read(max_bytes + 1)  # never more than the bound, even if the file grew meanwhile
    except OSError as e:
        raise AudioInputError(f"cannot read {str(p)!r} ({_os_reason(e)}); check its permissions") from None
    if len(data) > max_bytes:
        raise AudioInputError(f"{str(p)!r} is larger than {_format_bytes(max_bytes)}; use a shorter clip")
    return data


def _os_reason(e: BaseException) -> str:
    """An OSError's reason without the errno noise."""
    return getattr(e, "strerror", None) or str(e)


def decode_upload(data: bytes, filename: str = "", *, max_bytes: int, max_seconds: float) -> Decoded:
    """Decode an uploaded clip of any common format into mono float32.

    The size is checked before decoding and the duration while decoding (a long file is never decoded past
    ``max_seconds``). The container is detected from the content; ``filename`` is only used in messages.

    Parameters
    ----------
    data: the file's bytes.
    filename: the name the user gave it (for messages only).
    max_bytes: largest accepted upload, bytes.
    max_seconds: longest accepted upload, seconds.

    Returns
    -------
    Decoded: ``[N]`` float32 mono samples and their rate.

    Raises
    ------
    AudioInputError: empty, oversized, too long, cut off, not audio, or with impossible parameters; the message
        says what to send instead.
    """
    label = f"{filename!r}" if filename else "the file"
    if not data:
        raise AudioInputError(f"{label} is empty (0 bytes); send a recording of 3-10 s of your voice")
    if len(data) > max_bytes:
        raise AudioInputError(
            f"{label} is {_format_bytes(len(data))}; send at most {_format_bytes(max_bytes)} "
            "(a 10 s voice clip is well under 1 MB)"
        )
    _check_riff_length(data, label)
    try:
        container = av.open(
            io.BytesIO(data),
            mode="r",
            metadata_errors="ignore",
            container_options={"format_whitelist": DEMUXERS, "protocol_whitelist": "none"},
        )
    except (av.error.FFmpegError, ValueError, UnicodeDecodeError) as e:
        raise AudioInputError(_not_audio(label)) from e
    with container:
        if not container.streams.audio:
            raise AudioInputError(f"{label} has no audio track; send a voice recording ({ACCEPTED_FORMATS})")
        stream = container.streams.audio[0]
        ctx = stream.codec_context
        rate, channels = int(ctx.sample_rate or 0), int(ctx.channels or 0)
        _check_stream_parameters(label, rate, channels)
        declared_s = _declared_duration(container, stream)
        if declared_s is not None and declared_s > max_seconds:
            raise AudioInputError(f"the clip is {_format_duration(declared_s)} long; send at most {_format_duration(max_seconds)}")
        samples, decoded_in = _decode_stream(container, stream, label, rate, max_seconds, declared_s)
        format_name = container.format.name
    if decoded_in == 0:
        raise AudioInputError(f"{label} holds no audio samples; send a recording of 3-10 s of your voice")
    decoded_s = decoded_in / rate
    if declared_s is not None and _length_is_exact(format_name, data) and _cut_off(declared_s, decoded_s):
        raise AudioInputError(
            f"{label} is cut off: its header says {declared_s:.1f} s but only {decoded_s:.1f} s of audio is "
            "there; send the complete file"
        )
    out_rate = min(rate, MAX_DECODE_RATE)
    log.debug("decoded %s: %s, %d Hz -> %d Hz, %.2f s", label, format_name, rate, out_rate, decoded_s)
    return Decoded(samples=samples, sample_rate=out_rate, duration_s=samples.size / out_rate)


def _decode_stream(
    container: Any, stream: Any, label: str, rate: int, max_seconds: float, declared_s: float | None
) -> tuple[np.ndarray, int]:
    """Decode one audio stream to mono float32, stopping (and refusing) as soon as it passes ``max_seconds``."""
    out_rate = min(rate, MAX_DECODE_RATE)
    downsampler = StreamResampler(rate, out_rate) if out_rate != rate else None
    limit = int(math.floor(max_seconds * rate))  # input samples
    total = 0
    parts: list[np.ndarray] = []
    try:
        for packet in container.demux(stream):
            for frame in packet.decode():
                if frame.sample_rate != rate:
                    raise AudioInputError(
                        f"{label} changes sample rate midway ({rate} -> {frame.sample_rate} Hz); "
                        "export it again as one wav or flac file"
                    )
                mono = _frame_to_mono(frame)
                total += mono.size
                if total > limit:
                    raise AudioInputError(_too_long(max_seconds, declared_s))
                parts.append(downsampler.process(mono) if downsampler else mono)
    except av.error.FFmpegError as e:
        if total == 0:
            raise AudioInputError(_not_audio(label)) from e
        raise AudioInputError(
            f"{label} is damaged or cut off after {total / rate:.1f} s of audio ({ACCEPTED_FORMATS} are "
            "accepted); send the complete file"
        ) from e
    if downsampler is not None:
        parts.append(downsampler.process(np.zeros(0, np.float32), last=True))
    samples = np.concatenate(parts).astype(np.float32, copy=False) if parts else np.zeros(0, np.float32)
    return samples, total


def _frame_to_mono(frame: Any) -> np.ndarray:
    """One decoded AudioFrame -> ``[n]`` float32, channels averaged, non-finite values zeroed."""
    arr = frame.to_ndarray()
    channels = frame.layout.nb_channels
    if not frame.format.is_planar:
        arr = arr.reshape(-1, channels).T
    if arr.dtype == np.uint8:
        x = (arr.astype(np.float32) - 128.0) / 128.0
    elif np.issubdtype(arr.dtype, np.integer):
        x = arr.astype(np.float32) / float(np.iinfo(arr.dtype).max + 1)
    else:
        x = arr.astype(np.float32, copy=False)
    mono = x.mean(axis=0) if x.shape[0] > 1 else x[0]
    if not np.isfinite(mono).all():
        mono = np.nan_to_num(mono, nan=0.0, posinf=0.0, neginf=0.0)
    return np.ascontiguousarray(mono, dtype=np.float32)


def _check_stream_parameters(label: str, rate: int, channels: int) -> None:
    """Refuse impossible or unsupported stream parameters before decoding."""
    if channels <= 0:
        raise AudioInputError(f"{label} declares 0 audio channels, so its header is damaged; export it again ({ACCEPTED_FORMATS})")
    if channels > MAX_CHANNELS:
        raise AudioInputError(f"{label} declares {channels} channels; send a mono or stereo recording")
    if rate <= 0:
        raise AudioInputError(f"{label} declares no sample rate, so its header is damaged; export it again ({ACCEPTED_FORMATS})")
    if rate > MAX_INPUT_RATE:
        raise AudioInputError(
            f"{label} declares a sample rate of {rate:,} Hz; send audio at {MAX_INPUT_RATE // 1000} kHz or less "
            "(48 kHz is typical)"
        )
    if rate < MIN_INPUT_RATE:
        raise AudioInputError(f"{label} has a sample rate of {rate} Hz, too low for speech; record at 16 kHz or more")


def _check_riff_length(data: bytes, label: str) -> None:
    """Refuse a WAV whose data chunk declares more bytes than the file holds (cut off, or a lying header)."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return
    pos = 12
    while pos + 8 <= len(data):
        chunk_id, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        if chunk_id == b"data":
            available = len(data) - pos - 8
            # 0 and 0xFFFFFFFF are what streaming writers put there when the length is unknown.
            if size not in (0, 0xFFFFFFFF) and size > available:
                raise AudioInputError(
                    f"{label} is cut off or its header is wrong: it declares {_format_bytes(size)} of audio but "
                    f"holds {_format_bytes(available)}; send the complete file"
                )
            return
        pos += 8 + size + (size & 1)


def _declared_duration(container: Any, stream: Any) -> float | None:
    """The duration the file's headers state, seconds (None when they do not say)."""
    if stream.duration is not None and stream.time_base is not None and stream.duration > 0:
        return float(stream.duration * stream.time_base)
    if container.duration is not None and container.duration > 0:
        return container.duration / 1_000_000.0
    return None


def _length_is_exact(format_name: str, data: bytes) -> bool:
    """Whether the container's declared length is exact (not estimated from the bitrate)."""
    if any(name in format_name for name in _EXACT_LENGTH_FORMATS):
        return True
    if format_name == "mp3":  # only a Xing/Info/VBRI header states an mp3's length; otherwise it is estimated
        head = data[:16384]
        return b"Xing" in head or b"Info" in head or b"VBRI" in head
    return False


def _cut_off(declared_s: float, decoded_s: float) -> bool:
    """Whether the decoded audio is clearly shorter than the header promised."""
    return decoded_s < declared_s * TRUNCATION_TOLERANCE and declared_s - decoded_s > TRUNCATION_SLACK_S


def _not_audio(label: str) -> str:
    """The message for bytes FFmpeg cannot read as audio."""
    return f"{label} is not audio we can read; send {ACCEPTED_FORMATS}"


def _too_long(max_seconds: float, declared_s: float | None) -> str:
    """The message for a clip longer than allowed."""
    if declared_s is not None and declared_s > max_seconds:
        return f"the clip is {_format_duration(declared_s)} long; send at most {_format_duration(max_seconds)}"
    return f"the clip is longer than {_format_duration(max_seconds)}; send at most {_format_duration(max_seconds)}"


def _format_duration(seconds: float) -> str:
    """Human duration: '61 minutes', '10 minutes', '45 s'."""
    if seconds >= 120:
        return f"{round(seconds / 60)} minutes"
    return f"{seconds:.0f} s"


def _format_bytes(n: int) -> str:
    """Human size: '30.0 MB', '512 KB', '12 bytes'."""
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f} MB"
    if n >= 1_000:
        return f"{n / 1_000:.0f} KB"
    return f"{n} bytes"


# =============================================================================================================
# Resampling
# =============================================================================================================


def resample(x: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Resample a mono signal with soxr (high quality).

    Parameters
    ----------
    x: ``[N]`` float32 mono.
    sr_in, sr_out: rates in Hz.

    Returns
    -------
    ``[M]`` float32 with ``M ≈ N * sr_out / sr_in``.
    """
    if sr_in <= 0 or sr_out <= 0:
        raise ValueError(f"sample rates must be positive, got {sr_in} -> {sr_out}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if sr_in == sr_out or x.size == 0:
        return x.copy()
    return np.asarray(soxr.resample(x, sr_in, sr_out, quality="HQ"), dtype=np.float32)


class StreamResampler:
    """Chunked mono resampling whose joins are seamless (the filter state carries over between chunks).

    Parameters
    ----------
    sr_in, sr_out: rates in Hz.
    """

    def __init__(self, sr_in: int, sr_out: int) -> None:
        if sr_in <= 0 or sr_out <= 0:
            raise ValueError(f"sample rates must be positive, got {sr_in} -> {sr_out}")
        self.sr_in = sr_in
        self.sr_out = sr_out
        self._stream = soxr.ResampleStream(sr_in, sr_out, 1, dtype="float32", quality="HQ") if sr_in != sr_out else None
        self._done = False

    def process(self, chunk: np.ndarray, last: bool = False) -> np.ndarray:
        """Resample the next ``[n]`` float32 chunk; pass ``last=True`` once at the end to flush the filter tail.

        Returns the ``[m]`` float32 output that is ready (the filter delays a few ms of output until later chunks).
        """
        if self._done:
            raise RuntimeError("StreamResampler.process called after last=True; make a new resampler")
        self._done = last
        chunk = np.ascontiguousarray(chunk, dtype=np.float32)
        if self._stream is None:
            return chunk.copy()
        return np.asarray(self._stream.resample_chunk(chunk, last=last), dtype=np.float32)


# =============================================================================================================
# Reference preparation
# =============================================================================================================


def reference_from_upload(data: bytes, filename: str = "", *, max_bytes: int, max_seconds: float,
                          min_s: float = 3.0, max_s: float = 10.0) -> Reference:
    """:func:`decode_upload` then :func:`prepare_reference`, and the memory they used handed back to the system.

    A long upload is decoded into hundreds of MB of float arrays in a worker thread. Freed, that memory stays in
    glibc's per-thread arena, so every worker thread that once decoded a long clip would keep its peak for good
    (see FINDINGS.md#upload-memory). ``malloc_trim`` returns it once the arrays are gone, whether the upload was
    accepted or refused.
    """
    try:
        dec = decode_upload(data, filename, max_bytes=max_bytes, max_seconds=max_seconds)
        ref = prepare_reference(dec, min_s=min_s, max_s=max_s)
        del dec
        return ref
    finally:
        release_freed_memory()


def release_freed_memory() -> None:
    """Return the heap's free memory to the system (glibc ``malloc_trim``; a no-op on other C libraries)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


_TRIM: list[Any] = []  # [malloc_trim or None], looked up once


def _malloc_trim() -> Any:
    if not _TRIM:
        fn = None
        try:
            import ctypes
            import ctypes.util

            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            fn = getattr(libc, "malloc_trim", None)
        except OSError:
            pass
        _TRIM.append(fn)
    return _TRIM[0]


def prepare_reference(dec: Decoded, *, min_s: float = 3.0, max_s: float = 10.0) -> Reference:
    """Turn a decoded upload into a model-ready reference clip.

    Steps: remove DC, resample to 32 kHz, find speech (frames the voice detector, :mod:`synthesis.vad`, hears as a
    voice and that stand out of the clip's own noise floor), refuse silence / steady sound / a clip the detector
    hears no voice in (music, tones, noise) / too little speech, keep one speaker's turn when there are several
    (:mod:`synthesis.speakers`), pick the best ``min_s``-``max_s`` stretch (the most continuous speech, cut in pauses
    or outside it), measure the speech it leaves out, normalise loudness without clipping, fade the cut points.

    Without the detector (``synthesis.vad.model_path()`` is None: silero-vad not installed, or its model failed to
    load) speech is found by loudness alone: music or tones with pauses are accepted as speech, speakers are not told
    apart, a loud non-speech sound outside the stretch counts as left-out speech (so a transcript is dropped rather
    than trusted), and the Reference carries :data:`NO_DETECTOR_WARNING` for the person.

    Parameters
    ----------
    dec: the decoded upload.
    min_s, max_s: shortest amount of speech accepted and longest stretch kept, seconds.

    Returns
    -------
    Reference: its ``kept`` line says which seconds were kept and why when speech was left out (then
    ``speech_left_out`` is True and a transcript of the upload does not match it); warnings, measured on the kept
    stretch, for heavy clipping, loud background noise, a very quiet recording, a second speaker still in it, or no
    detector.

    Raises
    ------
    AudioInputError: the clip is silent, a steady sound, has no voice (music, tones, noise), or less than ``min_s``
        of speech (of any one speaker).
    """
    if not 0 < min_s <= max_s:
        raise ValueError(f"need 0 < min_s <= max_s, got {min_s}, {max_s}")
    if dec.samples.size == 0:
        raise AudioInputError("the clip is empty; record 3-10 s of your voice")
    src = dec.samples.astype(np.float32, copy=False)
    x = resample(src - np.float32(src.mean()), dec.sample_rate, SAMPLE_RATE)  # [N] float32 @ 32 kHz
    hop = int(round(FRAME_S * SAMPLE_RATE))  # samples per analysis frame
    n_frames = x.size // hop
    if n_frames == 0:
        raise AudioInputError(f"the clip is only {dec.duration_s:.2f} s long; record {min_s:g}-{max_s:g} s of your voice")
    frames = x[: n_frames * hop].reshape(n_frames, hop)
    db = 10.0 * np.log10(np.mean(frames.astype(np.float64) ** 2, axis=1) + 1e-12)  # [F] frame level, dBFS
    if db.max() < SILENCE_DBFS:
        raise AudioInputError(
            f"the clip is silent (loudest moment {db.max():.0f} dBFS); check that the right microphone is "
            "selected and unmuted, then record again"
        )
    floor_db = float(np.percentile(db, 10))
    loud_db = float(np.percentile(db, 99))
    if loud_db - floor_db < MIN_DYNAMIC_DB:
        raise AudioInputError(
            "no speech found: the clip is a steady sound (noise, hum or a tone) with no pauses; record yourself "
            "speaking in a quiet room"
        )
    voice = _voice_frames(x, n_frames)  # [F] bool, or None without the VAD model
    warnings: list[str] = []
    if voice is None:
        # No detector (silero-vad missing or broken): speech is whatever stands out of the noise floor, so music or
        # a tone with pauses passes for a voice and speakers are not told apart. The person is told so.
        warnings.append(NO_DETECTOR_WARNING)
    else:
        voice_s = float(voice.sum()) * FRAME_S
        if voice_s < MIN_VOICE_S:
            raise AudioInputError(
                f"no speech found: the voice detector hears no one speaking in this {dec.duration_s:.1f} s clip "
                f"({voice_s:.1f} s of voice), only music, tones or noise; record yourself speaking"
            )
        # Only voiced frames count, so a noise burst, music or another loud sound beside the speech is a pause to
        # the stretch choice, never "speech" (an energy gate's mistake).
        loud_db = float(np.percentile(db[voice], 99))
    threshold = max(floor_db + SPEECH_FRACTION * (loud_db - floor_db), SILENCE_DBFS)
    loud = db > threshold  # [F] bool, stands out of the noise floor
    speech = _clean_mask(loud if voice is None else loud & voice)  # [F] bool
    speech_s = float(speech.sum()) * FRAME_S
    if speech_s < min_s:
        raise AudioInputError(
            f"the clip has only {speech_s:.1f} s of speech; GPT-SoVITS needs {min_s:g}-{max_s:g} s: "
            "record a sentence or two"
        )

    # Speakers are told apart only in frames the detector hears as a voice: without it, a noise burst or music
    # would count as "another speaker".
    one_voice = _one_speaker(x, speech, loud, min_s, max_s) if voice is not None else None  # [F] bool, or None
    kept_speech = speech if one_voice is None else one_voice
    start, end = _best_stretch(db, kept_speech, loud, floor_db, loud_db, min_s, max_s)
    warnings += _quality_warnings(src, dec.sample_rate, db, speech, start, end)
    if one_voice is not None:
        warnings += _second_speaker(x, speech & loud, start, end)
    end_s = min(end * FRAME_S, dec.duration_s)
    left_out_s = float(speech[:start].sum() + speech[end:].sum()) * FRAME_S  # everyone's speech outside the stretch
    kept = ""
    if left_out_s > MAX_LEFT_OUT_S:
        own_left_out_s = float(kept_speech[:start].sum() + kept_speech[end:].sum()) * FRAME_S
        what = (f"the most continuous part of its {speech_s:.1f} s of speech (GPT-SoVITS takes {min_s:g}-{max_s:g} s)"
                if one_voice is None else "the one who speaks longest" if own_left_out_s <= MAX_LEFT_OUT_S else
                f"the most continuous part of the one who speaks longest (GPT-SoVITS takes {min_s:g}-{max_s:g} s)")
        kept = (f"{'the clip has more than one speaker; ' if one_voice is not None else ''}the voice uses seconds "
                f"{start * FRAME_S:.1f}-{end_s:.1f} of the {dec.duration_s:.1f} s clip, {what}, and leaves out "
                f"{left_out_s:.1f} s of speech")
        log.info("reference: %s", kept)

    clip = x[start * hop : end * hop].astype(np.float32, copy=True)
    in_clip = speech[start:end]
    speech_frames = frames[start:end][in_clip]
    rms = float(np.sqrt(np.mean(speech_frames.astype(np.float64) ** 2))) if speech_frames.size else 1e-6
    peak = float(np.max(np.abs(clip))) or 1e-6
    wanted_db = TARGET_RMS_DBFS - 20.0 * math.log10(max(rms, 1e-9))
    gain_db = min(wanted_db, MAX_GAIN_DB, 20.0 * math.log10(PEAK_CEILING / peak))
    if wanted_db > MAX_GAIN_DB:
        warnings.append(
            f"the recording is very quiet (speech at {20 * math.log10(max(rms, 1e-9)):.0f} dBFS); move closer to "
            "the microphone or raise its gain for a cleaner voice"
        )
    clip *= np.float32(10.0 ** (gain_db / 20.0))
    clip = fade_edges(clip)
    wav16k = resample(clip, SAMPLE_RATE, SSL_SAMPLE_RATE)
    for w in warnings:
        log.info("reference warning: %s", w)
    return Reference(
        wav32k=clip,
        wav16k=wav16k,
        duration_s=clip.size / SAMPLE_RATE,
        warnings=warnings,
        start_s=start * FRAME_S,
        end_s=end_s,
        clip_s=dec.duration_s,
        left_out_s=left_out_s,
        kept=kept,
    )


def _one_speaker(x: np.ndarray, speech: np.ndarray, loud: np.ndarray, min_s: float,
                 max_s: float) -> np.ndarray | None:
    """``[F]`` bool: the speech of the turn with the most speech when the clip has more than one speaker, else None.

    Turns come from :func:`synthesis.speakers.speaker_turns` on the loud voiced frames of ``x`` (32 kHz). A
    reference mixing two people makes a voice that is neither, so only one turn's speech is kept.

    Raises
    ------
    AudioInputError: more than one speaker, and none with ``min_s`` of speech in one turn.
    """
    turns = speaker_turns(resample(x, SAMPLE_RATE, SSL_SAMPLE_RATE), SSL_SAMPLE_RATE, speech & loud, FRAME_S)
    if len(turns) == 1:
        return None
    lo, hi = max(turns, key=lambda t: int(speech[t[0] : t[1]].sum()))
    kept = np.zeros_like(speech)
    kept[lo:hi] = speech[lo:hi]
    # A change of speaker is placed to within about half a second (exactly only where the two voices differ a lot):
    # speech that close to it is left out. Where the change lies in a long pause, that is pause anyway.
    margin = int(round(TURN_MARGIN_S / FRAME_S))
    if lo > 0:
        kept[lo : lo + margin] = False
    if hi < speech.size:
        kept[max(lo, hi - margin) : hi] = False
    kept_s = float(kept.sum()) * FRAME_S
    log.info("%d speaker turns, changes at %s s; keeping %.1f-%.1f s", len(turns),
             ", ".join(f"{a * FRAME_S:.1f}" for a, _ in turns[1:]), lo * FRAME_S, hi * FRAME_S)
    if kept_s < min_s:
        raise AudioInputError(
            f"the clip has more than one speaker and none speaks for {min_s:g} s in one go (longest {kept_s:.1f} s); "
            f"record {min_s:g}-{max_s:g} s of one voice alone"
        )
    return kept


def _clean_mask(mask: np.ndarray) -> np.ndarray:
    """Fill short pauses between speech frames, then drop speech islands too short to be speech."""
    out = mask.copy()
    gap = int(round(GAP_FILL_S / FRAME_S))
    island = int(round(MIN_ISLAND_S / FRAME_S))
    for value, run_start, run_len in _runs(out):
        interior = run_start > 0 and run_start + run_len < out.size
        if not value and interior and run_len <= gap:
            out[run_start : run_start + run_len] = True
    for value, run_start, run_len in _runs(out):
        if value and run_len < island:
            out[run_start : run_start + run_len] = False
    return out


def _runs(mask: np.ndarray) -> list[tuple[bool, int, int]]:
    """Run-length encoding of a bool array: (value, start, length) per run."""
    if mask.size == 0:
        return []
    edges = np.flatnonzero(np.diff(mask.astype(np.int8))) + 1
    starts = np.concatenate([[0], edges])
    lengths = np.diff(np.concatenate([starts, [mask.size]]))
    return [(bool(mask[s]), int(s), int(n)) for s, n in zip(starts, lengths)]


def _voice_frames(x: np.ndarray, n_frames: int) -> np.ndarray | None:
    """``[n_frames]`` bool: the VAD hears a voice in each :data:`FRAME_S` frame of ``x`` (32 kHz); None without it."""
    prob = speech_probability(resample(x, SAMPLE_RATE, VAD_RATE))  # [T] per 32 ms
    if prob is None or prob.size == 0:
        return None
    centres = (np.arange(n_frames) + 0.5) * FRAME_S  # s
    idx = np.minimum((centres / VAD_FRAME_S).astype(np.int64), prob.size - 1)
    voiced = prob[idx] >= VAD_THRESHOLD
    pad = int(round(VAD_PAD_S / FRAME_S))
    padded = voiced.copy()
    for k in range(1, pad + 1):  # widen each voiced run by ``pad`` frames each side (the detector's onset lag)
        padded[:-k] |= voiced[k:]
        padded[k:] |= voiced[:-k]
    return padded


def _second_speaker(x: np.ndarray, voiced: np.ndarray, start: int, end: int) -> list[str]:
    """A warning when the kept frames ``[start, end)`` of ``x`` (32 kHz) still hold more than one speaker, told apart
    on their ``voiced`` (loud speech) frames; [] when they hold one."""
    hop = int(round(FRAME_S * SAMPLE_RATE))
    seg = resample(x[start * hop : end * hop], SAMPLE_RATE, SSL_SAMPLE_RATE)
    turns = speaker_turns(seg, SSL_SAMPLE_RATE, voiced[start:end], FRAME_S)
    if len(turns) == 1:
        return []
    change_s = (start + turns[1][0]) * FRAME_S
    return [f"the kept audio seems to hold a second speaker too (a change near second {change_s:.1f} of the clip); "
            "for a faithful voice, upload a clip of one person alone"]


def _best_stretch(
    db: np.ndarray, speech: np.ndarray, loud: np.ndarray, floor_db: float, loud_db: float, min_s: float, max_s: float
) -> tuple[int, int]:
    """Frame range ``[start, end)`` of the best stretch of speech, ``min_s``-``max_s`` long where possible.

    A stretch scores its seconds of speech, minus :data:`PAUSE_WEIGHT` per second of long pause inside it,
    minus :data:`CUT_COST_S` times how loud the audio is at each edge (cut in pauses, not through words).
    """
    idx = np.flatnonzero(speech)
    first, last = int(idx[0]), int(idx[-1]) + 1
    min_f = int(round(min_s / FRAME_S))
    max_f = int(round(max_s / FRAME_S))
    if last - first <= max_f:
        start, end = first, last
    else:
        level = np.clip((db - floor_db) / max(loud_db - floor_db, 1e-6), 0.0, 1.0)  # [F] 0 = floor, 1 = loud
        level[loud & ~speech] = 0.0  # cutting through a loud non-speech sound costs nothing: it is not a word
        # cost of a cut at boundary b (between frame b-1 and b): the quieter neighbour's level
        left = np.concatenate([[level[0]], level])
        right = np.concatenate([level, [level[-1]]])
        cut = np.minimum(left, right) * (CUT_COST_S / FRAME_S)  # [F+1], in frames of speech
        voiced = np.concatenate([[0], np.cumsum(speech)])  # [F+1]
        pauses = np.concatenate([[0], np.cumsum(~speech)])
        best_score, start, end = -np.inf, first, first + max_f
        for length in range(min_f, max_f + 1):
            s = np.arange(first, last - length + 1)
            e = s + length
            score = (voiced[e] - voiced[s]) - PAUSE_WEIGHT * (pauses[e] - pauses[s]) - cut[s] - cut[e]
            i = int(np.argmax(score))
            if score[i] > best_score + 1e-9:
                best_score, start, end = float(score[i]), int(s[i]), int(e[i])
    pad = int(round(EDGE_PAD_S / FRAME_S))
    quiet = ~speech & ~loud  # padding goes into silence only, never into a noise burst next to the speech
    for _ in range(pad):  # keep a little silence around the speech, one frame per side at a time
        if start > 0 and quiet[start - 1] and end - start < max_f:
            start -= 1
        if end < speech.size and quiet[end] and end - start < max_f:
            end += 1
    return start, end


def _quality_warnings(
    src: np.ndarray, src_rate: int, db: np.ndarray, speech: np.ndarray, start: int, end: int
) -> list[str]:
    """Clipping and noise warnings for the chosen stretch, both measured on it (clipping on the original samples)."""
    warnings: list[str] = []
    i0, i1 = int(start * FRAME_S * src_rate), int(end * FRAME_S * src_rate)
    seg = np.abs(src[i0:i1])
    if seg.size:
        peak = float(seg.max())
        full = float(np.mean(seg >= FULL_SCALE))
        flat = float(np.mean(seg >= NEAR_PEAK * peak)) if peak > 0.1 else 0.0
        clipped = max(full, flat)
        if clipped > CLIP_WARN_FRACTION:
            warnings.append(
                f"the recording is heavily clipped ({clipped:.1%} of samples at full scale); lower the microphone "
                "gain or move further from it, then record again for a cleaner voice"
            )
    sel_db, sel_speech = db[start:end], speech[start:end]
    speech_db = float(np.median(sel_db[sel_speech]))
    # The noise that matters is the noise in the kept audio: a loud fan elsewhere in the upload is not in the voice.
    pauses = sel_db[~sel_speech]
    if pauses.size * FRAME_S >= MIN_NOISE_S:
        noise_db = float(np.median(pauses))
    else:  # speech without a long pause: the floor shows between syllables, in the stretch's quietest frames
        noise_db = float(np.percentile(sel_db, NOISE_PERCENTILE))
    snr = speech_db - noise_db
    if snr < NOISY_SNR_DB:
        warnings.append(
            f"there is loud background noise (speech only {snr:.0f} dB above it); record in a quieter place "
            "for a cleaner voice"
        )
    return warnings


def fade_edges(audio: np.ndarray, *, head: bool = True, tail: bool = True,
               sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """A copy of ``[N]`` float32 audio with :data:`FADE_S` raised-cosine fades at its start and/or end.

    Used wherever audio is cut or meets silence (reference cut points, sentence edges), so no join clicks.
    """
    n = min(int(round(FADE_S * sample_rate)), audio.size // 2)
    out = np.array(audio, dtype=np.float32, copy=True)
    if n <= 0:
        return out
    ramp = raised_cosine(n)
    if head:
        out[:n] *= ramp
    if tail:
        out[-n:] *= ramp[::-1]
    return out


def raised_cosine(n: int) -> np.ndarray:
    """``[n]`` float32 raised-cosine rise from 0 to 1 (fades and crossfades)."""
    return (0.5 - 0.5 * np.cos(np.linspace(0.0, np.pi, n, dtype=np.float64))).astype(np.float32)


# =============================================================================================================
# Encoding
# =============================================================================================================


def encode_audio(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """Encode a whole clip.

    Parameters
    ----------
    samples: ``[N]`` int16, or float32 in [-1, 1] (clipped), mono.
    sample_rate: Hz.
    fmt: one of :data:`ENCODE_FORMATS` (wav, raw/pcm = s16le, ogg/opus = Opus in Ogg, mp3, aac = ADTS, flac).

    Returns
    -------
    The file's bytes, with exact lengths in its headers (unlike :class:`StreamEncoder`).
    """
    _check_format(fmt)
    if fmt in ("wav", "raw", "pcm"):
        pcm = _pcm_bytes(samples)
        return _wav_header(sample_rate, len(pcm)) + pcm if fmt == "wav" else pcm
    x = _to_float(samples)
    buf = io.BytesIO()  # seekable: the muxer goes back to write exact lengths (flac STREAMINFO, mp3 Xing)
    muxer = _Muxer(fmt, sample_rate, buf, streaming=False)
    muxer.write(x)
    muxer.close()
    return buf.getvalue()


class StreamEncoder:
    """Encode audio chunk by chunk for a streaming HTTP response.

    ``header()`` gives the bytes that precede any audio (a WAV header with length 0, as upstream api_v2 sends;
    the container header for compressed formats), ``encode(chunk)`` the bytes ready after each chunk, and
    ``finish()`` the remainder. Calling ``header()`` is optional: otherwise those bytes lead the first
    ``encode()``. Concatenated, the pieces form a valid file.

    Parameters
    ----------
    fmt: one of :data:`ENCODE_FORMATS`.
    sample_rate: Hz of the chunks that will be passed in.
    """

    def __init__(self, fmt: str, sample_rate: int) -> None:
        _check_format(fmt)
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {sample_rate}")
        self.fmt = fmt
        self.sample_rate = sample_rate
        self.content_type = CONTENT_TYPES[fmt]
        self._sink = _ChunkSink()
        self._muxer = _Muxer(fmt, sample_rate, self._sink, streaming=True) if fmt in _AV_CODECS else None
        self._header_sent = False
        self._finished = False

    def header(self) -> bytes:
        """Bytes that must precede the audio (returned once; b"" for raw PCM)."""
        if self._header_sent:
            return b""
        self._header_sent = True
        if self.fmt == "wav":
            return _wav_header(self.sample_rate, 0)
        if self._muxer is not None:
            self._muxer.start()
            return self._sink.take()
        return b""

    def encode(self, chunk: np.ndarray) -> bytes:
        """Encode the next ``[n]`` chunk (int16, or float32 in [-1, 1]); returns the bytes ready so far."""
        if self._finished:
            raise RuntimeError("StreamEncoder.encode called after finish()")
        head = self.header()
        if self._muxer is None:
            return head + _pcm_bytes(chunk)
        self._muxer.write(_to_float(chunk))
        return head + self._sink.take()

    def finish(self) -> bytes:
        """Flush the encoder and close the container; returns the last bytes."""
        if self._finished:
            return b""
        head = self.header()
        self._finished = True
        if self._muxer is None:
            return head
        self._muxer.close()
        return head + self._sink.take()


class _ChunkSink:
    """A write-only, non-seekable file object collecting what the muxer writes."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: Any) -> int:
        """Append bytes written by FFmpeg."""
        b = bytes(data)
        self._parts.append(b)
        return len(b)

    def take(self) -> bytes:
        """Return and forget everything written so far."""
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class _Muxer:
    """One PyAV output container + audio stream; float mono in, encoded bytes out to ``file``."""

    def __init__(self, fmt: str, sample_rate: int, file: Any, *, streaming: bool) -> None:
        container_fmt, codec_name, self._sample_fmt = _AV_CODECS[fmt]
        rates = av.Codec(codec_name, "w").audio_rates
        self._rate = sample_rate if not rates or sample_rate in rates else FALLBACK_ENCODE_RATE
        self._resampler = StreamResampler(sample_rate, self._rate) if self._rate != sample_rate else None
        options: dict[str, str] = {}
        if streaming:
            options["flush_packets"] = "1"  # hand bytes over after every packet, not every 32 KB
            if container_fmt in ("ogg", "opus"):
                options["page_duration"] = str(OGG_PAGE_US)
        try:
            self._container: Any = av.open(file, mode="w", format=container_fmt, container_options=options)
            self._stream: Any = self._container.add_stream(codec_name, rate=self._rate)
            self._stream.layout = "mono"
            self._stream.format = self._sample_fmt
        except av.error.FFmpegError as e:  # pragma: no cover - depends on the FFmpeg build
            raise RuntimeError(f"this PyAV/FFmpeg build cannot encode {fmt} ({codec_name}): {e}") from e
        self._pts = 0
        self._started = False

    def start(self) -> None:
        """Write the container header."""
        if not self._started:
            self._started = True
            self._container.start_encoding()

    def write(self, x: np.ndarray) -> None:
        """Encode and mux ``[n]`` float32 mono samples at the input rate."""
        self.start()
        if self._resampler is not None:
            x = self._resampler.process(x)
        self._encode(x)

    def close(self) -> None:
        """Flush the resampler and encoder, write the trailer."""
        self.start()
        if self._resampler is not None:
            self._encode(self._resampler.process(np.zeros(0, np.float32), last=True))
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()

    def _encode(self, x: np.ndarray) -> None:
        """Wrap samples in an AudioFrame and mux whatever packets the encoder produces."""
        if x.size == 0:
            return
        if self._sample_fmt == "s16":
            arr: np.ndarray = to_pcm16(x)[None, :]
        else:
            arr = np.ascontiguousarray(x, dtype=np.float32)[None, :]
        frame = av.AudioFrame.from_ndarray(arr, format=self._sample_fmt, layout="mono")
        frame.sample_rate = self._rate
        frame.pts = self._pts
        frame.time_base = Fraction(1, self._rate)
        self._pts += x.size
        for packet in self._stream.encode(frame):
            self._container.mux(packet)


def _check_format(fmt: str) -> None:
    """Refuse an unknown output format, naming the known ones."""
    if fmt not in ENCODE_FORMATS:
        raise ValueError(f"unknown audio format {fmt!r}; use one of {', '.join(ENCODE_FORMATS)}")


def _to_float(samples: np.ndarray) -> np.ndarray:
    """int16 or float audio -> ``[n]`` float32 in [-1, 1]."""
    a = np.asarray(samples)
    if a.ndim != 1:
        raise ValueError(f"expected mono samples of shape [N], got shape {a.shape}")
    if a.dtype == np.int16:  # the inverse of to_pcm16, so int16 passes through a float codec path unchanged
        return a.astype(np.float32) / np.float32(PCM16_SCALE)
    return np.clip(a.astype(np.float32, copy=False), -1.0, 1.0)


def _pcm_bytes(samples: np.ndarray) -> bytes:
    """int16 (as is) or float audio (:func:`~synthesis.types.to_pcm16`) -> s16le PCM bytes."""
    a = np.asarray(samples)
    if a.dtype == np.int16 and a.ndim == 1:
        return a.astype("<i2", copy=False).tobytes()
    return to_pcm16(_to_float(a)).astype("<i2", copy=False).tobytes()


def _wav_header(sample_rate: int, data_bytes: int) -> bytes:
    """Canonical 44-byte mono s16 WAV header; ``data_bytes=0`` marks an unknown (streamed) length."""
    return (
        b"RIFF"
        + struct.pack("<I", 36 + data_bytes)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data_bytes)
    )
