"""Product comments say why in a line; the lab notebook (which CPU, which issue) lives in benchmarks/FINDINGS.md.

Scans the comments and docstrings of bot/, cogs/, synthesis/ and engines/ (``.py`` and ``.c``) for CPU and GPU
model names and issue numbers. A hit is a figure whose place is FINDINGS: keep the why and its deciding bound in the
comment, move the measurement under an anchor there, and name it (``see FINDINGS.md#anchor``).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("bot", "cogs", "synthesis", "engines")

# Processor and accelerator model names, as a measurement quotes them. Case-sensitive and whole-word, so that words
# such as "citizen" or "frozen" never match; compiler flags (``-march=znver3``) and GPU architectures named for a
# behaviour ("cuDNN's kernels on Hopper") are not figures and are left alone.
_MODELS = re.compile(
    r"\b(?:Zen ?[1-6]\b|EPYC|Xeon|Ryzen|Threadripper|Opteron|Core i[3579]\b|Graviton|"
    r"(?:Sapphire|Granite|Emerald) Rapids|(?:Ice|Cascade|Cooper|Alder|Raptor) Lake|Skylake|"
    r"[AHV]100\b|H200\b|GH200\b|B200\b|RTX ?\d{4}\b)"
)
# Issue references: "issue 13", "issues 13 and 14", "issue #13", "#35" (not "#define", "#if" or a hex colour).
_ISSUES = re.compile(r"\b[Ii]ssues? ?#?\d+|(?<![\w&#])#\d{1,4}\b")
PATTERNS = (("a CPU/GPU model name", _MODELS), ("an issue number", _ISSUES))

_C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_ANCHOR_REF = re.compile(r"FINDINGS\.md#([\w-]+)")


def python_notes(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every comment and docstring line of a Python source."""
    notes: list[tuple[int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            notes.append((tok.start[0], tok.string.lstrip("#")))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                notes.extend((first.lineno + i, line) for i, line in enumerate(first.value.value.split("\n")))
    return notes


def c_notes(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every comment line of a C source."""
    notes: list[tuple[int, str]] = []
    for m in _C_COMMENT.finditer(source):
        first = source.count("\n", 0, m.start()) + 1
        notes.extend((first + i, line) for i, line in enumerate(m.group().split("\n")))
    return notes


def hits(source: str, suffix: str) -> list[tuple[int, str, str]]:
    """``(line, what, matched text)`` for each lab-notebook mark in the comments of ``source``."""
    notes = c_notes(source) if suffix == ".c" else python_notes(source)
    found = [(line, what, m.group()) for line, text in notes for what, rx in PATTERNS for m in rx.finditer(text)]
    return sorted(set(found))


def product_hits() -> list[str]:
    """``file:line: ...`` for every hit in the product packages."""
    out: list[str] = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*")):
            if path.suffix not in (".py", ".c") or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(ROOT)
            for line, what, text in hits(path.read_text(encoding="utf-8"), path.suffix):
                out.append(f"{rel}:{line}: {what} ({text!r})")
    return out


def test_the_scanner_finds_marks_in_comments_and_docstrings_only() -> None:
    sample = '''"""A module. Measured on a 2-core AMD EPYC Zen 4."""
import re  # see issue 13 and #35
PATTERN = "#35 in a string is not a comment; nor is EPYC here"


def f() -> None:
    """The why, in a line (see FINDINGS.md#playback-guard)."""
    # a citizen 4 times frozen; -march=znver3; cuDNN on Hopper; a colour #fff; Zen and the art
    return None


class C:
    """Two lines.

    Fast on an H200 and a Xeon; issues 14."""
'''
    assert hits(sample, ".py") == [
        (1, "a CPU/GPU model name", "EPYC"),
        (1, "a CPU/GPU model name", "Zen 4"),
        (2, "an issue number", "#35"),
        (2, "an issue number", "issue 13"),
        (15, "a CPU/GPU model name", "H200"),
        (15, "a CPU/GPU model name", "Xeon"),
        (15, "an issue number", "issues 14"),
    ]


def test_the_scanner_reads_c_comments() -> None:
    sample = """#include <stdio.h>
#define N 4  /* rows: a Zen3 measured it */
static int x; // issue #7
/* two
 * lines, nothing here: #if and #define are not issues */
const char *s = "EPYC";
"""
    assert hits(sample, ".c") == [(2, "a CPU/GPU model name", "Zen3"), (3, "an issue number", "issue #7")]


def findings_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown text (lower case, punctuation dropped, spaces to -)."""
    heads = re.findall(r"^#+ (.*)$", markdown, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_findings_anchors_follow_github() -> None:
    text = "# Findings\n\n## Prefill (int8 GEMM, MKL_CBWR)\n\n### Vocoder: why int8\n\n### fp32 on CUDA\n"
    assert findings_anchors(text) == {"findings", "prefill-int8-gemm-mkl_cbwr", "vocoder-why-int8", "fp32-on-cuda"}


def test_every_findings_anchor_a_comment_names_exists() -> None:
    anchors = findings_anchors((ROOT / "benchmarks" / "FINDINGS.md").read_text(encoding="utf-8"))
    missing: list[str] = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*")):
            if path.suffix not in (".py", ".c") or "__pycache__" in path.parts:
                continue
            source = path.read_text(encoding="utf-8")
            notes = c_notes(source) if path.suffix == ".c" else python_notes(source)
            missing += [f"{path.relative_to(ROOT)}:{line}: FINDINGS.md#{m.group(1)}"
                        for line, text in notes for m in _ANCHOR_REF.finditer(text) if m.group(1) not in anchors]
    assert not missing, "comments name FINDINGS sections that do not exist:\n" + "\n".join(missing)


def test_product_comments_name_no_cpu_model_and_no_issue() -> None:
    found = product_hits()
    assert not found, (
        "product comments record lab notes; say why in a line with its deciding bound and move the figure to "
        "benchmarks/FINDINGS.md under an anchor the comment names (see FINDINGS.md#anchor):\n" + "\n".join(found))
