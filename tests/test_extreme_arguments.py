"""Extreme arguments never corrupt memory: Loader (threads and processes), Pipeline and the ops
driven by hypothesis with sizes at and past every limit (0, -1, 2**31, 2**63, 2**64, 64-dimension
samples, huge Folder shapes, crops and resizes). Each call works (and its batches have the
expected shapes) or raises ValueError/OverflowError naming one of the arguments involved; it
never aborts. Under `make pytest-asan` a heap overflow or a wrapped size aborts with a report;
`make stress` runs it there with FASTLOOP_EXTREME_EXAMPLES examples per test (10,000+ in all).

Sizes are drawn small or past a limit, not in between: a batch of 4 GiB that fits in memory is
valid and would only make the run slow."""

from __future__ import annotations

import os
import re
from typing import Any, Callable

import numpy as np
import pytest

import fastloop
from fastloop import ops

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

EXAMPLES = int(os.environ.get("FASTLOOP_EXTREME_EXAMPLES", "60"))
SETTINGS = hypothesis.settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                               suppress_health_check=list(hypothesis.HealthCheck))

HUGE = [2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64, 2**100]
BAD = [0, -1, -(2**63)]


def small_or_extreme(low: int, high: int) -> Any:
    """Mostly a usual value (so that calls with several such arguments often work), else one at
    or past a limit."""
    return mostly(st.integers(low, high), st.sampled_from(HUGE + BAD))


def mostly(usual: Any, extreme: Any) -> Any:
    """usual three times in four, else extreme."""
    return st.integers(0, 3).flatmap(lambda pick: usual if pick else extreme)


def works_or_names(call: Callable[[], Any], names: tuple[str, ...]) -> Any:
    """call()'s result, or None when it raised ValueError/OverflowError whose message names one
    of `names` (anything else fails the test; an abort ends the run)."""
    try:
        result = call()
    except (ValueError, OverflowError) as error:
        message = str(error)
        assert any(re.search(rf"\b{re.escape(name)}\b", message) for name in names), \
            f"{type(error).__name__}({message!r}) names none of {names}"
        hypothesis.event(f"refused: {type(error).__name__}")  # --hypothesis-show-statistics counts them
        return None
    hypothesis.event("worked")
    return result


LOADER_ARGS = ("batch_size", "num_workers", "prefetch_factor", "world_size", "rank", "shape", "sample", "source",
               "len(source)", "size", "seed")


def check_epoch(loader: fastloop.Loader, n: int, sample_shape: tuple, batch_size: int) -> None:
    """The first batches of an epoch have the size the sampler gives and the source's shape."""
    with loader:
        for i, batch in enumerate(loader):
            x = batch[0] if isinstance(batch, tuple) else batch
            assert x.shape[1:] == sample_shape and 1 <= len(x) <= min(batch_size, max(n, 1))
            if i == 2:
                break


@SETTINGS
@hypothesis.given(n=st.integers(0, 40), sample=st.one_of(st.lists(st.integers(0, 4), max_size=3),
                                                          st.integers(60, 63).map(lambda d: [1] * d)),
                  batch_size=small_or_extreme(1, 50),
                  num_workers=mostly(st.integers(0, 3), st.sampled_from([1024, 1025] + HUGE + BAD)),
                  prefetch_factor=small_or_extreme(1, 3), world_size=small_or_extreme(1, 4),
                  rank=small_or_extreme(0, 4), drop_last=st.booleans(),
                  seed=st.sampled_from([0, -1, 2**64 - 1, 2**100]), shuffle=st.booleans())
def test_loader_in_threads_works_or_names_the_argument(n: int, sample: list, batch_size: int, num_workers: int,
                                                        prefetch_factor: int, world_size: int, rank: int,
                                                        drop_last: bool, seed: int, shuffle: bool) -> None:
    source = np.arange(n * int(np.prod(sample, dtype=np.int64)), dtype=np.uint8).reshape(n, *sample)
    prefetch = {"prefetch_factor": prefetch_factor} if num_workers != 0 else {}  # with 0 workers it raises, as torch's
    loader = works_or_names(lambda: fastloop.Loader(source, batch_size=batch_size, num_workers=num_workers,
                                                    mode="threads", world_size=world_size, rank=rank, seed=seed,
                                                    shuffle=shuffle, drop_last=drop_last, **prefetch), LOADER_ARGS)
    if loader is not None and num_workers <= 3:  # 1024 threads would work too, only slowly
        check_epoch(loader, n, tuple(sample), batch_size)


class Samples:
    """n samples of one shape, as a Python dataset returns them."""

    def __init__(self, n: int, shape: tuple) -> None:
        self.n, self.shape = n, shape

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple:
        return np.full(self.shape, i % 251, np.uint8), np.int64(i)


@hypothesis.settings(SETTINGS, max_examples=max(EXAMPLES // 4, 10))
@hypothesis.given(n=st.integers(0, 12), sample=st.one_of(st.lists(st.integers(0, 3), max_size=3),
                                                          st.integers(62, 64).map(lambda d: [1] * d)),
                  batch_size=small_or_extreme(1, 20),
                  num_workers=mostly(st.integers(1, 2), st.sampled_from([257] + HUGE + BAD)),
                  prefetch_factor=small_or_extreme(1, 3),
                  world_size=small_or_extreme(1, 3), rank=small_or_extreme(0, 3))
def test_loader_in_worker_processes_works_or_names_the_argument(n: int, sample: list, batch_size: int,
                                                                 num_workers: int, prefetch_factor: int,
                                                                 world_size: int, rank: int) -> None:
    loader = works_or_names(lambda: fastloop.Loader(Samples(n, tuple(sample)), batch_size=batch_size,
                                                    num_workers=num_workers, mode="processes",
                                                    prefetch_factor=prefetch_factor, world_size=world_size,
                                                    rank=rank), LOADER_ARGS)
    if loader is not None:
        check_epoch(loader, n, tuple(sample), batch_size)


@pytest.fixture(scope="module")
def raw_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp("raw")
    for i in range(3):
        (folder / f"{i}.raw").write_bytes(bytes(range(i, i + 48)))  # (4, 4, 3) uint8
    return str(folder)


@SETTINGS
@hypothesis.given(shape=st.lists(st.one_of(st.integers(0, 4), st.sampled_from(HUGE[:5] + [-1])), min_size=1, max_size=4),
                  batch_size=small_or_extreme(1, 4), crop=st.one_of(st.integers(1, 4), st.sampled_from(HUGE[:6])),
                  cast=st.sampled_from(["uint8", "float64"]))
def test_a_folder_of_any_declared_shape_through_a_pipeline_works_or_names_the_argument(
        raw_folder: str, shape: list, batch_size: int, crop: int, cast: str) -> None:
    """A Folder's raw shape is the user's word (no file is read to check it before the epoch):
    sizes computed from it, the batch and the pipeline's steps must all be checked."""
    def make() -> fastloop.Loader:
        pipeline = ops.Pipeline([ops.RandomCrop(crop), ops.Cast(cast)]) if len(shape) == 3 else None
        return fastloop.Loader(fastloop.Folder(raw_folder, "*.raw", dtype="uint8", shape=shape),
                               batch_size=batch_size, transform=pipeline)

    loader = works_or_names(make, LOADER_ARGS + ("crop",))
    if loader is not None:
        with loader:  # the files hold 48 bytes: a shape of more is refused as each is read
            batch = works_or_names(lambda: next(iter(loader)), ("bytes", "shape"))
            assert batch is None or batch.shape[0] == min(batch_size, 3)


@SETTINGS
@hypothesis.given(size=st.one_of(st.integers(1, 12), st.sampled_from(HUGE + BAD), st.tuples(st.integers(1, 12), st.integers(1, 12)),
                                 st.sampled_from(HUGE + BAD).map(lambda side: (side, side))),
                  offset=st.one_of(st.integers(0, 8), st.sampled_from(HUGE[:7] + [-1, -(2**63)])),
                  layout=st.sampled_from(["HWC", "CHW"]), batch=st.integers(0, 3))
def test_ops_crop_and_resize_work_or_name_the_argument(size: Any, offset: int, layout: str, batch: int) -> None:
    x = np.arange(batch * 8 * 8 * 3, dtype=np.uint8).reshape(batch, 8, 8, 3)
    if layout == "CHW":
        x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    names = ("size", "offsets", "crop", "x")
    out = works_or_names(lambda: ops.crop(x, size, offsets=(offset, offset), layout=layout), names)
    if out is not None:
        h, w = (size, size) if isinstance(size, int) else size
        assert out.shape == ((batch, 3, h, w) if layout == "CHW" else (batch, h, w, 3))
    image = np.zeros((8, 8, 3), np.uint8)
    resized = works_or_names(lambda: ops.resize(image, size), names)
    if resized is not None:
        assert resized.shape[2] == 3 and resized.size > 0


@SETTINGS
@hypothesis.given(first=st.sampled_from(["crop", "center", "resize", "resized_crop", "none"]),
                  size=st.one_of(st.integers(1, 10), st.sampled_from(HUGE + BAD)),
                  channels=st.sampled_from([1, 3, 4, 2**31, 2**63]), cast=st.sampled_from(["uint8", "float32", "float64"]),
                  flip=st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.0, float("nan")]))
def test_pipelines_work_or_name_the_argument(first: str, size: int, channels: int, cast: str, flip: float) -> None:
    def make() -> ops.Pipeline:
        step = {"crop": lambda: ops.RandomCrop(size), "center": lambda: ops.CenterCrop(size),
                "resize": lambda: ops.Resize((size, size)), "resized_crop": lambda: ops.RandomResizedCrop(size),
                "none": lambda: None}[first]()
        normalize = ops.Normalize([0.5] * min(channels, 4), [0.25] * min(channels, 4))
        return ops.Pipeline([s for s in (step, ops.RandomHFlip(flip), normalize, ops.Cast(cast)) if s is not None])

    names = ("size", "p", "flip", "Normalize", "mean", "channels", "crop", "step", "Pipeline")
    pipeline = works_or_names(make, names)
    if pipeline is not None:
        x = np.zeros((2, 6, 6, min(channels, 4)), np.uint8)
        out = works_or_names(lambda: pipeline(x, seed=1), names)
        if out is not None:
            assert out.shape[0] == 2 and out.dtype == np.dtype(cast)
