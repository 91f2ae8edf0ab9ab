"""A map-style dataset that records, in memory shared with forked worker processes, which
indices were fetched: what a test of prefetching (how far ahead the workers run) reads.

    from recording import RecordsFetches
    dataset = RecordsFetches(40, lambda i: np.float32(i))
"""

from __future__ import annotations

import mmap
from typing import Any, Callable

import numpy as np

__all__ = ["RecordsFetches"]


class RecordsFetches:
    """Marks each index it is asked for in memory shared with the worker processes;
    `sample(i)` makes the sample."""

    def __init__(self, n: int, sample: Callable[[int], Any]) -> None:
        self._map = mmap.mmap(-1, n)
        self.fetched = np.frombuffer(self._map, np.uint8)
        self._sample = sample

    def __len__(self) -> int:
        return len(self.fetched)

    def __getitem__(self, i: int) -> Any:
        self.fetched[i] = 1
        return self._sample(i)
