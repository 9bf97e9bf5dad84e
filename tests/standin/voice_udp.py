"""The stand-in's voice UDP endpoint: IP discovery, RTP receive, transport decryption and Opus decoding.

One endpoint per guild. Every datagram that looks like RTP is recorded with its arrival time; its payload is
decrypted with the session's key (``aead_xchacha20_poly1305_rtpsize``: the RTP header is the associated data, the
last 4 bytes are a counter that forms the first 4 bytes of the 24-byte nonce) and decoded with
``discord.opus.Decoder`` to 48 kHz stereo int16, 20 ms per packet. Under DAVE the decrypted payload is an
end-to-end encrypted frame; the voice WebSocket registers an opener for the SSRC (``open_media``) that hands it to
the channel's listening members (:mod:`tests.standin.dave`) and returns the Opus they decrypted.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import discord.opus
import nacl.exceptions
import nacl.secret
import numpy as np

log = logging.getLogger(__name__)

SAMPLE_RATE = 48_000  # Hz, Discord voice
CHANNELS = 2
FRAME_SAMPLES = 960  # samples per channel in a 20 ms frame
RTP_TIMESTAMP_STEP = FRAME_SAMPLES  # RTP clock ticks per 20 ms frame
OPUS_SILENCE = b"\xf8\xff\xfe"  # the frame discord.py sends (5 of them) after a source ends
IP_DISCOVERY_SIZE = 74  # bytes, request and response
RTP_HEADER_SIZE = 12  # bytes without CSRCs or extension
NONCE_SUFFIX_SIZE = 4  # bytes of counter appended to each packet
SUPPORTED_MODE = "aead_xchacha20_poly1305_rtpsize"


@dataclass
class RtpPacket:
    """One received RTP packet.

    ``opus`` is the decrypted payload (empty when decryption failed) and ``pcm`` its decoded audio,
    int16 interleaved stereo @ 48 kHz (3,840 bytes for a 20 ms frame).
    """

    seq: int
    timestamp: int
    ssrc: int
    at: float  # time.monotonic() on arrival
    size: int  # bytes on the wire
    opus: bytes
    pcm: bytes
    e2ee: bool = False  # the payload was a DAVE frame (end-to-end encrypted), not plain Opus

    @property
    def is_silence(self) -> bool:
        """Whether this is the Opus silence frame discord.py sends after a source ends."""
        return self.opus == OPUS_SILENCE


@dataclass
class VoiceRecording:
    """Everything one guild's voice connection sent: RTP packets, SPEAKING updates and decryption errors."""

    guild_id: int
    packets: list[RtpPacket] = field(default_factory=list)
    speaking: list[tuple[float, int]] = field(default_factory=list)  # (monotonic time, op 5 speaking flags)
    errors: list[str] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def first_packet_at(self) -> float | None:
        """``time.monotonic()`` when the first RTP packet arrived, or None."""
        return self.packets[0].at if self.packets else None

    @property
    def last_packet_at(self) -> float | None:
        """``time.monotonic()`` when the latest RTP packet arrived, or None."""
        return self.packets[-1].at if self.packets else None

    def audio_packets(self) -> list[RtpPacket]:
        """The packets that carry audio, i.e. all but discord.py's trailing silence frames."""
        return [p for p in self.packets if not p.is_silence]

    def pcm(self, *, skip_silence: bool = False) -> np.ndarray:
        """The decoded audio of all packets in arrival order.

        Parameters
        ----------
        skip_silence
            Leave out the Opus silence frames discord.py appends after each source.

        Returns
        -------
        np.ndarray
            ``[samples, 2]`` int16 @ 48 kHz.
        """
        packets = self.audio_packets() if skip_silence else self.packets
        raw = b"".join(p.pcm for p in packets)
        return np.frombuffer(raw, dtype=np.int16).reshape(-1, CHANNELS).copy()

    def clear(self) -> None:
        """Forget everything recorded so far (between two utterances of one test)."""
        self.packets.clear()
        self.speaking.clear()
        self.errors.clear()

    async def wait_first_packet(self, timeout: float = 5.0) -> RtpPacket:
        """Wait until at least one RTP packet has arrived and return the first."""
        await self._wait_until(lambda: bool(self.packets), timeout, "no RTP packet arrived")
        return self.packets[0]

    async def wait_packets(self, count: int, timeout: float = 5.0) -> None:
        """Wait until at least ``count`` RTP packets have arrived."""
        await self._wait_until(lambda: len(self.packets) >= count, timeout, f"fewer than {count} RTP packets")

    async def wait_silence(self, quiet_ms: float = 200.0, timeout: float = 10.0) -> None:
        """Wait until packets have arrived and then none for ``quiet_ms`` milliseconds."""
        deadline = time.monotonic() + timeout
        await self.wait_first_packet(timeout)
        while True:
            last = self.last_packet_at
            assert last is not None
            quiet_until = last + quiet_ms / 1000.0
            now = time.monotonic()
            if now >= quiet_until:
                return
            if now >= deadline:
                raise asyncio.TimeoutError(f"voice in guild {self.guild_id} did not go quiet for {quiet_ms} ms")
            await asyncio.sleep(min(quiet_until, deadline) - now)

    async def _wait_until(self, condition: object, timeout: float, what: str) -> None:
        """Wait for ``condition()`` to become true, woken on every packet."""
        assert callable(condition)
        deadline = time.monotonic() + timeout
        while not condition():
            left = deadline - time.monotonic()
            if left <= 0:
                raise asyncio.TimeoutError(f"guild {self.guild_id}: {what} within {timeout} s")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except asyncio.TimeoutError:
                pass

    def _notify(self) -> None:
        """Wake waiters after a change."""
        self._changed.set()


class VoiceUdpEndpoint(asyncio.DatagramProtocol):
    """A guild's UDP voice server on 127.0.0.1: answers IP discovery and records RTP.

    Sessions are registered by the voice WebSocket (``register``) once it has sent the secret key; packets for an
    unknown SSRC are recorded undecrypted with an error.
    """

    def __init__(self, recording: VoiceRecording) -> None:
        self.recording = recording
        self.transport: asyncio.DatagramTransport | None = None
        self._boxes: dict[int, nacl.secret.Aead] = {}
        self._decoders: dict[int, discord.opus.Decoder] = {}
        self.peers: dict[int, tuple[str, int]] = {}  # SSRC -> the client's address seen in IP discovery
        # SSRC -> (seq, payload) -> (Opus, was end-to-end encrypted); raises when no member could decrypt it
        self.openers: dict[int, Callable[[int, bytes], tuple[bytes, bool]]] = {}

    @classmethod
    async def open(cls, recording: VoiceRecording) -> VoiceUdpEndpoint:
        """Bind a new endpoint to a free port on 127.0.0.1."""
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_datagram_endpoint(lambda: cls(recording), local_addr=("127.0.0.1", 0))
        protocol.transport = transport  # connection_made runs only on the next loop iteration
        return protocol

    @property
    def port(self) -> int:
        """The UDP port this endpoint listens on."""
        assert self.transport is not None
        return self.transport.get_extra_info("sockname")[1]

    def register(self, ssrc: int, secret_key: bytes) -> None:
        """Decrypt packets from ``ssrc`` with ``secret_key`` (32 bytes) from now on."""
        self._boxes[ssrc] = nacl.secret.Aead(secret_key)
        self._decoders[ssrc] = discord.opus.Decoder()

    def poke(self, ssrc: int) -> None:
        """Send the client an empty RTCP receiver report, as inbound traffic on a live channel would arrive.

        discord.py's socket reader thread blocks in ``select()`` on the socket it last read, for up to 30 s. On a
        channel where nobody else talks, that thread keeps waiting on the old socket after a voice reconnect, and the
        new connection's IP discovery answer stays unread. One datagram before the drop wakes it.
        """
        if self.transport is not None and ssrc in self.peers:
            self.transport.sendto(struct.pack(">BBHI", 0x80, 201, 1, ssrc), self.peers[ssrc])

    def close(self) -> None:
        """Stop listening."""
        if self.transport is not None:
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a datagram transport for a datagram endpoint

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(data) == IP_DISCOVERY_SIZE and data[:2] == b"\x00\x01":
            self._answer_discovery(data, addr)
        elif len(data) >= RTP_HEADER_SIZE and data[0] >> 6 == 2 and data[1] & 0x7F == 0x78:
            self._receive_rtp(data)
        else:
            self.recording.errors.append(f"unexpected {len(data)}-byte datagram starting {data[:4].hex()}")

    def _answer_discovery(self, data: bytes, addr: tuple[str, int]) -> None:
        """Reply type 2, length 70, the SSRC, the sender's IP (null padded to 64 bytes) and port."""
        assert self.transport is not None
        ssrc = struct.unpack_from(">I", data, 4)[0]
        self.peers[ssrc] = addr
        reply = struct.pack(">HHI", 2, 70, ssrc) + addr[0].encode("ascii").ljust(64, b"\0") + struct.pack(">H", addr[1])
        self.transport.sendto(reply, addr)

    def _receive_rtp(self, data: bytes) -> None:
        """Record one RTP packet, decrypting and decoding it when its SSRC has a session."""
        at = time.monotonic()
        seq, timestamp, ssrc = struct.unpack_from(">HII", data, 2)
        header_size = RTP_HEADER_SIZE + 4 * (data[0] & 0x0F)
        has_extension = bool(data[0] & 0x10)
        if has_extension:  # rtpsize: the 4-byte extension header is authenticated, its body encrypted
            header_size += 4
        opus = pcm = b""
        e2ee = False
        box = self._boxes.get(ssrc)
        if box is None:
            self.recording.errors.append(f"RTP from unknown SSRC {ssrc}")
        else:
            try:
                plain = box.decrypt(
                    data[header_size:-NONCE_SUFFIX_SIZE], data[:header_size],
                    data[-NONCE_SUFFIX_SIZE:] + bytes(24 - NONCE_SUFFIX_SIZE),
                )
            except nacl.exceptions.CryptoError as e:
                self.recording.errors.append(f"seq {seq}: decryption failed ({e})")
            else:
                if has_extension:
                    words = struct.unpack_from(">H", data, RTP_HEADER_SIZE + 2)[0]
                    plain = plain[4 * words :]
                opus, e2ee = self._open(ssrc, seq, plain)
                if opus:
                    try:
                        pcm = self._decoders[ssrc].decode(opus, fec=False)
                    except discord.opus.OpusError as e:
                        self.recording.errors.append(f"seq {seq}: Opus decode failed ({e})")
        self.recording.packets.append(RtpPacket(seq, timestamp, ssrc, at, len(data), opus, pcm, e2ee))
        self.recording._notify()

    def _open(self, ssrc: int, seq: int, payload: bytes) -> tuple[bytes, bool]:
        """The Opus inside a transport-decrypted payload: end-to-end decrypted where an opener is registered."""
        opener = self.openers.get(ssrc)
        if opener is None:
            return payload, False
        try:
            return opener(seq, payload)
        except ValueError as e:
            self.recording.errors.append(f"seq {seq}: end-to-end decryption failed ({e})")
            return b"", True
