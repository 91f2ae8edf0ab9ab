"""fastloop.serve with a torch nn.Module: dynamic batching (max_batch=32) against max_batch=1
with 64 client threads on 784-2048-2048-10 and 784-4096-4096-10 torch MLPs under
inference_mode: throughput, p50/p99 latency and the ratio (target >= 3x).

As a script: prints the tables.
    python benchmarks/bench_serve_torch.py [--quick] [--markdown]
Under pytest: runs the quick suite and checks every row was measured (the ratio is recorded
in BENCHMARKS.md, not asserted: a loaded test machine must not fail it).
"""

from __future__ import annotations

import math
import sys

import pytest

from fastloop.bench import serve_torch, targets
from fastloop.bench.report import format_table


def test_quick_torch_serve_suite_measures_every_row():
    pytest.importorskip("torch")
    runs = serve_torch.compare(quick=True)
    assert all(r.jobs > 0 and math.isfinite(r.p99_ms) for r in runs)
    results = serve_torch.results(runs, serve_torch.alone_all(quick=True))
    assert all(math.isfinite(r.measured) and r.measured > 0 for r in results)


if __name__ == "__main__":
    runs = serve_torch.compare(quick="--quick" in sys.argv)
    markdown = "--markdown" in sys.argv
    print(format_table(serve_torch.HEADERS, [serve_torch.row(r) for r in runs], markdown=markdown))
    print()
    alone = serve_torch.alone_all(quick="--quick" in sys.argv)
    print(format_table(targets.HEADERS, targets.table_rows(serve_torch.results(runs, alone)), markdown=markdown))
