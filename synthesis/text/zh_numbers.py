"""Chinese number words: cardinals (``1050`` -> 一千零五十), decimals and digit strings, as upstream reads them.

These are the reading conventions of upstream's ``zh_normalization`` (PaddleSpeech): a leading 一十 is shortened to
十 only at the very start (``12`` -> 十二, but ``1012`` -> 一千零一十二); a run of zeros inside a number is read as
one 零; a decimal keeps one trailing zero (``3.50`` -> 三点五零, ``3.500`` -> 三点五零); digit strings (codes, phone
numbers) may read ``1`` as 幺.
"""

from __future__ import annotations

DIGIT_CHARS = "零一二三四五六七八九"
# Positional units, largest first: a number longer than the unit's place count splits there (亿 then 万 ...).
_PLACES = ((8, "亿"), (4, "万"), (3, "千"), (2, "百"), (1, "十"))


def digits(text: str, yao: bool = False) -> str:
    """``"0138"`` -> 零一三八 (one character per digit); ``yao`` reads ``1`` as 幺, as in phone numbers."""
    out = "".join(DIGIT_CHARS[int(c)] for c in text)
    return out.replace("一", "幺") if yao else out


def _parts(text: str, zero_before: bool = True) -> list[str]:
    """Cardinal reading of a digit string as a list of characters (no 一十 shortening)."""
    core = text.lstrip("0")
    if not core:
        return []
    if len(core) == 1:
        # "05" inside a larger number reads 零五
        return ["零", DIGIT_CHARS[int(core)]] if zero_before and len(core) < len(text) else [DIGIT_CHARS[int(core)]]
    places, unit = next((p, u) for p, u in _PLACES if p < len(core))
    return _parts(text[:-places]) + [unit] + _parts(text[-places:])


def cardinal(text: str) -> str:
    """Digit string -> cardinal reading: ``"42"`` -> 四十二, ``"1050"`` -> 一千零五十, ``"0"`` -> 零, ``""`` -> ``""``."""
    if not text:
        return ""
    core = text.lstrip("0")
    if not core:
        return "零"
    parts = _parts(core)
    if len(parts) >= 2 and parts[0] == "一" and parts[1] == "十":
        parts = parts[1:]
    return "".join(parts)


def number(text: str) -> str:
    """``"158.5"`` -> 一百五十八点五, ``".5"`` -> 零点五, ``"12"`` -> 十二 (integer part as a cardinal, decimals digit by digit).

    A string with more than one ``.`` is read as digits and 点 throughout.
    """
    pieces = text.split(".")
    if len(pieces) > 2:
        return "点".join(cardinal(p) if p else "" for p in pieces)
    integer, decimal = (pieces[0], "") if len(pieces) == 1 else (pieces[0], pieces[1])
    out = cardinal(integer)
    # keep one trailing zero: "3.0" is read 三点零, "3.50" 三点五零
    decimal = decimal.rstrip("0") + "0" if decimal.endswith("0") else decimal
    if decimal:
        out = (out or "零") + "点" + digits(decimal)
    return out
