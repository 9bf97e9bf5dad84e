"""Japanese G2P: exact phone strings checked against OpenJTalk's labels, the label parser, wiring, lazy import.

Each expected string below was derived by hand from the OpenJTalk full-context labels of the sentence (fields
p3, A:a1+a2+a3, F:f1, E:..!e3) with upstream's rules: ``#`` after a border phone when a3 == 1 and the next
label's a2 == 1 (the v2 table has no ``#``: it reads ``UNK``); ``]`` when a1 == 0, next a2 == a2 + 1 and
a2 != f1; ``[`` when a2 == 1 and next a2 == 2. The labels used are quoted in each case's comment as
``phone(a1/a2/a3, f1)``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from synthesis.text import Phonemes, text_to_phonemes
from synthesis.text import english, japanese
from synthesis.text.symbols import UNK, symbol_ids, symbols

REPO = Path(__file__).resolve().parents[2]


def _phones(ph: Phonemes) -> str:
    table = symbols()
    return " ".join(table[i] for i in ph.ids)


@pytest.mark.parametrize(
    ("text", "phones"),
    [
        # k(-4/1/5) o(-4/1/5) N(-3/2/4): o is mora 1 and the next is mora 2 -> "[" (heiban, 5 morae); 。 -> "."
        ("こんにちは。", "k o [ N n i ch i w a ."),
        # 東京に (f1 5): o(-4/1/5) -> "[" ; i(0/5/1) then i(-2/1/4): last mora, next phrase starts -> "#" (UNK).
        # 行きます (f1 4): i(-2/1/4) -> "[" ; a(0/3/2) then s(1/4/1): a1 0, 3 -> 4, 3 != 4 -> "]"; U -> u.
        ("東京に行きます", "t o [ o ky o o n i UNK i [ k i m a ] s u"),
        # ちょっと (f1 3, type 1): o(0/1/3) then cl(1/2/2) -> "]"; o(2/3/1) then m(0/1/3) -> "#".
        # 待って (f1 3, type 1): a(0/1/3) then cl(1/2/2) -> "]"; ！ -> "!".
        ("ちょっと待って！", "ch o ] cl t o UNK m a ] cl t e !"),
        # Two runs split at 、 and 。. 今日は: o(0/1/3) then o(1/2/2) -> "]". いい: i(0/1/2) then i(1/2/1) -> "]",
        # i(1/2/1) then t(0/1/6) -> "#". 天気ですね: e(0/1/6) then N(1/2/5) -> "]"; the rest has a1 > 0.
        ("今日は、いい天気ですね。", "ky o ] o w a , i ] i UNK t e ] N k i d e s u n e ."),
        # The middle dot is a pause inside one run: o(0/4/1) then pau; both words heiban: o(-3/1/4) -> "[".
        ("東京・大阪", "t o [ o ky o o _ o [ o s a k a"),
    ],
)
def test_g2p_exact(text: str, phones: str) -> None:
    assert " ".join(japanese.g2p(japanese.normalize(text))) == phones


def test_question_mark_from_labels() -> None:
    # One run ending in ？: the final sil label has e3 == 1, so the run ends in "?" (the "^" ... "?" frame).
    # d e(0/5/3) then s(1/6/2): a1 0, 5 -> 6, 5 != 7 -> "]".
    assert japanese._prosody_phones("日本語ですか？") == "^ n i [ h o N g o d e ] s u k a ?".split()
    # Through g2p the ？ is a mark of its own: the run's frame is dropped and ？ maps to "?".
    assert " ".join(japanese.g2p("日本語ですか？")) == "n i [ h o N g o d e ] s u k a ?"


def test_marks_and_normalize() -> None:
    assert japanese.normalize("50％です!!!") == "50パーセントです!"
    assert japanese.normalize("え……そう、、、") == "え…そう、、、"  # only ! ? … , . - collapse
    # Brackets and ～ are marks outside the v2 table -> UNK (as upstream's cleaner); a space is dropped.
    got = japanese.g2p("「はい」 ～")
    assert got == [UNK, "h", "a", "]", "i", UNK, UNK]
    assert japanese.g2p("ー") == []  # no phonemes at all: nothing, no error
    assert japanese.g2p("") == []


def test_every_mora_maps_into_the_v2_table() -> None:
    # Every katakana, alone and with each small kana, through OpenJTalk: all phones and marks are v2 symbols
    # except "#" and the rare palatalised "ty" the v2 table lacks (upstream reads both UNK too).
    small = "ァィゥェォャュョヮ"
    kata = [chr(c) for c in range(0x30A1, 0x30FB)]
    raw: set[str] = set()
    for text in kata + [k + s for k in kata for s in small]:
        raw.update(p for p in japanese._prosody_phones(text)[1:-1])
    table = symbol_ids()
    assert sorted(p for p in raw if p not in table) == ["#", "ty"]
    assert {"cl", "N", "ts", "ch", "sh", "ky", "ny", "[", "]", "#"} <= raw
    assert japanese.g2p("テュ") == [UNK, "u"]  # t + yu: OpenJTalk's "ty" is not a v2 phone


@pytest.mark.parametrize(
    ("text", "language", "phones", "pieces"),
    [
        ("東京", "all_ja", "t o [ o ky o o", [("東京", "ja")]),  # kanji only: Japanese because the user said so
        ("東京", "ja", "t o [ o ky o o", [("東京", "ja")]),
        ("東京", "auto", ". d ong1 j ing1", [(".東京", "zh")]),  # no kana: auto reads it as Chinese
        ("こんにちは、世界！", "auto", "k o [ N n i ch i w a , s e ] k a i !", [("こんにちは、世界！", "ja")]),
        ("はい", "ja", ". h a ] i", [(".はい", "ja")]),  # 3 phones < 6: retried on ".はい"
        # 私は heiban: a(-3/1/4) -> "["; が好きです: a(0/1/1) then s(-1/1/4) -> "#", U(-1/1/4) -> "[",
        # i(0/2/3) then d(1/3/2) -> "]".
        (
            "私はPythonが好きです",
            "ja",
            "w a [ t a sh i w a P AY1 TH AA0 N g a UNK s u [ k i ] d e s u",
            [("私は", "ja"), ("Python", "en"), ("が好きです", "ja")],
        ),
    ],
)
def test_text_to_phonemes(text: str, language: str, phones: str, pieces: list[tuple[str, str]]) -> None:
    ph = text_to_phonemes(text, language)
    assert _phones(ph) == phones
    assert [(p.text, p.lang) for p in ph.pieces] == pieces
    assert all(p.word2ph is None for p in ph.pieces if p.lang == "ja")
    assert ph.pieces[-1].end == len(ph.ids) and ph.ids.min() >= 0


def test_mixed_pieces_line_up() -> None:
    ph = text_to_phonemes("私はPythonが好きです", "all_ja")
    table = symbols()
    for piece in ph.pieces:
        got = [table[i] for i in ph.ids[piece.start : piece.end]]
        want = japanese.g2p(piece.norm_text) if piece.lang == "ja" else english.g2p(english.normalize(piece.text))
        assert got == want


def test_pyopenjtalk_loads_on_first_japanese_text() -> None:
    code = (
        "import sys\n"
        "from synthesis.text import text_to_phonemes\n"
        "text_to_phonemes('Hello there, 你好世界。')\n"
        "assert 'pyopenjtalk' not in sys.modules, 'imported before any Japanese text'\n"
        "text_to_phonemes('こんにちは')\n"
        "assert 'pyopenjtalk' in sys.modules\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
