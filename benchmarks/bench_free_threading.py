"""Loader threads vs processes for Python datasets (pure Python, NumPy, Pillow JPEG decode) on a
GIL build and a free-threaded CPython side by side, plus two Python threads in a pure-Python
training loop; samples/s, CPU use and peak PSS, each configuration in a fresh interpreter.

As a script: prints the table and the answer (which mode on which interpreter).
    python benchmarks/bench_free_threading.py [--quick]
    FASTLOOP_BENCH_PYTHONS=.venv/bin/python:.venv-ft/bin/python python benchmarks/bench_free_threading.py
Under pytest: measures one configuration of each kind in this interpreter and checks each was
measured (the targets are read from the table and recorded in BENCHMARKS.md, not asserted).
"""

from __future__ import annotations

import math
import sys

from fastloop.bench import free_threading


def test_a_threads_loader_configuration_is_measured():
    row = free_threading.measure_loader(free_threading.PURE, "fastloop threads", 2, n=512)
    assert row.samples_per_s > 0 and math.isfinite(row.samples_per_s)
    assert row.cpu_cores > 0 and row.peak_pss_mib > 0


def test_the_two_threads_loop_is_measured():
    row = free_threading.measure_training_loop(2, steps=20)
    assert row.samples_per_s > 0 and row.workers == 2


if __name__ == "__main__":
    sys.exit(free_threading.main(sys.argv[1:]))
