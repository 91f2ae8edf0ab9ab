"""The docs hold together: docs/api.md matches the docstrings, every relative link in
README.md and docs/*.md leads to a file (and heading) that exists, and every public name
is in the API reference."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fastloop

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "api_docs.py"
API = ROOT / "docs" / "api.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _tool():
    spec = importlib.util.spec_from_file_location("api_docs", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- Markdown, as GitHub reads it

_FENCE = re.compile(r"^(```|~~~)")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def _without_code_spans(line: str) -> str:
    return re.sub(r"(`+)(.+?)\1", "code", line)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading's Markdown text: the rendered text, lowercased, without
    punctuation other than '-' and '_', spaces as '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links -> their text
    escaped: list[str] = []  # escaped characters are text, never emphasis marks
    text = re.sub(r"\\(.)", lambda m: escaped.append(m.group(1)) or f"\0{len(escaped) - 1}\0",
                  text.replace("`", ""))
    text = re.sub(r"(\*\*|__)(.+?)\1|\*(.+?)\*", lambda m: m.group(2) or m.group(3), text)
    text = re.sub(r"\0(\d+)\0", lambda m: escaped[int(m.group(1))], text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2 for repeats."""
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose_lines(path.read_text()):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = github_slug(match.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        anchors.add(base if n == 0 else f"{base}-{n}")
    return anchors


def links_of(path: Path) -> list[str]:
    """Link targets of inline links, images and reference definitions outside code."""
    targets = []
    for line in _prose_lines(path.read_text()):
        line = _without_code_spans(line)
        targets += re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", line)
        ref = re.match(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(\s|$)", line)
        if ref:
            targets.append(ref.group(1))
    return targets


def test_github_slug_matches_githubs_rules():
    assert github_slug("fastloop.Queue") == "fastloopqueue"
    assert github_slug(r"fastloop.\_\_version\_\_") == "fastloop__version__"
    assert github_slug("Threads or processes? How to decide") == "threads-or-processes-how-to-decide"
    assert github_slug("The fork-safety rule (processes mode)") == "the-fork-safety-rule-processes-mode"
    assert github_slug("`Loader` and [links](x.md)") == "loader-and-links"


# ---------------------------------------------------------------- the tests


def test_api_md_is_up_to_date():
    run = subprocess.run([sys.executable, str(TOOL), "--check"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert run.returncode == 0, run.stderr + run.stdout


def test_api_generation_never_loads_the_cuda_extension():
    """What keeps docs/api.md the same on machines with and without a CUDA build."""
    code = ("import runpy, sys, fastloop; tool = runpy.run_path(sys.argv[1]); tool['generate'](); "
            "print('fastloop._cuda' in sys.modules)")  # griffe would inspect _cuda.so once fastloop is imported
    run = subprocess.run([sys.executable, "-c", code, str(TOOL)], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_files_and_headings(page):
    broken = []
    for target in links_of(page):
        if re.match(r"^[a-zA-Z][\w+.-]*:", target):  # https:, mailto:, ...
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors_of(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    assert not broken, f"{page.relative_to(ROOT)} has broken links:\n  " + "\n  ".join(broken)


def _documented_names() -> set[str]:
    names = set()
    for line in _prose_lines(API.read_text()):
        match = re.match(r"^#{2,3}\s+(\S+)\s*$", line)
        if match:
            names.add(re.sub(r"\\(.)", r"\1", match.group(1)))
    return names


def test_every_public_name_is_in_the_api_reference():
    documented = _documented_names()
    expected = [f"fastloop.{name}" for name in fastloop.__all__]
    for path in ("ops", "nn", "cuda"):  # by the public path: fastloop.ops lives in fastloop.data.ops
        expected += [f"fastloop.{path}.{name}" for name in getattr(fastloop, path).__all__]
    missing = [name for name in expected if name not in documented]
    assert not missing, f"not in docs/api.md: {missing} (run make docs)"


def test_cuda_stub_docstrings_match_the_extension():
    """docs/api.md documents the CUDA extension's types from _cuda.pyi without importing the
    extension; where it is built, the stub's members and docstrings must be its own."""
    if not fastloop.cuda.is_built():
        pytest.skip(f"the CUDA extension is not built: {fastloop.cuda.is_built().reason}")
    import inspect

    import fastloop._cuda as ext

    stub = _tool().load()["_cuda"]
    for name in ("DeviceArray", "Stream", "PinnedRegion"):
        static, runtime = stub[name], getattr(ext, name)
        assert static.docstring.value == inspect.getdoc(runtime), name
        public = {n for n in dir(runtime) if not n.startswith("_") or n in ("__dlpack__", "__dlpack_device__",
                                                                             "__cuda_array_interface__")}
        assert public <= set(static.members), f"{name}: members missing from _cuda.pyi: {public - set(static.members)}"
        for member in public:
            doc = static.members[member].docstring
            assert doc is not None and doc.value == inspect.getdoc(getattr(runtime, member)), f"{name}.{member}"
