"""The engines package's own structure: no import cycle between its modules (lazy imports inside functions
included), and only the loader (and the build command, for the TensorRT builder) imports a backend, so backends
never import each other; what they share lives in runtime.py, graph_engine.py and gpt_sovits/generate.py."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ROOT / "engines"
BACKENDS = {"engines.torch_engine", "engines.onnx_engine", "engines.tensorrt_engine"}
MAY_IMPORT_BACKENDS = {"engines.loader": BACKENDS, "engines.build": {"engines.tensorrt_engine"}}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Every engines module -> the engines modules it imports anywhere in its body."""
    modules = {_module(p): p for p in ENGINES.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    return graph


def test_no_import_cycle_in_engines() -> None:
    graph = _imports()
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = path[path.index(name):] + [name]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        for dep in sorted(graph[name] - {"engines"}):  # the package surface re-exports; its members never import it
            visit(dep, path + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_only_the_loader_imports_backends() -> None:
    for name, deps in _imports().items():
        allowed = MAY_IMPORT_BACKENDS.get(name, set())
        wrong = (deps & BACKENDS) - allowed - {name}
        assert not wrong, f"{name} imports the backend(s) {sorted(wrong)}; share code through a common module instead"
