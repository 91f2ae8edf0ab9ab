"""The demo's embedded datasets, generated in a second from a seed (nothing to download),
and written once as JPEG files in ImageFolder layout into a cache folder.

Images: each class is a smooth random colour pattern (a prototype); a sample is its class's
prototype shifted by a few pixels, with random contrast, brightness and pixel noise, as
uint8 CHW. An MLP learns it to high accuracy in a few epochs, and the crop + flip
augmentations of the demo's pipeline matter. Regression: the seed's Linear(10, 1) problem.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np

from .._cache import cache_root

IMAGE_SHAPE = (3, 32, 32)
CLASSES = 10
SHARED = 0.85  # how much of every image is the common pattern
NOISE = 0.3  # pixel noise, in units of the full range


def _prototypes(rng: np.random.Generator) -> np.ndarray:
    """CLASSES smooth patterns in [0, 1], shape (CLASSES, 3, 40, 40): sums of a few low
    frequencies, so shifted crops of one class still look alike."""
    size = IMAGE_SHAPE[1] + 8
    grid = np.linspace(0.0, 2 * np.pi, size, endpoint=False)
    yy, xx = np.meshgrid(grid, grid, indexing="ij")
    out = np.zeros((CLASSES + 1, 3, size, size))
    for c in range(CLASSES + 1):  # one pattern every class shares, and one per class
        for channel in range(3):
            for _ in range(3):
                fy, fx = rng.integers(0, 3, 2)
                out[c, channel] += rng.normal() * np.cos(fy * yy + fx * xx + rng.uniform(0, 2 * np.pi))
    out = SHARED * out[:1] + (1 - SHARED) * out[1:]  # classes differ only in part of the pattern
    out -= out.min(axis=(1, 2, 3), keepdims=True)
    return (out / out.max(axis=(1, 2, 3), keepdims=True)).astype(np.float32)


def make_images(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (n, 3, 32, 32), labels int64 (n,)), reproducible from seed."""
    rng = np.random.default_rng(seed)
    prototypes = _prototypes(np.random.default_rng(1000 + seed))
    labels = rng.integers(0, CLASSES, n)
    h, w = IMAGE_SHAPE[1:]
    tops, lefts = rng.integers(0, 9, n), rng.integers(0, 9, n)
    windows = np.lib.stride_tricks.sliding_window_view(prototypes, (h, w), axis=(2, 3))  # (C, 3, 9, 9, h, w)
    images = np.empty((n,) + IMAGE_SHAPE, np.uint8)
    for start in range(0, n, 4096):  # in chunks: the float temporaries stay small
        stop = min(start + 4096, n)
        patch = windows[labels[start:stop], :, tops[start:stop], lefts[start:stop]]  # (k, 3, h, w)
        contrast = rng.uniform(0.6, 1.0, (stop - start, 1, 1, 1)).astype(np.float32)
        brightness = rng.uniform(-0.15, 0.15, (stop - start, 1, 1, 1)).astype(np.float32)
        noisy = patch * contrast + (brightness + 0.5 * (1 - contrast))
        noisy += rng.standard_normal(patch.shape, dtype=np.float32) * np.float32(NOISE)
        images[start:stop] = np.clip(noisy * 255.0, 0, 255).astype(np.uint8)
    return images, labels.astype(np.int64)


def make_regression(n: int, seed: int = 0, noise: float = 0.1) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """The seed's problem: x (n, 10) float32, y = x @ w + b + noise (n, 1); returns (x, y, w, b)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(10).astype(np.float32)
    b = float(rng.standard_normal())
    x = rng.standard_normal((n, 10), dtype=np.float32)
    y = (x @ w[:, None] + b + rng.normal(0.0, noise, (n, 1))).astype(np.float32)
    return x, y, w, b


def image_folder(n_train: int, n_val: int, seed: int = 0) -> tuple[str, bool]:
    """The dataset of make_images as JPEG files (quality 90) in torchvision's ImageFolder
    layout, <folder>/train/<class>/<i>.jpg and <folder>/val/..., written once into the cache
    and reused. Returns (folder, reused). Needs Pillow to encode."""
    from PIL import Image

    folder = os.path.join(cache_root(), f"demo-images-v1-seed{seed}-{n_train}+{n_val}")
    if os.path.isdir(folder):
        return folder, True
    os.makedirs(cache_root(), exist_ok=True)
    partial = tempfile.mkdtemp(prefix=".partial-", dir=cache_root())  # renamed when complete: never half a set
    try:
        images, labels = make_images(n_train + n_val, seed=seed)
        for split, start, stop in (("train", 0, n_train), ("val", n_train, n_train + n_val)):
            for c in range(CLASSES):
                os.makedirs(os.path.join(partial, split, f"class_{c}"))
            for i in range(start, stop):
                path = os.path.join(partial, split, f"class_{labels[i]}", f"{i:06d}.jpg")
                Image.fromarray(images[i].transpose(1, 2, 0)).save(path, "JPEG", quality=90)
        try:
            os.rename(partial, folder)
        except OSError:  # another run wrote it first
            if not os.path.isdir(folder):
                raise
            return folder, True
    finally:
        if os.path.isdir(partial):
            shutil.rmtree(partial, ignore_errors=True)
    return folder, False
