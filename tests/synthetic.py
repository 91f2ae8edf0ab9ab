"""Synthetic inputs several test files share: datasets whose samples a test can predict, and
images that compress like photographs.

    from synthetic import IndexDataset, Samples, natural_image
    IndexDataset(600)[7] == 7
    Samples(10, lambda i: np.full(3, i))[2]     # make(2)
    natural_image(120, 100, seed=20)            # (120, 100, 3) uint8
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np


class IndexDataset:
    """Sample i is the number i: lets a test see exactly which samples came."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.int64:
        return np.int64(i)


class Samples:
    """A map-style dataset of make(i) for i < n."""

    def __init__(self, n: int, make: Callable[[int], Any]) -> None:
        self.n, self.make = n, make

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.make(i)


def natural_image(h: int, w: int, seed: int) -> np.ndarray:
    """An (h, w, 3) uint8 image of smooth gradients plus noise: JPEG sizes and decode paths
    behave as on a photograph, unlike on flat or random pixels."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) * 127 // max(h + w - 2, 1)], -1)
    return np.clip(base + rng.normal(0, 10, base.shape), 0, 255).astype(np.uint8)
