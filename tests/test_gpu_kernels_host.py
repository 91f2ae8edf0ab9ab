"""The GPU preprocessing kernels' own per-pixel code (cuda/fl_gpu_math.cuh,
fl_preprocess_math.cuh, fl_resample_math.cuh), compiled by the host C compiler into the tests'
build (FASTLOOP_TESTING=1) and run over every pixel, checked against the CPU path: the
float16/bfloat16 rounding against NumPy's, torch's and a distance-comparing reference
(tests/rounding.py), and fl_cuda_preprocess's kernel against
fastloop.ops' crop, hflip and normalize on many shapes, regions, flips, layouts and dtypes.
(fl_gpu_decode's resample kernels are checked on staged JPEGs in test_gpu_stage.py.)

Bit-exact where the CPU's normalize is one fused multiply-add per value, as the kernels' is
(gcc's x86-64-v3 build of its loop, and its hand-vectorized RGB loop, where the CPU has FMA);
elsewhere (an -O1 sanitizer build, a CPU without FMA) its loop rounds the product before the
sum, and the bound is tests/rounding.py's assert_normalized_like_cpu. Which one the CPU does is
read from its output (cpu_normalize_fuses); the RGB HWC -> CHW loop must fuse on an x86-64 CPU
with AVX2 and FMA."""

from __future__ import annotations

import functools
import platform

import numpy as np
import pytest

from fastloop import _core
from fastloop import ops
from hooks import CORE_HOOKS, WHY_ABSENT
from rounding import assert_normalized_like_cpu, bfloat16_bits, bfloat16_bits_nearest, cpu_normalize_fuses, float16_bits

pytestmark = pytest.mark.skipif(not CORE_HOOKS, reason=WHY_ABSENT)

F32, F16, BF16 = 0, 1, 2
DTYPES = {F32: "float32", F16: "float16", BF16: "bfloat16"}


LAYOUTS = {(0, 0): "HWC", (0, 1): "HWC->CHW", (1, 1): "CHW", (1, 0): "CHW->HWC"}


_cpu_fuses = functools.lru_cache(maxsize=None)(cpu_normalize_fuses)


def _gpu_round(x: np.ndarray, dtype: int) -> np.ndarray:
    return np.frombuffer(_core._gpu_round(np.ascontiguousarray(x, np.float32), dtype), np.uint16)


def _hard_floats() -> np.ndarray:
    """Every float16 and bfloat16 value's neighbourhood: each value, the midpoints to the
    next one (ties), a float32 ulp either side of them; specials; a million random floats."""
    with np.errstate(invalid="ignore", over="ignore"):
        return _floats_near_ties()


def _floats_near_ties() -> np.ndarray:
    h = np.arange(1 << 16, dtype=np.uint32)
    f16 = h.astype(np.uint16).view(np.float16).astype(np.float32)
    f16 = f16[np.isfinite(f16)]
    nxt = np.nextafter(f16.astype(np.float16), np.float16(np.inf)).astype(np.float32)
    mids = ((f16.astype(np.float64) + nxt.astype(np.float64)) / 2).astype(np.float32)
    bf = (h << 16).view(np.float32)
    bf_mids = ((h << 16) | 0x8000).view(np.float32)
    around = np.concatenate([mids, bf_mids])
    around = np.concatenate([around, np.nextafter(around, np.float32(np.inf)), np.nextafter(around, -np.float32(np.inf))])
    specials = np.array([0.0, -0.0, np.inf, -np.inf, 65504, 65519.996, 65520, 65536, 2.0 ** -24, 2.0 ** -25,
                         2.0 ** -25 * 1.0000001, 2.0 ** -14, 3.4e38, -3.4e38, 1e-45], np.float32)
    rng = np.random.default_rng(0)
    random = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    return np.concatenate([f16, bf, around, specials, -specials, random]).astype(np.float32)


def test_float16_rounding_is_numpys_on_every_float16_tie_and_neighbour():
    x = _hard_floats()
    got = _gpu_round(x, F16)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    nan = np.isnan(x)
    assert np.isnan(got[nan].view(np.float16)).all()
    assert ((got[nan] & 0x8000) == (x[nan].view(np.uint32) >> 16 & 0x8000)).all()  # the sign kept
    mismatch = np.flatnonzero(got[~nan] != want[~nan].view(np.uint16))
    assert mismatch.size == 0, [(float(x[~nan][i]), hex(got[~nan][i])) for i in mismatch[:5]]


@pytest.mark.parametrize("reference", [bfloat16_bits, bfloat16_bits_nearest])
def test_bfloat16_rounding_is_the_nearest_value_on_every_bfloat16_tie_and_neighbour(reference):
    x = _hard_floats()
    got = _gpu_round(x, BF16)
    nan = np.isnan(x)
    assert np.isnan((got[nan].astype(np.uint32) << 16).view(np.float32)).all()
    finite = np.isfinite(x) if reference is bfloat16_bits_nearest else ~nan
    want = reference(x[finite])
    mismatch = np.flatnonzero(got[finite] != want)
    assert mismatch.size == 0, [(float(x[finite][i]), hex(got[finite][i]), hex(want[i])) for i in mismatch[:5]]


def test_the_rounding_hook_refuses_a_bad_dtype_code():
    with pytest.raises(ValueError, match="dtype code must be 0"):
        _core._gpu_round(np.zeros(2, np.float32), 7)
    with pytest.raises(ValueError, match="rounds to float16"):
        _core._gpu_round(np.zeros(2, np.float32), F32)


def _coefficients(mean: np.ndarray, std: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fl_cuda_preprocess_coefficients's a and b, in float32 as the C computes them."""
    mean, std = mean.astype(np.float32), std.astype(np.float32)
    return (np.float32(1.0) / np.float32(255.0)) / std, -mean / std


def _gpu_preprocess(src, chw_in, chw_out, out_h, out_w, top, left, offsets, flips, mean, std, dtype) -> np.ndarray:
    n = src.shape[0]
    c, h, w = (src.shape[1], src.shape[2], src.shape[3]) if chw_in else (src.shape[3], src.shape[1], src.shape[2])
    a, b = _coefficients(mean, std)
    raw = _core._gpu_preprocess(np.ascontiguousarray(src), n, h, w, c, int(chw_in), int(chw_out), out_h, out_w, top, left,
                                None if offsets is None else np.ascontiguousarray(offsets, np.int32),
                                None if flips is None else np.ascontiguousarray(flips, np.uint8), a, b, dtype)
    shape = (n, c, out_h, out_w) if chw_out else (n, out_h, out_w, c)
    return np.frombuffer(raw, np.float32 if dtype == F32 else np.uint16).reshape(shape)


def _cpu_preprocess(src, chw_in, chw_out, out_h, out_w, offsets, flips, mean, std) -> np.ndarray:
    """fastloop.ops on the CPU: crop each image at its offsets, mirror the flagged ones, normalize."""
    layout = "CHW" if chw_in else "HWC"
    cropped = ops.crop(np.ascontiguousarray(src), (out_h, out_w), offsets=np.asarray(offsets, np.int64), layout=layout)
    flipped = ops.hflip(cropped, flip=np.asarray(flips, np.uint8), layout=layout)
    return ops.normalize(flipped, mean, std, layout=LAYOUTS[int(chw_in), int(chw_out)])


def _assert_matches(got: np.ndarray, cpu: np.ndarray, dtype: int, fused: bool, a: np.ndarray, what: str) -> None:
    assert_normalized_like_cpu(got, cpu, DTYPES[dtype], fused, 255.0 * float(np.abs(a).max()), what)


CASES = [  # n, h, w, c, out_h, out_w
    (1, 1, 1, 3, 1, 1), (3, 7, 5, 3, 7, 5), (4, 31, 17, 3, 16, 9), (2, 9, 33, 1, 4, 30),
    (5, 12, 12, 4, 5, 11), (2, 224, 160, 3, 200, 128), (3, 3, 64, 2, 1, 64),
]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("chw_in,chw_out", [(0, 1), (0, 0), (1, 1), (1, 0)])
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_the_preprocess_kernel_matches_the_cpu_path(case, chw_in, chw_out, dtype):
    n, h, w, c, out_h, out_w = case
    rng = np.random.default_rng(hash((case, chw_in, chw_out, dtype)) % 2**32)
    src = rng.integers(0, 256, (n, c, h, w) if chw_in else (n, h, w, c), dtype=np.uint8)
    src.reshape(-1)[:2] = [0, 255]  # both ends of the range
    mean, std = rng.uniform(0.0, 1.0, c).astype(np.float32), rng.uniform(0.05, 0.5, c).astype(np.float32)
    offsets = np.stack([rng.integers(0, h - out_h + 1, n), rng.integers(0, w - out_w + 1, n)], 1)
    flips = rng.integers(0, 2, n).astype(np.uint8)
    cpu = _cpu_preprocess(src, chw_in, chw_out, out_h, out_w, offsets, flips, mean, std)
    got = _gpu_preprocess(src, chw_in, chw_out, out_h, out_w, 0, 0, offsets, flips, mean, std, dtype)
    fused = _cpu_fuses(LAYOUTS[chw_in, chw_out], c)
    a, _ = _coefficients(mean, std)
    _assert_matches(got, cpu, dtype, fused, a, f"per-image regions and flips, {case}")
    # one region for every image, no flips: the kernel's other branch
    top, left = (h - out_h) // 2, (w - out_w + 1) // 2
    same = np.tile([top, left], (n, 1))
    cpu = _cpu_preprocess(src, chw_in, chw_out, out_h, out_w, same, np.zeros(n, np.uint8), mean, std)
    got = _gpu_preprocess(src, chw_in, chw_out, out_h, out_w, top, left, None, None, mean, std, dtype)
    _assert_matches(got, cpu, dtype, fused, a, f"one region, no flips, {case}")


def test_the_cpu_rgb_loop_fuses_where_the_cpu_has_fma():
    flags = open("/proc/cpuinfo").read().split() if platform.system() == "Linux" else []
    if platform.machine() != "x86_64" or "fma" not in flags or "avx2" not in flags:
        pytest.skip("not an x86-64 CPU with AVX2 and FMA")
    assert _cpu_fuses("HWC->CHW", 3)


def test_the_preprocess_hook_refuses_a_crop_outside_its_image():
    src = np.zeros((2, 8, 8, 3), np.uint8)
    a = np.ones(3, np.float32)
    with pytest.raises(ValueError, match="image 1's crop leaves the image"):
        _core._gpu_preprocess(src, 2, 8, 8, 3, 0, 1, 4, 4, 0, 0, np.array([[0, 0], [5, 0]], np.int32), None, a, a, F32)
    with pytest.raises(ValueError, match="'src' holds 384 bytes"):
        _core._gpu_preprocess(src, 3, 8, 8, 3, 0, 1, 4, 4, 0, 0, None, None, a, a, F32)
