"""Threads vs processes on preprocessing (the seed experiment, done properly).

As a script: prints the table and the verdict, saves bench-results/preprocess.{png,md}.
    python benchmarks/bench_preprocess.py [--quick]
Under pytest: checks that every way computes the same values and that the quick run
produces a full table (no timing assertions: the numbers go to BENCHMARKS.md).
"""

from __future__ import annotations

import sys

from fastloop.bench import preprocess


def test_every_way_computes_the_same_values():
    preprocess.check_outputs_agree(quick=True)


def test_quick_run_fills_the_table():
    rows = preprocess.run(quick=True, rounds=1)
    ways = {r.way for r in rows}
    assert ways == {"serial numpy", "threads + numpy", "threads + fastloop", "processes + numpy", "fastloop threads=N"}
    assert len(rows) == 4 * 9  # 4 workloads x (1 serial + 4 ways x 2 worker counts)
    assert all(r.seconds > 0 and r.gbps > 0 and r.memcpy_gbps > 0 for r in rows)


if __name__ == "__main__":
    sys.exit(preprocess.main(quick="--quick" in sys.argv))
