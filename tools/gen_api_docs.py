#!/usr/bin/env python3
"""Generate docs/api.md, the API reference, from the docstrings of fastloop's public API.

    python tools/gen_api_docs.py            # writes docs/api.md
    python tools/gen_api_docs.py --check    # exit 1 if docs/api.md is not what it would write

What it documents: every name in ``fastloop.__all__``, then the ``__all__`` of the
submodules fastloop.ops, fastloop.nn, fastloop.cuda and fastloop.images, in ``__all__`` order. Classes get
their signature, docstring, attributes (properties, fields, C members) and public methods,
including those inherited from fastloop's own base classes. Signatures come from
``inspect.signature`` (for C functions and types that is the ``name(args)\\n--\\n\\n`` text
signature their docstrings carry), else from a ``Name(args)`` first docstring line.

The output must be the same on every machine, so:

* nothing is called, only introspected, and nothing that needs a GPU is touched;
* the CUDA extension's types (``fastloop.cuda.DeviceArray``, ``Stream``, ``PinnedRegion``)
  are never imported: their members and signatures are read from
  ``python/fastloop/_cuda.pyi`` and their docstrings from the binding's C source
  (``cuda/py/py_*.c``), so a build without CUDA writes the same file as one with it
  (tests/test_docs.py checks both readings against the extension where it is built);
* default values are printed without memory addresses.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import importlib
import inspect
import re
import sys
import types
from pathlib import Path
from typing import Any, Callable, ForwardRef, Iterable

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "api.md"
CUDA_STUB = ROOT / "python" / "fastloop" / "_cuda.pyi"
CUDA_SOURCES = ROOT / "cuda" / "py"

SUBMODULES = ("ops", "nn", "cuda", "images")

# Special methods worth listing as members (the rest show up in the "Supports" line).
LISTED_SPECIALS = {"__call__", "__dlpack__", "__dlpack_device__", "__cuda_array_interface__"}
PROTOCOLS = (  # (special method, how the "Supports" line names it)
    ("__enter__", "`with` (a context manager)"),
    ("__iter__", "iteration"),
    ("__len__", "`len()`"),
    ("__getitem__", "indexing (`obj[key]`)"),
    ("__contains__", "`in`"),
    ("__class_getitem__", "subscripting in type hints"),
)

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_DOC_SIGNATURE = re.compile(r"^(\w+)(\(.*\))$")


def import_fastloop() -> types.ModuleType:
    try:
        import fastloop
    except ImportError:  # not installed: the in-place build under python/
        sys.path.insert(0, str(ROOT / "python"))
        import fastloop
    return fastloop


# ---------------------------------------------------------------- text helpers


class _Raw:
    """Shows its text as is where inspect would repr() an annotation or a default."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def annotation_text(annotation: Any) -> str:
    if isinstance(annotation, str):
        return unquote_annotation(annotation)
    if isinstance(annotation, ForwardRef):
        return annotation.__forward_arg__
    if isinstance(annotation, type) and not isinstance(annotation, types.GenericAlias):
        return type_name(annotation)
    return _ADDRESS.sub("", inspect.formatannotation(annotation))


def unquote_annotation(text: str) -> str:
    """`'Optimizer | None'` -> `Optimizer | None`: forward references written as strings
    read as the types they name (quotes inside Literal[...] are kept)."""
    if "Literal[" in text:
        return text
    return re.sub(r"(['\"])([A-Za-z_][\w.\[\], |]*)\1", r"\2", text)


def type_name(t: type) -> str:
    """`int`, `numpy.float32`, `queue.Empty` (a private module's name made public where the
    public module holds the same object)."""
    if t.__module__ == "builtins":
        return t.__qualname__
    module = t.__module__
    if module.startswith("_"):
        try:
            public = importlib.import_module(module.lstrip("_"))
        except ImportError:
            public = None
        if public is not None and getattr(public, t.__qualname__, None) is t:
            module = public.__name__
    return f"{module}.{t.__qualname__}"


def value_text(value: Any) -> str:
    if isinstance(value, type):
        return type_name(value)
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '') or ''}.{value.__qualname__}".lstrip(".")
    return _ADDRESS.sub("", repr(value))


def signature_text(obj: Any, drop_first: bool = False) -> str | None:
    """`(a, b=1, *, c: int = 2) -> str`, without private parameters, or None when unknown."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    params = []
    for i, p in enumerate(sig.parameters.values()):
        if (drop_first and i == 0) or p.name.startswith("_"):
            continue
        params.append(p.replace(
            annotation=p.empty if p.annotation is p.empty else _Raw(annotation_text(p.annotation)),
            default=p.empty if p.default is p.empty else _Raw(value_text(p.default)),
        ))
    ret = sig.return_annotation
    ret = sig.empty if ret is sig.empty or ret in (None, "None") else _Raw(annotation_text(ret))
    return str(sig.replace(parameters=params, return_annotation=ret))


def split_doc_signature(name: str, doc: str) -> tuple[str | None, str]:
    """A docstring opening with `Name(args)` and a blank line: (the args, the rest)."""
    lines = doc.splitlines()
    if lines:
        match = _DOC_SIGNATURE.match(lines[0].strip())
        if match and match.group(1) == name and (len(lines) == 1 or not lines[1].strip()):
            return match.group(2), "\n".join(lines[2:]).strip()
    return None, doc


def strip_text_signature(doc: str) -> str:
    """Drops the `name(args)\\n--\\n\\n` header CPython hides from __doc__ of C callables."""
    match = re.match(r"^\w+\(.*?\)\n--\n\n", doc, re.S)
    return doc[match.end():] if match else doc


_CODE_SPAN = re.compile(r"(``.+?``|`[^`]+`)")


def escape_markdown(text: str) -> str:
    """Escapes what Markdown would eat in prose (emphasis, HTML-like <tags>, __dunders__),
    leaving code spans alone."""
    out = []
    for i, part in enumerate(_CODE_SPAN.split(text)):
        if i % 2:
            out.append(part)
            continue
        part = part.replace("\\", "\\\\").replace("*", "\\*")
        part = re.sub(r"<(?=[A-Za-z/!?])", r"\\<", part)
        part = re.sub(r"(?<![\w\\])(_+)(?=\w)|(?<=\w)(_+)(?!\w)",
                      lambda m: "\\_" * len(m.group(0)), part)
        out.append(part)
    return "".join(out)


def doc_markdown(doc: str) -> list[str]:
    """A docstring as Markdown: prose paragraphs kept (escaped), doctest lines and indented
    blocks as Python code fences."""
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith(">>>") or (line.startswith("    ") and stripped):
            indent = len(line) - len(line.lstrip())
            block = []
            while i < len(lines) and lines[i].strip() and (
                    len(lines[i]) - len(lines[i].lstrip()) >= indent or not block):
                block.append(lines[i][indent:].rstrip())
                i += 1
            if out and out[-1] != "":
                out.append("")
            out += ["```python", *block, "```", ""]
            continue
        if stripped:
            text = escape_markdown(stripped)
            if re.match(r"^(>|[-=]+$|#)", text):  # a quote, a setext underline, a heading
                text = "\\" + text
            out.append(text)
        elif out and out[-1] != "":
            out.append("")
        i += 1
    while out and out[-1] == "":
        out.pop()
    return out


def one_line(doc: str) -> str:
    """A docstring's first paragraph on one line, for a table cell."""
    text = " ".join(inspect.cleandoc(doc).split("\n\n")[0].split()) if doc else ""
    return escape_markdown(text).replace("|", "\\|")


# ---------------------------------------------------------------- a neutral model of the API


@dataclasses.dataclass
class Attribute:
    name: str
    type: str
    doc: str
    settable: bool = False


@dataclasses.dataclass
class Method:
    name: str
    signature: str
    doc: str


@dataclasses.dataclass
class ClassDoc:
    qualname: str  # fastloop.cuda.Stream
    signature: str | None  # "(device=0)", None when not constructible from Python / unknown
    bases: list[str]
    doc: str
    attributes: list[Attribute]
    methods: list[Method]
    protocols: list[str]
    note: str = ""


@dataclasses.dataclass
class FunctionDoc:
    qualname: str
    signature: str
    doc: str


@dataclasses.dataclass
class ValueDoc:
    qualname: str
    value: str
    doc: str


@dataclasses.dataclass
class ModuleLink:
    qualname: str
    target: str
    doc: str


Entry = ClassDoc | FunctionDoc | ValueDoc | ModuleLink


# ---------------------------------------------------------------- runtime introspection


def _own_classes(cls: type) -> list[type]:
    """cls and its bases that are fastloop's own (not object, tuple, Exception...)."""
    return [k for k in cls.__mro__ if (k.__module__ or "").split(".")[0] == "fastloop"]


def _is_generic_doc(doc: str) -> bool:
    return doc.startswith("Alias for field number") or doc in ("", None)


def describe_class(qualname: str, cls: type) -> ClassDoc:
    raw_doc = inspect.getdoc(cls) or ""
    doc_sig, doc = split_doc_signature(cls.__name__, raw_doc)
    if issubclass(cls, BaseException):
        bases = [type_name(b) if b.__module__.split(".")[0] != "fastloop" else b.__name__
                 for b in cls.__bases__]
        sig = signature_text(cls) if "__init__" in vars(cls) else None
        return ClassDoc(qualname, sig, bases, doc, [], [], [])
    sig = doc_sig or (None if issubclass(cls, tuple) and not _is_namedtuple(cls)
                      else signature_text(cls))
    bases = [b.__name__ for b in cls.__bases__ if b.__module__.split(".")[0] == "fastloop"]

    attributes: list[Attribute] = []
    methods: list[Method] = []
    seen: set[str] = set()
    fields = getattr(cls, "__dataclass_fields__", None) or {}
    annotations: dict[str, Any] = {}
    for k in reversed(_own_classes(cls)):
        annotations.update(getattr(k, "__annotations__", {}) if "__annotations__" in vars(k) else {})
    for name, field in fields.items():
        attributes.append(Attribute(name, annotation_text(field.type), ""))
        seen.add(name)
    for klass in _own_classes(cls):
        for name, attr in vars(klass).items():
            if name in seen:
                continue
            if name.startswith("_") and name not in LISTED_SPECIALS:
                continue
            seen.add(name)
            member = _describe_member(cls, name, attr, annotations)
            if isinstance(member, Attribute):
                attributes.append(member)
            elif isinstance(member, Method):
                methods.append(member)
    protocols = [text for special, text in PROTOCOLS
                 if any(special in vars(k) for k in _own_classes(cls))]
    return ClassDoc(qualname, sig, bases, doc, attributes, methods, protocols)


def _is_namedtuple(cls: type) -> bool:
    return issubclass(cls, tuple) and hasattr(cls, "_fields")


def _describe_member(cls: type, name: str, attr: Any, annotations: dict[str, Any]) -> Attribute | Method | None:
    if isinstance(attr, property):
        ret = inspect.signature(attr.fget).return_annotation if attr.fget else inspect.Signature.empty
        kind = "" if ret is inspect.Signature.empty else annotation_text(ret)
        doc = inspect.getdoc(attr) or ""
        return Attribute(name, kind, doc, settable=attr.fset is not None)
    if isinstance(attr, (types.GetSetDescriptorType, types.MemberDescriptorType)):
        return Attribute(name, "", attr.__doc__ or "")
    if type(attr).__name__ == "_tuplegetter":
        doc = attr.__doc__ or ""
        return Attribute(name, annotation_text(annotations[name]) if name in annotations else "",
                         "" if _is_generic_doc(doc) else doc)
    if isinstance(attr, (staticmethod, classmethod)):
        attr = attr.__func__
    if isinstance(attr, (types.FunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
                         types.BuiltinFunctionType, types.ClassMethodDescriptorType)):
        func = getattr(cls, name)
        static = isinstance(inspect.getattr_static(cls, name), (staticmethod, classmethod))
        sig = signature_text(attr if isinstance(attr, types.FunctionType) else func,
                             drop_first=not static)
        doc = _member_doc(cls, name)
        if sig is None:
            doc_sig, doc = split_doc_signature(name, doc)
            sig = doc_sig or "(...)"
        return Method(name, sig, doc)
    return None


def _member_doc(cls: type, name: str) -> str:
    """The member's docstring, else the one of the same member in a fastloop base class
    (never a builtin's generic "Call self as a function.")."""
    for klass in _own_classes(cls):
        attr = vars(klass).get(name)
        if isinstance(attr, (staticmethod, classmethod)):
            attr = attr.__func__
        doc = getattr(attr, "__doc__", None) if attr is not None else None
        if isinstance(attr, property):
            doc = attr.__doc__
        if doc:
            return inspect.cleandoc(doc)
    return ""


def describe_function(qualname: str, func: Callable[..., Any]) -> FunctionDoc:
    doc = inspect.getdoc(func) or ""
    sig = signature_text(func)
    if sig is None:
        sig, doc = split_doc_signature(func.__name__, doc)
    return FunctionDoc(qualname, sig or "(...)", doc)


def describe(module_name: str, name: str, obj: Any) -> Entry:
    qualname = f"{module_name}.{name}"
    if isinstance(obj, types.ModuleType):
        return ModuleLink(qualname, obj.__name__, inspect.getdoc(obj) or "")
    if isinstance(obj, type):
        return describe_class(qualname, obj)
    if callable(obj):
        return describe_function(qualname, obj)
    return ValueDoc(qualname, value_text(obj), "")


# ---------------------------------------------------------------- the CUDA extension, statically


def _stub_aliases(tree: ast.Module) -> dict[str, str]:
    """Module-level private aliases in the stub (`_StreamArg = ...`), to spell out."""
    return {node.targets[0].id: ast.unparse(node.value) for node in tree.body
            if isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name) and node.targets[0].id.startswith("_")}


def _expand(text: str, aliases: dict[str, str]) -> str:
    for alias, value in aliases.items():
        text = re.sub(rf"\b{re.escape(alias)}\b", value, text)
    return text


def _stub_signature(func: ast.FunctionDef, aliases: dict[str, str]) -> str:
    """The stub's signature, less `self`, printed as inspect prints the runtime ones."""
    def text(node: ast.expr | None) -> Any:
        return inspect.Parameter.empty if node is None else _Raw(_expand(ast.unparse(node), aliases))

    args = func.args
    P = inspect.Parameter
    positional = [(a, P.POSITIONAL_ONLY) for a in args.posonlyargs] + \
                 [(a, P.POSITIONAL_OR_KEYWORD) for a in args.args]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = [P(a.arg, kind, default=text(d), annotation=text(a.annotation))
              for (a, kind), d in zip(positional, defaults)]
    if args.vararg:
        params.append(P(args.vararg.arg, P.VAR_POSITIONAL, annotation=text(args.vararg.annotation)))
    params += [P(a.arg, P.KEYWORD_ONLY, default=text(d), annotation=text(a.annotation))
               for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        params.append(P(args.kwarg.arg, P.VAR_KEYWORD, annotation=text(args.kwarg.annotation)))
    if params and params[0].name == "self":
        params = params[1:]
    returns = func.returns
    ret = text(None if returns is None or ast.unparse(returns) == "None" else returns)
    return str(inspect.Signature(params, return_annotation=ret))


_C_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def _c_groups(source: str) -> list[list[str]]:
    """Every innermost {...} initializer of a C file, as a list of items: a string item is
    the concatenation of adjacent string literals; other items are their raw text."""
    source = re.sub(r"/\*.*?\*/|//[^\n]*", " ", source, flags=re.S)
    groups: list[list[str]] = []
    for match in re.finditer(r"\{([^{}]*)\}", source):
        body = match.group(1)
        items: list[str] = []
        for raw in _split_top_commas(body):
            strings = _C_STRING.findall(raw)
            if strings and not _C_STRING.sub("", raw).strip():
                items.append("\0" + "".join(ast.literal_eval('"' + s + '"') for s in strings))
            else:
                items.append(raw.strip())
        groups.append(items)
    return groups


def _split_top_commas(body: str) -> list[str]:
    parts, depth, current, i = [], 0, [], 0
    while i < len(body):
        ch = body[i]
        if ch == '"':
            end = _C_STRING.match(body, i)
            if end is None:
                current.append(ch)
                i += 1
                continue
            current.append(end.group(0))
            i = end.end()
            continue
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    if "".join(current).strip():
        parts.append("".join(current))
    return parts


def cuda_c_docstrings(type_name_: str) -> dict[str, str]:
    """The docstrings the binding gives `type_name_` and its members, read from the C file
    that defines the type (`.name = "fastloop.cuda.<type>"`): {"": the type's, member: ...}.
    Signature headers are stripped as CPython strips them from __doc__."""
    for path in sorted(CUDA_SOURCES.glob("py_*.c")):
        source = path.read_text()
        specs = re.findall(r'\.name\s*=\s*"fastloop\.(?:_?cuda)\.(\w+)"', source)
        if specs != [type_name_]:
            continue
        docs: dict[str, str] = {}
        for items in _c_groups(source):
            if not items:
                continue
            if items[0] == "Py_tp_doc" and len(items) > 1 and items[1].startswith("\0"):
                docs[""] = items[1][1:]
            elif items[0].startswith("\0") and len(items) >= 3:
                name = items[0][1:]
                strings = [item[1:] for item in items[1:] if item.startswith("\0")]
                if strings and name not in docs:
                    docs[name] = strip_text_signature(strings[-1])
        return docs
    return {}


def describe_stub_class(qualname: str, name: str) -> ClassDoc:
    tree = ast.parse(CUDA_STUB.read_text())
    aliases = _stub_aliases(tree)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    docs = cuda_c_docstrings(name)
    type_doc = docs.get("", "")
    doc_sig, type_doc = split_doc_signature(name, strip_text_signature(type_doc))
    signature = None
    attributes: list[Attribute] = []
    methods: list[Method] = []
    specials: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            attr = item.target.id
            attributes.append(Attribute(attr, _expand(ast.unparse(item.annotation), aliases),
                                        docs.get(attr, "")))
        elif isinstance(item, ast.FunctionDef):
            fname = item.name
            specials.add(fname)
            if fname == "__init__":
                signature = _stub_signature(item, aliases)
                continue
            if fname.startswith("_") and fname not in LISTED_SPECIALS:
                continue
            decorators = {ast.unparse(d) for d in item.decorator_list}
            if "property" in decorators:
                ret = _expand(ast.unparse(item.returns), aliases) if item.returns else ""
                attributes.append(Attribute(fname, ret, docs.get(fname, "")))
            else:
                methods.append(Method(fname, _stub_signature(item, aliases), docs.get(fname, "")))
    protocols = [text for special, text in PROTOCOLS if special in specials]
    note = ("A type of the CUDA extension `fastloop._cuda`, available when fastloop was built "
            "with CUDA (see [cuda.md](cuda.md)); elsewhere `fastloop.cuda.%s` raises "
            "`AttributeError` saying why. Documented from `_cuda.pyi` and the binding's "
            "docstrings, so this page reads the same with and without a CUDA build." % name)
    return ClassDoc(qualname, signature or doc_sig, [], type_doc, attributes, methods, protocols, note)


def stub_class_names() -> list[str]:
    tree = ast.parse(CUDA_STUB.read_text())
    return [n.name for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")]


# ---------------------------------------------------------------- gathering and rendering


def gather(fastloop: types.ModuleType) -> list[tuple[str, str, list[Entry]]]:
    """[(module name, module docstring, entries)] for fastloop and its documented submodules."""
    sections = []
    for module in [fastloop] + [getattr(fastloop, name) for name in SUBMODULES]:
        entries: list[Entry] = []
        namespace = vars(module)  # never getattr(): fastloop.cuda's __getattr__ loads _cuda
        stub_types = set(stub_class_names()) if module.__name__ == "fastloop.cuda" else set()
        for name in module.__all__:
            if name in namespace:
                entries.append(describe(module.__name__, name, namespace[name]))
            elif name in stub_types:
                entries.append(describe_stub_class(f"{module.__name__}.{name}", name))
            else:
                raise SystemExit(f"{module.__name__}.__all__ names {name!r}, which is neither "
                                 f"defined there nor a class in {CUDA_STUB.name}")
        sections.append((module.__name__, inspect.getdoc(module) or "", entries))
    return sections


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before duplicate numbering)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


class Anchors:
    """Hands out anchors as GitHub does: the first heading with a slug gets it, later ones
    get `-1`, `-2`, ... (`normalize` and `Normalize` share a slug)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.by_key: dict[str, str] = {}

    def heading(self, level: int, text: str, key: str | None = None) -> str:
        base = slug(text)
        n = self.counts.get(base, 0)
        self.counts[base] = n + 1
        self.by_key[key or text] = base if n == 0 else f"{base}-{n}"
        return f"{'#' * level} {escape_markdown(text)}"


def render(sections: list[tuple[str, str, list[Entry]]]) -> str:
    anchors = Anchors()
    body: list[str] = []
    for module_name, module_doc, entries in sections:
        body += [anchors.heading(2, module_name), ""]
        if module_doc:
            body += doc_markdown(module_doc) + [""]
        links = [e for e in entries if isinstance(e, ModuleLink)]
        if links:
            body += ["Submodules:", ""]
            body += [f"* [`{e.target}`](#{{anchor:{e.target}}}): "
                     + escape_markdown(" ".join(e.doc.split("\n\n")[0].split())) for e in links]
            body.append("")
        for entry in entries:
            if not isinstance(entry, ModuleLink):
                body += render_entry(entry, anchors)
    head = [
        anchors.heading(1, "API reference"),
        "",
        "<!-- Generated by tools/gen_api_docs.py from the docstrings: do not edit by hand. -->",
        "",
        "Generated from the docstrings of the public API (`fastloop.__all__` and the `__all__` "
        "of `fastloop.ops`, `fastloop.nn`, `fastloop.cuda` and `fastloop.images`) by `python tools/gen_api_docs.py`; "
        "`tests/test_docs.py` fails when it is out of date. The guides ([index.md](index.md)) "
        "explain how the pieces fit together; this page lists what each one takes and returns.",
        "",
    ]
    for module_name, _, entries in sections:
        head.append(f"* [`{module_name}`](#{{anchor:{module_name}}}): " + ", ".join(
            f"[`{e.qualname.rsplit('.', 1)[1]}`](#{{anchor:{e.qualname if not isinstance(e, ModuleLink) else e.target}}})"
            for e in entries))
    head.append("")
    text = "\n".join(head + body).rstrip() + "\n"
    return re.sub(r"\{anchor:([\w.]+)\}", lambda m: anchors.by_key[m.group(1)], text)


def render_entry(entry: Entry, anchors: Anchors) -> list[str]:
    out = [anchors.heading(3, entry.qualname), ""]
    if isinstance(entry, ValueDoc):
        out += ["```python", f"{entry.qualname} = {entry.value}", "```", ""]
        return out
    if isinstance(entry, FunctionDoc):
        out += ["```python", f"{entry.qualname}{entry.signature}", "```", ""]
        if entry.doc:
            out += doc_markdown(entry.doc) + [""]
        return out
    assert isinstance(entry, ClassDoc)
    out += ["```python", f"class {entry.qualname}{entry.signature or ''}", "```", ""]
    if entry.bases:
        out += [f"Bases: {', '.join(f'`{b}`' for b in entry.bases)}", ""]
    if entry.note:
        out += [entry.note, ""]
    if entry.doc:
        out += doc_markdown(entry.doc) + [""]
    if entry.protocols:
        out += ["Supports " + ", ".join(entry.protocols) + ".", ""]
    if entry.attributes:
        out += ["| attribute | type | |", "|---|---|---|"]
        for attr in entry.attributes:
            kind = ("`" + attr.type.replace("|", "\\|") + "`") if attr.type else ""
            text = one_line(attr.doc) + (" Settable." if attr.settable else "")
            out.append(f"| `{attr.name}` | {kind} | {text.strip()} |")
        out.append("")
    short = entry.qualname.rsplit(".", 1)[1]
    for method in entry.methods:
        out += [anchors.heading(4, f"{short}.{method.name}", f"{entry.qualname}.{method.name}"), "",
                "```python", f"{method.name}{method.signature}", "```", ""]
        if method.doc:
            out += doc_markdown(method.doc) + [""]
    return out


def generate() -> str:
    return render(gather(import_fastloop()))


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 if {OUTPUT.relative_to(ROOT)} differs from what would be written")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="where to write (default: %(default)s)")
    args = parser.parse_args(None if argv is None else list(argv))
    text = generate()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current == text:
            return 0
        diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(),
                                         "docs/api.md (committed)", "docs/api.md (generated)", lineterm="", n=1))
        shown = "\n".join(diff[:60]) + ("\n..." if len(diff) > 60 else "")
        shown_path = args.output.resolve()
        shown_path = shown_path.relative_to(ROOT) if shown_path.is_relative_to(ROOT) else shown_path
        print(f"{shown_path} is out of date with the docstrings; regenerate it with\n"
              f"    python tools/gen_api_docs.py\n{shown}", file=sys.stderr)
        return 1
    args.output.write_text(text)
    print(f"wrote {args.output} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
