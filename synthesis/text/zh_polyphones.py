"""Polyphones that pypinyin gets wrong without G2PW, read right (beyond upstream).

Upstream's pypinyin branch reads a character outside pypinyin's phrase table with its first reading; for 长 that is
zhang3 (to grow), so 很长的队 "a long queue" comes out as hen2 zhang3. Only the adjective is corrected here: 长
right after a degree word, in one jieba word or as the next word (很长, 太 长, 多长时间 ...), and 长时间. The verb
(长大, 他长得高, 长了一岁) keeps zhang3.
"""

from __future__ import annotations

# Degree and negation words that make 长 after them the adjective cháng.
_DEGREE = frozenset("很 太 最 更 好 挺 真 不 多 较 超 蛮 老 够 特别 非常 这么 那么 比较 十分 相当 越来越".split())


def fix_polyphones(previous: str, word: str, syls: list[str]) -> list[str]:
    """Correct pypinyin's reading of ``word`` where it is known to be wrong (a new list, same length).

    Parameters
    ----------
    previous: the word before it in the clause ('' at the start).
    word: one jieba word, after merging.
    syls: its TONE3 syllables from pypinyin, one per character.
    """
    if "长" not in word or len(syls) != len(word):
        return syls
    out = list(syls)
    for i, char in enumerate(word):
        if char != "长" or out[i] != "zhang3":
            continue
        head = word[:i] if i else previous
        if (head in _DEGREE and i == len(word) - 1) or word[i:] == "长时间":
            out[i] = "chang2"
    return out
