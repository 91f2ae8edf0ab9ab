"""Monitor, metrics and checkpoint targets: scalar() cost vs torch's SummaryWriter, a
monitored training loop's slowdown, and the checkpoint stall vs a memcpy.

As a script: prints the table.
    python benchmarks/bench_logistics.py [--quick]
Under pytest: runs the quick suite and checks every row was measured (targets are read
from the table and recorded in BENCHMARKS.md, not asserted).
"""

from __future__ import annotations

import math
import sys
import warnings

from fastloop.bench import logistics, targets
from fastloop.bench.report import format_table


def test_quick_logistics_suite_measures_every_row():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        results = logistics.run(quick=True)
    assert len(results) >= 4
    # a row runs, or says why not (SummaryWriter's needs torch)
    assert all(math.isfinite(r.measured) if r.measured is not None else "torch" in r.detail for r in results)


if __name__ == "__main__":
    warnings.simplefilter("ignore", RuntimeWarning)
    print(format_table(targets.HEADERS, targets.table_rows(logistics.run(quick="--quick" in sys.argv))))
