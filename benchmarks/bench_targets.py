"""The foundation's speed targets, measured side by side in one run (ratios).

As a script: prints the table (value, target, met).
    python benchmarks/bench_targets.py [--quick]
Under pytest: runs the quick suite and checks its bookkeeping (nothing lost by the queue,
every row measured); whether targets are met is read from the table, not asserted.
"""

from __future__ import annotations

import sys

from fastloop.bench import targets


def test_quick_targets_run_and_lose_no_queue_items():
    results = targets.run(quick=True)
    assert len(results) == 13
    assert all(r.measured > 0 for r in results)
    assert all("LOST" not in r.detail for r in results)


if __name__ == "__main__":
    results = targets.main(quick="--quick" in sys.argv)
    sys.exit(0)
