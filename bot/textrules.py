"""What a Discord message becomes before it is spoken: pure functions over text plus a small context object.

The rules, in the order they apply (each decision is deliberate):

- Fenced code blocks (three backticks, closed) are not read: each becomes the words "code block", so listeners know
  something was skipped. Inline code (single or double backticks) is dropped silently: it is usually a name or a
  command, and spelling it out is noise.
- Spoilers ``||x||`` are not read: they become the word "spoiler".
- Masked links ``[text](url)`` read their text; bare links (``<https://...>`` too) become "a link".
- User, role and channel mentions become names (from the context's resolvers; "someone", "a role", "a channel" when
  unknown); ``@everyone``/``@here`` become "everyone"/"everyone here"; slash-command mentions read the command;
  timestamps ``<t:unix:style>`` read as a UTC date and time.
- Custom emoji ``<:name:id>`` read their name (underscores as spaces) or are skipped, per ``emoji_mode``. Unicode
  emoji are never read.
- Markdown emphasis, strike-through, headings, subtext and quote markers are stripped; escaped characters kept.
- A character (or two-character unit, "haha") repeated more than ``repeat_cap`` times is cut to ``repeat_cap``
  repeats. Digits are never cut: "1000000" is a number.
- Line breaks become sentence breaks.
- A message left with no letters or digits (only punctuation and emoji) is dropped: ``clean_text`` returns None.
  Attachments are summarised after the text ("sent an image", "sent 2 images and a file") and survive that rule.
- The result is capped by characters and by estimated seconds of speech (``max_seconds``; about 15 characters per
  second for alphabetic scripts, 5 per second for CJK, scaled by the speaking rate), cut at a word boundary.

"X said" is not added here: the speaker decides it when the message is actually spoken.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Iterable, Protocol, Sequence

CHARS_PER_SECOND = 15.0  # alphabetic-script characters spoken per second at speed 1.0
CJK_CHARS_PER_SECOND = 5.0  # CJK characters (about one syllable each) spoken per second at speed 1.0
MIN_CUT_FRACTION = 0.5  # a word-boundary cut may give back at most half of the allowed text

CODE_BLOCK_WORDS = "code block"
SPOILER_WORDS = "spoiler"
LINK_WORDS = "a link"


class AttachmentLike(Protocol):
    """What the rules read from an attachment (``discord.Attachment`` fits)."""

    @property
    def filename(self) -> str: ...

    @property
    def content_type(self) -> str | None: ...


@dataclass(frozen=True)
class FileInfo:
    """A plain attachment description, for callers that have no ``discord.Attachment``."""

    filename: str
    content_type: str | None = None


def _unknown(_id: int) -> str | None:
    """A resolver that knows no names."""
    return None


@dataclass(frozen=True)
class MessageContext:
    """Names the text can refer to, resolved by the caller (the cog adapts ``discord.Message``/``Guild``).

    Each resolver takes a snowflake and returns the name to say, or None when unknown.
    """

    user_name: Callable[[int], str | None] = _unknown
    channel_name: Callable[[int], str | None] = _unknown
    role_name: Callable[[int], str | None] = _unknown
    attachments: Sequence[AttachmentLike] = field(default_factory=tuple)


@dataclass(frozen=True)
class TextRules:
    """The per-guild knobs of the rules (from the guild's settings)."""

    repeat_cap: int = 3  # most repeats of one character / two-character unit
    max_seconds: float = 30.0  # longest estimated speech, seconds
    max_chars: int = 2000  # longest text, characters
    emoji_mode: str = "name"  # "name": say custom emoji names; "skip": drop them
    speed: float = 1.0  # speaking rate: a faster voice fits more text into max_seconds

    def __post_init__(self) -> None:
        if self.repeat_cap < 1:
            raise ValueError(f"repeat_cap must be >= 1, got {self.repeat_cap}")
        if self.emoji_mode not in ("name", "skip"):
            raise ValueError(f"emoji_mode must be 'name' or 'skip', got {self.emoji_mode!r}")
        if self.max_seconds <= 0 or self.max_chars <= 0 or self.speed <= 0:
            raise ValueError("max_seconds, max_chars and speed must be positive")


EMPTY_CONTEXT = MessageContext()

# --- patterns -----------------------------------------------------------------------------------------------------

_FENCE_RE = re.compile(r"```.*?```", re.DOTALL)
_INLINE_CODE_RE = re.compile(r"``(?!`)(.+?)``|`([^`\n]+)`")
_SPOILER_RE = re.compile(r"\|\|(.+?)\|\|", re.DOTALL)
_MASKED_LINK_RE = re.compile(r"\[([^\[\]]+)\]\(<?https?://[^\s)>]+>?\)")
_URL_RE = re.compile(r"<?https?://[^\s<>]*[^\s<>.,;:!?)\]'\"]>?")
_CUSTOM_EMOJI_RE = re.compile(r"<a?:(\w{1,32}):\d{15,21}>")
_USER_RE = re.compile(r"<@!?(\d{15,21})>")
_ROLE_RE = re.compile(r"<@&(\d{15,21})>")
_CHANNEL_RE = re.compile(r"<#(\d{15,21})>")
_COMMAND_RE = re.compile(r"</([\w -]{1,100}):\d{15,21}>")
_TIMESTAMP_RE = re.compile(r"<t:(-?\d{1,13})(?::[tTdDfFR])?>")
_EVERYONE_RE = re.compile(r"@(everyone|here)\b")
_ESCAPE_RE = re.compile(r"\\([*_~|`>#\\\[\]()-])")
_HEADING_RE = re.compile(r"^[ \t]*(?:#{1,3}|-#)[ \t]+", re.MULTILINE)
_QUOTE_RE = re.compile(r"^[ \t]*>{1,3}[ \t]?", re.MULTILINE)
_BULLET_RE = re.compile(r"^[ \t]*[-*+][ \t]+", re.MULTILINE)
_DOUBLE_MARK_RE = re.compile(r"(\*\*|__|~~)(?=\S)(.+?)(?<=\S)\1", re.DOTALL)
_SINGLE_STAR_RE = re.compile(r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])", re.DOTALL)
_SINGLE_UNDERSCORE_RE = re.compile(r"(?<![\w_])_(?=[^\s_])(.+?)(?<=[^\s_])_(?![\w_])", re.DOTALL)
_EMOJI_RE = re.compile(
    "["
    "\U0001f000-\U0001faff"  # pictographs, emoticons, transport, flags, skin tones, supplemental symbols
    "\u2600-\u27bf"  # miscellaneous symbols and dingbats
    "\u2b00-\u2bff"  # arrows and stars used as emoji
    "\u2300-\u23ff"  # technical symbols (watch, hourglass, ...)
    "\ufe0e\ufe0f\u200d\u20e3"  # variation selectors, zero-width joiner, keycap
    "\U000e0020-\U000e007f"  # tag characters (subdivision flags)
    "]+"
)
_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_WORDCHAR_RE = re.compile(r"[^\W_]")
_SPACES_RE = re.compile(r"[ \t\u00a0]+")
_NEWLINE_RE = re.compile(r"[ \t]*\n[\s]*")
_SENTENCE_END = ".!?。！？…"
_PAUSE_END = _SENTENCE_END + ":;,"
_ESCAPE_BASE = 0xF0000  # escaped markdown characters ride in the private-use plane through the rules


# --- the rules ----------------------------------------------------------------------------------------------------


def clean_text(text: str, ctx: MessageContext = EMPTY_CONTEXT, rules: TextRules = TextRules()) -> str | None:
    """Rewrite a message for speech; None when nothing is left worth saying.

    Parameters
    ----------
    text:
        The raw message content (Discord markdown).
    ctx:
        Name resolvers and the message's attachments.
    rules:
        The guild's settings for repeats, emoji and length.

    Returns
    -------
    str | None
        One line of plain text, at most ``rules.max_chars`` characters and about ``rules.max_seconds`` of speech.
    """
    body = _rewrite(text, ctx, rules).strip(" ,")
    if not _WORDCHAR_RE.search(body):
        body = ""
    summary = summarize_attachments(ctx.attachments)
    if summary and body:
        body = body.rstrip(",;: ")
        body = f"{body}{'' if body[-1] in _SENTENCE_END else '.'} {summary[0].upper()}{summary[1:]}."
    elif summary:
        body = summary
    if not body:
        return None
    return truncate(body, rules.max_seconds, max_chars=rules.max_chars, speed=rules.speed)


def _rewrite(text: str, ctx: MessageContext, rules: TextRules) -> str:
    """Every rule but dropping and the length cap; keeps one leading/trailing space (streams need it)."""
    text = _ESCAPE_RE.sub(lambda m: chr(_ESCAPE_BASE + ord(m.group(1))), text)
    text = _FENCE_RE.sub(f" {CODE_BLOCK_WORDS}. ", text)
    text = _INLINE_CODE_RE.sub(" ", text)
    text = _SPOILER_RE.sub(f" {SPOILER_WORDS} ", text)
    text = _MASKED_LINK_RE.sub(r"\1", text)
    text = _URL_RE.sub(f" {LINK_WORDS} ", text)
    text = replace_mentions(text, ctx)
    if rules.emoji_mode == "name":
        text = _CUSTOM_EMOJI_RE.sub(lambda m: f" {m.group(1).replace('_', ' ').strip()} ", text)
    else:
        text = _CUSTOM_EMOJI_RE.sub(" ", text)
    text = _EMOJI_RE.sub(" ", text)
    text = strip_markdown(text)
    text = cap_repeats(text, rules.repeat_cap)
    text = "".join(chr(ord(c) - _ESCAPE_BASE) if ord(c) >= _ESCAPE_BASE else c for c in text)
    return _join_lines(text)


def replace_mentions(text: str, ctx: MessageContext) -> str:
    """Discord's ``<@id>``, ``<@&id>``, ``<#id>``, ``</cmd:id>``, ``<t:unix>``, @everyone -> words."""
    text = _USER_RE.sub(lambda m: _name(ctx.user_name, m.group(1), "someone"), text)
    text = _ROLE_RE.sub(lambda m: _name(ctx.role_name, m.group(1), "a role"), text)
    text = _CHANNEL_RE.sub(lambda m: _name(ctx.channel_name, m.group(1), "a channel"), text)
    text = _COMMAND_RE.sub(lambda m: m.group(1), text)
    text = _TIMESTAMP_RE.sub(lambda m: _say_time(int(m.group(1))), text)
    return _EVERYONE_RE.sub(lambda m: "everyone" if m.group(1) == "everyone" else "everyone here", text)


def mentioned_user_ids(text: str) -> set[int]:
    """The user ids mentioned in ``text`` (to look their spoken names up in one query)."""
    return {int(m) for m in _USER_RE.findall(text)}


def _name(resolve: Callable[[int], str | None], snowflake: str, fallback: str) -> str:
    """A resolved name (without a leading # or @), or the fallback."""
    try:
        name = resolve(int(snowflake))
    except Exception:  # a resolver failing must not lose the whole message
        name = None
    name = (name or "").lstrip("#@").strip()
    return name or fallback


def _say_time(unix: int) -> str:
    """A Discord timestamp as words."""
    try:
        when = _dt.datetime.fromtimestamp(unix, tz=_dt.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return "a time"
    return f"{when.day} {when:%B %Y}, {when:%H:%M} UTC"


def strip_markdown(text: str, *, strip_lines: bool = True) -> str:
    """Remove emphasis, strike-through, heading, subtext, quote and bullet markers; keep the words."""
    if strip_lines:
        text = _HEADING_RE.sub("", text)
        text = _QUOTE_RE.sub("", text)
        text = _BULLET_RE.sub("", text)
    for _ in range(3):  # nested emphasis (***x***, **_x_**) unwraps in a few passes
        before = text
        text = _DOUBLE_MARK_RE.sub(r"\2", text)
        text = _SINGLE_STAR_RE.sub(r"\1", text)
        text = _SINGLE_UNDERSCORE_RE.sub(r"\1", text)
        if text == before:
            break
    return text


def cap_repeats(text: str, cap: int) -> str:
    """Cut runs of one non-digit character, or of a two-character unit, to ``cap`` repeats."""
    if cap < 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    text = re.sub(r"([^\d\s])\1{%d,}" % cap, lambda m: m.group(1) * cap, text)
    return re.sub(r"([^\d\s]{2})\1{%d,}" % cap, lambda m: m.group(1) * cap, text)


def _join_lines(text: str) -> str:
    """Line breaks -> sentence breaks; runs of spaces -> one space."""

    def line_break(m: re.Match[str]) -> str:
        before = text[: m.start()].rstrip()
        return " " if not before or before[-1] in _PAUSE_END else ". "

    text = _NEWLINE_RE.sub(line_break, text)
    text = _SPACES_RE.sub(" ", text)
    return re.sub(r" ([.,!?;:])", r"\1", text)


def summarize_attachments(attachments: Iterable[AttachmentLike]) -> str:
    """``"sent an image"``, ``"sent 2 images and a file"``, or ``""`` when there are none."""
    counts: dict[str, int] = {}
    for a in attachments:
        kind = _attachment_kind(getattr(a, "content_type", None), getattr(a, "filename", "") or "")
        counts[kind] = counts.get(kind, 0) + 1
    if not counts:
        return ""
    order = ("image", "video", "audio file", "file")
    parts = []
    for kind in order:
        n = counts.get(kind, 0)
        if n == 1:
            parts.append(("an " if kind[0] in "aeiou" else "a ") + kind)
        elif n > 1:
            parts.append(f"{n} {kind}s")
    joined = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"sent {joined}"


_IMAGE_EXT = {"png", "jpg", "jpeg", "gif", "webp", "bmp", "heic", "avif", "svg"}
_VIDEO_EXT = {"mp4", "mov", "webm", "mkv", "avi", "m4v"}
_AUDIO_EXT = {"mp3", "wav", "ogg", "opus", "flac", "m4a", "aac"}


def _attachment_kind(content_type: str | None, filename: str) -> str:
    """image | video | audio file | file, from the content type, else the extension."""
    major = (content_type or "").split("/", 1)[0].lower()
    if major in ("image", "video"):
        return major
    if major == "audio":
        return "audio file"
    ext = filename.rsplit(".", 1)[-1].lower() if "." in filename else ""
    if ext in _IMAGE_EXT:
        return "image"
    if ext in _VIDEO_EXT:
        return "video"
    if ext in _AUDIO_EXT:
        return "audio file"
    return "file"


# --- length -------------------------------------------------------------------------------------------------------


def estimate_seconds(text: str, speed: float = 1.0) -> float:
    """Rough speaking time of ``text`` in seconds at a speaking rate (CJK characters count as syllables)."""
    cjk = len(_CJK_RE.findall(text))
    return (cjk / CJK_CHARS_PER_SECOND + (len(text) - cjk) / CHARS_PER_SECOND) / speed


def truncate(text: str, max_seconds: float, *, max_chars: int = 2000, speed: float = 1.0) -> str:
    """Cut ``text`` to at most ``max_chars`` characters and about ``max_seconds`` of speech, at a word boundary.

    A cut prefers the last space (or CJK punctuation) before the limit, unless that would give back more than half
    of the allowed text; then it cuts inside the word.
    """
    budget = max_seconds * speed
    spent = 0.0
    limit = len(text)
    for i, ch in enumerate(text):
        spent += 1.0 / (CJK_CHARS_PER_SECOND if _CJK_RE.match(ch) else CHARS_PER_SECOND)
        if spent > budget + 1e-9 or i >= max_chars:
            limit = i
            break
    if limit >= len(text):
        return text
    head = text[:limit]
    if text[limit].isspace():
        return head.rstrip(" ,;:")
    cut = max(head.rfind(" "), max(head.rfind(p) + 1 for p in "，。、！？"))
    if cut >= MIN_CUT_FRACTION * limit:
        head = head[:cut]
    return head.rstrip(" ,;:")


# --- streamed text (a chat model's reply) ----------------------------------------------------------------------------


class StreamCleaner:
    """The rules over text that arrives in pieces: ``feed`` pieces, ``finish`` at the end.

    Text is held back until a whitespace where no code span, spoiler or link is open, so every rule sees whole
    words; an open code fence is carried across pieces (its content is dropped, "code block" is said once). Once
    the speech estimate passes ``max_seconds`` the rest is discarded. Mentions use ``ctx``; attachments are ignored.
    """

    def __init__(self, ctx: MessageContext = EMPTY_CONTEXT, rules: TextRules = TextRules()) -> None:
        self.ctx = ctx
        self.rules = rules
        self._pending = ""
        self._in_fence = False
        self._seconds = 0.0
        self._chars = 0
        self._line_start = True  # the next text begins a line (line markers strip only there)
        self._ends_space = False  # the last emitted text ended with a space (no second one)
        self.done = False  # the length cap was reached

    def feed(self, piece: str) -> str:
        """Add a piece; return the cleaned text that is now certain (possibly "")."""
        if self.done:
            return ""
        self._pending += piece
        cut = _safe_cut(self._pending, self._in_fence)
        if cut == 0:
            return ""
        part, self._pending = self._pending[:cut], self._pending[cut:]
        return self._emit(part)

    def finish(self) -> str:
        """Flush what is held back (an unclosed code fence drops its content)."""
        if self.done:
            return ""
        part, self._pending = self._pending, ""
        return self._emit(part).rstrip()

    def _emit(self, part: str) -> str:
        """Clean a complete part, respecting the fence state and the length budget."""
        out: list[str] = []
        segments = part.split("```")
        for i, seg in enumerate(segments):
            if i > 0:
                self._in_fence = not self._in_fence
                if self._in_fence:
                    out.append(f" {CODE_BLOCK_WORDS}. ")
            if not self._in_fence and seg:
                out.append(self._rewrite_segment(seg))
        text = _SPACES_RE.sub(" ", "".join(out))
        if self._chars == 0 or self._ends_space:
            text = text.lstrip()
        if not text:
            return ""
        rules = self.rules
        remaining_s = rules.max_seconds - self._seconds
        remaining_chars = rules.max_chars - self._chars
        if estimate_seconds(text, rules.speed) > remaining_s or len(text) > remaining_chars:
            self.done = True
            text = truncate(text, max(remaining_s, 0.0), max_chars=max(remaining_chars, 0), speed=rules.speed)
        self._seconds += estimate_seconds(text, rules.speed)
        self._chars += len(text)
        if text:
            self._ends_space = text[-1].isspace()
        return text

    def _rewrite_segment(self, seg: str) -> str:
        """Rules for one non-code segment; line markers strip only where a line really starts."""
        guard = "" if self._line_start else "\x00"  # keeps ^-anchored line rules off a mid-line start
        body = _rewrite(guard + seg, self.ctx, self.rules).replace("\x00", "")
        self._line_start = seg.rstrip(" \t").endswith("\n")
        return body


def _safe_cut(text: str, in_fence: bool) -> int:
    """Index just after the last whitespace where no fence-less code span, spoiler or link is open (0: none)."""
    best = 0
    i = 0
    n = len(text)
    inline = spoiler = False
    bracket = 0
    while i < n:
        if text.startswith("```", i):
            in_fence = not in_fence
            i += 3
            continue
        ch = text[i]
        if in_fence:
            if ch.isspace():
                best = i + 1  # inside a fence every space is a fine cut: the content is dropped anyway
            i += 1
            continue
        if ch == "\\":
            i += 2
            continue
        if ch == "`":
            inline = not inline
        elif text.startswith("||", i):
            spoiler = not spoiler
            i += 2
            continue
        elif ch == "[" and not inline:
            bracket += 1
        elif ch == ")" and bracket and not inline:
            bracket = 0
        elif ch == "]" and bracket and not inline and not text.startswith("](", i):
            bracket -= 1
        elif ch.isspace() and not (inline or spoiler or bracket):
            best = i + 1
        i += 1
    return best


async def clean_stream(
    pieces: AsyncIterator[str], ctx: MessageContext = EMPTY_CONTEXT, rules: TextRules = TextRules()
) -> AsyncIterator[str]:
    """Apply the rules to an async stream of text pieces; stops reading once the length cap is reached.

    The source iterator is not closed here (its owner may still be using it).
    """
    cleaner = StreamCleaner(ctx, rules)
    async for piece in pieces:
        out = cleaner.feed(piece)
        if out:
            yield out
        if cleaner.done:
            return
    tail = cleaner.finish()
    if tail:
        yield tail
