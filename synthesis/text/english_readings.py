"""English readings upstream gets wrong, rewritten into plain words before upstream's normalisation runs.

Upstream appends "a.m." to every clock time before noon, reads ``Dr.`` as "drive" and ``Mon.`` as "mon", ``1990s`` as
"nineteen ninety seconds", ``03/15/2024`` as "three fifteenthstwenty twenty-four", and spells out phone numbers,
e-mail addresses, URLs, versions and most currency signs badly or not at all. Each rule here turns one such pattern
into words (or into digits upstream then reads right); text that none matches is left exactly as it was, so
everything else keeps upstream's reading.
"""

from __future__ import annotations

import re

from .english_normalize import DIGIT_WORDS, cardinal, money, number_words, ordinal

_AMOUNT = r"(\d(?:[\d,]*\d)?(?:\.\d+)?)"
# sign -> (unit, units, hundredth, hundredths); "" where no hundredth is in use (the decimals are read as such)
_SIGNS = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "€": ("euro", "euros", "cent", "cents"),
    "¥": ("yen", "yen", "", ""),
    "₹": ("rupee", "rupees", "paisa", "paise"),
    "₩": ("won", "won", "", ""),
    "₽": ("ruble", "rubles", "kopeck", "kopecks"),
    "₺": ("lira", "lira", "kurus", "kurus"),
    "₪": ("shekel", "shekels", "agora", "agorot"),
    "₫": ("dong", "dong", "", ""),
}
_CODES = {  # ISO 4217 code -> the sign it reads like, or its own (unit, units, hundredth, hundredths)
    "USD": ("US dollar", "US dollars", "cent", "cents"),
    "EUR": _SIGNS["€"],
    "GBP": _SIGNS["£"],
    "JPY": _SIGNS["¥"],
    "CNY": ("yuan", "yuan", "", ""),
    "RMB": ("yuan", "yuan", "", ""),
    "INR": _SIGNS["₹"],
    "KRW": _SIGNS["₩"],
    "RUB": _SIGNS["₽"],
    "TRY": _SIGNS["₺"],
    "ILS": _SIGNS["₪"],
    "VND": _SIGNS["₫"],
    "CAD": ("Canadian dollar", "Canadian dollars", "cent", "cents"),
    "AUD": ("Australian dollar", "Australian dollars", "cent", "cents"),
    "CHF": ("franc", "francs", "", ""),
}
_SCALES = {"k": "thousand", "K": "thousand", "m": "million", "M": "million", "mn": "million", "b": "billion",
           "B": "billion", "bn": "billion"}
_NEW_SIGNS = "".join(s for s in _SIGNS if s not in "$£")  # upstream reads $ and £ itself
_SCALED_MONEY_RE = re.compile(r"([" + re.escape("".join(_SIGNS)) + r"])" + _AMOUNT + r"\s?(bn|mn|[kKmMbB])\b")
_SIGN_BEFORE_RE = re.compile(r"([" + _NEW_SIGNS + r"])\s?" + _AMOUNT)
_SIGN_AFTER_RE = re.compile(_AMOUNT + r"\s?([" + _NEW_SIGNS + r"¢])")
_CODE_BEFORE_RE = re.compile(r"\b(" + "|".join(_CODES) + r")\s?" + _AMOUNT + r"(?!\d)")
_CODE_AFTER_RE = re.compile(_AMOUNT + r"\s?(" + "|".join(_CODES) + r")\b")

_CLOCK_RE = re.compile(r"\b([01]?\d|2[0-3]):([0-5]\d)(?:\s?([AaPp])\.?\s?[Mm]\b(\.?)|(?!\d))")
_HOUR_RE = re.compile(r"\b(1[0-2]|0?[1-9])\s?([AaPp])\.?\s?[Mm]\b(\.?)")
_PHONE_PLUS_RE = re.compile(r"\+\d{1,3}(?:[\s.-]?\(?\d{1,4}\)?){2,5}(?![\d])")
_PHONE_RE = re.compile(r"(?<![\d\-+.])(?:\(?\d{3}\)?[\s.-]\d{3}[\s.-]|\d{3}[.-])\d{4}(?![\d\-])")
_EMAIL_RE = re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")
_TLDS = "com|org|net|edu|gov|io|dev|ai|app|co|uk|us|ca|au|de|fr|jp|cn|ru|in|me|tv|gg|info|xyz|ly"
_URL_RE = re.compile(
    r"\b(?:https?://)?(?:www\.)?[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.(?:" + _TLDS + r")\b(?!\.\w)(?:/[^\s]*[^\s.,!?;:)])?"
)
_VERSION_RE = re.compile(r"\bv(\d+(?:\.\d+)*)\b|(?<![\d.])(\d+\.\d+\.\d+(?:\.\d+)*)(?![\d]|\.\d)")
_DECADE_RE = re.compile(r"\b(1[1-9]|20)(\d)0'?s\b")
_SHORT_DECADE_RE = re.compile(  # "the 90s", "her 20s", "mid-80s", "'70s": a bare "30s" stays thirty seconds
    r"(?:(\b(?:the|early|late|mid|her|his|their|my|your|our)(?:\s+|-))'?|(?<!\w)')([1-9])0'?s\b"
)
_THOUSANDS_RE = re.compile(r"\b(\d+(?:\.\d+)?)k\b")  # lower-case only: "4K" is a screen, "5K" a race
_TIMES_RE = re.compile(r"\b(\d+(?:\.\d+)?)x\b")
_TITLE_OR_PLACE_RE = re.compile(r"\b(Dr|St)(\.?)(?=\s|$)")
_TITLES = {"Dr": ("Doctor", "Drive"), "St": ("Saint", "Street")}  # (before a name, after one)
_DAYS = {"Mon": "Monday", "Tue": "Tuesday", "Tues": "Tuesday", "Wed": "Wednesday", "Thu": "Thursday",
         "Thur": "Thursday", "Thurs": "Thursday", "Fri": "Friday", "Sat": "Saturday", "Sun": "Sunday"}
_DAY_RE = re.compile(r"\b(" + "|".join(_DAYS) + r")\.")
_ISO_DATE_RE = re.compile(r"(?<![\d-])(\d{4})-(\d{2})-(\d{2})(?![\d-])")
_SLASH_DATE_RE = re.compile(r"(?<![\d/])(\d{1,2})/(\d{1,2})/(\d{4})(?![\d/])")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")


def _date(year: str, month: str, day: str, written: str) -> str:
    """A numeric date as upstream reads a written one: ``2024-03-15`` -> ``March 15th, 2024``."""
    if not (1 <= int(month) <= 12 and 1 <= int(day) <= 31):
        return written
    return f"{_MONTHS[int(month) - 1]} {ordinal(str(int(day)))}, {year}"


def _slash_date(m: re.Match[str]) -> str:
    """``03/15/2024`` month first (US); ``15/03/2024`` day first when the first number cannot be a month."""
    first, second = m.group(1), m.group(2)
    if int(first) > 12 >= int(second):
        first, second = second, first
    return _date(m.group(3), first, second, m.group(0))


def _digits(digits: str) -> str:
    """``0100`` -> ``zero one zero zero``."""
    return " ".join(DIGIT_WORDS[int(d)] for d in digits if d.isdigit())


def _keeps_period(text: str, end: int) -> bool:
    """Whether a "." that ends an abbreviation at ``end`` also ends the sentence (end of text or a capital next)."""
    rest = text[end:].lstrip()
    return not rest or rest[0].isupper()


def _amount(amount: str, names: tuple[str, str, str, str]) -> str:
    """An amount of a currency, in upstream's money wording (digits left for the number rules)."""
    unit, units, cent, cents = names
    amount = amount.replace(",", "")
    if not cent:  # no hundredths in use: "¥1.5" is one point five yen
        return f"{amount} {unit if amount == '1' else units}"
    return money(amount, unit, units, cent, cents)


def _scaled_money(m: re.Match[str]) -> str:
    """``$10k`` -> ``10 thousand dollars``, ``€2.5M`` -> ``2.5 million euros``."""
    return f"{m.group(2).replace(',', '')} {_SCALES[m.group(3)]} {_SIGNS[m.group(1)][1]}"


def _clock(m: re.Match[str]) -> str:
    """``7:30`` -> ``seven thirty``, ``7:05`` -> ``seven oh five``, ``15:00`` -> ``three P M``, ``3:30pm`` too."""
    hour, minute, period = int(m.group(1)), int(m.group(2)), (m.group(3) or "").upper()
    if hour > 12:  # a 24-hour time says its half of the day; before 13:00 none is invented
        hour, period = hour - 12, "P"
    elif hour == 0:
        hour, period = 12, "A"
    words = number_words(hour)
    if minute == 0:
        words += f" {period} M" if period else " o'clock"
    else:
        words += f" {'oh ' if minute < 10 else ''}{number_words(minute)}" + (f" {period} M" if period else "")
    return words + ("." if m.group(4) and _keeps_period(m.string, m.end()) else "")


def _hour(m: re.Match[str]) -> str:
    """``5pm`` / ``5 p.m.`` -> ``five P M``."""
    dot = "." if m.group(3) and _keeps_period(m.string, m.end()) else ""
    return f"{number_words(int(m.group(1)))} {m.group(2).upper()} M{dot}"


def _phone(m: re.Match[str]) -> str:
    """A phone number digit by digit, its groups set off by commas: ``+1 415`` -> ``plus one, four one five``."""
    groups = [g for g in re.split(r"[\s.()-]+", m.group(0)) if g]
    lead = "plus " if groups[0].startswith("+") else ""
    return lead + ", ".join(_digits(g) for g in groups)


def _spell_part(part: str) -> str:
    """A piece of an address: letters kept as a word, digits read one by one."""
    return re.sub(r"\d+", lambda d: f" {_digits(d.group(0))} ", part).strip()


_ADDRESS_MARKS = {".": "dot", "_": "underscore", "-": "dash", "+": "plus", "/": "slash", "%": "percent"}


def _address(text: str) -> str:
    """``john.doe_1`` -> ``john dot doe underscore one``."""
    pieces = re.split(r"([._\-+/%])", text)
    words = [_ADDRESS_MARKS[p] if p in _ADDRESS_MARKS else _spell_part(p) for p in pieces if p]
    return " ".join(w for w in words if w)


def _email(m: re.Match[str]) -> str:
    """``ann.lee@mail.com`` -> ``ann dot lee at mail dot com``."""
    local, domain = m.group(0).split("@", 1)
    return f"{_address(local)} at {_address(domain)}"


def _url(m: re.Match[str]) -> str:
    """``https://www.example.com/docs`` -> ``w w w dot example dot com slash docs`` (the scheme is not read)."""
    url = re.sub(r"^https?://", "", m.group(0))
    words = _address(url.removeprefix("www."))
    return ("w w w dot " + words) if url.startswith("www.") else words


def _version(m: re.Match[str]) -> str:
    """``v2.1.3`` -> ``version 2 point 1 point 3`` (each part a number, as versions are said)."""
    if m.group(1) is not None:
        return "version " + " point ".join(m.group(1).split("."))
    return " point ".join(m.group(2).split("."))


def _plural(words: str) -> str:
    """The plural of a number's last word: ninety -> nineties, hundred -> hundreds."""
    head, _, last = words.rpartition(" ")
    last = last[:-1] + "ies" if last.endswith("y") else last + "s"
    return f"{head} {last}" if head else last


def _decade(m: re.Match[str]) -> str:
    """``1990s`` -> ``nineteen nineties``, ``2000s`` -> ``two thousands``."""
    return _plural(cardinal(int(m.group(1) + m.group(2) + "0")))


def _short_decade(m: re.Match[str]) -> str:
    """``the 90s`` / ``'90s`` -> ``the nineties``."""
    return (m.group(1) or "") + _plural(number_words(int(m.group(2) + "0")))


def _title_or_place(m: re.Match[str]) -> str:
    """``Dr.``/``St.`` before a name -> Doctor/Saint; after one (``Elm Dr.``, ``Main St.``) -> Drive/Street."""
    head, _, prev = m.string[: m.start()].rstrip().rpartition(" ")
    sentence_start = not head.strip() or head.rstrip()[-1] in ".!?"
    # "Elm Dr." follows a name; "Hi Dr. Lee" does not (a capital that starts the sentence says nothing)
    after_name = bool(prev) and (prev[0].isupper() or prev[0].isdigit()) and not sentence_start
    before_name = _keeps_period(m.string, m.end()) and bool(m.string[m.end():].strip())
    title, place = _TITLES[m.group(1)]
    if before_name and not after_name:
        return title
    if not m.group(2) and not after_name:
        return m.group(0)  # "St" with nothing to tell which: left as written
    return place + ("." if m.group(2) and _keeps_period(m.string, m.end()) else "")


def _day(m: re.Match[str]) -> str:
    """``Mon.`` -> ``Monday`` (the period kept when it ends the sentence)."""
    return _DAYS[m.group(1)] + ("." if _keeps_period(m.string, m.end()) else "")


def rewrite(text: str) -> str:
    """Rewrite the patterns upstream misreads into words; leave all other text as it is.

    Parameters
    ----------
    text:
        English text, before :func:`synthesis.text.english_normalize.upstream_normalize`.

    Returns
    -------
    The text with curly apostrophes, ``℃``, numeric dates, e-mail addresses, URLs, phone numbers, versions,
    clock times, currency amounts, decades, ``10k``/``2x``, ``Dr.``/``St.`` and abbreviated weekdays written out.
    """
    text = text.replace("\u2019", "'").replace("\u2018", "'")  # upstream means to fold these, but its map never fires
    text = text.replace("℃", "°C").replace("℉", "°F")  # the one-character signs, for upstream's unit rule
    text = _ISO_DATE_RE.sub(lambda m: _date(m.group(1), m.group(2), m.group(3), m.group(0)), text)
    text = _SLASH_DATE_RE.sub(_slash_date, text)
    text = _EMAIL_RE.sub(_email, text)
    text = _URL_RE.sub(_url, text)
    text = _PHONE_PLUS_RE.sub(_phone, text)
    text = _PHONE_RE.sub(_phone, text)
    text = _VERSION_RE.sub(_version, text)
    text = _CLOCK_RE.sub(_clock, text)
    text = _HOUR_RE.sub(_hour, text)
    text = _SCALED_MONEY_RE.sub(_scaled_money, text)
    text = _SIGN_BEFORE_RE.sub(lambda m: _amount(m.group(2), _SIGNS[m.group(1)]), text)
    text = _SIGN_AFTER_RE.sub(
        lambda m: _amount(m.group(1), ("cent", "cents", "", "") if m.group(2) == "¢" else _SIGNS[m.group(2)]), text)
    text = _CODE_BEFORE_RE.sub(lambda m: _amount(m.group(2), _CODES[m.group(1)]), text)
    text = _CODE_AFTER_RE.sub(lambda m: _amount(m.group(1), _CODES[m.group(2)]), text)
    text = _DECADE_RE.sub(_decade, text)
    text = _SHORT_DECADE_RE.sub(_short_decade, text)
    text = _THOUSANDS_RE.sub(r"\1 thousand", text)
    text = _TIMES_RE.sub(r"\1 times", text)
    text = _TITLE_OR_PLACE_RE.sub(_title_or_place, text)
    return _DAY_RE.sub(_day, text)
