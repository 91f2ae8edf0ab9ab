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


def bits_as_float32(bits: np.ndarray, dtype: str) -> np.ndarray:
    """float16 or bfloat16 bit patterns (uint16) as float32 values."""
    bits = np.asarray(bits, np.uint16)
    if dtype == "float16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


# One step of each output type, relative to the value (its significand's last bit).
RELATIVE_STEP = {"float32": 2.0 ** -23, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}


def assert_normalized_like_cpu(got: np.ndarray, cpu: np.ndarray, dtype: str, fused: bool, largest_product: float,
                               what: str = "") -> None:
    """The kernels' x * a + b (one fused multiply-add, then cast to `dtype`: float32 values, or
    float16/bfloat16 bits) against the CPU path's float32. Bit for bit where the CPU fuses too.
    Where it rounds x * a before adding b, the two can differ by half a float32 step of the
    product, and by many steps of a result near zero (cancellation): the bound is a float32 step
    of the largest product (`largest_product`, 255 * max |a|) plus one step of the output type."""
    expected = cpu if dtype == "float32" else (float16_bits(cpu) if dtype == "float16" else bfloat16_bits(cpu))
    if fused:
        np.testing.assert_array_equal(got, expected, err_msg=what)
        return
    values = got if dtype == "float32" else bits_as_float32(got, dtype)
    atol = float(np.spacing(np.float32(largest_product))) + float(np.spacing(np.float32(np.abs(cpu).max(initial=0))))
    np.testing.assert_allclose(values, cpu, rtol=RELATIVE_STEP[dtype], atol=atol, err_msg=what)


def cpu_normalize_fuses(layout: str, c: int) -> bool:
    """Whether fastloop.ops.normalize rounds x * a + b once (a fused multiply-add) for this
    layout and channel count in this build, found from its output over every uint8 against the
    exact fused result (the product of 8 and 24 significant bits and the sum are exact in long
    double, then rounded once to float32). gcc fuses where the loop is built for FMA; an
    -O1 sanitizer build or a CPU without FMA may not."""
    from fastloop import ops

    x = np.arange(256, dtype=np.uint8)
    src = np.repeat(x, c).reshape(1, 16, 16, c) if layout.startswith("HWC") else np.tile(x, c).reshape(1, c, 16, 16)
    mean, std = np.full(c, 0.485, np.float32), np.full(c, 0.229, np.float32)
    a = (np.float32(1.0) / np.float32(255.0)) / std
    b = -mean / std
    out = ops.normalize(src, mean, std, layout=layout)
    fused = (x.astype(np.longdouble) * np.longdouble(a[0]) + np.longdouble(b[0])).astype(np.float32)
    values = out.reshape(-1, c, 256) if layout.endswith("CHW") else out.reshape(-1, 256, c).transpose(0, 2, 1)
    return bool(np.array_equal(values[0, 0], fused))
