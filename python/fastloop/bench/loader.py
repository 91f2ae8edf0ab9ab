"""fastloop.Loader against torch's DataLoader, side by side in one run, on the same data and
the same transform: 20,000 images 3x64x64 uint8 in memory, random crop 56 + horizontal flip +
normalize, batch 256, shuffled.

* torch DataLoader, num_workers 0, 1, 2, the transform written with torch ops per sample
* fastloop threads 1, 2 and processes 1, 2, the transform a C Pipeline
* a Python-transform dataset (the same transform per sample in NumPy): fastloop processes
  1, 2 vs torch workers 1, 2

Reported: samples/s over an epoch, the median time from constructing a loader to holding its
first batch (worker start-up included) over three fresh loaders, and the peak memory of the
whole process tree as PSS (shared pages split between processes), in total and above what the
process held before the loader was made. Each configuration runs in a fresh interpreter that
has imported torch (where installed), as a training script has.

    $ python benchmarks/bench_loader.py [--quick]     (or all suites: python -m fastloop bench)
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import fastloop
from fastloop.data.ops import Normalize, Pipeline, RandomCrop, RandomHFlip

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
CROP, BATCH = 56, 256


def make_data(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (n, 3, 64, 64), dtype=np.uint8), rng.integers(0, 1000, n, dtype=np.int64)


# ---- memory of a process tree ----


def _children(pid: int) -> list[int]:
    kids = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return kids


def _tree(root: int) -> list[int]:
    pids, stack = [], [root]
    while stack:
        pids.append(stack.pop())
        stack += _children(pids[-1])
    return pids


def _pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
    except (OSError, StopIteration):
        return 0


def tree_pss_bytes(root: int | None = None) -> int:
    """PSS of a process and all its descendants (Linux /proc), in bytes; 0 if unreadable.

    A reading that overlaps a fork counts the parent before it and the child after it, so
    the shared pages once in full and once halved: such readings (the set of processes
    changed while reading) are taken again."""
    root = root or os.getpid()
    for _ in range(10):
        pids = _tree(root)
        total = sum(_pss_bytes(pid) for pid in pids)
        if _tree(root) == pids:
            return total
    return total


class PeakPss:
    """Samples the PSS of this process tree every few milliseconds while active."""

    def __init__(self, every_s: float = 0.02) -> None:
        self.every_s, self.peak, self._stop = every_s, 0, threading.Event()

    def __enter__(self) -> "PeakPss":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_pss_bytes())
            self._stop.wait(self.every_s)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_pss_bytes())


# ---- the contenders ----


def numpy_transform(sample: tuple[np.ndarray, np.int64]) -> tuple[np.ndarray, np.int64]:
    """The transform per sample in NumPy: what a Python-transform dataset does."""
    image, label = sample
    top, left = np.random.randint(0, 64 - CROP + 1, 2)
    image = image[:, top:top + CROP, left:left + CROP]
    if np.random.random() < 0.5:
        image = image[:, :, ::-1]
    mean = np.asarray(MEAN, np.float32)[:, None, None]
    std = np.asarray(STD, np.float32)[:, None, None]
    return (image.astype(np.float32) / 255 - mean) / std, label


class NumpyDataset:
    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return numpy_transform((self.images[i], self.labels[i]))


def torch_dataset(images: np.ndarray, labels: np.ndarray, numpy_ops: bool):
    """A torch Dataset with the transform in torch ops (or in NumPy, for the Python case)."""
    import torch

    mean = torch.tensor(MEAN).view(3, 1, 1)
    std = torch.tensor(STD).view(3, 1, 1)
    x, y = torch.from_numpy(images), torch.from_numpy(labels)

    class TorchOps(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(y)

        def __getitem__(self, i: int):
            top, left = torch.randint(0, 64 - CROP + 1, (2,)).tolist()
            image = x[i, :, top:top + CROP, left:left + CROP]
            if torch.rand(()) < 0.5:
                image = image.flip(-1)
            return (image.float() / 255 - mean) / std, y[i]

    class NumpyOps(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(labels)

        def __getitem__(self, i: int):
            return numpy_transform((images[i], labels[i]))

    return NumpyOps() if numpy_ops else TorchOps()


class ThreadPoolLoader:
    """Batches of a map-style dataset fetched by Python threads (concurrent.futures): what
    "just use threads" gives per-sample Python code, for comparison with processes."""

    def __init__(self, dataset: Any, batch_size: int, workers: int, seed: int = 0) -> None:
        self.dataset, self.batch_size, self.workers = dataset, batch_size, workers
        self.rng = np.random.default_rng(seed)

    def __iter__(self) -> Any:
        from concurrent.futures import ThreadPoolExecutor

        order = self.rng.permutation(len(self.dataset))
        with ThreadPoolExecutor(self.workers) as pool:
            for start in range(0, len(order), self.batch_size):
                samples = list(pool.map(self.dataset.__getitem__, order[start:start + self.batch_size].tolist()))
                yield np.stack([s[0] for s in samples]), np.asarray([s[1] for s in samples])


@dataclass
class Row:
    dataset: str
    loader: str
    workers: int
    samples_per_s: float
    first_batch_s: float
    peak_pss_mib: float
    added_pss_mib: float  # peak minus the PSS just before the loader was made: the loader's own cost


def first_batch_s(make: Callable[[], Any]) -> float:
    """Seconds from constructing a loader to holding its first batch (worker start-up included)."""
    start = time.perf_counter()
    loader = make()
    batches = iter(loader)
    next(batches)
    elapsed = time.perf_counter() - start
    if hasattr(loader, "close"):
        loader.close()
    del batches, loader
    return elapsed


def measure(name: str, dataset: str, workers: int, make: Callable[[], Any], n: int, first_repeats: int = 3) -> Row:
    """One epoch: samples/s over the epoch and peak tree PSS; then the median time to the first
    batch over first_repeats fresh loaders (the first one in a process pays one-off costs)."""
    gc.collect()
    before = tree_pss_bytes()
    with PeakPss() as pss:
        start = time.perf_counter()
        loader = make()
        seen = 0
        for _, labels in loader:
            seen += len(labels)
        elapsed = time.perf_counter() - start
        if hasattr(loader, "close"):
            loader.close()
        del loader
    assert seen == n, f"{name}: {seen} samples, expected {n}"
    first = sorted(first_batch_s(make) for _ in range(first_repeats))[first_repeats // 2]
    return Row(dataset, name, workers, seen / elapsed, first, pss.peak / 2**20, (pss.peak - before) / 2**20)


C_OPS, PY = "arrays + C ops", "Python transform"
# (loader, dataset, workers): each measured in a fresh interpreter so that no run inherits
# another's heap, page cache warmth or leftover processes
CONFIGS = [("fastloop threads", C_OPS, 1), ("fastloop threads", C_OPS, 2),
           ("fastloop processes", C_OPS, 1), ("fastloop processes", C_OPS, 2),
           ("torch DataLoader", C_OPS, 0), ("torch DataLoader", C_OPS, 1), ("torch DataLoader", C_OPS, 2),
           ("fastloop processes", PY, 1), ("fastloop processes", PY, 2),
           ("torch DataLoader", PY, 1), ("torch DataLoader", PY, 2),
           ("Python threads", PY, 1), ("Python threads", PY, 2)]


def factory(loader: str, dataset: str, workers: int, images: np.ndarray, labels: np.ndarray) -> Callable[[], Any]:
    """A function that builds the loader of one configuration."""
    if loader == "torch DataLoader":
        import torch
        from torch.utils.data import DataLoader

        torch.set_num_threads(1)  # as in a worker; the in-process case gets one core too
        data = torch_dataset(images, labels, numpy_ops=dataset == PY)
        return lambda: DataLoader(data, BATCH, shuffle=True, num_workers=workers)
    if loader == "Python threads":
        return lambda: ThreadPoolLoader(NumpyDataset(images, labels), BATCH, workers)
    if dataset == PY:
        return lambda: fastloop.Loader(NumpyDataset(images, labels), BATCH, shuffle=True, num_workers=workers)
    aug = Pipeline([RandomCrop(CROP), RandomHFlip(), Normalize(MEAN, STD)], layout="CHW")
    mode = "threads" if loader == "fastloop threads" else "processes"
    return lambda: fastloop.Loader((images, labels), BATCH, shuffle=True, num_workers=workers, transform=aug, mode=mode)


def measure_config(index: int, n: int) -> Row:
    """Measures CONFIGS[index] in this process (the child side of run())."""
    if has_torch():
        import torch  # noqa: F401  every row pays torch's import, as in a training script

    images, labels = make_data(n)
    loader, dataset, workers = CONFIGS[index]
    return measure(loader, dataset, workers, factory(loader, dataset, workers, images, labels), n)


def has_torch() -> bool:
    return importlib.util.find_spec("torch") is not None


def run(quick: bool = False, log: Callable[[str], None] = lambda _: None) -> list[Row]:
    n = 4096 if quick else 20_000
    torch_ok = has_torch()
    if not torch_ok:
        log("  (torch not installed: pip install torch==2.13.0 for the torch rows)")
    rows: list[Row] = []
    for index, (loader, dataset, workers) in enumerate(CONFIGS):
        if loader.startswith("torch") and not torch_ok:
            continue
        child = subprocess.run([sys.executable, "-m", "fastloop.bench.loader", "--config", str(index), "--n", str(n)],
                               capture_output=True, text=True, check=False)
        if child.returncode != 0:
            raise RuntimeError(f"measuring {loader} x{workers} on {dataset} failed:\n{child.stderr[-4000:]}")
        rows.append(Row(**json.loads(child.stdout.strip().splitlines()[-1])))
        r = rows[-1]
        log(f"  {dataset:16s} {loader:18s} x{workers}: {r.samples_per_s:9.0f} samples/s, "
            f"first batch {r.first_batch_s * 1e3:7.1f} ms, peak PSS {r.peak_pss_mib:6.0f} MiB (+{r.added_pss_mib:.0f})")
    return rows


HEADERS = ["dataset", "loader", "workers", "samples/s", "first batch ms", "peak PSS MiB", "loader's PSS MiB"]


def table_rows(rows: list[Row]) -> list[list[object]]:
    return [[r.dataset, r.loader, r.workers, r.samples_per_s, r.first_batch_s * 1e3, r.peak_pss_mib, r.added_pss_mib]
            for r in rows]


def save_plot(rows: list[Row], out_dir: str) -> str | None:
    """Samples/s of every loader configuration, as loader.png in out_dir."""
    from .report import save_bar_plot

    groups: dict[str, dict[str, float]] = {}
    for r in rows:
        groups.setdefault(r.dataset, {})[f"{r.loader} x{r.workers}"] = r.samples_per_s
    return save_bar_plot(os.path.join(out_dir, "loader.png"), "Batches per second of each loader (samples/s, log scale)",
                         groups, "samples/s", log=True)


def summary(rows: list[Row]) -> list[str]:
    """The target ratios, as sentences."""
    lines = []

    def best(dataset: str, loader: str, workers: set[int] | None = None) -> Row | None:
        rs = [r for r in rows if r.dataset == dataset and r.loader == loader and (workers is None or r.workers in workers)]
        return max(rs, key=lambda r: r.samples_per_s) if rs else None

    c_ops, py = C_OPS, PY
    threads, torch_best = best(c_ops, "fastloop threads"), best(c_ops, "torch DataLoader")
    if rows and not any(r.loader == "torch DataLoader" for r in rows):
        lines.append("torch DataLoader rows: not run (torch is not installed)")
    if threads and torch_best:
        lines.append(f"fastloop threads {threads.samples_per_s:.0f}/s vs torch's best ({torch_best.workers} workers) "
                     f"{torch_best.samples_per_s:.0f}/s: {threads.samples_per_s / torch_best.samples_per_s:.1f}x (target >= 4x)")
        torch_workers = [r for r in rows if r.dataset == c_ops and r.loader == "torch DataLoader" and r.workers > 0]
        fastest_first = min(r.first_batch_s for r in rows if r.dataset == c_ops and r.loader.startswith("fastloop threads"))
        if torch_workers:
            ratio = fastest_first / min(r.first_batch_s for r in torch_workers)
            lines.append(f"time to first batch: fastloop threads {fastest_first * 1e3:.1f} ms vs torch with workers "
                         f"{min(r.first_batch_s for r in torch_workers) * 1e3:.0f} ms: {ratio:.3f} (target <= 0.1)")
    threads_py, processes_py = best(py, "Python threads"), best(py, "fastloop processes")
    if threads_py and processes_py:
        ratio = processes_py.samples_per_s / threads_py.samples_per_s
        lines.append(f"Python transform: fastloop processes {processes_py.samples_per_s:.0f}/s vs Python threads "
                     f"{threads_py.samples_per_s:.0f}/s ({ratio:.2f}x): "
                     + ("processes were faster here" if ratio > 1 else "threads were as fast or faster here"))
    for w in (1, 2):
        ours, theirs = best(py, "fastloop processes", {w}), best(py, "torch DataLoader", {w})
        if ours and theirs:
            lines.append(f"Python transform, {w} worker(s): fastloop processes {ours.samples_per_s:.0f}/s at "
                         f"{ours.peak_pss_mib:.0f} MiB (loader +{ours.added_pss_mib:.0f}) vs torch {theirs.samples_per_s:.0f}/s "
                         f"at {theirs.peak_pss_mib:.0f} MiB (+{theirs.added_pss_mib:.0f}) "
                         f"(target: >= torch's speed, lower PSS)")
    return lines


def main(argv: list[str] | None = None) -> int:
    import argparse

    from .report import print_suite

    parser = argparse.ArgumentParser(description="fastloop.Loader vs torch DataLoader, side by side")
    parser.add_argument("--quick", action="store_true", help="4,096 images instead of 20,000")
    parser.add_argument("--config", type=int, help=argparse.SUPPRESS)  # one measurement, in a child
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.config is not None:
        print(json.dumps(dataclasses.asdict(measure_config(args.config, args.n))))
        return 0
    return print_suite(sys.modules[__name__], "fastloop.Loader vs torch DataLoader", quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
