"""Timing helpers shared by the benchmark suites: interleaved best-of-N timing and a memcpy
baseline.

Numbers on a shared or small machine are noisy, so every suite compares variants measured
in the same run (ratios) and keeps the best of several rounds, which is the least disturbed.
"""

from __future__ import annotations

import os
import resource
import time
from typing import Callable

import numpy as np


def best_times(fns: dict[str, Callable[[], object]], *, rounds: int = 5, min_round_s: float = 0.05) -> dict[str, float]:
    """Seconds per call of each function, measured interleaved: every round times each
    function once (repeated to last min_round_s), and each keeps its best round. Variants
    compared side by side thus see the same disturbances of a noisy machine.

    >>> best_times({"a": lambda: sorted(range(100)), "b": lambda: list(range(100))})
    """
    calls = {}
    for name, fn in fns.items():  # warm up and find a call count that fills a round
        fn()
        n = 1
        while True:
            start = time.perf_counter()
            for _ in range(n):
                fn()
            if time.perf_counter() - start >= min_round_s:
                break
            n *= 2
        calls[name] = n
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            n = calls[name]
            start = time.perf_counter()
            for _ in range(n):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / n)
    return best


def call_times(fns: dict[str, Callable[[], object]], *, rounds: int = 5, min_round_s: float = 0.05,
               min_calls: int = 10) -> dict[str, list[float]]:
    """Seconds of every single call of each function, measured interleaved as best_times
    does (each round calls each function for min_round_s, and at least min_calls calls in
    all), for statistics over calls: min(times) is the best call, never above the median.

    >>> times = call_times({"a": lambda: sorted(range(100))}); min(times["a"])
    """
    per_round = -(-min_calls // rounds)  # ceil
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():  # warm up
        fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            began = time.perf_counter()
            calls = 0
            while calls < per_round or time.perf_counter() - began < min_round_s:
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
                calls += 1
    return times


def paired_ratio(baseline: Callable[[], object], variant: Callable[[], object], *, pairs: int = 21) -> float:
    """Median of time(variant) / time(baseline) over `pairs` back-to-back pairs, their order
    alternating (A B, B A, ...) so that slow drifts cancel. For small overheads this is far
    steadier than comparing two best-of-N times: on the development VM an A/A comparison
    differs by up to 3% best-of-9, by 0.3% as a median of paired ratios.

    >>> paired_ratio(lambda: sum(range(10**5)), lambda: sum(range(10**5)))  # about 1.0
    """
    baseline()
    variant()
    ratios = []
    for i in range(pairs):
        order = (baseline, variant) if i % 2 == 0 else (variant, baseline)
        seconds = {}
        for fn in order:
            start = time.perf_counter()
            fn()
            seconds[fn] = time.perf_counter() - start
        ratios.append(seconds[variant] / seconds[baseline])
    ratios.sort()
    return ratios[len(ratios) // 2]


def memcpy_call(nbytes: int) -> Callable[[], object]:
    """A function that copies nbytes between two buffers of its own (to time with others)."""
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    return lambda: np.copyto(dst, src)


def gbps(nbytes: int, seconds: float) -> float:
    """nbytes moved in `seconds`, in GB/s."""
    return nbytes / seconds / 1e9


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) process pid has used so far, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker_pids(loader: object) -> list[int]:
    """The worker processes of a started fastloop.Loader or torch DataLoader."""
    if hasattr(loader, "worker_pids"):
        return list(loader.worker_pids)  # type: ignore[attr-defined]
    return [w.pid for w in loader._iterator._workers]  # type: ignore[attr-defined]  # torch: private, the only way


class LoaderCpu:
    """The CPU a loader's main process and its worker processes spend from here on.

        cpu = LoaderCpu(loader)       # once an epoch has started the workers
        for _ in loader: pass
        main_s, workers_s = cpu.spent()
    """

    def __init__(self, loader: object) -> None:
        self.pids = worker_pids(loader)
        self.main0, self.workers0 = cpu_s(os.getpid()), [cpu_s(p) for p in self.pids]

    def spent(self) -> tuple[float, float]:
        """CPU seconds since creation: (this process, the workers together)."""
        return cpu_s(os.getpid()) - self.main0, sum(cpu_s(p) - c for p, c in zip(self.pids, self.workers0))


def epochs_cpu_us(loader: object, epochs: int, samples: int) -> tuple[float, float]:
    """Iterates `epochs` epochs of a started loader of `samples` samples per epoch: the CPU
    microseconds per sample spent by this process and by the workers together."""
    cpu = LoaderCpu(loader)
    for _ in range(epochs):
        for _ in loader:  # type: ignore[attr-defined]
            pass
    main_s, workers_s = cpu.spent()
    seen = samples * epochs
    return 1e6 * main_s / seen, 1e6 * workers_s / seen


def tree_cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system, all threads) used by these processes and their live
    descendants, read from /proc (Linux); a process that ended meanwhile counts nothing."""
    total, seen, todo = 0.0, set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            total += cpu_s(pid)
            for task in os.listdir(f"/proc/{pid}/task"):  # children are listed by the thread that forked them
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo += [int(p) for p in f.read().split()]
        except OSError:
            continue
    return total


def process_cpu_s() -> float:
    """CPU seconds this process has used with all its children: its threads, the children
    alive now (torch DataLoader workers) and those already waited for."""
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return tree_cpu_s([os.getpid()]) + reaped.ru_utime + reaped.ru_stime
