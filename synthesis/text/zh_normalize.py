"""Chinese text normalisation: sentences, with numbers, dates, times, phone numbers and units read out in characters.

Follows upstream GPT-SoVITS's ``zh_normalization.TextNormalizer`` (from PaddleSpeech), rule for rule and in its
order, because the v2 models were trained on its readings -- including its odd ones (a bare number of three or more
digits is read digit by digit, ``299`` -> 二九九, unless a measure word follows: ``299元`` -> 二百九十九元).
Where upstream is plainly wrong this module reads it right instead: currency signs (``$5`` -> 五美元), phone
numbers written with dashes (upstream reads the dash as 减, minus), thousands separators (upstream splits the
sentence at the comma), dates with one-digit months or days (``2024/3/5``: upstream reads a fraction), and a time
range whose first time is on the half hour (``8:30-9:15``: upstream reads the second time as 九点半).

Traditional characters are simplified one by one with the character table of the ``zhconv`` package (as upstream
simplifies character by character with a table of its own).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any, cast

from .zh_numbers import cardinal, digits, number

# Measure words after which a number is read as a quantity (upstream's list): classifiers, then units of length,
# weight, money and time, then containers. Two-character ones are listed only where their first character is not
# a measure word by itself.
_MEASURE_CHARS = (
    "个人只位名件条张本台架辆艘枚把支枝根颗粒片块双对套处栋间床株棵朵匹头口尾首篇页封项例列段批群层户家所座场回趟注目队阵阙"
    "幅幢堵墙面道顶丘山坡岭江溪网炮袭挑担捆扎撮堆叠刀令打手罗出脚板跳贴针线管身堂课单壳窠曲腔砣客贯"
    "丝毫厘分钱两斤铢石钧锱忽寸尺丈里寻常铺程米升斗合勺吨元角毛亿万千百平方亩"
    "年月日季刻时周天秒旬纪岁世更夜春夏秋冬代伏辈"
    "盘碗碟桶笼盆盒杯钟斛锅簋篮罐瓶壶卮盏箩箱煲啖袋钵丸泡"
)
_MEASURE_WORDS = ("公分", "十吨", "小时", "微克", "微米", "美元")
_MEASURE = "(?:" + "|".join(_MEASURE_WORDS) + "|[" + "".join(sorted(set(_MEASURE_CHARS))) + "])"

# Simplified characters in their own right that zhconv would still change (乾 qian2: 乾坤, 乾隆); upstream keeps them.
_KEEP_AS_WRITTEN = "乾"

_SPLIT_AFTER_RE = re.compile(r"([：、，；。？！,;?!][”’]?)")
_DROP_AT_SPLIT_RE = re.compile(r"[—《》【】<>{}()（）#&@“”^_|\\]")
_DROP_AT_END_RE = re.compile(r"[-—《》【】<=>{}()（）#&@“”^_|\\]")
_FULLWIDTH = {c + 0xFEE0: c for c in range(ord("0"), ord("9") + 1)}
_FULLWIDTH.update({c + 0xFEE0: c for c in range(ord("A"), ord("Z") + 1)})
_FULLWIDTH.update({c + 0xFEE0: c for c in range(ord("a"), ord("z") + 1)})
_FULLWIDTH[0x3000] = ord(" ")

# Beyond upstream: currency sign + amount -> amount + currency word (upstream drops the sign or reads "$" as a stop).
_CURRENCY_WORDS = {"$": "美元", "¥": "元", "￥": "元", "€": "欧元", "£": "英镑", "₩": "韩元", "₹": "卢比"}
_CURRENCY_RE = re.compile(r"([$¥￥€£₩₹])\s*(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?")
# Beyond upstream: dashed phone numbers (mobile 3-4-4, landline area-number, 400 service numbers).
_DASHED_PHONE_RE = re.compile(
    r"(?<![\d-])(?:1\d{2}-\d{4}-\d{4}|0\d{2,3}-[1-9]\d{6,7}|400-\d{3}-\d{4})(?![\d-])"
)

_DATE_RE = re.compile(r"(\d{4}|\d{2})年(?:(0?[1-9]|1[0-2])月)?(?:(0?[1-9]|[12][0-9]|30|31)([日号]))?")
_DASHED_DATE_RE = re.compile(r"(\d{4})([- /.])(0[1-9]|1[012])\2(0[1-9]|[12][0-9]|3[01])")
# Beyond upstream: 2024/3/5, 2024-3-15 (upstream wants two-digit months and days, and reads these as a fraction
# or a subtraction).
_SHORT_DATE_RE = re.compile(r"(?<!\d)(\d{4})([-/])(0?[1-9]|1[012])\2(0?[1-9]|[12][0-9]|3[01])(?!\d)")
# Beyond upstream: thousands separators (upstream splits the sentence at the comma: 1,250 -> 一，二百五十).
_GROUPED_RE = re.compile(r"(?<![\d,])\d{1,3}(?:,\d{3})+(?![\d,])")
_CLOCK = r"([01]?[0-9]|2[0-3]):([0-5][0-9])(?::([0-5][0-9]))?"
_TIME_RANGE_RE = re.compile(_CLOCK + r"[~-]" + _CLOCK)
_TIME_RE = re.compile(_CLOCK)
_NUM = r"(?:-?\d+(?:\.\d+)?|\.\d+)"
_UNIT = r"(?:%|°C|℃|度|摄氏度|cm2|cm²|cm3|cm³|cm|db|ds|kg|km|m2|m²|m³|m3|ml|m|mm|s)"
_TO_RANGE_RE = re.compile(_NUM + _UNIT + "~" + _NUM + _UNIT)
_TEMPERATURE_RE = re.compile(r"(-?)(\d+(?:\.\d+)?)(°C|℃|度|摄氏度)")
# Unit abbreviations, replaced in this order wherever they occur (upstream's order: "m" before "mm").
_UNITS = (
    ("cm2", "平方厘米"), ("cm²", "平方厘米"), ("cm3", "立方厘米"), ("cm³", "立方厘米"), ("cm", "厘米"),
    ("db", "分贝"), ("ds", "毫秒"), ("kg", "千克"), ("km", "千米"), ("m2", "平方米"), ("m²", "平方米"),
    ("m³", "立方米"), ("m3", "立方米"), ("ml", "毫升"), ("m", "米"), ("mm", "毫米"), ("s", "秒"),
)
_POW = "[⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ]*"
_OPERAND = rf"(?:-?\d+(?:\.\d+)?{_POW}|\.\d+{_POW}|[A-Za-z]{_POW})"
_ARITH_RE = re.compile(rf"({_OPERAND})([+\-×÷=])({_OPERAND})")
_ARITH_WORDS = {"+": "加", "-": "减", "×": "乘", "÷": "除", "=": "等于"}
_POWER_RE = re.compile(r"[⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ]+")
_SUPERSCRIPTS = dict(zip("⁰¹²³⁴⁵⁶⁷⁸⁹ˣʸⁿ", "0123456789xyn"))
_FRACTION_RE = re.compile(r"(-?)(\d+)/(\d+)")
_PERCENT_RE = re.compile(r"(-?)(\d+(?:\.\d+)?)%")
_MOBILE_RE = re.compile(r"(?<!\d)((?:\+?86 ?)?1(?:[38]\d|5[0-35-9]|7[678]|9[89])\d{8})(?!\d)")
_LANDLINE_RE = re.compile(r"(?<!\d)((?:0(?:10|2[1-3]|[3-9]\d{2})-?)?[1-9]\d{6,7})(?!\d)")
_SERVICE_NUMBER_RE = re.compile(r"400-?\d{3}-?\d{4}")
_RANGE_RE = re.compile(r"(?<![\d+\-×÷=])(-?\d+(?:\.\d+)?)[-~](-?\d+(?:\.\d+)?)(?![\d+\-×÷=])")
_NEGATIVE_RE = re.compile(r"-(\d+)")
_VERSION_RE = re.compile(r"\d+\.\d+(?:\.\d+)?(?:\.\d+)+")
_DECIMAL_RE = re.compile(r"(-?)(\d+\.\d+)|\.(\d+)")
_QUANTITY_RE = re.compile(r"(\d+)([多余几+])?(?=" + _MEASURE + ")")
_CODE_RE = re.compile(r"\d{3,}")
_NUMBER_RE = re.compile(r"(-?)(\d+(?:\.\d+)?)|\.(\d+)")
# Symbols read as words at the end (circled numbers, Greek letters, arithmetic signs left over).
_SYMBOL_WORDS = {
    "/": "每", "①": "一", "②": "二", "③": "三", "④": "四", "⑤": "五", "⑥": "六", "⑦": "七", "⑧": "八", "⑨": "九",
    "⑩": "十", "α": "阿尔法", "β": "贝塔", "γ": "伽玛", "Γ": "伽玛", "δ": "德尔塔", "Δ": "德尔塔", "ε": "艾普西龙",
    "ζ": "捷塔", "η": "依塔", "θ": "西塔", "Θ": "西塔", "ι": "艾欧塔", "κ": "喀帕", "λ": "拉姆达", "Λ": "拉姆达",
    "μ": "缪", "ν": "拗", "ξ": "克西", "Ξ": "克西", "ο": "欧米克伦", "π": "派", "Π": "派", "ρ": "肉", "ς": "西格玛",
    "Σ": "西格玛", "σ": "西格玛", "τ": "套", "υ": "宇普西龙", "φ": "服艾", "Φ": "服艾", "χ": "器", "ψ": "普赛",
    "Ψ": "普赛", "ω": "欧米伽", "Ω": "欧米伽", "+": "加", "-": "减", "×": "乘", "÷": "除", "=": "等",
}
_SYMBOL_RE = re.compile("|".join(re.escape(k) for k in _SYMBOL_WORDS))


def normalize_sentences(text: str) -> list[str]:
    """Chinese text -> its sentences, with non-words read out in Chinese characters.

    Upstream ``TextNormalizer.normalize``: spaces and brackets/quotes removed, split after ``：、，；。？！,;?!``
    (the mark stays with its sentence), traditional characters simplified, full-width digits and letters made
    ASCII, then dates (``2024年3月15日`` -> 二零二四年三月十五日), times (``8:30`` -> 八点半), temperatures,
    units, arithmetic, fractions, percentages, phone numbers (幺 for 1), ranges, negative numbers, decimals and
    quantities read out. Punctuation is left as written (the caller maps it).

    Returns
    -------
    The sentences in order (``[""]`` for blank text).
    """
    text = _CURRENCY_RE.sub(_currency, text)
    text = _GROUPED_RE.sub(lambda m: m.group(0).replace(",", ""), text)
    text = text.replace(" ", "")
    text = _DROP_AT_SPLIT_RE.sub("", text)
    text = _SPLIT_AFTER_RE.sub("\\1\n", text).strip()
    return [_normalize_sentence(s.strip()) for s in re.split(r"\n+", text)]


def to_simplified(text: str) -> str:
    """Traditional characters -> simplified, character by character (``說話`` -> 说话); others unchanged."""
    table = _simplified_table()
    return "".join(table.get(c, c) for c in text)


@lru_cache(maxsize=1)
def _simplified_table() -> dict[str, str]:
    """zhconv's one-character zh-cn conversions, read from its packaged dictionary on first use."""
    raw = resources.files("zhconv").joinpath("zhcdict.json").read_bytes()
    data = cast(dict[str, Any], json.loads(raw.decode("utf-8")))
    table: dict[str, str] = {}
    for key in ("zh2Hans", "zh2CN"):  # zh-cn = the Hans table with the mainland overrides on top
        part = cast(dict[str, str], data.get(key) or {})
        table.update({k: v for k, v in part.items() if len(k) == 1 and _readable(v)})
    for char in _KEEP_AS_WRITTEN:
        table.pop(char, None)
    return table


def _readable(char: str) -> bool:
    """A single character the Chinese G2P keeps (basic CJK block); rarer targets would be deleted, so are not used."""
    return len(char) == 1 and "\u4e00" <= char <= "\u9fa5"


def _normalize_sentence(s: str) -> str:
    """One sentence through upstream's rules, in upstream's order."""
    s = to_simplified(s).translate(_FULLWIDTH)
    s = _DATE_RE.sub(_date, s)
    for date_re in (_DASHED_DATE_RE, _SHORT_DATE_RE):
        s = date_re.sub(lambda m: f"{digits(m.group(1))}年{cardinal(m.group(3))}月{cardinal(m.group(4))}日", s)
    s = _TIME_RANGE_RE.sub(_time_range, s)
    s = _TIME_RE.sub(lambda m: _clock(m.group(1), m.group(2), m.group(3)), s)
    s = _TO_RANGE_RE.sub(lambda m: m.group(0).replace("~", "至"), s)
    s = _TEMPERATURE_RE.sub(_temperature, s)
    for abbr, word in _UNITS:
        s = s.replace(abbr, word)
    s = _DASHED_PHONE_RE.sub(lambda m: "，".join(digits(p, yao=True) for p in m.group(0).split("-")), s)
    while _ARITH_RE.search(s):
        s = _ARITH_RE.sub(lambda m: m.group(1) + _ARITH_WORDS[m.group(2)] + m.group(3), s)
    s = _POWER_RE.sub(lambda m: "的" + "".join(_SUPERSCRIPTS[c] for c in m.group(0)) + "次方", s)
    s = _FRACTION_RE.sub(lambda m: f"{_neg(m.group(1))}{number(m.group(3))}分之{number(m.group(2))}", s)
    s = _PERCENT_RE.sub(lambda m: f"{_neg(m.group(1))}百分之{number(m.group(2))}", s)
    s = _MOBILE_RE.sub(lambda m: "，".join(digits(p, yao=True) for p in m.group(0).strip("+").split()), s)
    s = _LANDLINE_RE.sub(_phone, s)
    s = _SERVICE_NUMBER_RE.sub(_phone, s)
    s = _RANGE_RE.sub(lambda m: f"{_signed(m.group(1))}到{_signed(m.group(2))}", s)
    s = _NEGATIVE_RE.sub(lambda m: "负" + number(m.group(1)), s)
    s = _VERSION_RE.sub(lambda m: "".join("点" if c == "." else cardinal(c) for c in m.group(0)), s)
    s = _DECIMAL_RE.sub(_decimal, s)
    s = _QUANTITY_RE.sub(_quantity, s)
    s = _CODE_RE.sub(lambda m: digits(m.group(0), yao=True), s)
    s = _NUMBER_RE.sub(_decimal, s)
    s = _SYMBOL_RE.sub(lambda m: _SYMBOL_WORDS[m.group(0)], s)
    return _DROP_AT_END_RE.sub("", s)


def _neg(sign: str) -> str:
    """'-' -> 负."""
    return "负" if sign else ""


def _signed(text: str) -> str:
    """A possibly negative number -> its reading."""
    return ("负" if text.startswith("-") else "") + number(text.lstrip("-"))


def _currency(m: re.Match[str]) -> str:
    """``$1,299.5`` -> 一千二百九十九点五美元."""
    return number(m.group(2).replace(",", "") + (m.group(3) or "")) + _CURRENCY_WORDS[m.group(1)]


def _date(m: re.Match[str]) -> str:
    """``2024年3月15日`` -> 二零二四年三月十五日 (the year digit by digit)."""
    out = digits(m.group(1)) + "年"
    if m.group(2):
        out += cardinal(m.group(2)) + "月"
    if m.group(3):
        out += cardinal(m.group(3)) + m.group(4)
    return out


def _clock_part(value: str) -> str:
    """Minutes or seconds: ``"05"`` -> 零五, ``"20"`` -> 二十."""
    return ("零" if value.startswith("0") else "") + number(value.lstrip("0"))


def _clock(hour: str, minute: str, second: str | None, half: bool | None = None) -> str:
    """``8:30`` -> 八点半, ``7:05:09`` -> 七点零五分零九秒; ``half`` overrides when :30 reads 半."""
    out = number(hour) + "点"
    if minute.lstrip("0"):
        out += "半" if (int(minute) == 30 if half is None else half) else _clock_part(minute) + "分"
    if second and second.lstrip("0"):
        out += _clock_part(second) + "秒"
    return out


def _time_range(m: re.Match[str]) -> str:
    """``8:30-9:30`` -> 八点半至九点半."""
    start_half = int(m.group(2)) == 30
    # Upstream decides 半 for the end time from the start's minutes; only both on the half hour read 半 here.
    end_half = start_half and int(m.group(5)) == 30
    return _clock(m.group(1), m.group(2), m.group(3)) + "至" + _clock(m.group(4), m.group(5), m.group(6), end_half)


def _temperature(m: re.Match[str]) -> str:
    """``-3°C`` -> 零下三度."""
    unit = "摄氏度" if m.group(3) == "摄氏度" else "度"
    return ("零下" if m.group(1) else "") + number(m.group(2)) + unit


def _phone(m: re.Match[str]) -> str:
    """A landline or service number, digit by digit with 幺, its dash read as a pause."""
    return "，".join(digits(p, yao=True) for p in m.group(0).split("-"))


def _decimal(m: re.Match[str]) -> str:
    """``-1.5`` -> 负一点五, ``.5`` -> 零点五 (``_DECIMAL_RE`` / ``_NUMBER_RE`` groups)."""
    if m.group(3):
        return number("." + m.group(3))
    return _neg(m.group(1)) + number(m.group(2))


def _quantity(m: re.Match[str]) -> str:
    """``2个`` -> 两个, ``3+年`` -> 三多年 (the measure word itself stays)."""
    amount = number(m.group(1))
    more = "多" if m.group(2) == "+" else (m.group(2) or "")
    return ("两" if amount == "二" else amount) + more
