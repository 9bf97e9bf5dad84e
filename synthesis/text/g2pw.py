"""G2PW polyphone prediction for Mandarin, used as upstream GPT-SoVITS uses it -- only where the model is installed.

Upstream's default Chinese front-end asks the G2PW ONNX model (a BERT polyphone classifier) for the reading of
every polyphonic character in a clause, takes the other characters from a monophone table or pypinyin, and then
overrides words listed in its ``polyphonic.rep`` tables (``correct_pronunciation``). This module does the same when
the ``G2PWModel`` folder (``g2pW.onnx``, ``config.py``, ``POLYPHONIC_CHARS.txt``, ``MONOPHONIC_CHARS.txt``,
``bopomofo_to_pinyin_wo_tune_dict.json``) is present, with the tokenizer of the Chinese BERT folder. The correction
tables are read from ``polyphonic.rep`` / ``polyphonic-fix.rep`` in the same folder when they are there (``models
download`` puts them there); without them, the model's readings are used as they are.

Nothing is downloaded here (``python -m bot models download`` fetches the folder and the correction tables into
the models folder): without the folder :func:`predict` returns None and the pypinyin path is used (the path
the v2 golden data was made with).

Where it is looked for: :func:`configure` (the bot passes ``models.dir``'s ``G2PWModel``), else
``$VOICEBOT_G2PW_DIR``; nowhere else (never the working directory, so a test run from a checkout does not pick up a
user's folder). The tokenizer: the one given to :func:`configure`, else ``$VOICEBOT_BERT_DIR``, else the
``chinese-roberta-wwm-ext-large`` folder beside the model's.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import numpy as np

log = logging.getLogger(__name__)

MODEL_DIR_ENV = "VOICEBOT_G2PW_DIR"
TOKENIZER_DIR_ENV = "VOICEBOT_BERT_DIR"
SIBLING_TOKENIZER = "chinese-roberta-wwm-ext-large"  # the Chinese BERT's folder, beside G2PWModel under models.dir
CONTEXT_CHARS = 16  # characters of context kept on each side of the polyphones (upstream's default)
MAX_SPAN_CHARS = 400  # polyphones further apart than this go to the model in separate windows (BERT takes 512)
# Characters the model lists as polyphonic that upstream reads with pypinyin anyway (sandhi handles 一 and 不).
_NOT_PREDICTED = frozenset("一不和咋嗲剖差攢倒難奔勁拗肖瘙誒泊听噢")
_NOT_MONOPHONIC = frozenset("似攢")  # listed as monophonic, but pypinyin knows better (upstream drops them)
_REP_LINE_RE = re.compile(r"^(.+?):\s*(\[.*\])\s*$")

_configured: tuple[Path | None, Path | None] | None = None


def configure(model_dir: str | os.PathLike[str] | None, tokenizer_dir: str | os.PathLike[str] | None = None) -> None:
    """Use the G2PW folder ``model_dir`` (None: never use G2PW) with the BERT tokenizer in ``tokenizer_dir``.

    Overrides the environment; takes effect on the next :func:`predict`.
    """
    global _configured
    _configured = (
        Path(model_dir) if model_dir is not None else None,
        Path(tokenizer_dir) if tokenizer_dir is not None else None,
    )
    _model.cache_clear()


def use_defaults() -> None:
    """Forget :func:`configure`: look in the environment again."""
    global _configured
    _configured = None
    _model.cache_clear()


def _locations() -> tuple[Path | None, Path | None]:
    """(model folder, tokenizer folder) from configure() or the environment; (None, None) where neither names one."""
    if _configured is not None:
        model_dir, tokenizer_dir = _configured
    else:
        env = os.environ.get(MODEL_DIR_ENV)
        model_dir = Path(env) if env else None
        tokenizer_dir = None
    if model_dir is None:
        return None, None
    if tokenizer_dir is None:
        env = os.environ.get(TOKENIZER_DIR_ENV)
        tokenizer_dir = Path(env) if env else model_dir.parent / SIBLING_TOKENIZER
    return model_dir, tokenizer_dir


def available() -> bool:
    """Whether the G2PW model is installed and loads."""
    return _model() is not None


def predict(clause: str) -> list[str] | None:
    """One TONE3 reading per character of ``clause`` (punctuation as itself), or None without the model.

    ``clause`` is normalised Chinese (CJK characters and ``! ? … , .``).
    """
    model = _model()
    return model.read(clause) if model is not None else None


def correct(word: str, syls: list[str]) -> list[str]:
    """Upstream's ``correct_pronunciation``: a listed word takes its table reading, else listed characters do."""
    model = _model()
    table = model.corrections if model is not None else {}
    if word in table and len(table[word]) == len(word):
        return list(table[word])
    return [table[c][0] if c in table and table[c] else s for c, s in zip(word, syls)]


@lru_cache(maxsize=1)
def _model() -> _G2PW | None:
    """The loaded model, or None when its folder is absent (or broken: logged once)."""
    model_dir, tokenizer_dir = _locations()
    if model_dir is None or tokenizer_dir is None or not model_dir.is_dir():
        return None
    onnx_path = next((p for p in (model_dir / "g2pW.onnx", model_dir / "g2pw.onnx") if p.is_file()), None)
    if onnx_path is None:
        return None
    try:
        return _G2PW.load(model_dir, onnx_path, tokenizer_dir)
    except Exception as e:  # a half-copied folder must not break Chinese: fall back to pypinyin
        log.warning("G2PW folder %s could not be loaded (%s); reading Chinese with pypinyin", model_dir, e)
        return None


def _read_config(path: Path) -> dict[str, Any]:
    """The literal assignments of the model's ``config.py`` (read, not executed)."""
    out: dict[str, Any] = {}
    if not path.is_file():
        return out
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return out


def _read_pairs(path: Path) -> list[tuple[str, str]]:
    """A two-column tab-separated file (character, bopomofo)."""
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").strip().split("\n")]
    return [(r[0], r[1]) for r in rows if len(r) >= 2]


def _read_corrections(model_dir: Path) -> dict[str, list[str]]:
    """``word: ['pin1', 'yin1']`` lines of polyphonic.rep then polyphonic-fix.rep (later lines win)."""
    table: dict[str, list[str]] = {}
    for name in ("polyphonic.rep", "polyphonic-fix.rep"):
        path = model_dir / name
        if not path.is_file():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            m = _REP_LINE_RE.match(line)
            if not m:
                continue
            value: object = ast.literal_eval(m.group(2))
            if isinstance(value, list):
                table[m.group(1).strip()] = [str(v) for v in cast(list[object], value)]
    return table


def _wordpieces(text: str) -> list[tuple[str, int, int]]:
    """Upstream's pre-tokenisation: runs of ASCII letters/digits are one word, spaces are dropped, else one char."""
    out: list[tuple[str, int, int]] = []
    for m in re.finditer(r"[a-zA-Z0-9]+|[^ ]", text):
        out.append((m.group(0), m.start(), m.end()))
    return out


@dataclass
class _G2PW:
    """The ONNX session and its tables."""

    session: Any
    tokenizer: Any
    labels: list[str]  # model output index -> bopomofo (or "char bopomofo")
    char_labels: dict[str, list[int]]  # polyphonic char -> its allowed label indices
    char_ids: dict[str, int]
    monophones: dict[str, str]  # char -> bopomofo
    bopomofo_pinyin: dict[str, str]  # toneless bopomofo -> toneless pinyin
    corrections: dict[str, list[str]]
    labels_have_chars: bool
    use_mask: bool

    @classmethod
    def load(cls, model_dir: Path, onnx_path: Path, tokenizer_dir: Path) -> _G2PW:
        """Read the folder and open the session (CPU; onnxruntime and transformers imported only here)."""
        import onnxruntime  # pyright: ignore[reportMissingTypeStubs]  # typed enough; used as Any
        from transformers import AutoTokenizer  # imported here: slow to import

        config = _read_config(model_dir / "config.py")
        use_char_phoneme = bool(config.get("use_char_phoneme", False))
        polyphones = _read_pairs(model_dir / "POLYPHONIC_CHARS.txt")
        if use_char_phoneme:
            labels = sorted({f"{c} {p}" for c, p in polyphones})
        else:
            labels = sorted({p for _, p in polyphones})
        index = {label: i for i, label in enumerate(labels)}
        char_labels: dict[str, list[int]] = {}
        for c, p in polyphones:
            char_labels.setdefault(c, []).append(index[f"{c} {p}" if use_char_phoneme else p])
        chars = sorted(char_labels)
        monophones = {c: p for c, p in _read_pairs(model_dir / "MONOPHONIC_CHARS.txt") if c not in _NOT_MONOPHONIC}
        bopomofo_pinyin = json.loads((model_dir / "bopomofo_to_pinyin_wo_tune_dict.json").read_text(encoding="utf-8"))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 2
        session = onnxruntime.InferenceSession(str(onnx_path), sess_options=options,
                                               providers=["CPUExecutionProvider"])
        tokenizer = cast(Any, AutoTokenizer.from_pretrained(  # pyright: ignore[reportUnknownMemberType]
            str(tokenizer_dir)))
        _to_taiwan("中")  # opencc-python-reimplemented must be there too: fail here, where pypinyin takes over
        corrections = _read_corrections(model_dir)
        if not corrections:
            log.info("G2PW: no polyphonic.rep in %s; model readings are used without upstream's corrections", model_dir)
        return cls(session, tokenizer, labels, char_labels, {c: i for i, c in enumerate(chars)}, monophones,
                   dict(bopomofo_pinyin), corrections, use_char_phoneme, bool(config.get("use_mask", True)))

    def _pinyin(self, bopomofo: str) -> str | None:
        """``ㄓㄤˇ``-style label with a tone digit -> TONE3 pinyin (None when the table lacks it)."""
        base = self.bopomofo_pinyin.get(bopomofo[:-1])
        return base + bopomofo[-1] if base and bopomofo[-1:] in "12345" else None

    def read(self, clause: str) -> list[str]:
        """TONE3 per character: the model for polyphones, the monophone table, else pypinyin."""
        from pypinyin import Style, pinyin

        from .zh_normalize import to_simplified

        traditional = _to_taiwan(clause)
        fallback = [p[0] for p in pinyin(to_simplified(traditional), style=Style.TONE3, neutral_tone_with_five=True)]
        if len(fallback) != len(clause):
            fallback = [(pinyin(c, style=Style.TONE3, neutral_tone_with_five=True) or [[c]])[0][0] for c in clause]
        out = list(fallback)
        queries: list[int] = []
        for i, char in enumerate(traditional):
            if char in self.char_ids and char not in _NOT_PREDICTED:
                queries.append(i)
            elif char in self.monophones:
                out[i] = self._pinyin(self.monophones[char]) or out[i]
        for group in _groups(queries):
            left = max(0, group[0] - CONTEXT_CHARS)
            window = traditional[left : group[-1] + CONTEXT_CHARS + 1]
            for i, label in zip(group, self._classify(window, [q - left for q in group])):
                bopomofo = label.split(" ")[1] if self.labels_have_chars else label
                out[i] = self._pinyin(bopomofo) or out[i]
        return out

    def _classify(self, text: str, queries: list[int]) -> list[str]:
        """The model's label for each query position of ``text``."""
        text = text.lower()
        tokens: list[str] = []
        char_token: list[int | None] = [None] * len(text)
        for word, start, end in _wordpieces(text):
            pieces: list[str] = list(self.tokenizer.tokenize(word))
            if not pieces or pieces == ["[UNK]"]:
                pieces = ["[UNK]"]
                spans = [(start, end)]
            else:
                spans: list[tuple[int, int]] = []
                pos = start
                for piece in pieces:
                    width = len(piece[2:] if piece.startswith("##") else piece)
                    spans.append((pos, pos + width))
                    pos += width
            for piece, (s, e) in zip(pieces, spans):
                for k in range(s, min(e, len(text))):
                    char_token[k] = len(tokens)
                tokens.append(piece)
        ids = [int(i) for i in self.tokenizer.convert_tokens_to_ids(["[CLS]", *tokens, "[SEP]"])]
        n = len(queries)
        n_labels = len(self.labels)
        masks = np.zeros((n, n_labels), np.float32)
        for row, q in enumerate(queries):
            if self.use_mask:
                masks[row, self.char_labels[text[q]]] = 1.0
            else:
                masks[row, :] = 1.0
        feeds = {
            "input_ids": np.tile(np.asarray(ids, np.int64), (n, 1)),
            "token_type_ids": np.zeros((n, len(ids)), np.int64),
            "attention_mask": np.ones((n, len(ids)), np.int64),
            "phoneme_mask": masks,
            "char_ids": np.asarray([self.char_ids[text[q]] for q in queries], np.int64),
            "position_ids": np.asarray([(char_token[q] or 0) + 1 for q in queries], np.int64),
        }
        probs = np.asarray(self.session.run(None, feeds)[0])  # [n, n_labels]
        return [self.labels[int(k)] for k in probs.argmax(axis=1)]


def _groups(queries: list[int]) -> list[list[int]]:
    """Query positions in runs short enough for one BERT window (upstream sends the whole clause; a clause is
    almost always far shorter than the window, and a longer one would be truncated there)."""
    groups: list[list[int]] = []
    for q in queries:
        if groups and q - groups[-1][0] < MAX_SPAN_CHARS:
            groups[-1].append(q)
        else:
            groups.append([q])
    return groups


def _to_taiwan(text: str) -> str:
    """Simplified -> Taiwan traditional characters (the model was trained on them), same length."""
    from opencc import OpenCC  # pyright: ignore[reportMissingTypeStubs]  # opencc-python-reimplemented, untyped

    converter: Any = _converter(OpenCC)
    out = str(converter.convert(text))
    if len(out) == len(text):
        return out
    return "".join(str(converter.convert(c))[:1] or c for c in text)


@lru_cache(maxsize=1)
def _converter(factory: Any) -> Any:
    """The s2tw converter, built once."""
    return factory("s2tw")
