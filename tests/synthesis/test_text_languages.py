"""Which languages this build can read, found without loading anything, and the one-line refusal of the others
before consent, a download or a model load (CLI, HTTP, Discord's choices)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from synthesis import SpeechError, SynthesisParams
from synthesis.text import TextError, check_speakable, speakable_languages
from synthesis.text import cantonese, korean, text_to_phonemes
from synthesis.text.packages import missing as _missing
from synthesis.types import LANGUAGES

_HIDDEN = {"mecab", "ToJyutping"}  # MeCab-ko (Korean) and ToJyutping (Cantonese) as if not installed


@pytest.fixture
def without_korean_and_cantonese(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **kw: None if name.split(".")[0] in _HIDDEN else real(name, *a, **kw))
    _missing.cache_clear()  # (looked up once per process)
    yield
    _missing.cache_clear()


def test_a_full_install_reads_every_language() -> None:
    assert speakable_languages() == LANGUAGES
    for language in LANGUAGES:
        check_speakable(language)


def test_missing_packages_take_their_languages_off_the_list(without_korean_and_cantonese: None) -> None:
    assert speakable_languages() == ("auto", "en", "zh", "ja", "all_zh", "all_ja")
    with pytest.raises(TextError, match=r"cannot read Korean \('all_ko' needs it\): pip install python-mecab-ko=="):
        check_speakable("all_ko")
    with pytest.raises(TextError, match=r"cannot read Cantonese .* pip install ToJyutping==.*choose one of auto, en"):
        check_speakable("auto_yue")
    check_speakable("ja")
    with pytest.raises(TextError, match="unknown language 'xx'"):
        check_speakable("xx")


def test_the_cli_refuses_an_unreadable_language_before_loading(without_korean_and_cantonese: None) -> None:
    from bot.__main__ import _check_language  # pyright: ignore[reportPrivateUsage]

    with pytest.raises(SpeechError, match="cannot read Korean") as e:
        _check_language("ko", "--lang")
    assert "\n" not in str(e.value)
    _check_language("en", "--lang")


def test_http_requests_for_an_unreadable_language_are_a_400(without_korean_and_cantonese: None) -> None:
    from bot.http.api_v2 import make_params
    from bot.http.responses import ApiError

    with pytest.raises(ApiError) as e:
        make_params(SynthesisParams(), language="yue")
    assert e.value.status == 400 and "ToJyutping" in str(e.value)
    assert make_params(SynthesisParams(), language="zh").language == "zh"


@pytest.mark.parametrize(("hidden", "text", "lang", "pin", "gone", "kept"), [
    ("g2pk2", "안녕하세요", "ko", r"g2pk2==0\.0\.3", {"ko", "all_ko"}, {"auto", "zh"}),
    ("ToJyutping", "你好呀", "yue", r"ToJyutping==3\.2\.0", {"yue", "all_yue", "auto_yue"}, {"auto", "zh"}),
])
def test_a_missing_package_is_one_line_naming_its_pin(monkeypatch: pytest.MonkeyPatch, hidden: str, text: str,
                                                      lang: str, pin: str, gone: set[str], kept: set[str]) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **kw: None if name == hidden else real(name, *a, **kw))
    loaders = (korean._g2pk, cantonese._jyutping)  # pyright: ignore[reportPrivateUsage]
    for cached in (*loaders, _missing):
        cached.cache_clear()
    try:
        with pytest.raises(TextError, match=pin) as info:
            text_to_phonemes(text, lang)
        assert "\n" not in str(info.value)
        speakable = set(speakable_languages())
        assert not gone & speakable and kept <= speakable  # a Korean piece in auto needs Korean; the mode does not
    finally:
        for cached in (*loaders, _missing):
            cached.cache_clear()
