"""BERT (Chinese text features) loads in a helper thread, never on the device thread that every listener's speech
shares (issue 14, item 6): the load takes seconds with real weights."""

from __future__ import annotations

import threading

import pytest

from bot.services import build_synthesizer
from engines.gpt_sovits.bert import BertFeaturizer
from synthesis.types import SynthesisParams
from tests.audio_samples import speech_like_wav

CONSENT = {"user_id": 1, "text": "this is my own voice"}


@pytest.fixture
def load_threads(monkeypatch):
    """Names of the threads BERT was loaded on."""
    names: list[str] = []
    original = BertFeaturizer.from_folder

    def spy(*args, **kwargs):
        names.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(BertFeaturizer, "from_folder", spy)
    return names


async def test_first_chinese_text_loads_bert_off_the_device_thread(tiny_config, load_threads):
    synth = build_synthesizer(tiny_config)
    try:
        voice, _ = await synth.voicing.create("alice", speech_like_wav(), "alice.wav", transcript="Hello, my voice.",
                                              language="en", consent=CONSENT)
        assert load_threads == []  # English needs no BERT
        params = SynthesisParams(language="zh", seed=7)
        chunks = [c async for c in synth.stream("你好，今天天气很好。", voice, params)]
        assert chunks and load_threads and all(not n.startswith("voicebot-") for n in load_threads), load_threads
        assert len(load_threads) == 1  # loaded once
        more = [c async for c in synth.stream("我们去公园吧。", voice, params)]
        assert more and len(load_threads) == 1
    finally:
        await synth.close()


async def test_bert_loads_at_start_when_chinese_is_the_default(tiny_config, load_threads):
    import dataclasses

    cfg = dataclasses.replace(tiny_config, synthesis=dataclasses.replace(tiny_config.synthesis, language="zh"))
    synth = build_synthesizer(cfg)
    try:
        await synth.warm_up()
        assert len(load_threads) == 1 and not load_threads[0].startswith("voicebot-"), load_threads
    finally:
        await synth.close()
