"""fastloop.nn's training step vs torch's on the CPU (MLP 784-512-512-10, batch 256,
cross-entropy, SGD and Adam), and the rate of a Python thread running beside it.

As a script: prints the table and the target ratios.
    python benchmarks/bench_model.py [--quick]
Under pytest: measures the quick suite and checks every row was measured (targets are read
from the table and recorded in BENCHMARKS.md, not asserted).
"""

from __future__ import annotations

import math
import sys

from fastloop.bench import model


def test_model_step_is_measured():
    rows = model.run(quick=True)
    assert rows and all(r.step_ms > 0 and math.isfinite(r.samples_per_s) for r in rows)
    assert all(r.python_thread_rate > 0 for r in rows if r.name.endswith("SGD"))


if __name__ == "__main__":
    sys.exit(model.main(sys.argv[1:]))
