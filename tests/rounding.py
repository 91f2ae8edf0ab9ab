"""The CPU path's float32 results in the GPU kernels' output types, by references independent
of the kernels' own rounding code (cuda/fl_gpu_math.cuh): NumPy's astype for float16, and for
bfloat16 torch's .to where torch is installed, else the nearer of the two bfloat16 values
around each float (in float64, exact), ties to the even one."""

from __future__ import annotations

import numpy as np


def float16_bits(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(x, np.float32).astype(np.float16).view(np.uint16)


def bfloat16_bits_nearest(x: np.ndarray) -> np.ndarray:
    """Round to nearest, ties to even, by comparing distances, for finite floats: past the
    largest bfloat16 the next value up is 2^128 (an infinity), as IEEE rounding counts it."""
    x = np.ascontiguousarray(x, np.float32)
    down = x.view(np.uint32) >> 16  # the bfloat16 toward zero
    up = down + 1                   # the next one away from zero
    value = x.astype(np.float64)
    lo = (down << 16).astype(np.uint32).view(np.float32).astype(np.float64)
    with np.errstate(over="ignore"):
        hi = (up << 16).astype(np.uint32).view(np.float32).astype(np.float64)
    hi = np.where(np.isinf(hi), np.copysign(2.0 ** 128, value), hi)
    to_lo, to_hi = np.abs(value - lo), np.abs(hi - value)
    pick_up = (to_hi < to_lo) | ((to_hi == to_lo) & (down & 1 == 1))
    return np.where(pick_up, up, down).astype(np.uint16)


def bfloat16_bits(x: np.ndarray) -> np.ndarray:
    try:
        import torch
    except ImportError:
        return bfloat16_bits_nearest(x)
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
