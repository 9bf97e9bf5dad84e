"""Sentence splitting: upstream's cut0-cut5 + pre_seg_text rules, and the streaming splitter against it."""

from __future__ import annotations

import random

import pytest

from synthesis.text import SentenceStream, TextError, split_sentences
from synthesis.text.split import merge_short, replace_consecutive_punctuation, split_big_text

PROSE = (
    "Hello there, my friend. It costs 3.5 dollars! Mr. Smith said e.g. this works. Ok? Yes. "
    "I paid $1,000 at 10:30 yesterday. Hi. Then we left... And nothing else happened; really.\n"
    "New paragraph here. Short. A. B. The end."
)
CHINESE = "你好，世界。今天天气很好！我们去公园吧？好的……那就走吧——快点。我喜欢Python，你呢？嗯。"
MIXED = (
    'Wait... what?! No way. "Quoted sentence." Then more text follows, with commas, and clauses; also '
    "semicolons: colons too. Numbers like 3.14159 and 2.5 stay. Dr. Who is here. J. K. Rowling wrote books. Fine."
)


@pytest.mark.parametrize(
    ("text", "method", "language", "expected"),
    [
        # cut5: after every punctuation mark; short pieces merge up to 5 chars; decimals and Mr. stay whole.
        ("Hello there, my friend. It costs 3.5 dollars!", "cut5", "auto",
         ["Hello there,", "my friend.", "It costs 3.5 dollars!"]),
        ("Mr. Smith is here. Ok? Yes.", "cut5", "en", [".Mr. Smith is here.", "Ok? Yes."]),
        ("We owe 1,000 dollars, e.g. this much.", "cut5", "en", ["We owe 1,000 dollars,", "e.g. this much."]),
        # the "。"/"." prefix rule: a first clause shorter than 4 chars gets a leading mark.
        ("你好，世界。今天天气很好", "cut5", "zh", ["。你好，世界。", "今天天气很好。"]),
        ("Hi. How are you today?", "cut5", "en", [".Hi. How are you today?"]),
        # consecutive punctuation collapses first: "?!" -> "?", "..." -> "."
        ("Really?! Yes... sure thing", "cut5", "en", ["Really?", "Yes.", "sure thing."]),
        ("First one. Second one. Third one.", "cut0", "en", ["First one. Second one. Third one."]),
        # cut1: groups of 4 clauses, the last group takes the remainder (9 clauses -> 4 + 5)
        (" ".join(f"Line {i}." for i in range(1, 10)), "cut1", "en",
         ["Line 1. Line 2. Line 3. Line 4.", "Line 5. Line 6. Line 7. Line 8. Line 9."]),
        (" ".join(f"Line {i}." for i in range(1, 9)), "cut1", "en", [" ".join(f"Line {i}." for i in range(1, 9))]),
        # cut2: accumulate > 50 chars; a short last group joins the previous one
        ("This is the first clause, it is long enough to pass fifty. Tail here.", "cut2", "en",
         ["This is the first clause, it is long enough to pass fifty. Tail here."]),
        ("第一个句子。第二个句子。第三", "cut3", "zh", ["第一个句子。", "第二个句子第三。"]),  # "。" is removed, short tail joins
        ("One sentence. Pi is 3.14 today. Done", "cut4", "en", ["One sentence.", "Pi is 3.14 today.", "Done."]),
        # line breaks always cut; lines glued by the merge keep a space between Latin words
        ("a\n\nb c d e f\nxyz", "cut5", "en", ["a b c d e f xyz."]),
        ("   ", "cut5", "auto", []),
        ("...!!", "cut5", "auto", []),
        ("@@@ ###.", "cut5", "auto", []),
    ],
)
def test_split_sentences(text: str, method: str, language: str, expected: list[str]) -> None:
    assert split_sentences(text, method, language) == expected


def test_cut2_groups_over_fifty_chars() -> None:
    text = "The first clause is here, and it keeps going on. " * 2 + "Then the final words of it all here, long enough."
    assert split_sentences(text, "cut2", "en") == [
        "The first clause is here, and it keeps going on. The first clause is here,",  # 74 > 50 chars
        "and it keeps going on. Then the final words of it all here, long enough.",  # 13-char tail joined
    ]


def test_helpers() -> None:
    assert replace_consecutive_punctuation("Hi!?... ok--") == "Hi! ok-"
    assert merge_short(["ab", "cd", "efgh", "i"], 5) == (["ab cd", "efgh i"], "")
    assert merge_short(["你好", "世界", "！"], 5) == (["你好世界！"], "")
    assert merge_short(["Hello,", " w", "x"], 5) == (["Hello,"], " w x")
    long = "x" * 300 + ", " + "y" * 300 + "."
    assert [len(p) for p in split_big_text(long)] == [301, 302]
    assert split_sentences("好" * 1200, "cut0", "zh")[0] == "好" * 510


def test_bad_options() -> None:
    with pytest.raises(TextError, match="cut5"):
        split_sentences("hi", "cut9")
    with pytest.raises(TextError, match="language"):
        split_sentences("hi", "cut5", "xx")


def _stream(text: str, method: str, rng: random.Random) -> tuple[list[str], int]:
    """Feed ``text`` in random chunks; returns (all sentences, how many were emitted before flush)."""
    s = SentenceStream(method, max_chars=10_000)
    out: list[str] = []
    i = 0
    while i < len(text):
        j = min(len(text), i + rng.randint(1, 12))
        out += s.feed(text[i:j])
        i = j
    early = len(out)
    return out + s.flush(), early


@pytest.mark.parametrize("method", ["cut0", "cut1", "cut2", "cut3", "cut4", "cut5"])
@pytest.mark.parametrize("text", [PROSE, CHINESE, MIXED])
def test_stream_equals_batch(text: str, method: str) -> None:
    want = split_sentences(text, method)
    for seed in range(60):
        got, _ = _stream(text, method, random.Random(seed))
        assert got == want, f"seed {seed}"


def test_stream_emits_before_the_end() -> None:
    got, early = _stream(PROSE, "cut5", random.Random(1))
    assert len(got) == 12 and early >= 10  # all but the last one or two come out while text still arrives


@pytest.mark.parametrize(
    ("pieces", "emitted"),
    [
        (["It costs 3.", "5 dollars. More text"], [[], ["It costs 3.5 dollars."]]),  # "3." + "5" is a decimal
        (["I met Mr.", " Smith today. And", " then"], [[], [], ["I met Mr. Smith today."]]),
        (["Wait.", ".", ". What is it"], [[], [], ["Wait."]]),  # "..." may continue
        (["Hello world.", " Next one"], [[], ["Hello world."]]),  # a final "." is not certain yet
        (["Hello world. Hi", " there you"], [[], ["Hello world."]]),  # ≥ 5 solid chars must follow
    ],
)
def test_stream_certainty(pieces: list[str], emitted: list[list[str]]) -> None:
    s = SentenceStream("cut5", "en")
    assert [s.feed(p) for p in pieces] == emitted


def test_stream_flush_and_pending() -> None:
    s = SentenceStream("cut5", "en")
    assert s.feed("Good morning everyone. How are") == ["Good morning everyone."]
    assert s.pending == " How are"
    assert s.flush() == ["How are."]
    assert s.pending == "" and s.flush() == []


def test_stream_max_chars_cuts_long_runs() -> None:
    s = SentenceStream("cut5", "en", max_chars=40)
    out = s.feed("word " * 20)
    assert out and all(len(x) <= 41 for x in out)
    assert out[0] == "word word word word word word word word."
    rest = s.flush()
    assert " ".join(x.rstrip(".") for x in out + rest).split() == ["word"] * 20
    with pytest.raises(ValueError):
        SentenceStream(max_chars=5)
