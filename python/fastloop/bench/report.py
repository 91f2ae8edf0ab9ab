"""Printing benchmark results: aligned text tables, markdown, machine facts and plots."""

from __future__ import annotations

import datetime
import os
import platform
from typing import Any, Callable, Protocol, Sequence

import numpy as np


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, markdown: bool = False) -> str:
    """Renders rows as an aligned text table (or a markdown table).

    >>> print(format_table(["a", "b"], [[1, 2.5]]))
    """
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    if markdown:
        lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |"]
        lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    else:
        lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths))]
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def format_section(headers: Sequence[str], rows: Sequence[Sequence[object]], notes: Sequence[str]) -> str:
    """A suite's table with its notes (summary lines) below it, as its script and ``python -m fastloop bench``
    print them.

    >>> print(format_section(["a", "b"], [[1, 2.5]], ["a is 1"]))
    """
    return format_table(headers, rows) + "".join(f"\n{line}" for line in notes)


class Suite(Protocol):
    """A suite module (``bench.loader``, ``bench.model``) as its script and ``python -m fastloop bench`` use it."""

    HEADERS: list[str]

    def run(self, quick: bool = ..., log: Callable[[str], None] = ...) -> list[Any]: ...

    def table_rows(self, rows: list[Any]) -> list[list[object]]: ...

    def summary(self, rows: list[Any]) -> list[str]: ...


def print_suite(suite: Suite, title: str, *, quick: bool) -> int:
    """A suite's script: the title and this machine, the progress as it runs, then the table and the summary."""
    print(f"{title} on {machine_summary()}")
    rows = suite.run(quick=quick, log=print)
    print(format_section(suite.HEADERS, suite.table_rows(rows), suite.summary(rows)))
    return 0


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def machine_summary() -> str:
    """One line on where the numbers come from: CPU, cores, Python, NumPy, date."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, NumPy {np.__version__}, "
        f"{datetime.date.today().isoformat()}"
    )


def save_bar_plot(path: str, title: str, groups: dict[str, dict[str, float]], ylabel: str,
                  log: bool = False) -> str | None:
    """Saves a grouped bar chart (group -> series -> value) as PNG, on a log axis if asked;
    returns the path, or None with a printed notice when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib is not installed: no plot; pip install matplotlib)")
        return None
    series = list(dict.fromkeys(s for values in groups.values() for s in values))
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(groups)), 4.8))
    width = 0.8 / max(1, len(series))
    for i, name in enumerate(series):
        xs = [g + i * width for g in range(len(groups))]
        ax.bar(xs, [groups[g].get(name, 0.0) for g in groups], width, label=name)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
    ax.set_xticklabels(list(groups), fontsize=8)
    ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_info() -> None:
    """What this build of fastloop has: used by ``python -m fastloop info``."""
    import fastloop

    print(f"fastloop {fastloop.__version__} on {machine_summary()}")
    built = fastloop.cuda.is_built()
    available = fastloop.cuda.is_available()
    print(f"CUDA built:     {bool(built)} ({built.reason})")
    print(f"CUDA available: {bool(available)} ({available.reason})")
