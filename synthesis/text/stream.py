"""Incremental sentence splitting for text that arrives while it is being written (a chat model's stream).

:class:`SentenceStream` emits a sentence as soon as nothing that can still arrive would change it, and runs the
batch code (:func:`synthesis.text.split.segment`) on that prefix, so for ordinary prose the streamed sentences
are exactly those of :func:`synthesis.text.split.split_sentences` on the whole text.

A cut after ``text[i]`` is *certain* when the method cuts there and the next character is already known and is
not punctuation (``"3."`` + ``"5"`` is a decimal, ``"Wait.."`` may still become ``"Wait..."``). Emitting the
prefix up to a certain cut is safe when (a) upstream's merge of short pieces has nothing left over there and
(b) at least ``MERGE_MIN_CHARS`` solid characters follow, so a short tail can never be glued back onto it.
"""

from __future__ import annotations

from .split import (
    ALL_PUNCT,
    CUT1_GROUP,
    CUT2_MIN_CHARS,
    CUT5_PUNCT,
    DROP_CHARS,
    MERGE_MIN_CHARS,
    SPLITS,
    check_options,
    is_cut,
    replace_consecutive_punctuation,
    segment,
)

MIN_MAX_CHARS = 20  # smallest accepted max_chars, chars


class SentenceStream:
    """Split text fed piece by piece into sentences, each emitted once it is certainly complete.

    Parameters
    ----------
    method, language:
        As for :func:`synthesis.text.split.split_sentences`.
    max_chars:
        A run this long with no certain sentence end is cut at its last comma or space (a forced cut; the
        sentences then differ from a batch split, which a pause-free 300-char run makes acceptable).

    Attributes
    ----------
    pending:
        Text received but not yet emitted.
    """

    def __init__(self, method: str = "cut5", language: str = "auto", max_chars: int = 300) -> None:
        check_options(method, language)
        if max_chars < MIN_MAX_CHARS:
            raise ValueError(f"max_chars must be >= {MIN_MAX_CHARS}, got {max_chars}")
        self.method = method
        self.language = language
        self.max_chars = max_chars
        self.pending = ""
        self._started = False  # whether text was consumed (upstream's leading "。" rule applies once)

    def feed(self, piece: str) -> list[str]:
        """Add text; return the sentences that are certainly complete now (possibly none)."""
        self.pending += piece
        out: list[str] = []
        while True:
            found = self._safe_cut()
            if found is not None:
                k, sentences = found
                self._consume(k)
                out.extend(sentences)
            if len(self.pending) <= self.max_chars:
                return out
            k = self._forced_cut()
            out.extend(self._run(self.pending[:k], final=True))
            self._consume(k)

    def flush(self) -> list[str]:
        """Return every pending sentence (end of input, or a pause long enough to speak what we have)."""
        out = self._run(self.pending, final=True)
        self._consume(len(self.pending))
        return out

    def _run(self, head: str, final: bool) -> list[str]:
        """Split a prefix with the batch code."""
        sentences, _ = segment(head, self.method, self.language, at_start=not self._started, final=final)
        return sentences

    def _consume(self, k: int) -> None:
        """Drop the first ``k`` pending chars (emitted)."""
        if self.pending[:k].strip("\n"):
            self._started = True
        self.pending = self.pending[k:]

    def _safe_cut(self) -> tuple[int, list[str]] | None:
        """The largest safe emission point and its sentences, or None."""
        text = self.pending
        for k in reversed(self._candidates(text)):
            if _solid_chars(text, k) < MERGE_MIN_CHARS:
                continue
            head = text[:k]
            if not self._started and not _prefix_rule_decided(head):
                continue
            sentences, tail = segment(head, self.method, self.language, at_start=not self._started, final=False)
            if not tail:
                return k, sentences
        return None

    def _candidates(self, text: str) -> list[int]:
        """Certain cut points (exclusive end indices) for this method, ascending."""
        n = len(text)
        if self.method in ("cut1", "cut2"):
            lead = 0 if self._started else _leading_mark_len(text)
            return _group_ends(text, self.method, lead)
        out: list[int] = []
        for i in range(n - 1):
            c = text[i]
            if c == "\n":
                out.append(i + 1)
            elif text[i + 1] in ALL_PUNCT:
                continue
            elif self.method == "cut5" and is_cut(text, i, CUT5_PUNCT):
                out.append(i + 1)
            elif self.method == "cut4" and c == "." and is_cut(text, i, frozenset(".")):
                out.append(i + 1)
            elif self.method == "cut3" and c == "。":
                out.append(i + 1)
        if n and text[-1] == "\n":
            out.append(n)
        return out

    def _forced_cut(self) -> int:
        """Where to cut an over-long run: after its last comma, else its last space, else at ``max_chars``."""
        window = self.pending[: self.max_chars]
        for chars in (",，、;；:：", " \t"):
            k = max(window.rfind(c) for c in chars)
            if k > 0:
                return k + 1
        return self.max_chars


def _solid_chars(text: str, k: int) -> int:
    """How many chars after ``k`` are neither whitespace nor droppable punctuation."""
    return sum(1 for c in text[k:] if not c.isspace() and c not in DROP_CHARS)


def _prefix_rule_decided(head: str) -> bool:
    """Whether upstream's leading-"。" rule gives the same answer for ``head`` as for any text that extends it."""
    t = replace_consecutive_punctuation(head).strip("\n")
    return not t or any(c in SPLITS for c in t) or len(t.strip()) >= 4


def _leading_mark_len(text: str) -> int:
    """1 when upstream's rule will put a "。"/"." before ``text`` (it then counts as a clause of its own), else 0."""
    t = replace_consecutive_punctuation(text).strip("\n")
    if not t or t[0] in SPLITS:
        return 0
    first = t
    for i, c in enumerate(t):
        if c in SPLITS:
            first = t[:i]
            break
    return 1 if len(first.strip()) < 4 else 0


def _group_ends(text: str, method: str, lead: int) -> list[int]:
    """cut1/cut2: ends of clause groups that a later complete group makes final (``lead``: prepended mark)."""
    ends: list[int] = [0] * lead  # the prepended mark is a clause of its own
    for i in range(len(text) - 1):
        if text[i + 1] not in ALL_PUNCT and is_cut(text, i, SPLITS):
            ends.append(i + 1)
    groups: list[int] = []  # exclusive end of each complete group
    if method == "cut1":
        # The last upstream group takes up to 8 clauses, so a group is final once 5 more clauses are certain.
        for j in range(CUT1_GROUP, len(ends) - CUT1_GROUP, CUT1_GROUP):
            groups.append(ends[j - 1])
        return [g for g in groups if g > 0]
    start, acc = 0, lead
    for e in ends[lead:]:
        acc += e - start
        start = e
        if acc > CUT2_MIN_CHARS:
            groups.append(e)
            acc = 0
    return groups[:-1]  # the last complete group may still absorb a short tail
