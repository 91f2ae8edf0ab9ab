"""GPU benchmark: fastloop's CUDA paths side by side with their yardsticks, in one run.

    python benchmarks/bench_gpu.py [--quick]

Rows (each measured in its own try, so one failure does not hide the others):
  train step   MLP 784-512-512-10, batch 256, cross-entropy, SGD lr 0.01: fastloop.nn on
               cuda vs torch on cuda (samples/s; target >= 0.8x torch)
  h2d copy     a pinned uint8 batch 256x224x224x3 copied with to_device on a Stream (the
               copy preprocess queues) vs cudaMemcpyAsync from cudaMallocHost memory
               (memcpy_benchmark) in the same run (GB/s; target >= 0.8x)
  preprocess   that batch through fastloop.cuda.preprocess (copy + normalize + HWC->CHW)
               (images/s, and its input GB/s against the same memcpy yardstick)
Under pytest: runs the quick version where a GPU exists (skipped elsewhere) and checks the
table is filled; no timing assertions (the numbers go to BENCHMARKS.md).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

import fastloop
from fastloop import cuda

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@dataclass
class Row:
    name: str
    unit: str
    fastloop: float | None = None
    reference: float | None = None
    reference_name: str = ""
    target: float | None = None  # the ratio fastloop / reference to reach
    error: str = ""

    @property
    def ratio(self) -> float | None:
        if self.fastloop is None or not self.reference:
            return None
        return self.fastloop / self.reference


def _rate(work: Callable[[], None], sync: Callable[[], None], repeats: int) -> float:
    """Calls per second of work(), after one warm-up call, over `repeats` calls."""
    work()
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        work()
    sync()
    return repeats / (time.perf_counter() - start)


def train_step_row(quick: bool) -> Row:
    row = Row("train step MLP 784-512-512-10, batch 256", "samples/s", reference_name="torch cuda", target=0.8)
    steps = 20 if quick else 300
    rng = np.random.default_rng(0)
    x_host = rng.standard_normal((256, 784)).astype(np.float32)
    y_host = rng.integers(0, 10, 256).astype(np.int64)
    try:
        nn = fastloop.nn
        model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10),
                              device="cuda")
        opt = nn.SGD(model, lr=0.01)
        x, y = cuda.to_device(x_host), cuda.to_device(y_host)
        for _ in range(5):
            model.train_step(x, y, loss="cross_entropy", opt=opt)
        row.fastloop = 256 * _rate(lambda: model.train_step(x, y, loss="cross_entropy", opt=opt), lambda: None, steps)
    except Exception as error:  # the row says what failed; the others still run
        row.error = f"fastloop: {type(error).__name__}: {error}"
    try:
        row.reference = 256 * _torch_train_rate(x_host, y_host, steps)
    except Exception as error:
        row.error += f" torch: {type(error).__name__}: {error}"
    return row


def _torch_train_rate(x_host: np.ndarray, y_host: np.ndarray, steps: int) -> float:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = torch.from_numpy(x_host).cuda(), torch.from_numpy(y_host).cuda()

    def step() -> None:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        loss.item()  # fastloop's train_step returns the loss as a float each step too

    for _ in range(5):
        step()
    return _rate(step, torch.cuda.synchronize, steps)


def _pinned_batch() -> tuple[np.ndarray, object]:
    batch = np.random.default_rng(1).integers(0, 256, (256, 224, 224, 3), dtype=np.uint8)
    return batch, cuda.pin(batch)


def copy_rows(quick: bool) -> list[Row]:
    repeats = 5 if quick else 40
    copy = Row("h2d copy of a pinned 256x224x224x3 uint8 batch", "GB/s", reference_name="cudaMemcpyAsync pinned",
               target=0.8)
    pre = Row("preprocess 256x224x224x3 uint8 -> float32 CHW", "images/s")
    pre_gbps = Row("preprocess input rate", "GB/s", reference_name="cudaMemcpyAsync pinned", target=0.8)
    rows = [copy, pre, pre_gbps]
    try:
        batch, region = _pinned_batch()
    except Exception as error:
        for row in rows:
            row.error = f"pin: {type(error).__name__}: {error}"
        return rows
    with region:
        try:
            yardstick = cuda.memcpy_benchmark(batch.nbytes, pinned=True, repeats=repeats)
            copy.reference = pre_gbps.reference = yardstick
        except Exception as error:
            copy.error = pre_gbps.error = f"memcpy_benchmark: {type(error).__name__}: {error}"
        stream = cuda.Stream()
        try:
            out = cuda.empty(batch.shape, np.uint8)
            calls = _rate(lambda: cuda.to_device(batch, stream=stream, out=out), stream.synchronize, repeats)
            copy.fastloop = calls * batch.nbytes / 1e9
        except Exception as error:
            copy.error += f" to_device: {type(error).__name__}: {error}"
        try:
            out = cuda.empty((256, 3, 224, 224), np.float32)
            calls = _rate(lambda: cuda.preprocess(batch, mean=MEAN, std=STD, out=out, stream=stream),
                          stream.synchronize, repeats)
            pre.fastloop = 256 * calls
            pre_gbps.fastloop = calls * batch.nbytes / 1e9
        except Exception as error:
            pre.error = pre_gbps.error = f"preprocess: {type(error).__name__}: {error}"
        stream.synchronize()
    return rows


def run(quick: bool = False) -> list[Row]:
    rows = [train_step_row(quick)]
    rows += copy_rows(quick)
    return rows


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}" if value >= 10 else f"{value:.3g}"


def table(rows: list[Row]) -> str:
    lines = ["| what | unit | fastloop | reference | fastloop / reference | target | note |",
             "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        target = "-" if r.target is None else f">= {r.target}x"
        reference = f"{_fmt(r.reference)} ({r.reference_name})" if r.reference_name else _fmt(r.reference)
        lines.append(f"| {r.name} | {r.unit} | {_fmt(r.fastloop)} | {reference} | {ratio} | {target} | {r.error} |")
    return "\n".join(lines)


def main(quick: bool = False) -> int:
    answer = cuda.is_available()
    if not answer:
        print(f"no GPU benchmark: {answer.reason}")
        return 1
    print(f"GPU: {answer.reason}")
    print(table(run(quick)))
    return 0


@pytest.mark.skipif(not cuda.is_available(), reason=f"no usable GPU: {cuda.is_available().reason}")
def test_quick_gpu_benchmark_fills_every_row():
    rows = run(quick=True)
    assert len(rows) == 4
    for row in rows[1:]:  # the copy and preprocess rows are fastloop.cuda's alone
        assert row.fastloop and row.fastloop > 0, row.error
    assert table(rows).count("\n") == len(rows) + 1


if __name__ == "__main__":
    sys.exit(main(quick="--quick" in sys.argv))
