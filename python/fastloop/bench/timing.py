"""Timing helpers shared by the benchmark suites: best-of-N timing and a memcpy baseline.

Numbers on a shared or small machine are noisy, so every suite compares variants measured
in the same run (ratios) and keeps the best of several rounds, which is the least disturbed.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np


def best_time(fn: Callable[[], object], *, rounds: int = 5, min_round_s: float = 0.05) -> float:
    """Seconds per call of fn: the best of `rounds` rounds, each repeating fn for at least
    min_round_s (after one warm-up call).

    >>> best_time(lambda: sum(range(1000)))  # about 1e-05 on a laptop
    """
    fn()
    calls = 1
    while True:  # find a call count that fills a round
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_round_s:
            break
        calls *= 2
    best = elapsed / calls
    for _ in range(rounds - 1):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def memcpy_gbps(nbytes: int, *, rounds: int = 5) -> float:
    """Copy bandwidth in GB/s (bytes read + bytes written) for a buffer of nbytes, measured
    now with NumPy's copy (libc memcpy underneath).

    >>> memcpy_gbps(64 << 20)  # out of cache: main-memory bandwidth
    """
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    seconds = best_time(lambda: np.copyto(dst, src), rounds=rounds)
    return 2 * nbytes / seconds / 1e9


def gbps(nbytes: int, seconds: float) -> float:
    """nbytes moved in `seconds`, in GB/s."""
    return nbytes / seconds / 1e9
