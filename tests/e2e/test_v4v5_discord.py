"""A tiny v4 model speaking through the real bot into the local Discord stand-in: the stand-in decrypts each RTP
packet and Opus-decodes it; the audio is the model's 48 kHz, sent without a resampler, and heard (not silence)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import bot.audio_source
from bot.services import build_synthesizer
from tests.audio_samples import speech_like_wav
from tests.e2e.conftest import BotEnv, _with_seed
from tests.e2e.test_bot_e2e import (MIN_ENVELOPE_CORRELATION, MIN_WAVEFORM_CORRELATION, _correlation,
                                    _envelope_correlation, _mono, _say)
from tests.standin.voice_udp import FRAME_SAMPLES, SAMPLE_RATE
from tests.synthesis.test_v4v5_product import _family_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

RATE = 48000  # Hz, v4 output: Discord's own rate
FRAME_S = FRAME_SAMPLES / SAMPLE_RATE  # 0.02 s per RTP packet
TWO_SENTENCES = "The little boat left the harbour early. Gulls followed it out past the lighthouse."


@pytest.fixture(scope="module")
def real_synthesizer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real synthesizer on a tiny v4 model set (``models make-tiny --family v4``), for every test here."""
    root = tmp_path_factory.mktemp("e2e-v4")
    cfg = _with_seed(_family_config(root / "v4", root / "data", "v4"))
    synth = build_synthesizer(cfg)
    assert synth.sample_rate == RATE
    yield synth
    asyncio.run(synth.close())


async def test_a_v4_voice_speaks_48k_over_rtp_without_a_resampler(env: BotEnv,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[tuple[int, int]] = []
    real = bot.audio_source.StreamResampler

    def spy(sr_in: int, sr_out: int) -> Any:
        made.append((sr_in, sr_out))
        return real(sr_in, sr_out)

    monkeypatch.setattr(bot.audio_source, "StreamResampler", spy)
    standin, lay = env.standin, env.standin.layout
    # a v4 voice needs its clip's transcript
    await env.synth.real.voicing.create("alice", speech_like_wav(4.0, 140.0, 0), "alice.wav", owner_id=lay.admin_id,
                                        transcript="Hello, this is my voice.", language="en",
                                        consent={"user_id": lay.admin_id, "text": "test fixture"})
    voice = standin.voice(lay.guild_id)
    await _say(env, lay.guild_id, lay.admin_id, TWO_SENTENCES)
    await voice.wait_first_packet(timeout=60)
    [record] = await env.synth.wait_streams(1)
    await env.synth.wait_closed(record, timeout=120)
    await voice.wait_silence(quiet_ms=300, timeout=30)

    assert record.completed and voice.errors == []
    assert record.sentences == ["The little boat left the harbour early.",
                                "Gulls followed it out past the lighthouse."]
    assert {c.sample_rate for _, c in record.chunks} == {RATE}
    assert made == []  # 48 kHz went to the Opus encoder as it came
    decoded = voice.pcm(skip_silence=True)  # [N, 2] int16 @ 48 kHz, decrypted and Opus-decoded
    speaker = env.speech.speaker(lay.guild_id)
    underrun_s = speaker.underrun_frames * FRAME_S
    print(f"\nv4 /say: {decoded.shape[0] / SAMPLE_RATE:.3f} s decoded, {record.seconds:.3f} s synthesized, "
          f"{speaker.underrun_frames} underrun frames")
    assert np.sqrt(np.mean(_mono(decoded) ** 2)) > 0.01, "the decoded audio is silent"
    assert abs(decoded.shape[0] / SAMPLE_RATE - underrun_s - record.seconds) <= FRAME_S
    if speaker.underrun_frames == 0:  # then the decoded audio lines up with the synthesized one throughout
        reference = record.audio.astype(np.float64)  # already at Discord's rate
        assert _correlation(_mono(decoded), reference) > MIN_WAVEFORM_CORRELATION
        assert _envelope_correlation(_mono(decoded), reference) > MIN_ENVELOPE_CORRELATION
