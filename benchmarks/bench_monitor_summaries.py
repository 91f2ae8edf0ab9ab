"""What a histogram, an image and a text record cost the training thread: fastloop.Monitor
(copy + queue; binning and PNG encoding happen on the C writer thread) against torch's
SummaryWriter (add_histogram/add_image/add_text encode in the calling thread), side by side
in one run, best of interleaved rounds.

As a script: prints the table (python benchmarks/bench_monitor_summaries.py [--quick]).
Under pytest: runs the quick size and checks every row was measured.
"""

from __future__ import annotations

import math
import sys
import tempfile
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensorboard")

import fastloop  # noqa: E402
from fastloop.bench.report import format_table  # noqa: E402
from fastloop.bench.targets import HEADERS, Result, table_rows  # noqa: E402


def best_call_s(call, rounds: int, calls: int, between=lambda: None) -> float:
    best = math.inf
    for _ in range(rounds):
        start = time.perf_counter()
        for i in range(calls):
            call(i)
        best = min(best, (time.perf_counter() - start) / calls)
        between()
    return best


def measure(quick: bool) -> list[Result]:
    from torch.utils.tensorboard import SummaryWriter

    rng = np.random.default_rng(0)
    weights = torch.from_numpy(rng.standard_normal(250_000 if quick else 1_000_000).astype(np.float32))
    image = torch.from_numpy(rng.random((3, 224, 224)).astype(np.float32))
    text = "lr=1e-3, batch=256, " * 20
    rounds, calls = (3, 5) if quick else (5, 20)
    with tempfile.TemporaryDirectory() as tmp:
        writer = SummaryWriter(f"{tmp}/torch")
        mon = fastloop.Monitor(interval_s=0, gpu=False, sinks=[fastloop.TensorBoardSink(f"{tmp}/fl")])
        drain = lambda: mon.flush()  # noqa: E731  untimed: the writer catches up between rounds
        cases = {
            "histogram": (lambda i: mon.histogram("w", weights, i, bins=30),
                          lambda i: writer.add_histogram("w", weights, i, bins=30)),
            "image 3x224x224 float": (lambda i: mon.image("x", image, i), lambda i: writer.add_image("x", image, i)),
            "text": (lambda i: mon.text("t", text, i), lambda i: writer.add_text("t", text, i)),
        }
        results = []
        for name, (ours, theirs) in cases.items():
            ours_s = best_call_s(ours, rounds, calls, drain)
            theirs_s = best_call_s(theirs, rounds, calls, writer.flush)
            results.append(Result(f"SummaryWriter / Monitor, {name}: cost to the caller", theirs_s / ours_s,
                                  "x", "(reference)", None,
                                  f"{theirs_s * 1e6:.0f} us vs {ours_s * 1e6:.0f} us"))
        mon.close()
        writer.close()
    return results


def test_quick_monitor_summary_suite_measures_every_row():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = measure(quick=True)
    assert len(results) == 3 and all(math.isfinite(r.measured) for r in results)


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    print(format_table(HEADERS, table_rows(measure(quick="--quick" in sys.argv))))
