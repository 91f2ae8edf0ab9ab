"""One sharding rule for every Loader mode: the C sampler's (fl_sampler.c). Over world sizes
1-8, n = 0..50 and drop_last both ways, every rank runs the same number of steps (a rank with
one more would wait forever in a DDP all-reduce), the ranks cover the data, and every mode
hands each rank the very batches the C threads loader does."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

import fastloop
from synthetic import IndexDataset


MODES: dict[str, Callable[[int, dict], fastloop.Loader]] = {
    "threads, 0 workers": lambda n, kw: fastloop.Loader(np.arange(n), num_workers=0, **kw),
    "threads, 2 workers": lambda n, kw: fastloop.Loader(np.arange(n), num_workers=2, mode="threads", **kw),
    "processes": lambda n, kw: fastloop.Loader(IndexDataset(n), num_workers=1, mode="processes", **kw),
    "in-process (num_workers=0, a Python dataset)": lambda n, kw: fastloop.Loader(IndexDataset(n), num_workers=0, **kw),
}


def rank_batches(mode: str, n: int, world: int, drop_last: bool) -> list[list[list[int]]]:
    """Each rank's batches (as lists of sample indices) of one shuffled epoch."""
    batch_size = 1 + n % 3  # 1, 2 and 3 over the n's: shard sizes and batch rounding both vary
    per_rank = []
    for rank in range(world):
        kw = dict(batch_size=batch_size, shuffle=True, seed=7, rank=rank, world_size=world, drop_last=drop_last)
        with MODES[mode](n, kw) as loader:
            batches = [batch.tolist() for batch in loader]
            assert len(batches) == len(loader), (mode, n, world, rank)
        per_rank.append(batches)
    return per_rank


@pytest.mark.parametrize("world", range(1, 9), ids=lambda w: f"world_size={w}")
@pytest.mark.parametrize("drop_last", [False, True], ids=["padded", "drop_last"])
@pytest.mark.parametrize("mode", list(MODES))
def test_every_rank_gets_as_many_batches_and_together_the_ranks_cover_the_data(mode: str, drop_last: bool,
                                                                               world: int) -> None:
    for n in range(51):
        per_rank = rank_batches(mode, n, world, drop_last)
        counts = [len(batches) for batches in per_rank]
        assert len(set(counts)) == 1, f"{mode}: world_size={world}, n={n}: batches per rank {counts}"
        seen = [i for batches in per_rank for batch in batches for i in batch]
        if not drop_last:  # padded by wrapping around: every sample, up to world - 1 twice
            assert sorted(set(seen)) == list(range(n)), (mode, n, world)
            assert len(seen) - n < world
        else:  # trimmed: disjoint, up to world - 1 (shard tail) + world * (batch - 1) sit out
            assert len(set(seen)) == len(seen) and set(seen) <= set(range(n)), (mode, n, world)
            assert n - len(seen) < world * (1 + n % 3)
        if mode != "threads, 0 workers":  # the same batches as the C threads loader, rank by rank
            assert per_rank == rank_batches("threads, 0 workers", n, world, drop_last), (mode, n, world)


def test_four_ranks_over_ten_samples_run_three_steps_each_in_every_mode() -> None:
    """The case that diverged: num_workers=0 with a Python dataset gave ranks 3, 3, 2, 2 batches."""
    for mode in MODES:
        steps = [len(batches) for batches in rank_batches(mode, 10, 4, drop_last=False)]  # batch size 2 here
        assert steps == [2, 2, 2, 2], (mode, steps)
        lengths = [len(fastloop.Loader(IndexDataset(10), batch_size=1, rank=r, world_size=4)) for r in range(4)]
        assert lengths == [3, 3, 3, 3]
