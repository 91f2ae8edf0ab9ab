"""Threads or processes for Python code in a Loader, answered again now that free-threaded
CPython runs Python threads in parallel: the same datasets on a GIL build (3.11) and a
free-threaded one (3.13t), side by side in one run, each configuration in a fresh interpreter.

Datasets, each with its __getitem__ in Python:
  pure Python  parses a text record and computes its features in Python loops
  NumPy        normalizes and projects a 64x64 array (NumPy ops, a BLAS product)
  Pillow JPEG  decodes a JPEG with Pillow, resizes it, and flips it at random in Python
Loaders: fastloop.Loader in threads mode (1 and 2 workers) and processes mode (2 workers), and
torch's DataLoader (2 workers) where torch is installed. Then the question this project started
from: two Python threads running a pure-Python training-style loop, against one.

Reported: samples/s, CPU use (CPU seconds per second of the run, worker processes included)
and the peak PSS of the process tree.

    python benchmarks/bench_free_threading.py [--quick]
    FASTLOOP_BENCH_PYTHONS=python3.11:.venv-ft/bin/python python -m fastloop.bench.free_threading
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import resource
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import fastloop

from .loader import PeakPss, has_torch

BATCH = 32
PURE, NUMPY, PILLOW = "pure Python", "NumPy", "Pillow JPEG"
DATASETS = [PURE, NUMPY, PILLOW]
# (loader, workers); each measured per dataset and interpreter in a fresh interpreter
CONFIGS = [("fastloop threads", 1), ("fastloop threads", 2), ("fastloop processes", 2), ("torch DataLoader", 2)]
LOOP = "training loop"  # the dataset column of the two-threads question


def free_threaded() -> bool:
    """This interpreter runs Python threads in parallel (a free-threaded build, the GIL off)."""
    return not getattr(sys, "_is_gil_enabled", lambda: True)()


def interpreter_name() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}{'t' if free_threaded() else ''}"


def _sample_rng() -> np.random.Generator:
    """The sample's generator in a fastloop worker; a fresh one in torch's."""
    try:
        return fastloop.sample_rng()
    except RuntimeError:
        return np.random.default_rng()


# ---- the datasets ----


class PurePythonRecords:
    """Text records ("id;v0,v1,...") parsed and summarized in Python: arithmetic, no C."""

    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(0)
        values = rng.standard_normal((64, 96)).round(4)
        self.n = n
        self.lines = [f"{i};" + ",".join(str(v) for v in values[i % 64]) for i in range(64)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        key, _, text = self.lines[i % 64].partition(";")
        values = [float(v) for v in text.split(",")]
        mean = sum(values) / len(values)
        var = sum((v - mean) ** 2 for v in values) / len(values)
        features = [mean, var, max(values), min(values)]
        for lag in (1, 2, 3, 4):
            features.append(sum(a * b for a, b in zip(values, values[lag:])) / len(values))
        for _ in range(6):  # smoothing passes, as feature code does
            values = [(a + b) / 2 for a, b in zip(values, values[1:] + values[:1])]
        features += values[:8]
        return np.asarray(features, np.float32), int(key)


class NumpyArrays:
    """A 64x64 array normalized, clipped and projected in NumPy."""

    def __init__(self, n: int) -> None:
        rng = np.random.default_rng(1)
        self.n = n
        self.base = rng.standard_normal((16, 64, 64)).astype(np.float32)
        self.projection = rng.standard_normal((64, 16)).astype(np.float32)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        x = self.base[i % 16] * (1 + 0.001 * (i % 7))
        x = (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-6)
        x = np.clip(x, -2.5, 2.5)
        y = np.tanh(x @ self.projection)
        return (y.T @ y).astype(np.float32), i


class PillowJpegs:
    """JPEGs (ImageNet-sized, photograph-like) decoded with Pillow, resized to 128x128 and
    flipped at random (the sample's generator) in Python, as a torchvision-style dataset does."""

    def __init__(self, n: int) -> None:
        from .image_data import encode

        self.n = n
        self.jpegs = [encode(seed) for seed in range(16)]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        from PIL import Image

        with Image.open(io.BytesIO(self.jpegs[i % 16])) as image:
            image = image.convert("RGB").resize((128, 128), Image.BILINEAR)
        pixels = np.asarray(image)
        if _sample_rng().random() < 0.5:
            pixels = pixels[:, ::-1]
        return np.ascontiguousarray(pixels), i


def make_dataset(name: str, n: int) -> Any:
    return {PURE: PurePythonRecords, NUMPY: NumpyArrays, PILLOW: PillowJpegs}[name](n)


def torch_dataset(dataset: Any) -> Any:
    import torch.utils.data

    class Wrapped(torch.utils.data.Dataset):  # type: ignore[misc]
        def __len__(self) -> int:
            return len(dataset)

        def __getitem__(self, i: int) -> Any:
            return dataset[i]

    return Wrapped()


# ---- measuring ----


@dataclass
class Row:
    interpreter: str
    dataset: str
    loader: str
    workers: int
    samples_per_s: float
    cpu_cores: float  # CPU seconds per second of the run, worker processes included
    peak_pss_mib: float


def _cpu_seconds() -> float:
    """User + system CPU of this process and its reaped children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def make_loader(loader: str, workers: int, dataset: Any) -> Any:
    if loader == "torch DataLoader":
        import torch
        from torch.utils.data import DataLoader

        torch.set_num_threads(1)
        return DataLoader(torch_dataset(dataset), BATCH, shuffle=True, num_workers=workers)
    mode = "threads" if loader == "fastloop threads" else "processes"
    return fastloop.Loader(dataset, BATCH, shuffle=True, num_workers=workers, mode=mode, seed=0)


def measure_loader(dataset_name: str, loader: str, workers: int, n: int) -> Row:
    """One epoch of n samples: samples/s, CPU use and the process tree's peak PSS."""
    dataset = make_dataset(dataset_name, n)
    dataset[0]  # warm: imports and caches outside the timing
    with PeakPss() as pss:
        cpu, start = _cpu_seconds(), time.perf_counter()
        made = make_loader(loader, workers, dataset)
        seen = sum(len(labels) for _, labels in made)
        if hasattr(made, "close"):
            made.close()
        del made  # torch's workers end (and are reaped) here
        elapsed = time.perf_counter() - start
        cpu = _cpu_seconds() - cpu
    assert seen == n, f"{loader} gave {seen} samples of {n}"
    return Row(interpreter_name(), dataset_name, loader, workers, n / elapsed, cpu / elapsed, pss.peak / 2**20)


def training_step(weights: list[float], xs: list[list[float]], ys: list[float], lr: float) -> float:
    """One step of least squares on a tiny linear model, all in Python: the kind of code the
    GIL serializes."""
    grad = [0.0] * len(weights)
    loss = 0.0
    for x, y in zip(xs, ys):
        error = sum(w * v for w, v in zip(weights, x)) - y
        loss += error * error
        for k, v in enumerate(x):
            grad[k] += error * v
    for k in range(len(weights)):
        weights[k] -= lr * grad[k] / len(xs)
    return loss / len(xs)


def measure_training_loop(threads: int, steps: int) -> Row:
    """`threads` Python threads each training its own model on its own data for `steps` steps
    at once (objects one thread makes are cheapest for it to use in a free-threaded build)."""
    barrier = threading.Barrier(threads + 1)

    def train() -> None:
        rng = np.random.default_rng(2)
        xs = rng.standard_normal((32, 16)).tolist()
        ys = rng.standard_normal(32).tolist()
        weights = [0.0] * 16
        barrier.wait()
        for _ in range(steps):
            training_step(weights, xs, ys, 0.01)

    workers = [threading.Thread(target=train) for _ in range(threads)]
    for t in workers:
        t.start()
    with PeakPss() as pss:
        cpu, start = _cpu_seconds(), time.perf_counter()
        barrier.wait()
        for t in workers:
            t.join()
        elapsed = time.perf_counter() - start
        cpu = _cpu_seconds() - cpu
    return Row(interpreter_name(), LOOP, "Python threads", threads, threads * steps / elapsed, cpu / elapsed,
               pss.peak / 2**20)


# ---- running the matrix ----


def interpreters() -> list[str]:
    """The interpreters to compare: FASTLOOP_BENCH_PYTHONS (paths, os.pathsep between), else this
    one and the other of {a GIL build, a free-threaded build} found beside the checkout
    (.venv and .venv-ft, as make builds them)."""
    given = os.environ.get("FASTLOOP_BENCH_PYTHONS")
    if given:
        return [p for p in given.split(os.pathsep) if p]
    found = [sys.executable]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    for venv in (".venv", ".venv-ft"):
        other = os.path.join(root, venv, "bin", "python")
        if os.path.exists(other) and os.path.realpath(other) != os.path.realpath(sys.executable):
            found.append(other)
    return found


def _child(python: str, args: list[str]) -> Row:
    done = subprocess.run([python, "-m", "fastloop.bench.free_threading", *args], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{python} {' '.join(args)} failed:\n{done.stderr[-4000:]}")
    return Row(**json.loads(done.stdout.strip().splitlines()[-1]))


def _has(python: str, module: str) -> bool:
    probe = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    return subprocess.run([python, "-c", probe], check=False).returncode == 0


def _measurements(quick: bool) -> list[tuple[str, list[str]]]:
    """(python, a child's arguments) for every row, interpreter by interpreter."""
    sizes = {PURE: 4096, NUMPY: 8192, PILLOW: 512} if quick else {PURE: 32768, NUMPY: 65536, PILLOW: 4096}
    steps = 600 if quick else 4000
    plan = []
    for python in interpreters():
        torch_ok = _has(python, "torch")
        for dataset in DATASETS:
            for loader, workers in CONFIGS:
                if loader != "torch DataLoader" or torch_ok:
                    plan.append((python, ["--dataset", dataset, "--loader", loader, "--workers", str(workers),
                                          "--n", str(sizes[dataset])]))
        plan += [(python, ["--loop", str(threads), "--n", str(steps)]) for threads in (1, 2)]
    return plan


def run(quick: bool = False, log: Callable[[str], None] = lambda _: None, rounds: int | None = None) -> list[Row]:
    """Every row `rounds` times (3, 1 with quick), interleaved: round after round through all of
    them, each row keeping its fastest round, the one the machine disturbed least."""
    rounds = rounds or (1 if quick else 3)
    plan = _measurements(quick)
    for python in interpreters():
        if not _has(python, "torch"):
            log(f"  ({python}: torch is not installed there, no torch DataLoader rows)")
    best: list[Row | None] = [None] * len(plan)
    for round_ in range(rounds):
        for k, (python, args) in enumerate(plan):
            row = _child(python, args)
            if best[k] is None or row.samples_per_s > best[k].samples_per_s:  # type: ignore[union-attr]
                best[k] = row
            log(f"  round {round_ + 1}/{rounds} {row.interpreter:6s} {row.dataset:13s} {row.loader:18s} "
                f"x{row.workers}: {row.samples_per_s:8.0f}/s, {row.cpu_cores:4.2f} cores, "
                f"peak PSS {row.peak_pss_mib:5.0f} MiB")
    return [row for row in best if row is not None]


HEADERS = ["python", "dataset", "loader", "workers", "samples/s", "CPU cores", "peak PSS MiB"]


def table_rows(rows: list[Row]) -> list[list[object]]:
    return [[r.interpreter, r.dataset, r.loader, r.workers, r.samples_per_s, r.cpu_cores, r.peak_pss_mib]
            for r in rows]


def _find(rows: list[Row], interpreter: str, dataset: str, loader: str, workers: int) -> Row | None:
    return next((r for r in rows if (r.interpreter, r.dataset, r.loader, r.workers) ==
                 (interpreter, dataset, loader, workers)), None)


def summary(rows: list[Row]) -> list[str]:
    """The targets and the answer: which mode to use on which interpreter, per dataset."""
    lines = []
    for interpreter in dict.fromkeys(r.interpreter for r in rows):
        loop1, loop2 = (_find(rows, interpreter, LOOP, "Python threads", k) for k in (1, 2))
        if loop1 and loop2:
            lines.append(f"{interpreter}: two Python threads run a pure-Python training loop at "
                         f"{loop2.samples_per_s / loop1.samples_per_s:.2f}x one thread")
        for dataset in DATASETS:
            one, two = (_find(rows, interpreter, dataset, "fastloop threads", k) for k in (1, 2))
            procs = _find(rows, interpreter, dataset, "fastloop processes", 2)
            torch = _find(rows, interpreter, dataset, "torch DataLoader", 2)
            if not (one and two and procs):
                continue
            line = (f"{interpreter} {dataset}: threads x2 {two.samples_per_s / one.samples_per_s:.2f}x threads x1; "
                    f"{two.samples_per_s / procs.samples_per_s:.2f}x processes x2 at {two.peak_pss_mib:.0f} vs "
                    f"{procs.peak_pss_mib:.0f} MiB")
            if torch:
                line += f"; {two.samples_per_s / torch.samples_per_s:.2f}x torch DataLoader x2"
            ratio = two.samples_per_s / procs.samples_per_s
            line += (" -> use threads" + (" (as fast within 5%, less memory, no fork)" if ratio < 1 else "")
                     if ratio >= 0.95 else " -> use processes")
            lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> int:
    import argparse

    from .report import print_suite

    parser = argparse.ArgumentParser(description="Loader threads vs processes on a GIL and a free-threaded CPython")
    parser.add_argument("--quick", action="store_true", help="fewer samples (about a minute per interpreter)")
    parser.add_argument("--dataset", help=argparse.SUPPRESS)  # one measurement, in a child
    parser.add_argument("--loader", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--loop", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loop is not None:
        print(json.dumps(dataclasses.asdict(measure_training_loop(args.loop, args.n))))
        return 0
    if args.dataset is not None:
        print(json.dumps(dataclasses.asdict(measure_loader(args.dataset, args.loader, args.workers, args.n))))
        return 0
    return print_suite(sys.modules[__name__], "Loader threads vs processes, GIL and free-threaded", quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
