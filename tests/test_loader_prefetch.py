"""Prefetch depth as DataLoader defines it: `prefetch` (prefetch_factor) batches per worker in
flight besides the batches the user holds, in both modes, whether the user holds the current
batch, the current and the previous one, or keeps a list of them."""

from __future__ import annotations

import numpy as np
import pytest

import fastloop
from recording import RecordsFetches
from waiting import wait_until

N, BATCH = 400, 4
IMAGES = np.arange(N * 6, dtype=np.float32).reshape(N, 6)
LABELS = np.arange(N, dtype=np.int64)


def make_loader(mode: str, workers: int, prefetch: int) -> tuple[fastloop.Loader, RecordsFetches | None]:
    if mode == "threads":
        return fastloop.Loader((IMAGES, LABELS), batch_size=BATCH, num_workers=workers, prefetch_factor=prefetch), None
    dataset = RecordsFetches(N, lambda i: (IMAGES[i], LABELS[i]))
    loader = fastloop.Loader(dataset, batch_size=BATCH, num_workers=workers, prefetch_factor=prefetch, timeout=60)
    return loader, dataset


@pytest.mark.parametrize("mode", ["threads", "processes"])
@pytest.mark.parametrize("held", [1, 2, 5])
@pytest.mark.parametrize("workers,prefetch", [(1, 1), (2, 2)])
def test_workers_times_prefetch_batches_are_in_flight_besides_the_batches_held(mode, held, workers, prefetch):
    loader, dataset = make_loader(mode, workers, prefetch)
    it = iter(loader)
    kept = [next(it) for _ in range(held)]
    depth = workers * prefetch
    core = loader._core
    assert wait_until(lambda: core.ahead == depth), f"{core.ahead} batches ahead, want {depth}"
    if dataset is not None:  # the workers fetched exactly the held batches and `depth` more
        want = (held + depth) * BATCH
        assert wait_until(lambda: int(dataset.fetched.sum()) == want), np.flatnonzero(dataset.fetched)
    assert core.ahead == depth  # never more: a further batch waits for one to be taken
    # two held batches stay views of their slots; a third one kept is a copy, so keeping batches
    # never takes slots from the workers
    views = [x for x, _ in kept if isinstance(x.base, fastloop._core._SlotLease)]
    assert len(views) == min(held, 2) and core.lent == min(held, 2)
    for b, (x, y) in enumerate(kept):
        assert np.array_equal(y, LABELS[b * BATCH:(b + 1) * BATCH]) and np.array_equal(x, IMAGES[y])
    del kept, views
    rest = [y.copy() for _, y in it]
    assert np.array_equal(np.concatenate(rest), LABELS[held * BATCH:])
    loader.close()


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_the_usual_loop_takes_every_batch_as_a_view_and_keeps_the_depth(mode):
    """`for x, y in loader:` still holds the previous batch while the next is taken: no copy."""
    loader, _ = make_loader(mode, 2, 2)
    core = loader._core
    for step, (x, y) in enumerate(loader):
        assert isinstance(x.base, fastloop._core._SlotLease), f"batch {step} was copied"
        if step == 10:
            assert wait_until(lambda: core.ahead == 4), core.ahead
    loader.close()
