#!/usr/bin/env python3
"""Write docs/api.md, the API reference, from what griffe reads of fastloop's public API.

    python tools/api_docs.py            # writes docs/api.md (make docs)
    python tools/api_docs.py --check    # exit 1 if docs/api.md is not what it would write

griffe (the loader mkdocstrings uses; the `docs` extra) reads the Python sources and the
`.pyi` stubs of the C extensions statically; this script only renders its object tree as
one Markdown page: every name in ``fastloop.__all__`` and in the ``__all__`` of
fastloop.ops, fastloop.nn, fastloop.cuda and fastloop.images, in that order.

The page must read the same on every machine, so the CUDA extension is never imported: its
stub, ``_cuda.pyi``, carries the binding's docstrings (tests/test_docs.py checks them against
the extension where it is built). ``fastloop._core`` is always built: its docstrings are
read from it, its signatures from ``_core.pyi``.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import re
import sys
from pathlib import Path

import griffe

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "api.md"
SUBMODULES = ("ops", "nn", "cuda", "images")
# Public paths whose module lives elsewhere (its .pyi at the public path is for type checkers).
MOVED = {"ops": "data.ops", "images": "data.images"}
RUNTIME_DOCS = "fastloop._core"  # a compiled module documented from its stub plus its own docstrings

# Special methods listed as members; the others show in the "Supports" line.
LISTED_SPECIALS = {"__call__", "__dlpack__", "__dlpack_device__", "__cuda_array_interface__"}
PROTOCOLS = {"__enter__": "`with` (a context manager)", "__iter__": "iteration", "__len__": "`len()`",
             "__getitem__": "indexing (`obj[key]`)", "__contains__": "`in`"}


def load() -> griffe.Module:
    # allow_inspection=False: griffe reads the stubs, never imports a compiled module (_cuda)
    package = griffe.load("fastloop", search_paths=[ROOT / "python"], resolve_aliases=True, allow_inspection=False,
                          resolve_external=False)
    sys.path.insert(0, str(ROOT / "python"))  # an in-place build works without an install
    add_runtime_docstrings(package[RUNTIME_DOCS.split(".", 1)[1]], importlib.import_module(RUNTIME_DOCS))
    return package


def add_runtime_docstrings(stub: griffe.Object, runtime: object) -> None:
    """Gives the stub's classes, functions and attributes the docstrings the C extension has
    for them (a class's members too)."""
    for name, member in stub.members.items():
        if member.is_alias or (name.startswith("__") and name not in LISTED_SPECIALS):
            continue
        obj = inspect.getattr_static(runtime, name, None)  # a getset descriptor, not the value it gives
        doc = getattr(obj, "__doc__", None)
        if doc and doc != type(obj).__doc__:  # a constant's is its type's (int's): none of its own
            if member.is_class:  # a named tuple type's opens with "Name(fields)"
                doc = re.sub(rf"^{name}\(.*\)\n\n", "", doc)
            member.docstring = griffe.Docstring(inspect.cleandoc(doc), parent=member)
        if member.is_class and obj is not None:
            add_runtime_docstrings(member, obj)


# ---------------------------------------------------------------- what each entry shows


def target(obj: griffe.Object | griffe.Alias) -> griffe.Object:
    return obj.final_target if obj.is_alias else obj


def doc_of(obj: griffe.Object) -> str:
    return obj.docstring.value if obj.docstring else ""


def documented(obj: griffe.Object, package: griffe.Module) -> griffe.Object:
    """What an exported name shows: itself, or for `name = wrapper(some.function)` the function."""
    if obj.is_attribute and isinstance(obj.value, griffe.ExprCall) and len(obj.value.arguments) == 1:
        path = getattr(obj.value.arguments[0], "canonical_path", "")
        if path.startswith("fastloop.") and target(package[path.split(".", 1)[1]]).is_function:
            return target(package[path.split(".", 1)[1]])
    return obj


def type_text(annotation: object, where: griffe.Object) -> str:
    """An annotation as written, forward references unquoted and the module's private type
    aliases (`_StreamArg = Stream | int | None`) spelled out; TypeVars stay."""
    text = str(annotation)
    if "Literal[" not in text:
        text = re.sub(r"(['\"])([A-Za-z_][\w.\[\], |]*)\1", r"\2", text)
    aliases = where.module.members
    return re.sub(r"\b_\w+\b", lambda m: str(aliases[m.group(0)].value) if m.group(0) in aliases
                  and aliases[m.group(0)].is_attribute and not str(aliases[m.group(0)].value).startswith("TypeVar")
                  else m.group(0), text)


def value_text(qualname: str) -> str:
    """A module constant's value, as the running module has it (`MAX_PIXELS = _core.f()`)."""
    module, name = qualname.rsplit(".", 1)
    return repr(getattr(importlib.import_module(module), name))


def signature(func: griffe.Function, drop_self: bool = False) -> str:
    """`(a, b: int = 1, *, c=2) -> str`, as inspect prints one, without private parameters."""
    out, star_done, slash_due = [], False, False
    for i, p in enumerate(func.parameters):
        if (drop_self and i == 0) or p.name.startswith("_"):
            continue
        kind = p.kind.value
        if slash_due and kind != "positional-only":
            out.append("/")
            slash_due = False
        if kind == "keyword-only" and not star_done:
            out.append("*")
        star_done = star_done or kind in ("keyword-only", "variadic positional")
        slash_due = kind == "positional-only"
        text = {"variadic positional": "*", "variadic keyword": "**"}.get(kind, "") + p.name
        if p.annotation is not None:
            text += f": {type_text(p.annotation, func)}"
        if p.default is not None and kind not in ("variadic positional", "variadic keyword"):
            text += f" = {p.default}" if p.annotation is not None else f"={p.default}"
        out.append(text)
    if slash_due:
        out.append("/")
    text = f"({', '.join(out)})"
    return text if func.returns in (None, "None") else f"{text} -> {type_text(func.returns, func)}"


def fields(cls: griffe.Class) -> list[griffe.Attribute]:
    """Declared attributes: properties, annotated fields (dataclass, named tuple, stub) and
    documented ones; not what a method merely assigns to self."""
    out = []
    for name, member in cls.all_members.items():
        member = target(member)
        if not member.is_attribute or (name.startswith("_") and name not in LISTED_SPECIALS):
            continue
        in_method = any(m.is_function and m.lineno <= member.lineno <= m.endlineno
                        for m in member.parent.members.values() if not m.is_alias)
        if "property" in member.labels or member.docstring or (member.annotation is not None and not in_method):
            out.append(member)
    return out


def methods(cls: griffe.Class) -> list[griffe.Function]:
    return [target(m) for name, m in cls.all_members.items()
            if target(m).is_function and "property" not in target(m).labels
            and (not name.startswith("_") or name in LISTED_SPECIALS)]


def is_stub(obj: griffe.Object) -> bool:
    return obj.module.filepath.suffix == ".pyi"


def class_signature(cls: griffe.Class) -> str:
    if "__init__" in cls.all_members:
        return signature(target(cls.all_members["__init__"]), drop_self=True)
    if any(str(b).startswith(("NamedTuple", "tuple")) for b in cls.bases):  # a named tuple
        return "(" + ", ".join(f"{f.name}: {type_text(f.annotation, f)}" if f.annotation else f.name
                               for f in fields(cls)) + ")"
    # a C type without __init__ is not made from Python; an exception takes any arguments
    return "" if is_stub(cls) or is_exception(cls) else "()"


def base_paths(cls: griffe.Class) -> list[str]:
    return [getattr(b, "canonical_path", str(b)) for b in cls.bases]


def is_exception(cls: griffe.Class) -> bool:
    return any(p.endswith(("Error", "Exception")) for p in base_paths(cls))


def own_bases(cls: griffe.Class) -> list[str]:
    """Exceptions show every base; other classes fastloop's own public ones."""
    shown = [p.rsplit(".", 1)[1] if p.startswith("fastloop.") else p for p in base_paths(cls)]
    if is_exception(cls):
        return shown
    return [s for s, p in zip(shown, base_paths(cls)) if p.startswith("fastloop.") and not s.startswith("_")]


# ---------------------------------------------------------------- Markdown

_CODE_SPAN = re.compile(r"(``.+?``|`[^`]+`)")


def escape(text: str) -> str:
    """Escapes what Markdown would eat in prose (emphasis, <tags>, __dunders__), not in code."""
    out = []
    for i, part in enumerate(_CODE_SPAN.split(text)):
        if not i % 2:
            part = part.replace("\\", "\\\\").replace("*", "\\*")
            part = re.sub(r"<(?=[A-Za-z/!?])", r"\\<", part)
            part = re.sub(r"(?<![\w\\])(_+)(?=\w)|(?<=\w)(_+)(?!\w)", lambda m: "\\_" * len(m.group(0)), part)
        out.append(part)
    return "".join(out)


def doc_markdown(doc: str) -> list[str]:
    """Prose paragraphs escaped; doctest lines and indented blocks as Python code fences."""
    lines, out, i = doc.splitlines(), [], 0
    while i < len(lines):
        line, stripped = lines[i], lines[i].strip()
        if stripped.startswith(">>>") or (line.startswith("    ") and stripped):
            indent, block = len(line) - len(line.lstrip()), []
            while i < len(lines) and lines[i].strip() and (
                    len(lines[i]) - len(lines[i].lstrip()) >= indent or not block):
                block.append(lines[i][indent:].rstrip())
                i += 1
            out += ([""] if out and out[-1] else []) + ["```python", *block, "```", ""]
            continue
        if stripped:
            text = escape(stripped)
            out.append("\\" + text if re.match(r"^(>|[-=]+$|#|\d+\. )", text) else text)
        elif out and out[-1]:
            out.append("")
        i += 1
    while out and not out[-1]:
        out.pop()
    return out


def one_line(doc: str) -> str:
    """A docstring's first paragraph on one line, for a table cell."""
    return escape(" ".join(doc.split("\n\n")[0].split())).replace("|", "\\|")


class Anchors:
    """GitHub's heading anchors: lowercased, punctuation dropped, repeats numbered -1, -2."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.by_key: dict[str, str] = {}

    def heading(self, level: int, text: str, key: str | None = None) -> str:
        base = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = self.counts.get(base, 0)
        self.counts[base] = n + 1
        self.by_key[key or text] = base if n == 0 else f"{base}-{n}"
        return f"{'#' * level} {escape(text)}"


def render_entry(qualname: str, obj: griffe.Object, anchors: Anchors) -> list[str]:
    out = [anchors.heading(3, qualname), ""]
    if obj.is_attribute:
        return out + ["```python", f"{qualname} = {value_text(qualname)}", "```", ""]
    if obj.is_function:
        out += ["```python", f"{qualname}{signature(obj)}", "```", ""]
        return out + (doc_markdown(doc_of(obj)) + [""] if obj.docstring else [])
    out += ["```python", f"class {qualname}{class_signature(obj)}", "```", ""]
    if own_bases(obj):
        out += [f"Bases: {', '.join(f'`{b}`' for b in own_bases(obj))}", ""]
    if obj.module.path == "fastloop._cuda":
        out += [f"A type of the CUDA extension `fastloop._cuda`, available when fastloop was built with "
                f"CUDA (see [cuda.md](cuda.md)); elsewhere `{qualname}` raises `AttributeError` saying why.", ""]
    if obj.docstring:
        out += doc_markdown(doc_of(obj)) + [""]
    supports = [text for special, text in PROTOCOLS.items() if special in obj.all_members]
    supports += ["subscripting in type hints"] if any(str(b).startswith("Generic") for b in obj.bases) else []
    if supports:
        out += ["Supports " + ", ".join(supports) + ".", ""]
    if fields(obj):
        out += ["| attribute | type | |", "|---|---|---|"]
        for attr in fields(obj):
            kind = f"`{type_text(attr.annotation, attr)}`".replace("|", "\\|") if attr.annotation else ""
            settable = " Settable." if "writable" in attr.labels else ""
            out.append(f"| `{attr.name}` | {kind} | {(one_line(doc_of(attr)) + settable).strip()} |")
        out.append("")
    short = qualname.rsplit(".", 1)[1]
    for method in methods(obj):
        static = "staticmethod" in method.labels or "classmethod" in method.labels
        out += [anchors.heading(4, f"{short}.{method.name}", f"{qualname}.{method.name}"), "",
                "```python", f"{method.name}{signature(method, drop_self=not static)}", "```", ""]
        out += doc_markdown(doc_of(method)) + [""] if method.docstring else []
    return out


def public_module(package: griffe.Module, name: str) -> griffe.Object:
    """fastloop.<name> as documented: the module itself, wherever it lives."""
    return target(package[MOVED.get(name, name)])


def render(package: griffe.Module) -> str:
    anchors, body, index = Anchors(), [], []
    modules = [("fastloop", package)] + [(f"fastloop.{name}", public_module(package, name)) for name in SUBMODULES]
    for path, module in modules:  # by the public path (fastloop.ops), not where it lives (fastloop.data.ops)
        entries = [(f"{path}.{name}", module[name]) for name in module.exports]
        body += [anchors.heading(2, path), ""]
        body += doc_markdown(doc_of(module)) + [""] if module.docstring else []
        submodules = [(q, public_module(package, q.split(".", 1)[1]) if module is package else target(m))
                      for q, m in entries if target(m).is_module]
        if submodules:
            body += ["Submodules:", ""]
            body += [f"* [`{q}`](#{{anchor:{q}}}): {one_line(doc_of(m))}" for q, m in submodules] + [""]
        for qualname, member in entries:
            if not target(member).is_module:
                body += render_entry(qualname, documented(target(member), package), anchors)
        index.append(f"* [`{path}`](#{{anchor:{path}}}): " + ", ".join(
            f"[`{q.rsplit('.', 1)[1]}`](#{{anchor:{q}}})" for q, m in entries))
    head = [anchors.heading(1, "API reference"), "",
            "<!-- Generated by tools/api_docs.py (make docs) from the docstrings: do not edit by hand. -->", "",
            "Generated from the docstrings and type stubs of the public API (`fastloop.__all__` and the "
            "`__all__` of `fastloop.ops`, `fastloop.nn`, `fastloop.cuda` and `fastloop.images`) by "
            "`make docs` (griffe reads them); `tests/test_docs.py` fails when it is out of date. The guides "
            "([index.md](index.md)) explain how the pieces fit together; this page lists what each one "
            "takes and returns.", "", *index, ""]
    text = "\n".join(head + body).rstrip() + "\n"
    return re.sub(r"\{anchor:([\w.]+)\}", lambda m: anchors.by_key[m.group(1)], text)


def generate() -> str:
    return render(load())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is out of date")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="where to write (default: %(default)s)")
    args = parser.parse_args(argv)
    text = generate()
    if not args.check:
        args.output.write_text(text)
        print(f"wrote {args.output} ({len(text.splitlines())} lines)")
        return 0
    current = args.output.read_text() if args.output.exists() else ""
    if current == text:
        return 0
    diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(), "docs/api.md (committed)",
                                     "docs/api.md (generated)", lineterm="", n=1))
    print("docs/api.md is out of date with the docstrings; regenerate it with `make docs`\n"
          + "\n".join(diff[:60]) + ("\n..." if len(diff) > 60 else ""), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
