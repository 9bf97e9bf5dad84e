"""bot.textrules: the message -> speech rewrite, table-driven, plus length caps and the streaming cleaner."""

from __future__ import annotations

from typing import AsyncIterator

import pytest

from bot.textrules import (
    FileInfo,
    MessageContext,
    StreamCleaner,
    TextRules,
    cap_repeats,
    clean_stream,
    clean_text,
    estimate_seconds,
    mentioned_user_ids,
    summarize_attachments,
    truncate,
)

ALICE, BOB = 111111111111111111, 222222222222222222
GENERAL, MODS = 333333333333333333, 444444444444444444

CTX = MessageContext(
    user_name={ALICE: "Alice"}.get,
    channel_name={GENERAL: "general"}.get,
    role_name={MODS: "Moderators"}.get,
)

CASES: list[tuple[str, str | None]] = [
    # plain text passes through
    ("hello there", "hello there"),
    ("  spaced   out  ", "spaced out"),
    # mentions
    (f"hi <@{ALICE}>", "hi Alice"),
    (f"hi <@!{ALICE}>", "hi Alice"),
    (f"hi <@{BOB}>", "hi someone"),
    (f"ask <@&{MODS}>", "ask Moderators"),
    ("ask <@&555555555555555555>", "ask a role"),
    (f"see <#{GENERAL}>", "see general"),
    ("see <#666666666666666666>", "see a channel"),
    ("@everyone wake up", "everyone wake up"),
    ("@here lunch", "everyone here lunch"),
    ("run </ping:777777777777777777>", "run ping"),
    ("at <t:1700000000:R>", "at 14 November 2023, 22:13 UTC"),
    # links
    ("look https://example.com/a_b?c=1", "look a link"),
    ("look https://example.com/page.", "look a link."),
    ("<https://example.com> wow", "a link wow"),
    ("[the docs](https://example.com/docs) help", "the docs help"),
    ("https://example.com", "a link"),
    # custom emoji (name mode) and unicode emoji (never read)
    ("nice <:pepe_happy:123456789012345678>", "nice pepe happy"),
    ("<a:party_blob:123456789012345678> party", "party blob party"),
    ("great 😀👍🏽 job", "great job"),
    # code
    ("before ```py\nprint('x')\n``` after", "before code block. after"),
    ("```\nonly code\n```", "code block."),
    ("run `rm -rf /` now", "run now"),
    ("`just code`", None),
    # spoilers
    ("the killer is ||Bob||", "the killer is spoiler"),
    # markdown
    ("**bold** and *italic* and __under__", "bold and italic and under"),
    ("_lean_ and ~~struck~~ and ***both***", "lean and struck and both"),
    ("keep snake_case_names and 2*3*4", "keep snake_case_names and 2*3*4"),
    (r"\*not emphasis\*", "*not emphasis*"),
    ("# Title\n> quoted\n- item one\n- item two", "Title. quoted. item one. item two"),
    ("-# small print", "small print"),
    # repeats
    ("soooooooo gooood", "sooo goood"),
    ("what!!!!!!!", "what!!!"),
    ("hahahahahaha", "hahaha"),
    ("wait.......", "wait..."),
    ("1000000 people", "1000000 people"),
    # lines
    ("first line\nsecond line", "first line. second line"),
    ("question?\nanswer", "question? answer"),
    # dropped: only punctuation / emoji
    ("!!!", None),
    ("😂😂😂", None),
    ("<:kek:123456789012345678>", "kek"),
    ("...?!", None),
    ("", None),
    # CJK passes
    ("你好，世界", "你好，世界"),
]


@pytest.mark.parametrize(("raw", "expected"), CASES)
def test_clean_text_table(raw: str, expected: str | None) -> None:
    assert clean_text(raw, CTX) == expected


def test_table_is_big_enough() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize(
    ("raw", "mode", "expected"),
    [
        ("nice <:pepe_happy:123456789012345678>", "skip", "nice"),
        ("<:pepe_happy:123456789012345678>", "skip", None),
        ("<:pepe_happy:123456789012345678>", "name", "pepe happy"),
    ],
)
def test_emoji_mode(raw: str, mode: str, expected: str | None) -> None:
    assert clean_text(raw, CTX, TextRules(emoji_mode=mode)) == expected


@pytest.mark.parametrize(
    ("cap", "raw", "expected"),
    [(1, "soooo!!!", "so!"), (2, "soooo!!!", "soo!!"), (5, "soooooooo", "sooooo"), (3, "lolololol", "lololol")],
)
def test_repeat_cap(cap: int, raw: str, expected: str) -> None:
    assert cap_repeats(raw, cap) == expected


@pytest.mark.parametrize(
    ("files", "text", "expected"),
    [
        ([FileInfo("a.png", "image/png")], "", "sent an image"),
        ([FileInfo("a.png"), FileInfo("b.JPG")], "", "sent 2 images"),
        ([FileInfo("clip.mp4"), FileInfo("notes.pdf", "application/pdf")], "", "sent a video and a file"),
        (
            [FileInfo("v.ogg", "audio/ogg"), FileInfo("x.bin"), FileInfo("y.bin"), FileInfo("z.gif")],
            "",
            "sent an image, an audio file and 2 files",
        ),
        ([FileInfo("a.png", "image/png")], "look at this", "look at this. Sent an image."),
        ([FileInfo("a.png", "image/png")], "look!", "look! Sent an image."),
        ([FileInfo("a.png", "image/png")], "😀", "sent an image"),
    ],
)
def test_attachments_summarised(files: list[FileInfo], text: str, expected: str) -> None:
    assert clean_text(text, MessageContext(attachments=files)) == expected


def test_summary_of_nothing_is_empty() -> None:
    assert summarize_attachments([]) == ""


def test_length_cap_by_seconds_cuts_at_a_word() -> None:
    words = " ".join(f"word{i}" for i in range(200))  # ~1290 characters
    out = clean_text(words, rules=TextRules(max_seconds=10.0))
    assert out is not None
    assert len(out) <= 150 and len(out) >= 120  # 10 s * 15 chars/s
    assert words.startswith(out) and words[len(out)] == " "  # ends on a whole word


def test_length_cap_scales_with_speed_and_chars() -> None:
    text = "abc " * 300
    slow = clean_text(text, rules=TextRules(max_seconds=10.0, speed=1.0))
    fast = clean_text(text, rules=TextRules(max_seconds=10.0, speed=2.0))
    capped = clean_text(text, rules=TextRules(max_seconds=300.0, max_chars=50))
    assert slow is not None and fast is not None and capped is not None
    assert len(fast) == pytest.approx(2 * len(slow), abs=8)  # each cut gives back at most one word
    assert len(capped) <= 50


def test_cjk_counts_as_syllables() -> None:
    assert estimate_seconds("你好世界你好世界你好") == pytest.approx(2.0)  # 10 chars / 5 per s
    assert estimate_seconds("a" * 30) == pytest.approx(2.0)
    out = truncate("今天天气很好，我们去公园散步吧。然后去吃饭。", 2.0)
    assert out == "今天天气很好，"  # cut after the comma, inside the 10-character budget


def test_unbreakable_text_is_cut_hard() -> None:
    assert truncate("x" * 100, 1.0) == "x" * 15


def test_mentioned_ids() -> None:
    assert mentioned_user_ids(f"<@{ALICE}> and <@!{BOB}> and <@&{MODS}>") == {ALICE, BOB}


def test_a_failing_resolver_does_not_lose_the_message() -> None:
    def boom(_id: int) -> str:
        raise RuntimeError("cache miss")

    assert clean_text(f"hi <@{ALICE}>", MessageContext(user_name=boom)) == "hi someone"


# --- streaming ------------------------------------------------------------------------------------------------------


async def _pieces(parts: list[str]) -> AsyncIterator[str]:
    for p in parts:
        yield p


async def _collect(parts: list[str], rules: TextRules | None = None) -> tuple[list[str], str]:
    out = [p async for p in clean_stream(_pieces(parts), CTX, rules or TextRules())]
    return out, "".join(out)


async def test_stream_matches_whole_text_rules() -> None:
    text = "Here is **bold** text with a link https://example.com/x and <@111111111111111111>. Done!"
    parts = [text[i : i + 3] for i in range(0, len(text), 3)]  # split mid-word, mid-marker, mid-URL
    out, joined = await _collect(parts)
    assert joined == clean_text(text, CTX)
    assert len(out) > 5  # it really streamed, not one flush at the end


async def test_stream_drops_code_fences_across_pieces() -> None:
    parts = ["Try this:\n``", "`python\nimport os\nos.re", "move('x')\n``", "`\nThat deletes it."]
    _, joined = await _collect(parts)
    assert joined == "Try this: code block. That deletes it."


async def test_stream_waits_for_closing_spoiler_and_inline_code() -> None:
    cleaner = StreamCleaner(CTX)
    assert cleaner.feed("The answer is ||forty ") == "The answer is "
    assert cleaner.feed("two|| and `some code` ok ") == "spoiler and ok "
    assert cleaner.finish() == ""


async def test_stream_stops_at_the_length_cap() -> None:
    consumed = 0

    async def endless() -> AsyncIterator[str]:
        nonlocal consumed
        while True:
            consumed += 1
            yield "blah "

    out = [p async for p in clean_stream(endless(), CTX, TextRules(max_seconds=2.0))]
    joined = "".join(out)
    assert 20 <= len(joined) <= 30  # 2 s * 15 chars/s
    assert joined.rstrip().endswith("blah")
    assert consumed < 10
