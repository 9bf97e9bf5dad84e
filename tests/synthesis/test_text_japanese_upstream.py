"""Japanese against upstream: the same OpenJTalk dictionary, the same direct-path phones, and where we read better.

The golden text set (see its README) was made with plain pyopenjtalk 0.4.1 on the Open JTalk 1.11 naist-jdic
dictionary; accent marks (``[``, ``]``, the ``UNK`` of ``#``) move with another dictionary or frontend, so the first
test checks that ours is the same file. The per-entry inference comparison lives in test_text_conformance.py; here
the whole-text ``clean_text`` path (top-level ``phone_ids``) is compared too. The reading table is what we read on
purpose unlike upstream: decimals, clock times, thousands separators, currency signs.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from synthesis.text import japanese
from synthesis.text.symbols import symbol_ids
from tests.golden_text import golden_text_dir, load_language

REPO = Path(__file__).resolve().parents[2]
_MARKS = {"[", "]", "UNK"}  # prosody marks (and UNK, mostly the accent-phrase boundary): not part of the reading


def _reading(text: str) -> str:
    """Phones of ``text`` without prosody marks: what is said."""
    return " ".join(p for p in japanese.g2p(japanese.normalize(text)) if p not in _MARKS)


def test_dictionary_is_the_one_the_golden_set_was_made_with() -> None:
    path = golden_text_dir() / "ja.json"
    if not path.exists():
        pytest.skip("the golden text set has no ja file")
    want = json.loads(path.read_text(encoding="utf-8"))["meta"]["offline"]["openjtalk_dic"]["sys.dic_sha256"]
    import pyopenjtalk

    sys_dic = Path(bytes(pyopenjtalk.OPEN_JTALK_DICT_DIR).decode("utf-8")) / "sys.dic"
    digest = hashlib.sha256()
    with sys_dic.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    assert digest.hexdigest() == want


def test_direct_path_equals_upstreams_clean_text() -> None:
    entries = [e for e in load_language("ja") if not e.quirk_in("direct")]
    if not entries:
        pytest.skip("the golden text set has no ja entries")
    table = symbol_ids()
    misses = [
        e.id for e in entries if tuple(table[p] for p in japanese.g2p(japanese.normalize(e.text))) != e.phone_ids
    ]
    assert not misses


def test_decimal_quirks_read_the_point() -> None:
    # Upstream cuts a decimal number at its point (a pause, "ten" unread); every decimal quirk entry is read whole.
    entries = [e for e in load_language("ja") if e.quirk and e.category == "decimal"]
    if not entries:
        pytest.skip("the golden text set has no ja decimal quirk")
    table = symbol_ids()
    for e in entries:
        phones = japanese.g2p(japanese.normalize(e.text))
        assert "t e N" in " ".join(phones), e.id
        assert tuple(table[p] for p in phones) != e.phone_ids, e.id


@pytest.mark.parametrize(
    ("text", "normalized", "reading"),
    [
        # Decimals: OpenJTalk reads the whole number (it lengthens a one-mora digit before 点: ジューニーテンゴ).
        ("今日は12.5キロ走りました。", "今日は12.5キロ走りました。",
         "ky o o w a j u u n i i t e N g o k i r o h a sh i r i m a sh i t a ."),
        ("3.14", "3.14", "s a N t e N i ch i y o N"),
        ("1.5倍", "1.5倍", "i cl t e N g o b a i"),
        # Clock times (upstream: なな UNK さんじゅう); minutes left out on the hour, seconds read.
        ("7:30に起きた", "7時30分に起きた", "sh i ch i j i s a N j u cl p u N n i o k i t a"),
        ("７：３０", "7時30分", "sh i ch i j i s a N j u cl p u N"),
        ("会議は10:00からです", "会議は10時からです", "k a i g i w a j u u j i k a r a d e s u"),
        ("23:05:09", "23時5分9秒", "n i j u u s a N j i g o f u N ky u u by o o"),
        # Thousands separators (upstream: いち , ごひゃく).
        ("1,500円です", "1500円です", "s e N g o hy a k u e N d e s u"),
        ("１，５００円", "１５００円", "s e N g o hy a k u e N"),
        # Currency signs before an amount (upstream: UNK, then the bare number).
        ("¥1500です", "1500円です", "s e N g o hy a k u e N d e s u"),
        ("￥1,500でした", "1500円でした", "s e N g o hy a k u e N d e sh i t a"),
        ("$20です", "20ドルです", "n i j u u d o r u d e s u"),
        ("€5", "5ユーロ", "g o y u u r o"),
        ("£3", "3ポンド", "s a N p o N d o"),
        ("$1,299.99", "1299.99ドル",
         "s e N n i hy a k u ky u u j u u ky u u t e N ky u u ky u u d o r u"),
        # As upstream: the full-width percent sign is spelled out.
        ("20％", "20パーセント", "n i j u cl p a a s e N t o"),
        # Left alone: a ratio (one-digit "minutes"), a list of numbers (no group of three), no valid time.
        ("比率は1:2です", "比率は1:2です", "h i r i ts u w a i ch i n i d e s u"),
        ("1,2,3", "1,2,3", "i ch i , n i , s a N"),
        ("99:99", "99:99", "ky u u j u u ky u u ky u u j u u ky u u"),
    ],
)
def test_reads_beyond_upstream(text: str, normalized: str, reading: str) -> None:
    assert japanese.normalize(text) == normalized
    assert _reading(text) == reading


def test_never_downloads_a_dictionary(tmp_path: Path) -> None:
    # pyopenjtalk fetches a dictionary when its folder is missing; ours refuses instead, with a TextError.
    code = (
        "from synthesis.text import japanese\n"
        "from synthesis.text.errors import TextError\n"
        "try:\n"
        "    japanese.g2p('こんにちは')\n"
        "except TextError as e:\n"
        "    print('refused:', e)\n"
    )
    env = {**os.environ, "OPEN_JTALK_DICT_DIR": str(tmp_path / "none")}
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "refused: cannot read Japanese: no OpenJTalk dictionary" in run.stdout
    assert not (tmp_path / "none").exists()
