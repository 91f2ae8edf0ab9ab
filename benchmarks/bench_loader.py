"""fastloop.Loader (threads and processes) vs torch's DataLoader: samples/s, time to the
first batch and peak PSS of the process tree, each configuration in a fresh interpreter.

As a script: prints the table and the target ratios.
    python benchmarks/bench_loader.py [--quick]
Under pytest: runs one fastloop configuration of the quick suite and checks it was measured
(targets are read from the table and recorded in BENCHMARKS.md, not asserted).
"""

from __future__ import annotations

import math
import sys

from fastloop.bench import loader


def test_one_loader_configuration_is_measured():
    row = loader.measure_config(loader.CONFIGS.index(("fastloop threads", loader.C_OPS, 2)), n=2048)
    assert row.samples_per_s > 0 and math.isfinite(row.samples_per_s)
    assert 0 < row.first_batch_s < 60
    assert row.peak_pss_mib > 0


if __name__ == "__main__":
    sys.exit(loader.main(sys.argv[1:]))
