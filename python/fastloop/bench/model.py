"""The model core vs torch on the CPU: one training step of an MLP 784-512-512-10, batch 256,
cross-entropy, SGD (the issue's anchor), and how fast a Python thread runs while another
thread trains (proof that the step releases the GIL).

    >>> from fastloop.bench import model
    >>> rows = model.run(quick=True)
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import nn
from .timing import call_times

SIZES = (784, 512, 512, 10)
BATCH = 256


@dataclass
class Row:
    name: str
    step_ms: float  # the fastest single step
    median_ms: float  # the median single step (of the same steps)
    samples_per_s: float
    python_thread_rate: float | None = None  # a counting thread's rate while this trains, vs idle
    shared_step_rate: float | None = None  # this training loop's rate beside the counting thread, vs alone


def has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def fastloop_step(optimizer: str = "sgd") -> Callable[[], float]:
    nn.manual_seed(0)
    layers = [nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)]
    model = nn.Sequential(*layers)
    opt = nn.SGD(model, lr=0.01) if optimizer == "sgd" else nn.Adam(model, lr=1e-3)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, 784), dtype=np.float32)
    y = rng.integers(0, 10, BATCH)
    return lambda: model.train_step(x, y, loss="cross_entropy", opt=opt)


def torch_step(optimizer: str = "sgd") -> Callable[[], float]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01) if optimizer == "sgd" else torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(BATCH, 784)
    y = torch.randint(0, 10, (BATCH,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> float:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def counting_rate(seconds: float, background: Callable[[], object] | None) -> tuple[float, float]:
    """Counts per second of a pure-Python loop in this thread while `background` runs in a
    loop in another thread (None: idle), and the background's calls per second meanwhile."""
    stop = threading.Event()
    calls = [0, 0.0]  # calls made, and when counting started

    def loop() -> None:
        while not stop.is_set():
            background()  # type: ignore[misc]
            calls[0] += 1

    worker = threading.Thread(target=loop, daemon=True) if background else None
    if worker:
        worker.start()
        time.sleep(0.05)
    count, start = 0, time.perf_counter()
    first_call = calls[0]
    deadline = start + seconds
    while True:
        for _ in range(1000):
            count += 1
        if time.perf_counter() >= deadline:
            break
    elapsed = time.perf_counter() - start
    background_calls = calls[0] - first_call
    stop.set()
    if worker:
        worker.join()
    return count / elapsed, background_calls / elapsed


def run(quick: bool = False, log: Callable[[str], None] = lambda _: None) -> list[Row]:
    steps: dict[str, Callable[[], object]] = {"fastloop.nn SGD": fastloop_step("sgd"), "fastloop.nn Adam": fastloop_step("adam")}
    if has_torch():
        steps["torch SGD"] = torch_step("sgd")
        steps["torch Adam"] = torch_step("adam")
    log(f"timing {len(steps)} training steps interleaved ...")
    times = call_times(steps, rounds=3 if quick else 7, min_round_s=0.1 if quick else 0.3,
                       min_calls=10 if quick else 40)
    rows = []
    for name in steps:
        best, median = min(times[name]), statistics.median(times[name])
        rows.append(Row(name, best * 1e3, median * 1e3, BATCH / best))
    seconds = 0.5 if quick else 2.0
    idle, _ = counting_rate(seconds, None)
    for row in rows:
        if row.name.endswith("SGD"):
            python_rate, steps_per_s = counting_rate(seconds, steps[row.name])
            row.python_thread_rate = python_rate / idle
            row.shared_step_rate = steps_per_s * row.median_ms / 1e3
            log(f"{row.name}: a Python thread runs at {row.python_thread_rate:.0%} of its idle rate, "
                f"training at {row.shared_step_rate:.0%} of its own")
    return rows


HEADERS = ["train step (MLP 784-512-512-10, batch 256, CE)", "ms/step (best)", "ms/step (median)", "samples/s",
           "beside a Python thread: thread's rate / training's rate"]


def table_rows(rows: list[Row]) -> list[list[object]]:
    return [[r.name, f"{r.step_ms:.2f}", f"{r.median_ms:.2f}", f"{r.samples_per_s:.0f}",
             "" if r.python_thread_rate is None else f"{r.python_thread_rate:.0%} / {r.shared_step_rate:.0%}"] for r in rows]


def summary(rows: list[Row]) -> list[str]:
    by_name = {r.name: r for r in rows}
    lines = []
    if rows and not any(r.name.startswith("torch") for r in rows):
        lines.append("torch SGD, torch Adam: not run (torch is not installed)")
    for opt in ("SGD", "Adam"):
        ours, theirs = by_name.get(f"fastloop.nn {opt}"), by_name.get(f"torch {opt}")
        if ours and theirs:
            target = " (target <= 1.2x)" if opt == "SGD" else ""
            lines.append(f"{opt} step: fastloop.nn {ours.step_ms:.2f} ms vs torch {theirs.step_ms:.2f} ms: "
                         f"{ours.step_ms / theirs.step_ms:.2f}x torch's time{target}")
    for name in ("fastloop.nn SGD", "torch SGD"):
        row = by_name.get(name)
        if row and row.python_thread_rate is not None:
            target = " (target >= 30%)" if name.startswith("fastloop") else ""
            lines.append(f"a Python thread beside {name}'s training loop runs at {row.python_thread_rate:.0%} of its "
                         f"idle rate{target}, while the training runs at {row.shared_step_rate:.0%} of its own rate")
    return lines


def main(argv: list[str] | None = None) -> int:
    import argparse

    from .report import print_suite

    parser = argparse.ArgumentParser(description="fastloop.nn train step vs torch on the CPU")
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args(argv)
    return print_suite(sys.modules[__name__], f"fastloop.nn (BLAS: {nn.blas_info()}) vs torch", quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
