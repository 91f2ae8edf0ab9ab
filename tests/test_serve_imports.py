"""python/fastloop/serve reads as a tree: no import cycle between its modules (imports inside
functions count: a lazy import is a dependency all the same), no file over 500 lines, and the
parts of InferenceService (service.py and its _*.py pieces) under 400 each."""

from __future__ import annotations

import ast
from pathlib import Path

SERVE = Path(__file__).resolve().parents[1] / "python" / "fastloop" / "serve"
MAX_LINES = 500
SERVICE_PARTS = ("service.py", "_admission.py", "_job_table.py", "_persistence.py", "_deadlines.py",
                 "_workers.py", "_results.py")
MAX_SERVICE_LINES = 400


def serve_imports(path: Path) -> set[str]:
    """The serve modules (file stems) that `path` imports, at module level or in a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:  # from .x import y / from . import x
                names = [node.module] if node.module else [alias.name for alias in node.names]
            elif node.level == 0 and (node.module or "").startswith("fastloop.serve"):
                rest = (node.module or "").split(".")[2:]
                names = rest[:1] if rest else [alias.name for alias in node.names]
            else:
                continue
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[2] for a in node.names
                     if a.name.startswith("fastloop.serve.") and len(a.name.split(".")) > 2]
        else:
            continue
        found |= {name.split(".")[0] for name in names if (SERVE / f"{name.split('.')[0]}.py").exists()}
    return found - {path.stem}


def import_graph() -> dict[str, set[str]]:
    return {path.stem: serve_imports(path) for path in sorted(SERVE.glob("*.py")) if path.stem != "__init__"}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (a depth-first search keeping the path)."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in graph:
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_reader_sees_lazy_imports_and_cycles():
    assert "checkpoint_model" in serve_imports(SERVE / "model_source.py")  # imported inside a function
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_serve():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle in fastloop.serve: " + " -> ".join(cycle or [])


def test_service_does_not_import_shared_nor_cli_model_source():
    graph = import_graph()
    assert "shared" not in graph["service"]
    assert "cli" not in graph["model_source"]


def test_no_serve_file_over_500_lines_and_service_parts_under_400():
    too_long = []
    for path in sorted(SERVE.glob("*.py")):
        lines = len(path.read_text().splitlines())
        limit = MAX_SERVICE_LINES if path.name in SERVICE_PARTS else MAX_LINES
        if lines > limit:
            too_long.append(f"{path.name}: {lines} lines (limit {limit})")
    assert not too_long, too_long
    assert all((SERVE / name).exists() for name in SERVICE_PARTS)
