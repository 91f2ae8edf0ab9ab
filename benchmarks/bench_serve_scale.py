"""fastloop.serve scaled out: 2 server processes vs 1 on one port, share-nothing (each its own
queue in memory) and on the queue in Redis (the front-bound small MLP over HTTP; target
>= 1.6x on 2 cores, p99 stated), and a second "host"
(server process on its own port) when the model's cost is a GIL-free device wait (target: it
adds >= 0.8x of one host's jobs/s). fastloop.bench.serve_scale says what is measured.

As a script: prints the tables and the command.
    python benchmarks/bench_serve_scale.py [--quick] [--markdown]
Under pytest: runs the quick suite and checks every row was measured (the targets are
reported, not asserted: a loaded test machine must not fail them). Skipped without uvicorn,
redis-py or redis-server.
"""

from __future__ import annotations

import math
import shutil
import sys

import pytest

from fastloop.bench import targets
from fastloop.bench.report import format_table, machine_summary


def test_quick_scale_suite_measures_every_row():
    pytest.importorskip("uvicorn")
    pytest.importorskip("redis")
    if shutil.which("redis-server") is None:
        pytest.skip("the redis-server binary is not installed")
    from fastloop.bench import serve_scale

    runs = serve_scale.compare(quick=True)
    assert len(runs) == 7 and all(r.jobs > 0 and math.isfinite(r.p99_ms) for r in runs)
    assert all(math.isfinite(r.measured) for r in serve_scale.results(runs))


if __name__ == "__main__":
    from fastloop.bench import serve_scale

    quick = "--quick" in sys.argv
    markdown = "--markdown" in sys.argv
    runs = serve_scale.compare(quick=quick)
    print(format_table(serve_scale.HEADERS, [r.row() for r in runs], markdown=markdown))
    print()
    print(format_table(targets.HEADERS, targets.table_rows(serve_scale.results(runs)), markdown=markdown))
    print(f"command: {serve_scale.COMMAND}{' --quick' if quick else ''}; {machine_summary()}")
