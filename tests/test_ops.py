"""fastloop.ops against NumPy references on random shapes, and every bad input."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

import fastloop
from fastloop import ops

RNG = np.random.default_rng(1234)
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)
ALL_DTYPES = ["uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float32", "float64"]


def random_images(shape, dtype):
    if np.dtype(dtype).kind == "f":
        return RNG.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def random_shape(layout, batched, channels=None):
    h, w = (int(v) for v in RNG.integers(1, 40, 2))
    c = channels or int(RNG.integers(1, 6))
    core = (h, w, c) if layout == "HWC" else (c, h, w)
    return ((int(RNG.integers(1, 5)),) if batched else ()) + core


# ---- normalize ----


def normalize_reference(x, mean, std, layout):
    src, _, dst = layout.partition("->")
    dst = dst or src
    y = x.astype(np.float32)
    if x.dtype == np.uint8:
        y = y / np.float32(255)
    channel_axis = -1 if src == "HWC" else -3
    shape = [1] * y.ndim
    shape[channel_axis] = -1
    y = (y - mean.reshape(shape)) / std.reshape(shape)
    if src != dst:
        y = np.moveaxis(y, -1, -3) if src == "HWC" else np.moveaxis(y, -3, -1)
    return y


@pytest.mark.parametrize("dtype", ["uint8", "float32", "float64"])
@pytest.mark.parametrize("layout", ["HWC->CHW", "CHW", "HWC", "CHW->HWC"])
def test_normalize_matches_numpy_on_random_shapes(dtype, layout):
    for trial in range(12):
        shape = random_shape(layout[:3], batched=trial % 2 == 0)
        c = shape[-1] if layout.startswith("HWC") else shape[-3]
        x = random_images(shape, dtype)
        mean = RNG.uniform(-1, 1, c).astype(np.float32)
        std = RNG.uniform(0.1, 2, c).astype(np.float32)
        want = normalize_reference(x, mean, std, layout)
        got = ops.normalize(x, mean, std, layout=layout, num_threads=1 + trial % 3)
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_normalize_is_the_same_for_any_thread_count_and_reuses_out():
    x = random_images((16, 128, 96, 3), "uint8")  # 590K values: several chunks of the pool
    out = np.empty((16, 3, 128, 96), np.float32)
    one = ops.normalize(x, MEAN, STD)
    result = ops.normalize(x, MEAN, STD, out=out, num_threads=4)
    assert result is out
    np.testing.assert_array_equal(one, out)


def test_normalize_takes_scalars_and_sequences_for_mean_and_std():
    x = random_images((5, 7, 3), "float32")
    np.testing.assert_allclose(ops.normalize(x, 0.5, 2.0, layout="HWC"), (x - 0.5) / 2, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        ops.normalize(x, [0.1, 0.2, 0.3], (1, 2, 3), layout="HWC"),
        (x - [0.1, 0.2, 0.3]) / np.array([1, 2, 3], np.float32),
        rtol=1e-5,
        atol=1e-6,
    )


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda x: ops.normalize(x.astype(np.int16), MEAN, STD), TypeError, ["'x'", "int16"]),
        (lambda x: ops.normalize(np.ascontiguousarray(x[0, :, :, 0]), MEAN, STD), ValueError, ["'x'", "(8, 8)"]),
        (lambda x: ops.normalize(x[:, ::2], MEAN, STD), ValueError, ["'x'", "C-contiguous"]),
        (lambda x: ops.normalize(x.tolist(), MEAN, STD), TypeError, ["'x'", "numpy.ndarray", "list"]),
        (lambda x: ops.normalize(x, MEAN[:2], STD), ValueError, ["'mean'", "2 values", "3 channels"]),
        (lambda x: ops.normalize(x, MEAN, [1, 0, 1]), ValueError, ["std[1]", "0"]),
        (lambda x: ops.normalize(x, MEAN, "abc"), ValueError, ["'std'"]),
        (lambda x: ops.normalize(x, MEAN, STD, layout="NHWC"), ValueError, ["'layout'", "NHWC"]),
        (lambda x: ops.normalize(x, MEAN, STD, num_threads=0), ValueError, ["'num_threads'", ">= 1"]),
        (lambda x: ops.normalize(x, MEAN, STD, out=np.empty((2, 3, 8, 9), np.float32)), ValueError, ["'out'", "shape"]),
        (lambda x: ops.normalize(x, MEAN, STD, out=np.empty((2, 3, 8, 8), np.float64)), TypeError, ["'out'", "float32"]),
        (lambda x: ops.normalize(x.astype(">f4"), MEAN, STD), TypeError, ["'x'", "byte order"]),
        (lambda x: ops.normalize(x.astype(object), MEAN, STD), TypeError, ["'x'", "Python objects"]),
    ],
)
def test_normalize_rejects_bad_input_naming_the_argument(call, error, words):
    x = random_images((2, 8, 8, 3), "uint8")
    with pytest.raises(error) as raised:
        call(x)
    for word in words:
        assert word in str(raised.value), f"{word!r} not in {str(raised.value)!r}"


def test_out_must_be_writable_and_must_not_overlap_the_input():
    x = random_images((2, 4, 4, 3), "float32")
    readonly = np.empty((2, 3, 4, 4), np.float32)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        ops.normalize(x, MEAN, STD, out=readonly)
    with pytest.raises(ValueError, match="overlap"):
        ops.normalize(x, MEAN, STD, layout="HWC", out=x)
    with pytest.raises(ValueError, match="overlap"):
        ops.cast(x, np.float32, out=x)


# ---- cast ----


@pytest.mark.parametrize("src", ALL_DTYPES)
def test_cast_matches_astype_for_values_every_type_can_hold(src):
    x = RNG.integers(0, 100, (3, 17, 5)).astype(src)
    for dst in ALL_DTYPES:
        got = ops.cast(x, dst, num_threads=2)
        assert got.dtype == np.dtype(dst)
        np.testing.assert_array_equal(got, x.astype(dst))


def test_cast_wraps_integers_like_numpy_and_saturates_floats():
    ints = np.array([-1, 256, 70000, -129], np.int32)
    np.testing.assert_array_equal(ops.cast(ints, np.uint8), ints.astype(np.uint8))
    floats = np.array([-1.5, 300.7, np.nan, 12.9, -np.inf, np.inf, 255.0], np.float32)
    np.testing.assert_array_equal(ops.cast(floats, np.uint8), [0, 255, 0, 12, 0, 255, 255])
    np.testing.assert_array_equal(ops.cast(np.array([1e300, -1e300, -7.9]), "int64"), [2**63 - 1, -(2**63), -7])
    big = RNG.standard_normal(300_000) * 1e3
    np.testing.assert_array_equal(ops.cast(big, np.float32, num_threads=3), big.astype(np.float32))


def test_cast_names_the_bad_argument():
    x = np.zeros(4, np.uint8)
    with pytest.raises(TypeError, match="'dtype'.*float16"):
        ops.cast(x, np.float16)
    with pytest.raises(TypeError, match="'x'.*bool"):
        ops.cast(np.zeros(3, bool), np.uint8)
    with pytest.raises(TypeError):
        ops.cast(x, "no such dtype")
    with pytest.raises(ValueError, match="'out'.*shape"):
        ops.cast(x, np.float32, out=np.zeros(5, np.float32))


# ---- crop ----


@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_crop_at_given_offsets_equals_slicing(layout):
    for trial in range(10):
        shape = random_shape(layout, batched=True)
        x = random_images(shape, ["uint8", "float32", "int64"][trial % 3])
        n, (h, w) = shape[0], ((shape[1], shape[2]) if layout == "HWC" else (shape[2], shape[3]))
        size = (int(RNG.integers(1, h + 1)), int(RNG.integers(1, w + 1)))
        offsets = np.stack([RNG.integers(0, h - size[0] + 1, n), RNG.integers(0, w - size[1] + 1, n)], axis=1)
        got = ops.crop(x, size, offsets=offsets, layout=layout, num_threads=2)
        for i, (top, left) in enumerate(offsets):
            rows, cols = slice(top, top + size[0]), slice(left, left + size[1])
            want = x[i, rows, cols] if layout == "HWC" else x[i, :, rows, cols]
            np.testing.assert_array_equal(got[i], want)
        shared = ops.crop(x, size, offsets=(0, 0), layout=layout)
        np.testing.assert_array_equal(shared, x[:, : size[0], : size[1]] if layout == "HWC" else x[:, :, : size[0], : size[1]])


def test_random_crops_are_reproducible_in_bounds_and_thread_independent():
    x = np.arange(32 * 20 * 20, dtype=np.int32).reshape(32, 20, 20, 1)
    a = ops.crop(x, 8, seed=7)
    b = ops.crop(x, 8, seed=7, num_threads=3)
    c = ops.crop(x, 8, seed=8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    tops = (a[:, 0, 0, 0] % 400) // 20 
    lefts = a[:, 0, 0, 0] % 20
    assert tops.min() >= 0 and tops.max() <= 12 and lefts.max() <= 12
    assert len(set(zip(tops.tolist(), lefts.tolist()))) > 16  # they really vary


def test_center_crop_matches_torchvision_rounding():
    for full, part in [(10, 4), (11, 4), (13, 4), (7, 2), (9, 2), (8, 8)]:
        x = np.arange(full * full, dtype=np.uint8).reshape(full, full, 1)
        top = int(round((full - part) / 2.0))  # torchvision's formula, round half to even
        np.testing.assert_array_equal(ops.crop(x, part, offsets="center"), x[top : top + part, top : top + part])


def test_crop_on_a_single_image_and_bad_crops():
    x = random_images((10, 12, 3), "uint8")
    assert ops.crop(x, (4, 5), seed=1).shape == (4, 5, 3)
    with pytest.raises(ValueError, match="larger than"):
        ops.crop(x, 11)
    with pytest.raises(ValueError, match=r"sample 0.*10x12"):
        ops.crop(x, 4, offsets=(7, 0))
    with pytest.raises(ValueError, match=r"sample 1"):
        ops.crop(np.stack([x, x]), 4, offsets=[[0, 0], [-1, 0]])
    with pytest.raises(ValueError, match="'offsets'"):
        ops.crop(x, 4, offsets=[[0, 0], [1, 1], [2, 2]])
    with pytest.raises(ValueError, match="'offsets'"):
        ops.crop(x, 4, offsets="middle")
    with pytest.raises(ValueError, match="'offsets'"):
        ops.crop(x, 4, offsets=(1.5, 2.0))
    with pytest.raises(ValueError, match="'size'"):
        ops.crop(x, 0)
    with pytest.raises(TypeError, match="'seed'"):
        ops.crop(x, 4, seed="x")


# ---- hflip ----


@pytest.mark.parametrize("layout", ["HWC", "CHW"])
def test_hflip_all_none_and_explicit(layout):
    shape = random_shape(layout, batched=True)
    x = random_images(shape, "float32")
    width_axis = -2 if layout == "HWC" else -1
    np.testing.assert_array_equal(ops.hflip(x, p=1.0, layout=layout), np.flip(x, axis=width_axis))
    np.testing.assert_array_equal(ops.hflip(x, p=0.0, layout=layout), x)
    flags = [i % 2 == 0 for i in range(shape[0])]
    got = ops.hflip(x, flip=flags, layout=layout, num_threads=2)
    for i, flag in enumerate(flags):
        np.testing.assert_array_equal(got[i], np.flip(x[i], axis=width_axis) if flag else x[i])


def test_hflip_in_place_and_with_odd_pixel_sizes():
    for c, dtype in [(3, "uint8"), (5, "int16"), (1, "float64"), (7, "float32"), (40, "uint8")]:
        x = random_images((3, 6, 9, c), dtype)
        original = x.copy()
        assert ops.hflip(x, p=1.0, out=x) is x
        np.testing.assert_array_equal(x, original[:, :, ::-1])


def test_random_flips_are_reproducible_and_about_p():
    x = np.zeros((10_000, 1, 2, 1), np.float32)
    x[:, 0, 1, 0] = 1  # flipped images start with 1
    a = ops.hflip(x, p=0.3, seed=11)
    np.testing.assert_array_equal(a, ops.hflip(x, p=0.3, seed=11, num_threads=4))
    flipped = a[:, 0, 0, 0].mean()
    assert 0.27 < flipped < 0.33


def test_hflip_bad_input():
    x = random_images((2, 4, 4, 3), "uint8")
    with pytest.raises(ValueError, match="'p'"):
        ops.hflip(x, p=1.5)
    with pytest.raises(ValueError, match="'flip' has 3 values"):
        ops.hflip(x, flip=[True, False, True])
    backing = np.zeros(x.size + 1, x.dtype)
    with pytest.raises(ValueError, match="overlap"):  # out overlaps x but does not start with it
        ops.hflip(backing[:-1].reshape(x.shape), out=backing[1:].reshape(x.shape))


# ---- stack ----


def test_stack_matches_numpy_stack():
    for dtype in ["uint8", "float32", "int64"]:
        arrays = [random_images((13, 7, 3), dtype) for _ in range(9)]
        np.testing.assert_array_equal(ops.stack(arrays, num_threads=3), np.stack(arrays))
        out = np.empty((9, 13, 7, 3), dtype)
        assert ops.stack(tuple(arrays), out=out) is out
    big = [random_images((300, 300, 3), "uint8") for _ in range(3)]  # several blocks per item
    np.testing.assert_array_equal(ops.stack(big, num_threads=2), np.stack(big))


def test_stack_bad_input_names_the_index():
    a = np.zeros((2, 2), np.float32)
    with pytest.raises(ValueError, match=r"arrays\[2\].*shape"):
        ops.stack([a, a, np.zeros((2, 3), np.float32)])
    with pytest.raises(TypeError, match=r"arrays\[1\].*dtype"):
        ops.stack([a, a.astype(np.float64)])
    with pytest.raises(ValueError, match=r"arrays\[1\].*C-contiguous"):
        ops.stack([a, np.zeros((2, 4), np.float32)[:, ::2]])
    with pytest.raises(ValueError, match="empty"):
        ops.stack([])
    with pytest.raises(TypeError, match="sequence"):
        ops.stack(5)
    with pytest.raises(ValueError, match=r"overlaps arrays\[0\]"):
        backing = np.zeros((2, 2, 2), np.float32)
        ops.stack([backing[0], a], out=backing)


# ---- divide_by_max ----


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_divide_by_max_is_bit_identical_to_numpy(dtype):
    x = random_images((1000, 37), dtype)
    if np.dtype(dtype).kind == "u":
        x[x == 0] = 1
    want = x / x.max()
    got = fastloop.ops.divide_by_max(x, num_threads=3)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_divide_by_max_nan_in_place_and_errors():
    x = RNG.standard_normal(100_000).astype(np.float32)
    x[5] = np.nan
    assert np.isnan(ops.divide_by_max(x)).all()
    y = RNG.standard_normal((64, 64))
    want = y / y.max()
    assert ops.divide_by_max(y, out=y) is y
    np.testing.assert_array_equal(y, want)
    with pytest.raises(ValueError, match="empty"):
        ops.divide_by_max(np.zeros(0))
    with pytest.raises(TypeError, match="'out'.*float64"):
        ops.divide_by_max(np.ones(3, np.int32), out=np.ones(3, np.float32))
    ints = np.ones(3, np.int64)
    with pytest.raises(ValueError, match="overlap"):
        ops.divide_by_max(ints, out=ints.view(np.float64))


# ---- the GIL ----


def test_a_python_thread_keeps_running_while_an_op_runs():
    x = RNG.standard_normal(20_000_000)  # 160 MB: the op takes well over 100 ms
    done = threading.Event()
    during = []

    def op():
        for _ in range(3):
            ops.divide_by_max(x)
        done.set()

    counter = 0
    worker = threading.Thread(target=op)
    start = time.perf_counter()
    worker.start()
    while not done.is_set():
        counter += 1
    elapsed = time.perf_counter() - start
    worker.join()
    during.append(counter / elapsed)
    # With the GIL held by the op this loop would get almost no turns; released, it spins
    # freely. A pure-Python loop manages millions of turns a second here; ask for 50k/s.
    assert elapsed > 0.05 and during[0] > 50_000, f"{during[0]:.0f} iterations/s"


# ---- edge cases of the machinery ----


def test_empty_batches_give_empty_results():
    x = np.zeros((0, 8, 8, 3), np.uint8)
    assert ops.normalize(x, MEAN, STD).shape == (0, 3, 8, 8)
    assert ops.crop(x, 4).shape == (0, 4, 4, 3)
    assert ops.hflip(x).shape == (0, 8, 8, 3)
    assert ops.cast(x, np.float32).shape == (0, 8, 8, 3)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork()")
# Forking while the pool's threads run is the point of the test (the child must not rely on them);
# Python 3.12+ warns of exactly that.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
def test_a_forked_child_gets_a_working_pool_of_its_own():
    import os

    x = random_images((16, 128, 128, 3), "uint8")
    want = ops.normalize(x, MEAN, STD, num_threads=2)  # starts the pool's workers here
    pid = os.fork()
    if pid == 0:  # the child: the parent's workers do not exist here
        code = 1
        try:
            code = 0 if np.array_equal(ops.normalize(x, MEAN, STD, num_threads=2), want) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
