"""Which languages this build can read, found without loading anything, and the one-line refusal of the others
before consent, a download or a model load (CLI, HTTP, Discord's choices)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from synthesis import LANGUAGES, SpeechError, SynthesisParams
from synthesis.text import TextError, check_speakable, speakable_languages
from synthesis.text.frontend import _missing  # pyright: ignore[reportPrivateUsage]

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
