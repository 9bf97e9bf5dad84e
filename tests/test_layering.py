"""The layering, read from the source: imports point cogs -> bot -> synthesis -> engines, through each package's
public surface, and discord / torch stay in their layers; the benchmarks sit beside the product and use it the same way.

Every module of the five packages is parsed (``ast``, nothing is imported), and every import statement counts:
top level, inside functions, under ``TYPE_CHECKING``. The rules:

- a layer imports itself and the layers below it, never one above (engines knows nothing of synthesis, bot, cogs);
- ``benchmarks`` is a tool beside the product: it may use bot, synthesis and engines (never cogs), and nothing
  imports it but the one entry in ``ENTRY`` (the bot's command line adds the bench commands);
- across layers only the package's own surface: its face (``import synthesis``, ``from synthesis import X`` with ``X``
  in ``synthesis.__all__``) or one of the modules in ``MODULES`` that own what the face leaves out (``from
  synthesis.voices import VoiceStore``, a name without a leading underscore); never another submodule
  (``synthesis.pipeline``, ``engines.loader``);
- ``cogs`` import only ``bot`` (its face carries what a command names from the layers below);
- ``discord`` only in bot/ and cogs/; ``torch``, ``onnxruntime`` and ``tensorrt`` only in engines/; ``ray`` only in
  the modules of the Ray Serve backend that need it (synthesis/cluster/: client, replica, storage);
- no import cycle among the project's modules: an import run at any time (top level or inside a function) is an
  edge; one under ``TYPE_CHECKING`` is not (that is how a module names a type of a module that imports it).

A failure lists every offending import as ``file:line``. The few imports that break a rule on purpose are in
``ALLOWED`` below, each with its reason; ``PENDING_SURFACE`` waives the public-surface rule in a folder being
reworked, for now.
"""

from __future__ import annotations

import ast
import dataclasses
import graphlib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("benchmarks", "cogs", "bot", "synthesis", "engines")  # top to bottom; benchmarks: a tool over the product
PRODUCT = LAYERS[1:]  # the product's own chain
NOT_FROM = {  # layers below that a layer still may not import, with the reason
    "benchmarks": {"cogs": "benchmarks/ uses the product below cogs/, not its commands"},
    "cogs": dict.fromkeys(("synthesis", "engines"), "cogs/ import only bot: its face has what a command names from below"),
}
RANK = {name: i for i, name in enumerate(LAYERS)}
ONLY_IN = {  # third-party packages and the layers (folders) or files that may import them
    "discord": {"bot", "cogs"},
    "torch": {"engines"},
    "onnxruntime": {"engines"},
    "tensorrt": {"engines"},
    # an optional extra (`.[cluster]`): a one-machine install has no ray, so nothing else may need it (the cluster's
    # options and stores neither: the config loads the options)
    "ray": {"synthesis/cluster/client.py", "synthesis/cluster/replica.py", "synthesis/cluster/storage.py"},
}

# The modules a layer above may import besides the package's face: each owns names the face leaves out (types,
# constants, the parts bot/services.py wires). Every other submodule is the package's own.
MODULES: dict[str, set[str]] = {
    "engines": {
        "engines.base",  # the types and constants that cross the Engine protocol
        "engines.instruments",  # what the benchmarks measure from the inside
        "engines.lazy",  # the packages' faces load their heavy names with it
    },
    "synthesis": {f"synthesis.{m}" for m in (
        "types", "backend", "voices", "text", "audio", "styles", "cache", "cache_lane", "scheduler",
        "cluster.client", "cluster.options")},
    "bot": {f"bot.{m}" for m in (
        "autoread", "chat", "config", "http", "pronunciations", "services", "speaker", "speech", "store")},
    "cogs": set(),
    "benchmarks": set(),
}

# Files that may reach into the layers below and import torch / onnxruntime, with the reason. Only the direction
# rule still holds for them (nothing here may import a layer above). Keep it short: each entry is a tool or a debt.
ALLOWED: dict[str, str] = {
    # Silero VAD's small ONNX model picks the speech in an upload (issue 16 item 8): upload preparation, not speech
    # synthesis, so it has no place behind the Engine protocol; one CPU session, created on first use.
    "synthesis/vad.py": "runs the voice-activity model for upload preparation",
    # Upstream's default Mandarin front-end asks the G2PW polyphone model (a small ONNX BERT classifier) for
    # readings: text processing, optional (only where the user installed it), one CPU session on first use.
    "synthesis/text/g2pw.py": "runs the optional G2PW polyphone model of the Mandarin front-end",
}

# Imports of a layer above that are the point of a file, with the reason (file, imported package).
ENTRY: dict[tuple[str, str], str] = {
    ("bot/__main__.py", "benchmarks"): "the command line adds the bench commands (one lazy import in _parser)",
}

# Folders where, for now, only the public-surface rule is waived (the direction and the discord/torch rules still
# hold): a folder being reworked while its imports still name submodules. None at present.
PENDING_SURFACE: dict[str, str] = {}


@dataclass(frozen=True)
class Import:
    """One imported module (``names``: what a ``from`` import takes from it, empty for ``import m``)."""

    file: str  # relative to the repository root, with forward slashes
    line: int
    module: str  # absolute dotted name
    names: tuple[str, ...]
    typing_only: bool = False  # under ``if TYPE_CHECKING:``: never run

    @property
    def layer(self) -> str:
        return self.file.split("/", 1)[0]

    def __str__(self) -> str:
        what = f"from {self.module} import {', '.join(self.names)}" if self.names else f"import {self.module}"
        return f"{self.file}:{self.line}: {what}"


def _package_of(rel: Path) -> list[str]:
    """The package a module lives in: ``synthesis/text/split.py`` and ``synthesis/text/__init__.py`` are both in
    ``['synthesis', 'text']``."""
    return list(rel.with_suffix("").parts[:-1])


def imports_of(path: Path, root: Path = ROOT) -> list[Import]:
    """Every import statement in one source file, relative ones made absolute."""
    rel = path.relative_to(root)
    found: list[Import] = []
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(rel))
    typing_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node.test)
                   for stmt in node.body for inner in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only and isinstance(node, (ast.Import, ast.ImportFrom)):
            found += [dataclasses.replace(imp, typing_only=True) for imp in _imports_in(node, rel)]
        else:
            found += _imports_in(node, rel)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports_in(node: ast.AST, rel: Path) -> list[Import]:
    """The imports of one statement (none unless it is an import), relative ones made absolute."""
    if isinstance(node, ast.Import):
        return [Import(rel.as_posix(), node.lineno, a.name, ()) for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    names = tuple(a.name for a in node.names)
    if not node.level:
        return [Import(rel.as_posix(), node.lineno, node.module or "", names)]
    package = _package_of(rel)
    base = package[: len(package) - (node.level - 1)]
    module = ".".join(base + ([node.module] if node.module else []))
    if not node.module:  # `from . import a, b`: each name is a submodule of the package (or a name in it)
        return [Import(rel.as_posix(), node.lineno, f"{module}.{n}", ()) for n in names]
    return [Import(rel.as_posix(), node.lineno, module, names)]


def public_names(package: str) -> set[str]:
    """The names in a package's ``__all__``, read from its ``__init__.py`` (a literal list or tuple)."""
    tree = ast.parse((ROOT / package / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
            return set(ast.literal_eval(node.value))
    return set()


@dataclass(frozen=True)
class Violation:
    imp: Import
    rule: str  # DIRECTION, SURFACE or THIRD_PARTY
    why: str

    def __str__(self) -> str:
        return f"  {self.imp}  ({self.why})"


DIRECTION, SURFACE, THIRD_PARTY = "direction", "surface", "third-party"


def violations(imports: list[Import], surfaces: dict[str, set[str]]) -> list[Violation]:
    """Each import that breaks a rule, with the rule it breaks."""
    bad: list[Violation] = []
    for imp in imports:
        top = imp.module.split(".")[0]
        if top in ONLY_IN and not any(imp.file == p or imp.file.startswith(p + "/") for p in ONLY_IN[top]):
            where = " and ".join(p if p.endswith(".py") else f"{p}/" for p in sorted(ONLY_IN[top]))
            bad.append(Violation(imp, THIRD_PARTY, f"{top} belongs in {where} only"))
        if top not in RANK or top == imp.layer:
            continue
        if RANK[top] < RANK[imp.layer]:
            if (imp.file, top) in ENTRY:
                continue
            why = (f"nothing imports {top}/ but the entries in ENTRY" if top not in PRODUCT
                   else f"{imp.layer}/ is below {top}/: imports point {' -> '.join(PRODUCT)}")
            bad.append(Violation(imp, DIRECTION, why))
        elif top in NOT_FROM.get(imp.layer, {}):
            bad.append(Violation(imp, DIRECTION, NOT_FROM[imp.layer][top]))
        elif imp.module != top and imp.module not in MODULES[top]:
            bad.append(Violation(imp, SURFACE, f"reaches into {imp.module}: import it from the package ({top}) or "
                                               f"a module in MODULES"))
        elif imp.module != top and (private := [n for n in imp.names if n.startswith("_")]):
            bad.append(Violation(imp, SURFACE, f"{', '.join(private)} private to {imp.module}"))
        elif imp.module == top and (private := [n for n in imp.names if n not in surfaces[top]
                                                 and f"{top}.{n}" not in MODULES[top]]):
            bad.append(Violation(imp, SURFACE, f"{', '.join(private)} not in {top}.__all__"))
    return bad


def all_imports() -> list[Import]:
    return [imp for layer in LAYERS for path in sorted((ROOT / layer).rglob("*.py")) for imp in imports_of(path)]


def _allowed(v: Violation) -> bool:
    return v.imp.file in ALLOWED and v.rule in (SURFACE, THIRD_PARTY)


def _pending(v: Violation) -> bool:
    return v.rule == SURFACE and any(v.imp.file.startswith(folder) for folder in PENDING_SURFACE)


def test_imports_follow_the_layers() -> None:
    surfaces = {layer: public_names(layer) for layer in LAYERS}
    bad = [v for v in violations(all_imports(), surfaces) if not _allowed(v) and not _pending(v)]
    if bad:
        pytest.fail("imports against the layering:\n" + "\n".join(map(str, bad)), pytrace=False)


def test_every_exemption_is_still_needed() -> None:
    found = violations(all_imports(), {layer: public_names(layer) for layer in LAYERS})
    stale = [f for f in sorted(ALLOWED) if not any(_allowed(v) for v in found if v.imp.file == f)]
    stale += [f for f in sorted(PENDING_SURFACE) if not any(_pending(v) for v in found if v.imp.file.startswith(f))]
    imported = {(imp.file, imp.module.split(".")[0]) for imp in all_imports()}
    stale += [f"{file} -> {top}" for file, top in sorted(ENTRY) if (file, top) not in imported]
    if stale:
        pytest.fail("exemptions no import needs any more (remove them from tests/test_layering.py): "
                    + ", ".join(stale), pytrace=False)


def module_of(file: str) -> str:
    """``synthesis/cluster/client.py`` -> ``synthesis.cluster.client``; a package's ``__init__.py`` is the package."""
    parts = file.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(imports: list[Import]) -> dict[str, set[str]]:
    """Each module of the project -> the project's modules it imports when it runs (``TYPE_CHECKING`` imports left
    out). ``from p import n`` is an edge to the module ``p.n`` when there is one, else to ``p``."""
    graph: dict[str, set[str]] = {module_of(imp.file): set() for imp in imports}
    modules = set(graph)
    for imp in imports:
        if imp.typing_only:
            continue
        targets = {f"{imp.module}.{n}" if f"{imp.module}.{n}" in modules else imp.module for n in imp.names or ("",)}
        graph[module_of(imp.file)] |= (targets & modules) - {module_of(imp.file)}
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph (its modules, the first repeated at the end), or [] when there is none."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        return list(e.args[1])
    return []


def test_no_import_cycle() -> None:
    cycle = import_cycle(import_graph(all_imports()))
    if cycle:
        pytest.fail("an import cycle: " + " -> ".join(cycle) + " (move what both need into a module of its own; "
                    "a type alone may be imported under TYPE_CHECKING)", pytrace=False)


@pytest.mark.parametrize("layer", LAYERS)
def test_the_public_surface_exists(layer: str) -> None:
    """Every name in ``__all__`` resolves (lazily exported ones included) and importing the package stays light."""
    import importlib
    import subprocess
    import sys

    module = importlib.import_module(layer)
    missing = [n for n in sorted(public_names(layer)) if not hasattr(module, n)]
    assert not missing, f"{layer}.__all__ names what {layer}/__init__.py does not provide: {missing}"
    # a bare `import <layer>` loads neither torch nor discord: what a layer pulls in is what it uses, not its surface
    code = f"import sys, {layer}; print(sorted(m for m in ('torch', 'discord') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", (layer, out.stdout, out.stderr)


# ---- the checker itself, on small made-up sources ------------------------------------------------------------------

def _check(tmp_path: Path, files: dict[str, str]) -> list[str]:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    imports = [imp for name in files for imp in imports_of(tmp_path / name, tmp_path)]
    surfaces = {"synthesis": {"Synthesizer"}, "engines": {"SpeechError"}, "bot": set(), "cogs": set(),
                "benchmarks": set()}
    return [f"{v.imp.file}:{v.imp.line} {v.why}" for v in violations(imports, surfaces)]


def test_the_checker_finds_each_kind_of_offence(tmp_path: Path) -> None:
    found = _check(tmp_path, {
        "engines/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from synthesis import Synthesizer\n",
        "synthesis/b.py": "def f():\n    import discord\n    from engines.loader import load_engine\n",
        "synthesis/c/d.py": "from ..e import x\nfrom . import g\nfrom engines import SpeechError, Secret\n"
                            "from engines.base import _private, VoicePrompt\nfrom engines import base, instruments\n",
        "bot/f.py": "import torch.nn as nn\nimport synthesis\nfrom synthesis import Synthesizer\nfrom bot.x import y\n",
        "synthesis/cluster/client.py": "from ray import serve\n",
        "synthesis/pipeline.py": "import ray\n",
    })
    assert found == [
        "engines/a.py:3 engines/ is below synthesis/: imports point cogs -> bot -> synthesis -> engines",
        "synthesis/b.py:2 discord belongs in bot/ and cogs/ only",
        "synthesis/b.py:3 reaches into engines.loader: import it from the package (engines) or a module in MODULES",
        "synthesis/c/d.py:3 Secret not in engines.__all__",
        "synthesis/c/d.py:4 _private private to engines.base",
        "bot/f.py:1 torch belongs in engines/ only",
        "synthesis/pipeline.py:1 ray belongs in synthesis/cluster/client.py and synthesis/cluster/replica.py and "
        "synthesis/cluster/storage.py only",
    ]
    assert [imp.module for imp in imports_of(tmp_path / "synthesis/c/d.py", tmp_path)] == [
        "synthesis.e", "synthesis.c.g", "engines", "engines.base", "engines"]


def test_the_benchmarks_sit_beside_the_product(tmp_path: Path) -> None:
    found = _check(tmp_path, {
        "benchmarks/a.py": "from bot import Services\nfrom cogs import x\nimport engines.loader\n",
        "bot/__main__.py": "import benchmarks\n",
        "bot/other.py": "import benchmarks\n",
        "cogs/c.py": "from benchmarks import gpt\n",
    })
    assert found == [
        "benchmarks/a.py:1 Services not in bot.__all__",
        "benchmarks/a.py:2 benchmarks/ uses the product below cogs/, not its commands",
        "benchmarks/a.py:3 reaches into engines.loader: import it from the package (engines) or a module in MODULES",
        "bot/other.py:1 nothing imports benchmarks/ but the entries in ENTRY",
        "cogs/c.py:1 nothing imports benchmarks/ but the entries in ENTRY",
    ]


def test_the_cogs_import_only_bot(tmp_path: Path) -> None:
    found = _check(tmp_path, {
        "cogs/a.py": "import bot\nfrom bot.speech import NoVoice\nfrom synthesis import Synthesizer\nimport engines\n"
                     "from bot.client import VoiceBot\nfrom cogs.base import ReplyingCog\n",
    })
    only_bot = "cogs/ import only bot: its face has what a command names from below"
    assert found == [f"cogs/a.py:3 {only_bot}", f"cogs/a.py:4 {only_bot}",
                     "cogs/a.py:5 reaches into bot.client: import it from the package (bot) or a module in MODULES"]
    # and in the tree: every project import of a cog is of cogs/ or bot/
    below = [str(imp) for imp in all_imports() if imp.layer == "cogs" and imp.module.split(".")[0] in LAYERS
             and imp.module.split(".")[0] not in ("cogs", "bot")]
    assert below == []


def test_the_cycle_finder_counts_lazy_imports_and_not_type_checking_ones(tmp_path: Path) -> None:
    def cycle(files: dict[str, str]) -> list[str]:
        for name, text in files.items():
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(text)
        return import_cycle(import_graph([imp for n in files for imp in imports_of(tmp_path / n, tmp_path)]))

    # a top-level import one way, a lazy one back (as the Ray client and its storage actor once were)
    found = cycle({"synthesis/remote.py": "def f():\n    from synthesis import served\n",
                   "synthesis/served.py": "from synthesis.remote import Stores\n"})
    assert sorted(set(found)) == ["synthesis.remote", "synthesis.served"] and found[0] == found[-1]
    # through a package's face and a relative import: a -> synthesis (its __init__) -> b -> a
    assert len(cycle({"synthesis/__init__.py": "from synthesis.b import x\n",
                      "synthesis/a.py": "from synthesis import Thing\n",
                      "synthesis/b.py": "from .a import y\n"})) == 4
    # the same pair with the way back under TYPE_CHECKING, and a package's own submodules: no cycle
    assert cycle({"synthesis/served.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                         "    from synthesis.remote import Stores\n",
                  "synthesis/c/__init__.py": "from synthesis.c import d\n", "synthesis/c/d.py": "X = 1\n"}) == []
