"""Fused, GIL-free preprocessing kernels on NumPy arrays.

Every function checks dtype, shape and contiguity at the call (a TypeError or ValueError
naming the argument), reads its input once and writes its output once, accepts ``out=``
to reuse a buffer, releases the GIL while it runs (inputs of 2 KiB and more), and takes
``threads=`` to split the work over fastloop's C thread pool. Random choices (``crop``,
``hflip``) are drawn per image from ``seed``, so results never depend on ``threads``.

    >>> x = numpy.zeros((8, 224, 224, 3), numpy.uint8)
    >>> fastloop.ops.normalize(x, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]).shape
    (8, 3, 224, 224)
"""

from __future__ import annotations

from ._core import cast, crop, divide_by_max, hflip, normalize, stack

__all__ = ["normalize", "cast", "crop", "hflip", "stack", "divide_by_max"]
