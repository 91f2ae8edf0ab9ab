"""The package's layers, read from its imports: no module imports from a layer above its own,
and the parts of one layer do not import each other (docs/development.md, "The package's map").

Lazy imports inside functions count: they are dependencies all the same."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "fastloop"

# Bottom to top. A module belongs to the longest name listed here that it starts with.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("fastloop.errors", "fastloop._core", "fastloop._cuda", "fastloop._version", "fastloop._build_info",
              "fastloop._args", "fastloop._cache", "fastloop._cli", "fastloop._device", "fastloop._files",
              "fastloop._lifecycle")),
    ("cuda", ("fastloop.cuda",)),
    ("library", ("fastloop.data", "fastloop.nn", "fastloop.monitor", "fastloop.checkpoint")),
    ("serve", ("fastloop.serve",)),
    ("entry points", ("fastloop", "fastloop.__main__", "fastloop.bench", "fastloop.demo")),
]
GENERATED = ("fastloop._core", "fastloop._cuda", "fastloop._build_info")  # built by setup.py, not in the tree
# The module paths from before data/ existed, kept as aliases by fastloop/__init__.py.
ALIASES = {f"fastloop.{name}": f"fastloop.data.{name}" for name in ("loader", "images", "datasets", "ops")}


def module_name(path: Path) -> str:
    parts = ("fastloop",) + path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    relative = Path(*name.split(".")[1:])
    return name in GENERATED or (PACKAGE / relative).with_suffix(".py").exists() \
        or (PACKAGE / relative / "__init__.py").exists()


def imported_modules(path: Path) -> set[str]:
    """Every fastloop module `path` imports, resolved to the module the names come from."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "fastloop"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == "fastloop":
                source = node.module or ""
            else:
                continue
            submodules = {f"{source}.{alias.name}" for alias in node.names if is_module(f"{source}.{alias.name}")}
            found |= submodules or {source}
    return {ALIASES.get(module, module) for module in found}


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, the part of that layer) for a module."""
    best = max(((len(part), index, part) for index, (_, parts) in enumerate(LAYERS) for part in parts
                if module == part or module.startswith(part + ".")), default=None)
    assert best is not None, f"{module} belongs to no layer: add it to LAYERS and docs/development.md"
    return best[1], best[2]


def test_every_module_belongs_to_a_layer():
    for path in PACKAGE.rglob("*.py"):
        layer_of(module_name(path))


def test_no_module_imports_from_a_layer_above_or_a_sibling_part_of_its_own():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        own_layer, own_part = layer_of(name)
        for imported in sorted(imported_modules(path)):
            layer, part = layer_of(imported)
            if layer > own_layer:
                wrong.append(f"{name} ({LAYERS[own_layer][0]}) imports {imported} ({LAYERS[layer][0]}), a layer above")
            elif layer == own_layer and part != own_part and LAYERS[layer][0] != "entry points" \
                    and LAYERS[layer][0] != "base":
                wrong.append(f"{name} imports {imported}: two parts of the {LAYERS[layer][0]} layer")
    assert not wrong, "\n".join(wrong)


def test_the_layer_reader_sees_upward_imports():
    module = PACKAGE / "data" / "ops.py"
    assert "fastloop._core" in imported_modules(module)
    assert layer_of("fastloop.data._samples") == (2, "fastloop.data")
    assert layer_of("fastloop.serve.http") > layer_of("fastloop.nn")


def test_importing_fastloop_leaves_serve_bench_and_demo_unloaded():
    # The command line's parts load only when `python -m fastloop bench|demo|serve` asks for them.
    code = ("import sys, fastloop; print(sorted(m for m in sys.modules "
            "if m.split('.')[:2] in (['fastloop', 'bench'], ['fastloop', 'demo'], ['fastloop', 'serve'])))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_old_module_paths_are_the_moved_modules():
    import fastloop.data.images
    import fastloop.data.loader
    import fastloop.images
    import fastloop.loader
    from fastloop.ops import Normalize

    assert fastloop.images is fastloop.data.images and fastloop.loader is fastloop.data.loader
    assert Normalize is fastloop.data.ops.Normalize
    # type checkers do not follow sys.modules: a stub at each old path says what it holds
    for old, new in ALIASES.items():
        stub = PACKAGE / (old.split(".", 1)[1] + ".pyi")
        assert f"from .{new.split('.', 1)[1]} import *" in stub.read_text(), f"{stub.name} does not re-export {new}"
