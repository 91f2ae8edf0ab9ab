"""Writes the image fuzz corpus's seeds: small JPEG and PNG files of every kind the decoders
convert (RGB, 4:4:4 / 4:2:0, progressive, grayscale, CMYK, palette, alpha, 1- and 16-bit,
interlaced, 1x1), made by Pillow from photo-like content.

    python3 tests/fuzz/make_image_seeds.py tests/fuzz/corpus/image
"""

from __future__ import annotations

import hashlib
import io
import sys
from pathlib import Path

import numpy as np
from PIL import Image


def natural(h: int, w: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) * 127 // max(h + w - 2, 1)], -1)
    base[(x // 5 + y // 7) % 2 == 0] //= 2
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def seeds() -> list[bytes]:
    rgb = Image.fromarray(natural(24, 40))
    out = []
    for image, fmt, options in [
        (rgb, "JPEG", {"quality": 90}),
        (rgb, "JPEG", {"quality": 75, "subsampling": 0}),
        (rgb, "JPEG", {"progressive": True}),
        (rgb.convert("L"), "JPEG", {}),
        (rgb.convert("CMYK"), "JPEG", {}),
        (Image.fromarray(natural(1, 1)), "JPEG", {}),
        (rgb, "PNG", {}),
        (rgb.convert("RGBA"), "PNG", {}),
        (rgb.convert("P"), "PNG", {"transparency": 2}),
        (rgb.convert("LA"), "PNG", {}),
        (rgb.convert("1"), "PNG", {}),
        (Image.fromarray(natural(9, 7)[..., 0].astype(np.uint16) * 300), "PNG", {}),
        (rgb, "PNG", {"interlace": 1}),
        (Image.fromarray(natural(1, 1)), "PNG", {}),
    ]:
        buffer = io.BytesIO()
        image.save(buffer, fmt, **options)
        out.append(buffer.getvalue())
    return out


def main(folder: str) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)
    for i, data in enumerate(seeds()):
        (Path(folder) / hashlib.sha1(data).hexdigest()).write_bytes(data)
        if i % 3 == 0:  # and some cut short: the truncated-data paths
            cut = data[: len(data) * 2 // 3]
            (Path(folder) / hashlib.sha1(cut).hexdigest()).write_bytes(cut)


if __name__ == "__main__":
    main(sys.argv[1])
