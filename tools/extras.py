#!/usr/bin/env python3
"""Print the requirements of one of pyproject.toml's optional-dependency extras, one a line,
for `pip install $(python tools/extras.py docs)` (make venv installs the docs extra so)."""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11: the TOML reader pip itself ships
    from pip._vendor import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def requirements(extra: str) -> list[str]:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    if extra not in extras:
        raise SystemExit(f"pyproject.toml has no extra {extra!r} (it has {', '.join(sorted(extras))})")
    return extras[extra]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tools/extras.py EXTRA")
    print("\n".join(requirements(sys.argv[1])))
