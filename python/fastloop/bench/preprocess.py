"""Threads vs processes for preprocessing: the same work done five ways, side by side.

Two workloads, each cut into small chunks (cache-sized, as when one sample is processed at
a time) and large chunks (as when whole batches are):

* normalize: uint8 HWC images -> float32 CHW, ``((x/255 - mean)/std).transpose``
* divide_by_max: ``x / x.max()`` on float64 (8M values in all, as in the seed experiment)

and five ways to run it, with 1 and 2 workers:

  serial numpy         one thread, the NumPy expression
  threads + numpy      N worker threads run the NumPy expression, results through a Queue
  threads + fastloop   N worker threads run the fastloop.ops kernel, results through a Queue
  processes + numpy    a multiprocessing Pool (started beforehand) maps the NumPy expression

Each way consumes its outputs as they arrive, as a training loop consumes batches.
  fastloop threads=N   one Python thread; the kernel splits each chunk over N C threads

Reported: time, speedup over serial numpy, and GB/s (input + output bytes) next to a memcpy
of the same size measured in the same run.

    $ python -m fastloop bench --quick
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

import fastloop

from .report import format_table, machine_summary, save_bar_plot
from .timing import best_times, gbps, memcpy_call

MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


# Module-level so that process pools can pickle them by name.
def normalize_numpy(x: np.ndarray) -> np.ndarray:
    """The NumPy expression the fastloop kernel replaces (the transpose is a view)."""
    return ((x.astype(np.float32) / 255 - MEAN) / STD).transpose(0, 3, 1, 2)


def normalize_fastloop(x: np.ndarray, threads: int = 1) -> np.ndarray:
    return fastloop.ops.normalize(x, MEAN, STD, layout="HWC->CHW", num_threads=threads)


def divide_by_max_numpy(x: np.ndarray) -> np.ndarray:
    return x / x.max()


def divide_by_max_fastloop(x: np.ndarray, threads: int = 1) -> np.ndarray:
    return fastloop.ops.divide_by_max(x, num_threads=threads)


@dataclass
class Workload:
    name: str
    numpy_fn: Callable[[np.ndarray], np.ndarray]
    fastloop_fn: Callable[..., np.ndarray]
    chunks: list[np.ndarray]
    chunking: str  # "small" or "large", with the chunk size spelled out

    @property
    def bytes_moved(self) -> int:
        out_itemsize = 4 if self.name == "normalize" else 8
        return sum(c.nbytes + c.size * out_itemsize for c in self.chunks)

    @property
    def chunk_output_bytes(self) -> int:
        return self.chunks[0].size * (4 if self.name == "normalize" else 8)


def make_workloads(quick: bool) -> list[Workload]:
    rng = np.random.default_rng(0)
    images = 32 if quick else 128
    values = (2 if quick else 8) << 20
    batch = rng.integers(0, 256, (images, 224, 224, 3), dtype=np.uint8)
    floats = rng.standard_normal(values)
    per_large = images // 4
    return [
        Workload("normalize", normalize_numpy, normalize_fastloop,
                 [batch[i : i + 1] for i in range(images)], "small: 1 image 224x224x3"),
        Workload("normalize", normalize_numpy, normalize_fastloop,
                 [batch[i : i + per_large] for i in range(0, images, per_large)], f"large: {per_large} images"),
        Workload("divide_by_max", divide_by_max_numpy, divide_by_max_fastloop,
                 list(floats.reshape(-1, 1 << 16)), "small: 64K float64"),
        Workload("divide_by_max", divide_by_max_numpy, divide_by_max_fastloop,
                 list(floats.reshape(4, -1)), f"large: {_count(values // 4)} float64"),
    ]


def _count(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"


def threaded(fn: Callable[[np.ndarray], np.ndarray], chunks: list[np.ndarray], workers: int):
    """Yields fn(chunk) for every chunk (in completion order, tagged with the chunk index),
    computed by `workers` threads that hand results over through a bounded fastloop.Queue:
    the shape of a data pipeline, like a process pool's workers -> pipe -> parent."""
    results: fastloop.Queue = fastloop.Queue(maxsize=2 * workers)

    def work(first: int) -> None:
        for i in range(first, len(chunks), workers):
            results.put((i, fn(chunks[i])))

    threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in range(workers)]
    for t in threads:
        t.start()
    for _ in chunks:
        yield results.get()
    for t in threads:
        t.join()


def variants(workload: Workload, workers: int, process_pool, keep: bool = False) -> dict[str, Callable[[], object]]:
    """The ways to run one workload with `workers` workers. Each consumes its outputs as
    they arrive, as a training loop does (so memory is reused, not page-faulted anew each
    round), or returns them all in chunk order with keep=True (to compare them)."""
    chunks, np_fn, fl_fn = workload.chunks, workload.numpy_fn, workload.fastloop_fn

    def drain(outputs, tagged: bool = False) -> list | None:
        if keep:
            results = list(outputs)
            return [r for _, r in sorted(results, key=lambda t: t[0])] if tagged else results
        for _ in outputs:
            pass
        return None

    return {
        "serial numpy": lambda: drain(np_fn(c) for c in chunks),
        "threads + numpy": lambda: drain(threaded(np_fn, chunks, workers), tagged=True),
        "threads + fastloop": lambda: drain(threaded(fl_fn, chunks, workers), tagged=True),
        "processes + numpy": lambda: drain(process_pool.imap(np_fn, chunks)),
        "fastloop threads=N": lambda: drain(fl_fn(c, workers) for c in chunks),
    }


@dataclass
class Row:
    workload: str
    chunking: str
    way: str
    workers: int
    seconds: float
    speedup: float
    gbps: float
    memcpy_gbps: float


def run(quick: bool = False, rounds: int | None = None, log: Callable[[str], None] = lambda _: None) -> list[Row]:
    """Measures every workload x way x worker count; returns the rows of the table."""
    rounds = rounds or (3 if quick else 5)
    rows: list[Row] = []
    context = multiprocessing.get_context("forkserver")
    pools = {w: context.Pool(w) for w in (1, 2)}
    try:
        for workload in make_workloads(quick):
            fns = {"memcpy": memcpy_call(workload.chunk_output_bytes)}
            for workers in (1, 2):
                for way, fn in variants(workload, workers, pools[workers]).items():
                    if not (way == "serial numpy" and workers == 2):  # one thread by definition
                        fns[f"{way}|{workers}"] = fn
            log(f"  {workload.name}, {workload.chunking}: {len(fns)} variants x {rounds} rounds")
            times = best_times(fns, rounds=rounds, min_round_s=0.02)
            copy_rate = gbps(2 * workload.chunk_output_bytes, times.pop("memcpy"))
            serial = times["serial numpy|1"]
            for key, seconds in times.items():
                way, workers = key.split("|")
                rows.append(Row(workload.name, workload.chunking, way, int(workers), seconds,
                                serial / seconds, gbps(workload.bytes_moved, seconds), copy_rate))
    finally:
        for pool in pools.values():
            pool.terminate()
            pool.join()
    return rows


def check_outputs_agree(quick: bool = True) -> None:
    """Every way computes the same values (what the timings are worth); raises otherwise."""
    context = multiprocessing.get_context("forkserver")
    with context.Pool(2) as pool:
        for workload in make_workloads(quick):
            results = {way: fn() for way, fn in variants(workload, 2, pool, keep=True).items()}
            reference = results.pop("serial numpy")
            for way, outputs in results.items():
                for got, want in zip(outputs, reference):
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{workload.name}: {way}")


HEADERS = ["workload", "chunks", "way", "workers", "ms", "x serial", "GB/s", "memcpy GB/s"]


def table_rows(rows: list[Row]) -> list[list[object]]:
    return [[r.workload, r.chunking, r.way, r.workers, r.seconds * 1e3, r.speedup, r.gbps, r.memcpy_gbps] for r in rows]


def verdict(rows: list[Row]) -> str:
    """The answer to "threads or processes?" for this machine, from the measured rows."""
    lines = []
    for (workload, chunking) in dict.fromkeys((r.workload, r.chunking) for r in rows):
        group = [r for r in rows if (r.workload, r.chunking) == (workload, chunking)]
        best = max(group, key=lambda r: r.speedup)
        procs = max((r for r in group if r.way == "processes + numpy"), key=lambda r: r.speedup)
        np_threads = max((r for r in group if r.way == "threads + numpy"), key=lambda r: r.speedup)
        lines.append(
            f"- {workload}, {chunking}: best is {best.way} x{best.workers} at {best.speedup:.1f}x serial numpy; "
            f"threads + numpy reach {np_threads.speedup:.2f}x, processes + numpy {procs.speedup:.2f}x."
        )
    return "\n".join(lines)


def save_plot(rows: list[Row], out_dir: str) -> str | None:
    """The speedup of every way over serial NumPy, as preprocess.png in out_dir."""
    groups: dict[str, dict[str, float]] = {}
    for r in sorted(rows, key=lambda r: (r.way, r.workers)):
        groups.setdefault(f"{r.workload}\n{r.chunking}", {})[f"{r.way} x{r.workers}"] = r.speedup
    return save_bar_plot(os.path.join(out_dir, "preprocess.png"),
                         "Speedup over serial NumPy (log scale; higher is better, below 1 is slower)",
                         groups, "x serial numpy", log=True)
