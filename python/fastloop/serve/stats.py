"""Counters of an InferenceService: jobs by outcome, batch sizes, latencies.

    >>> s = ServiceStats(); s.count("submitted"); s.batch(8); s.latency(0.004)
    >>> s.snapshot()["latency_s"]["p50"]
    0.004
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import numpy as np

__all__ = ["ServiceStats"]

COUNTERS = ("submitted", "done", "failed", "cancelled", "rejected", "expired", "requeued_at_start",
            "failed_at_start", "submits_adopted", "listener_errors", "store_errors", "deadline_exceeded",
            "workers_stuck", "in_doubt_removed")


class ServiceStats:
    """Thread-safe counters; latencies (submit to finish) of the last `window` done jobs."""

    def __init__(self, window: int = 10000) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._batch_sizes: collections.Counter[int] = collections.Counter()
        self._latencies: collections.deque[float] = collections.deque(maxlen=window)

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def batch(self, size: int) -> None:
        with self._lock:
            self._batch_sizes[size] += 1

    def latency(self, seconds: float) -> None:
        with self._lock:
            self._latencies.append(seconds)

    def done(self, seconds: float) -> None:
        """count("done") and latency(seconds) under one hold of the lock (once per job)."""
        with self._lock:
            self._counts["done"] += 1
            self._latencies.append(seconds)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            counts = dict(self._counts)
            sizes = dict(sorted(self._batch_sizes.items()))
            latencies = np.array(self._latencies, dtype=np.float64)
        batches = sum(sizes.values())
        counts["batches"] = batches
        counts["batch_sizes"] = sizes
        counts["mean_batch_size"] = sum(k * v for k, v in sizes.items()) / batches if batches else 0.0
        if latencies.size:
            p50, p90, p99 = np.percentile(latencies, [50, 90, 99])
            counts["latency_s"] = {"p50": float(p50), "p90": float(p90), "p99": float(p99),
                                    "max": float(latencies.max()), "samples": int(latencies.size)}
        else:
            counts["latency_s"] = {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0, "samples": 0}
        return counts
