"""Generated JPEG data for the image benchmarks: photo-like content at ImageNet's sizes, as an
ImageFolder tree and as WebDataset-style tar shards of the same bytes, written once per
configuration into a cache folder and reused.

    >>> data = fastloop.bench.image_data.dataset(5120)
    >>> data.image_folder, data.shards          # 'cache/.../images', 'cache/.../shard-{0000..0009}.tar'
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from .._cache import cache_root

QUALITY = 90


@dataclass(frozen=True)
class ImageData:
    root: str
    count: int
    classes: int
    shard_count: int

    @property
    def image_folder(self) -> str:
        """root/images/class_k/<i>.jpg: torchvision's ImageFolder layout."""
        return os.path.join(self.root, "images")

    @property
    def shards(self) -> str:
        """A brace pattern of the tar shards (<i>.jpg + <i>.cls members)."""
        return os.path.join(self.root, f"shard-{{0000..{self.shard_count - 1:04d}}}.tar")


def natural(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """Smooth shading, hard-edged shapes and sensor-like noise, so a JPEG of it costs about
    what a photo costs to decode (not a flat image that decodes for free)."""
    y = np.linspace(0, 1, h, dtype=np.float32)[:, None]
    x = np.linspace(0, 1, w, dtype=np.float32)[None, :]
    image = np.empty((h, w, 3), np.float32)
    for c in range(3):  # low-frequency shading: sky, walls, skin
        fx, fy, phase = rng.uniform(1, 6), rng.uniform(1, 6), rng.uniform(0, 6.3)
        image[..., c] = 128 + 70 * np.sin(fx * x + phase) * np.cos(fy * y - phase)
    for _ in range(int(rng.integers(3, 8))):  # objects: flat-coloured rectangles and discs with sharp edges
        cy, cx, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.05, 0.3)
        mask = ((y - cy) ** 2 + (x - cx) ** 2 < r * r) if rng.random() < 0.5 else \
            ((abs(y - cy) < r) & (abs(x - cx) < r * rng.uniform(0.5, 2)))
        image[mask] = image[mask] * 0.3 + rng.uniform(0, 255, 3).astype(np.float32) * 0.7
    texture = rng.integers(-12, 13, (h, w, 3), dtype=np.int16)  # fine detail and noise
    return np.clip(image + texture, 0, 255).astype(np.uint8)


def image_size(rng: np.random.Generator) -> tuple[int, int]:
    """(h, w) spread around ImageNet's typical 500x375: mostly landscape, a quarter portrait."""
    w = int(rng.integers(400, 620))
    if rng.random() < 0.25:
        return int(w * rng.uniform(1.2, 1.4)), w
    return int(w * rng.uniform(0.66, 0.8)), w


def encode(seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(natural(*image_size(rng), rng)).save(out, "JPEG", quality=QUALITY)
    return out.getvalue()


def dataset(count: int = 5120, classes: int = 10, shard_count: int = 10, folder: str | None = None) -> ImageData:
    """The benchmark set of `count` JPEGs (label = index % classes), written once under
    `folder` (default: the fastloop cache, $FASTLOOP_CACHE or ~/.cache/fastloop) and reused."""
    base = folder or cache_root()
    root = os.path.join(base, f"bench-images-v1-{count}-{classes}-{shard_count}")
    data = ImageData(root, count, classes, shard_count)
    if os.path.isdir(root):
        return data
    os.makedirs(base, exist_ok=True)
    partial = tempfile.mkdtemp(prefix=".partial-", dir=base)  # renamed when complete
    try:
        _write(partial, count, classes, shard_count)
        try:
            os.rename(partial, root)
        except OSError:  # another run finished first
            if not os.path.isdir(root):
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return data


def _write(root: str, count: int, classes: int, shard_count: int) -> None:
    for c in range(classes):
        os.makedirs(os.path.join(root, "images", f"class_{c:02d}"))
    per_shard = -(-count // shard_count)
    # a thread per core: NumPy and Pillow release the GIL for most of the work (the same bytes, in order)
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        jpegs = pool.map(encode, range(count))
        for s in range(shard_count):
            _write_shard(root, s, range(s * per_shard, min(count, (s + 1) * per_shard)), jpegs, classes)


def _write_shard(root: str, shard: int, indices: range, jpegs: Iterator[bytes], classes: int) -> None:
    """Images `indices` (their bytes next from `jpegs`) into the ImageFolder and tar shard `shard`."""
    with tarfile.open(os.path.join(root, f"shard-{shard:04d}.tar"), "w", format=tarfile.GNU_FORMAT) as tar:
        for i in indices:
            jpeg, label = next(jpegs), i % classes
            with open(os.path.join(root, "images", f"class_{label:02d}", f"{i:06d}.jpg"), "wb") as f:
                f.write(jpeg)
            for name, payload in ((f"{i:06d}.jpg", jpeg), (f"{i:06d}.cls", str(label).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
