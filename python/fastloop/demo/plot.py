"""The demo's PNG: training loss and throughput against the step, read back from the run's
metrics.csv (what the Monitor wrote), so the plot shows exactly what was logged."""

from __future__ import annotations

import csv
import os
from collections import defaultdict


def read_series(csv_path: str, names: tuple[str, ...]) -> dict[str, list[tuple[int, float]]]:
    """(step, value) pairs of each metric in `names` from a fastloop CSVSink file."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            if row["name"] in names:
                series[row["name"]].append((int(row["step"]), float(row["value"])))
    return series


def write_plot(csv_path: str, png_path: str, loss_name: str, rate_name: str) -> str | None:
    """Writes the plot; returns None, or why there is none (matplotlib missing, no data)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib for the plot)"
    series = read_series(csv_path, (loss_name, rate_name))
    if not series.get(loss_name):
        return f"no {loss_name} records in {csv_path}"
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    steps, values = zip(*sorted(series[loss_name]))
    top.plot(steps, values, linewidth=0.8)
    top.set_ylabel(loss_name)
    top.set_yscale("log")
    top.grid(alpha=0.3)
    if series.get(rate_name):
        steps, values = zip(*sorted(series[rate_name]))
        bottom.plot(steps, values, linewidth=0.8, color="tab:green")
    bottom.set_ylabel("samples/s")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    fig.suptitle(f"fastloop demo: {os.path.basename(os.path.dirname(os.path.abspath(png_path)))}")
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return None
