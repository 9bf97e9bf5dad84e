"""Mandarin tone sandhi and erhua on jieba words, as upstream GPT-SoVITS (PaddleSpeech's ``ToneSandhi``) applies them.

Syllables are TONE3 pinyin strings (``"hao3"``, 5 = neutral); a punctuation mark that jieba glued to a word stays
as its own item and is never retoned. The rules, in upstream's order:

* words are first merged so that the rules see whole units: 不 and 一 join the next word, ``V一V`` joins,
  repeated words join, and neighbours in the third tone join while short enough (``_merge``);
* 不: neutral in ``V不V`` (看不懂), 2nd tone before a 4th (不怕);
* 一: unchanged in numbers, neutral in ``V一V``, 1st in 第一, 2nd before a 4th tone, else 4th;
* neutral tone: reduplicated nouns/verbs/adjectives (奶奶), particles (吧 呢 啊 ...), 的地得, aspect 了着过,
  plural 们/子 on nouns, place words (桌上), directional complements (上来), the classifier 个, and a list of words
  whose last syllable is conventionally neutral (衣服, 喜欢, 地方 ...);
* third tone: in two- to four-syllable words a 3rd tone before a 3rd becomes 2nd, by sub-word;
* erhua: a word-final 儿 takes the preceding syllable's tone, except in words where 儿 means child (女儿 ...).
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any, Callable

Word = tuple[str, str]  # (word, jieba part-of-speech tag)

# Words whose last syllable is read in the neutral tone (the list upstream uses; 胡萝 stands for 胡萝卜).
_NEUTRAL_WORDS = frozenset(
    "爱人 巴结 巴掌 白净 棒槌 帮手 包袱 报复 包涵 本事 比方 荸荠 扁担 编辑 别扭 槟榔 薄荷 "
    "簸箕 玻璃 拨弄 补丁 部分 不由 不在 裁缝 财主 苍蝇 柴火 差事 称呼 畜生 锄头 出息 窗户 "
    "炊帚 刺激 刺猬 聪明 凑合 打扮 打点 打发 大方 大夫 耷拉 打量 大人 打算 打听 大爷 大意 "
    "答应 耽搁 耽误 道士 倒腾 得罪 灯笼 地道 地方 提防 嘀咕 弟兄 惦记 点心 东家 动静 动弹 "
    "东西 豆腐 嘟囔 对付 对头 队伍 多么 多少 哆嗦 耳朵 翻腾 费用 分析 凤凰 风筝 福气 父亲 "
    "咖喱 干事 甘蔗 高粱 告示 告诉 膏药 胳膊 疙瘩 跟头 功夫 工夫 咕噜 姑娘 故事 骨头 寡妇 "
    "怪物 棺材 官司 罐头 关系 规矩 闺女 过去 蛤蟆 哈欠 寒碜 含糊 行当 和尚 核桃 合同 红火 "
    "厚道 喉咙 后头 狐狸 葫芦 胡萝 胡琴 护士 胡同 糊涂 滑溜 荒唐 馄饨 火候 伙计 活泼 记号 "
    "计划 脊梁 机灵 吉他 记性 家伙 架势 嫁妆 见识 糨糊 将就 讲究 叫唤 交情 街坊 姐夫 介绍 "
    "结实 戒指 精神 开通 客气 咳嗽 口袋 窟窿 快活 困难 阔气 喇叭 喇嘛 邋遢 蜡烛 懒得 烂糊 "
    "浪头 老婆 牢骚 老实 老太 老头 姥爷 老爷 累赘 冷战 篱笆 利害 厉害 痢疾 里脊 利落 力气 "
    "利索 里头 连累 两口 凉快 粮食 趔趄 铃铛 溜达 琉璃 弄堂 喽啰 萝卜 逻辑 罗嗦 骆驼 麻烦 "
    "马虎 麻利 码头 蚂蚱 买卖 馒头 忙活 冒失 玫瑰 眉毛 媒人 门道 眯缝 迷糊 棉花 苗条 苗头 "
    "明白 名堂 名字 蘑菇 模糊 木匠 母亲 木头 那个 那么 难为 脑袋 能耐 泥鳅 念叨 念头 娘家 "
    "奴才 暖和 女婿 疟疾 牌楼 盘缠 盘算 佩服 朋友 屁股 枇杷 琵琶 脾气 便宜 漂亮 婆家 铺盖 "
    "菩萨 葡萄 扑腾 欺负 千斤 前头 勤快 亲戚 清楚 亲家 情形 拳头 热闹 人家 认识 软和 丧气 "
    "扫把 扫帚 商量 上司 上头 烧饼 少爷 舌头 什么 牲口 生意 似的 拾掇 师傅 师父 世故 时候 "
    "使唤 石匠 石榴 事情 石头 实在 收成 收拾 首饰 舒服 疏忽 舒坦 熟悉 爽快 思量 算计 算盘 "
    "岁数 踏实 抬举 太阳 特务 体面 甜头 挑剔 跳蚤 笤帚 铁匠 痛快 头发 妥当 唾沫 拖沓 挖苦 "
    "外甥 尾巴 委屈 位置 稳当 温和 窝囊 悟性 媳妇 希罕 稀罕 喜欢 下巴 吓唬 下水 先生 相声 "
    "笑话 小伙 小气 消息 笑语 心思 新鲜 幸福 行李 兄弟 秀才 秀气 休息 玄乎 学生 学问 哑巴 "
    "牙碜 衙门 丫头 眼睛 砚台 烟筒 胭脂 秧歌 养活 吆喝 妖精 钥匙 一辈 衣服 衣裳 意识 意思 "
    "应酬 冤家 冤枉 鸳鸯 月饼 月亮 云彩 匀称 运气 在乎 造化 糟蹋 怎么 眨巴 栅栏 扎实 丈夫 "
    "张罗 帐篷 丈人 照顾 招呼 招牌 这个 这么 折腾 枕头 正经 指甲 芝麻 志气 知识 指头 妯娌 "
    "嘱咐 主意 转悠 庄稼 壮实 状元 琢磨 字号 自在 祖宗 嘴巴 作坊".split()
)
# Words that keep their full tones although a rule above would neutralise them (男子, 人人, 想想 ...).
_KEEP_TONE_WORDS = frozenset(
    "吵吵 打打 电子 分子 干嘛 耕地 瓜子 哈哈 虎虎 花花草草 家家户户 佼佼 局地 考考 恳恳 莲子 "
    "量子 留得 卵子 落地 男子 袅袅 女子 青青 冉冉 攘攘 人人 莘莘 石子 数数 死死 算子 娃哈哈 "
    "熙熙 想想 学子 幺幺 以下 原子 整整".split()
)
_PARTICLES = "吧呢哈啊呐噻嘛吖嗨哦哒额滴哩哟喽啰耶喔诶"  # a word ending in one is neutral at the end
_YI_STOPS = "：，；。？！“”‘’':,;.?!"  # 一 before one of these keeps its 1st tone
# 儿 words read as two syllables (儿 = child, or part of a name), and words read with erhua although tagged so.
_NOT_ERHUA = frozenset(
    "虐儿 为儿 护儿 瞒儿 救儿 替儿 有儿 一儿 我儿 俺儿 妻儿 拐儿 聋儿 乞儿 患儿 幼儿 孤儿 婴儿 婴幼儿 连体儿 "
    "脑瘫儿 流浪儿 体弱儿 混血儿 蜜雪儿 舫儿 祖儿 美儿 应采儿 可儿 侄儿 孙儿 侄孙儿 女儿 男儿 红孩儿 花儿 虫儿 "
    "马儿 鸟儿 猪儿 猫儿 狗儿 少儿".split()
)
_MUST_ERHUA = frozenset("小院儿 胡同儿 范儿 老汉儿 撒欢儿 寻老礼儿 妥妥儿 媳妇儿".split())


@lru_cache(maxsize=1)
def _jieba() -> Any:
    """jieba's default tokenizer, loaded on first use."""
    import jieba  # pyright: ignore[reportMissingTypeStubs]  # untyped; its source gives the types

    jieba.setLogLevel(logging.WARNING)  # pyright: ignore[reportUnknownMemberType]  # untyped parameter
    return jieba


def word_pinyin(word: str) -> list[str]:
    """TONE3 pinyin of a word as pypinyin reads it in one piece (its phrase table resolves polyphones).

    One item per character for Chinese characters; a run of other characters is one item, as written.
    """
    from pypinyin import Style, lazy_pinyin

    return lazy_pinyin(word, style=Style.TONE3, neutral_tone_with_five=True)


def _tone(syl: str) -> str:
    """A syllable's tone digit; '' for a punctuation item."""
    return syl[-1] if syl[-1:].isdigit() else ""


def _retone(syls: list[str], i: int, tone: str) -> None:
    """Set syllable ``i``'s tone in place (punctuation items are left alone)."""
    if _tone(syls[i]):
        syls[i] = syls[i][:-1] + tone


def _all_third(syls: list[str]) -> bool:
    """Every syllable in the 3rd tone (vacuously true for none, as upstream)."""
    return all(s[-1:] == "3" for s in syls)


def _is_reduplication(word: str) -> bool:
    """``XX``: two equal characters."""
    return len(word) == 2 and word[0] == word[1]


def _split_in_two(word: str) -> tuple[str, str]:
    """A word -> (head, tail) around its shortest search-mode sub-word (upstream's split for sandhi)."""
    parts: list[str] = list(_jieba().cut_for_search(word))
    shortest = min(parts, key=len)  # the first of the shortest, as a stable sort would give
    if word.find(shortest) == 0:
        return shortest, word[len(shortest) :]
    return word[: -len(shortest)], shortest


# ---- merging ------------------------------------------------------------------------------------------------------


def merge_words(words: list[Word]) -> list[Word]:
    """Upstream's ``pre_merge_for_modify``: join words so the sandhi rules see whole units.

    不 + next word; ``V 一 V`` -> ``V一V`` and 一 + next word; a word repeated -> one word; neighbours that are
    all 3rd tone, then neighbours meeting on a 3rd tone, join while at most 3 characters (not after a
    reduplication); a lone 儿 joins the word before it.
    """
    words = _merge_bu(words)
    words = _merge_yi(words)
    words = _merge_repeats(words)
    words = _merge_third_tones(words, lambda a, b: _all_third(a) and _all_third(b))
    words = _merge_third_tones(words, lambda a, b: a[-1][-1:] == "3" and b[0][-1:] == "3")
    return _merge_er(words)


def _merge_bu(words: list[Word]) -> list[Word]:
    """不 joins the word after it (a final lone 不 stays, tagged ``d``)."""
    out: list[Word] = []
    last = ""
    for word, pos in words:
        if last == "不":
            word = "不" + word
        if word != "不":
            out.append((word, pos))
        last = word
    if last == "不":
        out.append(("不", "d"))
    return out


def _merge_yi(words: list[Word]) -> list[Word]:
    """``V 一 V`` (both verbs) -> ``V一V``; then a lone 一 joins the word after it."""
    out: list[list[str]] = []
    i = 0
    while i < len(words):
        word, pos = words[i]
        if i >= 1 and word == "一" and i + 1 < len(words):
            prev, nxt = out[-1], words[i + 1]
            if prev[0] == nxt[0] and prev[1] == "v" and nxt[1] == "v":
                out[-1] = [prev[0] + "一" + nxt[0], prev[1]]
                i += 2
                continue
        out.append([word, pos])
        i += 1
    joined: list[list[str]] = []
    for word, pos in out:
        if joined and joined[-1][0] == "一":
            joined[-1][0] += word
        else:
            joined.append([word, pos])
    return [(w, p) for w, p in joined]


def _merge_repeats(words: list[Word]) -> list[Word]:
    """A word equal to the one before it joins it (谢谢 谢谢 -> 谢谢谢谢)."""
    out: list[Word] = []
    for word, pos in words:
        if out and out[-1][0] == word:
            out[-1] = (word + word, out[-1][1])
        else:
            out.append((word, pos))
    return out


def _merge_third_tones(words: list[Word], meets: Callable[[list[str], list[str]], bool]) -> list[Word]:
    """Join a word to the previous one when ``meets(prev_pinyin, pinyin)`` and the two are at most 3 characters.

    A word that was itself just joined takes no further word; a reduplication before never takes one.
    """
    pinyins = [word_pinyin(w) for w, _ in words]
    if any(not p for p in pinyins):  # upstream's merge gives up (an exception it swallows) on an empty word
        return words
    out: list[Word] = []
    joined_prev = False
    for i, (word, pos) in enumerate(words):
        join = (
            i >= 1
            and not joined_prev
            and meets(pinyins[i - 1], pinyins[i])
            and not _is_reduplication(words[i - 1][0])
            and len(words[i - 1][0]) + len(word) <= 3
        )
        if join:
            out[-1] = (out[-1][0] + word, out[-1][1])
        else:
            out.append((word, pos))
        joined_prev = join
    return out


def _merge_er(words: list[Word]) -> list[Word]:
    """A lone 儿 joins the word before it."""
    out: list[Word] = []
    for word, pos in words:
        if out and word == "儿" and out[-1][0] != "#":
            out[-1] = (out[-1][0] + word, out[-1][1])
        else:
            out.append((word, pos))
    return out


# ---- tones --------------------------------------------------------------------------------------------------------


def modify_tones(word: str, pos: str, syls: list[str]) -> list[str]:
    """Upstream's ``modified_tone``: 不, 一, neutral-tone and third-tone sandhi on one merged word.

    Parameters
    ----------
    word: the merged word (Chinese characters, maybe one trailing punctuation mark).
    pos: its jieba tag (of its first part, for merged words).
    syls: its TONE3 syllables, one per character.

    Returns
    -------
    The syllables with their tones changed (a new list).
    """
    syls = list(syls)
    _bu(word, syls)
    _yi(word, syls)
    _neutral(word, pos, syls)
    return _third(word, syls)


def _bu(word: str, syls: list[str]) -> None:
    """不: neutral in the middle of ``X不X``; 2nd before a 4th tone."""
    if len(word) == 3 and word[1] == "不":
        _retone(syls, 1, "5")
        return
    for i, char in enumerate(word[:-1]):
        if char == "不" and _tone(syls[i + 1]) == "4":
            _retone(syls, i, "2")


def _yi(word: str, syls: list[str]) -> None:
    """一: unchanged among numerals; neutral in ``V一V``; 1st in 第一; 2nd before a 4th tone, else 4th."""
    if "一" not in word or all(c.isnumeric() for c in word if c != "一"):
        return
    if len(word) == 3 and word[1] == "一" and word[0] == word[2]:
        _retone(syls, 1, "5")
    elif word.startswith("第一"):
        _retone(syls, 1, "1")
    else:
        for i, char in enumerate(word[:-1]):
            if char != "一":
                continue
            if syls[i + 1][-1:] == "4":
                _retone(syls, i, "2")
            elif word[i + 1] not in _YI_STOPS:
                _retone(syls, i, "4")


def _neutral(word: str, pos: str, syls: list[str]) -> None:
    """Neutral tones: reduplication, particles, suffixes and the conventional list (in place)."""
    n = len(word)
    for j in range(1, n):
        if word[j] == word[j - 1] and pos[:1] in ("n", "v", "a") and word not in _KEEP_TONE_WORDS:
            _retone(syls, j, "5")
    ge = word.find("个")
    last = n - 1
    if word[-1] in _PARTICLES or word[-1] in "的地得":
        _retone(syls, last, "5")
    elif n == 1 and word in "了着过" and pos in ("ul", "uz", "ug"):
        _retone(syls, last, "5")
    elif n > 1 and word[-1] in "们子" and pos in ("r", "n") and word not in _KEEP_TONE_WORDS:
        _retone(syls, last, "5")
    elif n > 1 and word[-1] in "上下里" and pos in ("s", "l", "f"):
        _retone(syls, last, "5")
    elif n > 1 and word[-1] in "来去" and word[-2] in "上下进出回过起开":
        _retone(syls, last, "5")
    elif (ge >= 1 and (word[ge - 1].isnumeric() or word[ge - 1] in "几有两半多各整每做是")) or word == "个":
        _retone(syls, ge, "5")
    elif word in _NEUTRAL_WORDS or word[-2:] in _NEUTRAL_WORDS:
        _retone(syls, last, "5")
    # and again per half, so a compound ending in a listed word (or starting with one) gets its neutral tone
    head, tail = _split_in_two(word)
    for part, end in ((head, len(head) - 1), (tail, n - 1)):
        if part and (part in _NEUTRAL_WORDS or part[-2:] in _NEUTRAL_WORDS):
            _retone(syls, end, "5")


def _third(word: str, syls: list[str]) -> list[str]:
    """Third-tone sandhi inside a word of 2-4 syllables, by sub-word."""
    n = len(word)
    if n == 2 and _all_third(syls):
        _retone(syls, 0, "2")
    elif n == 3:
        head, _ = _split_in_two(word)
        if _all_third(syls):
            if len(head) == 2:  # 蒙古/包: both syllables of the head change
                _retone(syls, 0, "2")
                _retone(syls, 1, "2")
            elif len(head) == 1:  # 纸/老虎
                _retone(syls, 1, "2")
        else:
            first, second = syls[: len(head)], syls[len(head) :]
            if _all_third(first) and len(first) == 2:  # 所有/人
                _retone(first, 0, "2")
            if _all_third(second) and len(second) == 2:
                _retone(second, 0, "2")
            elif second and not _all_third(second) and second[0][-1:] == "3" and first[-1][-1:] == "3":
                _retone(first, len(first) - 1, "2")  # 好/喜欢
            syls = first + second
    elif n == 4:  # idioms: two halves of two
        for start in (0, 2):
            if _all_third(syls[start : start + 2]):
                _retone(syls, start, "2")
    return syls


def erhua(word: str, pos: str, syls: list[str]) -> list[str]:
    """Upstream's ``_merge_erhua``: a word-final 儿 read er2/er5 takes the tone of the syllable before it.

    A final ``er1`` is first read ``er2``. Words where 儿 is its own syllable (女儿, 婴儿 ...) and adjectives,
    abbreviations and person names keep it, unless the word is a known erhua word (小院儿 ...).
    """
    syls = list(syls)
    if syls and word[-1:] == "儿" and len(syls) == len(word) and syls[-1] == "er1":
        syls[-1] = "er2"
    if word not in _MUST_ERHUA and (word in _NOT_ERHUA or pos in ("a", "j", "nr")):
        return syls
    if len(syls) != len(word) or len(word) < 2:
        return syls
    if word[-1] == "儿" and syls[-1] in ("er2", "er5") and word[-2:] not in _NOT_ERHUA:
        syls[-1] = "er" + syls[-2][-1]
    return syls
