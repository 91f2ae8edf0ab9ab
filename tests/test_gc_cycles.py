"""Reference cycles through fastloop's C types are collected: a dataset that refers back to
its Loader (as a torch Dataset keeping `self.loader` does) is freed by gc.collect(), and the
Loader's forked workers end with it.

A cycle through a batch (dataset -> batch -> its slot lease -> loader) cannot be: a NumPy
array does not tell the collector about its .base, so nothing fastloop does is seen there."""

from __future__ import annotations

import gc
import weakref

import numpy as np

import fastloop
from waiting import alive, wait_until


class SelfAwareDataset:
    """Keeps a reference to the Loader that reads it: dataset -> Loader -> C loader ->
    fetch -> dataset."""

    def __init__(self, n: int = 64) -> None:
        self.n = n
        self.loader = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return np.full((4,), i, np.float32), np.int64(i)


def test_cycle_through_a_dataset_is_collected_and_its_workers_end():
    dataset = SelfAwareDataset()
    loader = fastloop.Loader(dataset, batch_size=8, num_workers=2, mode="processes", persistent_workers=True)
    dataset.loader = loader
    assert sum(len(y) for _, y in loader) == 64  # a whole epoch: the persistent workers stay
    pids = loader.worker_pids
    assert len(pids) == 2 and all(alive(p) for p in pids)
    gone = weakref.ref(dataset)
    del dataset, loader
    gc.collect()
    assert gone() is None, "the dataset in a cycle with its Loader was not collected"
    assert wait_until(lambda: not any(alive(p) for p in pids)), f"workers {pids} outlived the collected loader"


def test_cycle_through_an_open_epoch_is_collected_and_its_workers_end():
    dataset = SelfAwareDataset()
    loader = fastloop.Loader(dataset, batch_size=8, num_workers=2, mode="processes")
    epoch = iter(loader)
    dataset.loader, dataset.epoch = loader, epoch
    assert next(epoch)[0].shape == (8, 4)  # workers running; the batch is dropped at once
    pids = loader.worker_pids
    assert len(pids) == 2
    gone = weakref.ref(dataset)
    del dataset, loader, epoch
    gc.collect()
    assert gone() is None
    assert wait_until(lambda: not any(alive(p) for p in pids))


class Tagged(np.ndarray):
    """An array a user hangs attributes on (the loader it feeds, batches it cached)."""


def test_cycle_through_an_array_source_in_threads_mode_is_collected():
    images = np.zeros((64, 3, 8, 8), np.uint8).view(Tagged)
    loader = fastloop.Loader((images, np.arange(64)), batch_size=8, num_workers=2)
    images.loader = loader
    assert sum(len(y) for _, y in loader) == 64
    gone = weakref.ref(images)
    del images, loader
    gc.collect()
    assert gone() is None, "the source array in a cycle with its Loader was not collected"


def test_a_loader_a_finalizer_in_the_cycle_resurrects_still_works():
    """Finalizers run before the collector clears anything (PEP 442): one that keeps the C
    loader keeps the whole cycle, uncleared and working."""
    from fastloop import _core

    survivors = []

    class Keeper:
        def __del__(self):
            survivors.append(self.core)

    dataset = SelfAwareDataset()
    loader = fastloop.Loader(dataset, batch_size=8, num_workers=1, mode="processes")
    keeper = Keeper()
    keeper.core, keeper.dataset, dataset.keeper = loader._core, dataset, keeper
    dataset.loader = loader
    del dataset, loader, keeper
    gc.collect()
    assert len(survivors) == 1 and isinstance(survivors[0], _core._ProcLoader)
    core = survivors.pop()
    core.start_epoch(0)
    x, y, objects = core.next(10)  # arrays, then the batch's object bytes (none here)
    assert y.tolist() == list(range(8)) and objects is None
    del x, y
    core.stop()
