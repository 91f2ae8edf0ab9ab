"""Every format string the bindings hand to CPython is valid on the oldest supported Python
(3.9), read from the C sources, so a binding that only runs on a GPU is checked here too.

PyArg_Parse* formats: known units only, '|' before '$', at most one of each, ':'/';' last.
PyErr_Format / fl_raisef / PyUnicode_FromFormat / PyErr_WarnFormat: only the conversions 3.9 knows
(%T, %N and %#T came in 3.13; the 'z'/'l' modifiers go with d, i, u only before 3.12).
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
BINDINGS = sorted([*ROOT.glob("csrc/py/*.c"), *ROOT.glob("cuda/py/*.c")])

# "s#" and the like are one unit; "e" takes an encoding then s/t/#; "(...)" nests.
_PARSE_UNITS = re.compile(r"es#|et#|es|et|[syzw]\*|[syzu]#|U|S|Y|O[!&]?|[bBhHiIlkLKnfdDcCpsyzu]|[()]")
_ARG_CALLS = re.compile(r"PyArg_(?:ParseTupleAndKeywords|ParseTuple|Parse|VaParseTupleAndKeywords)\s*\(")
_FORMAT_CALLS = re.compile(r"\b(?:PyErr_Format|fl_raisef|PyUnicode_FromFormat|PyErr_WarnFormat|PyUnicode_FromFormatV)\s*\(")
# What PyUnicode_FromFormat understands on 3.9: width/precision digits, then one of these.
_CONVERSION = re.compile(r"%(?:%|(\d*)(?:\.\d+)?(ll|l|z)?([diuxcspAUVSR]))")


def _literals_after(text: str, start: int) -> tuple[str | None, int]:
    """The first string-literal argument of the call opening at `start` (adjacent literals
    joined), or None when the first literal is not among the call's first four arguments."""
    depth, i, arg = 1, start, 0
    while i < len(text) and depth > 0:
        ch = text[i]
        if ch == '"':
            parts = []
            while True:
                match = re.compile(r'"((?:[^"\\]|\\.)*)"\s*').match(text, i)
                if match is None:
                    break
                parts.append(match.group(1))
                i = match.end()
            return "".join(parts), i
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 1:
            arg += 1
            if arg > 3:
                return None, i
        i += 1
    return None, i


def _calls(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    """(file:line, the call's format literal) for each call in the bindings."""
    found = []
    for path in BINDINGS:
        text = path.read_text()
        for match in pattern.finditer(text):
            literal, _ = _literals_after(text, match.end())
            if literal is not None:
                line = text.count("\n", 0, match.start()) + 1
                found.append((f"{path.relative_to(ROOT)}:{line}", literal))
    return found


def parse_format_problem(fmt: str) -> str | None:
    """Why a PyArg_Parse* format is invalid on Python 3.9, or None when it is valid."""
    body = re.split(r"[:;]", fmt, maxsplit=1)[0]
    seen_bar = seen_dollar = False
    i = 0
    while i < len(body):
        if body[i] == "|":
            if seen_bar or seen_dollar:
                return "'|' after '|' or '$'" if seen_bar else "'|' after '$' ('$' must follow '|')"
            seen_bar, i = True, i + 1
            continue
        if body[i] == "$":
            if seen_dollar:
                return "'$' twice"
            if not seen_bar:
                return "'$' before '|' (keyword-only arguments must be optional on 3.9-3.12)"
            seen_dollar, i = True, i + 1
            continue
        match = _PARSE_UNITS.match(body, i)
        if match is None:
            return f"unknown format unit {body[i]!r} at {i}"
        i = match.end()
    return None


def format_problem(fmt: str) -> str | None:
    """Why a PyUnicode_FromFormat-style format fails on Python 3.9, or None."""
    i = 0
    while True:
        i = fmt.find("%", i)
        if i < 0:
            return None
        match = _CONVERSION.match(fmt, i)
        if match is None:
            return f"conversion {fmt[i:i + 4]!r} is not known to Python 3.9 (use %s with Py_TYPE(o)->tp_name for %T)"
        width, modifier, kind = match.groups()
        if modifier and kind not in "diu":
            return f"'%{modifier}{kind}': the {modifier!r} modifier goes with d, i, u only before Python 3.12"
        if width and width.startswith("0") and kind not in "diux":
            return f"zero padding on %{kind}"
        i = match.end()


def test_the_scanner_finds_the_bindings_calls():
    # the PyArg_Parse* calls left: positional-only methods and specs read from internal tuples;
    # a binding's arguments are declared with fl_parse_args (csrc/py/py_args.h), checked below
    assert len(_calls(_ARG_CALLS)) > 20 and len(_calls(_FORMAT_CALLS)) > 100


_DECLARATION = re.compile(r"fl_parse_args(?:_dict)?\((.*?)\) < 0", re.S)
_FL_ARG = re.compile(r'FL_ARG\("([^"]*)", (\w+), ')


def test_declared_arguments_are_well_formed():
    kinds = set(re.findall(r"^\s+FL_ARG_(\w+),", (ROOT / "csrc/py/py_args.h").read_text(), re.M))
    declarations = [(path.name, call) for path in BINDINGS for call in _DECLARATION.findall(path.read_text())]
    assert len(declarations) > 30 and "OBJECT" in kinds
    for where, call in declarations:
        args = _FL_ARG.findall(call)
        names = [name.lstrip("|$") for name, _ in args]
        marks = "".join(ch for name, _ in args for ch in name[:2] if ch in "|$")
        assert args and all(re.fullmatch(r"\|?\$?[a-z_][a-z0-9_]*", name) for name, _ in args), (where, call)
        assert all(kind in kinds for _, kind in args), (where, call)
        assert len(set(names)) == len(names) and marks in ("", "|", "$", "|$"), (where, call)


@pytest.mark.parametrize("fmt, problem", [
    ("OOO$d|ddpp:sgd", "'$' before '|'"), ("O|$OO:f", None), ("O|O$O", None), ("|$O|O", "'|' after"),
    ("O$O", "'$' before '|'"), ("Oq", "unknown format unit"), ("s#|n:f", None), ("(ii)", None),
    ("es|O", None), ("O!O&|p", None),
])
def test_parse_format_checker_knows_valid_and_invalid_formats(fmt, problem):
    found = parse_format_problem(fmt)
    assert (found is None) if problem is None else (found is not None and problem in found)


@pytest.mark.parametrize("fmt, ok", [
    ("not %T", False), ("not %N", False), ("0x%zx", False), ("%lx", False), ("%zd %zu %lld %llu %ld", True),
    ("%.200s %R %S %U %V %A %p %c %x %i %%", True), ("%5d|%-5d", False), ("100%", False),
])
def test_message_format_checker_knows_what_python_3_9_takes(fmt, ok):
    assert (format_problem(fmt) is None) == ok


def test_every_pyarg_format_is_valid_on_python_3_9():
    problems = [f"{where}: {fmt!r}: {why}" for where, fmt in _calls(_ARG_CALLS)
                if (why := parse_format_problem(fmt)) is not None]
    assert problems == []


def test_every_message_format_is_valid_on_python_3_9():
    problems = [f"{where}: {fmt!r}: {why}" for where, fmt in _calls(_FORMAT_CALLS)
                if (why := format_problem(fmt)) is not None]
    assert problems == []
