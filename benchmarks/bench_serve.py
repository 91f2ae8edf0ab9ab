"""fastloop.serve: dynamic batching (max_batch=32) against max_batch=1 with 64 client
threads on 784-512-512-10 and 784-2048-2048-10 MLPs: throughput and p50/p99 latency, and the ratio (target >= 3x).

As a script: prints the tables.
    python benchmarks/bench_serve.py [--quick]
Under pytest: runs the quick suite and checks every row was measured (the ratio is recorded
in docs/serve.md, not asserted: a loaded test machine must not fail it).
"""

from __future__ import annotations

import math
import sys

from fastloop.bench import serve, targets
from fastloop.bench.report import format_table


def test_quick_serve_suite_measures_every_row():
    runs = serve.compare(quick=True)
    assert all(r.jobs > 0 and math.isfinite(r.p99_ms) for r in runs)
    results = serve.results(runs)
    assert all(math.isfinite(r.measured) and r.measured > 0 for r in results)


if __name__ == "__main__":
    runs = serve.compare(quick="--quick" in sys.argv)
    markdown = "--markdown" in sys.argv
    print(format_table(serve.HEADERS, [r.row() for r in runs], markdown=markdown))
    print()
    print(format_table(targets.HEADERS, targets.table_rows(serve.results(runs)), markdown=markdown))
