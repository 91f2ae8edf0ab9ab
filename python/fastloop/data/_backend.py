"""What a Loader asks of the source of its batches, whichever backend makes them, as
fl_batch_source is in C (csrc/data/fl_batch_source.h): the Loader (loader.py) is written once
over this protocol, and each backend builds one source:

* _backend_arrays.py: C threads read arrays, Folders and image sources into the slots (_Loader);
* _backend_threads.py: worker threads of this process run the Python dataset (_ThreadLoader);
* _backend_processes.py: forked worker processes run it, into shared memory (_ProcLoader);
* _backend_inline.py: num_workers=0 with Python code: the calling thread fetches each batch.

Also here: what the Python-fed backends share (the slot fields, the sampling arguments, the
workers' seeds)."""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import numpy as np

from ._samples import Fetcher
from .ops import _GEOMETRY_HINT, Pipeline


class BatchSource(Protocol):
    """A source of batches, in order, one epoch at a time. One consumer thread calls
    start_epoch and next; stop may come from any thread.

    next() returns None after the epoch's last batch, else a batch: a tuple of the slot's
    arrays (zero-copy, the slot lent until the arrays are dropped), ended by the workers'
    objects (bytes or a list) for the Python-fed worker backends; or a _batches.Batch
    (num_workers=0 with Python code). A worker's failure raises there.

    What only some sources have, the Loader reads with getattr: `lent` (slots lent out now),
    `pids` (worker processes), `skipped` ((count, first message) of on_error="skip"),
    `batch_ends` (a batch_sampler's uneven batches, set before each epoch), `copied_out`."""

    @property
    def batches(self) -> int:
        """Batches per epoch of this rank."""
        ...

    def start_epoch(self, epoch: int, first_batch: int = 0) -> None:
        """Begins `epoch` at batch first_batch (the batches before it are skipped),
        abandoning one in progress."""
        ...

    def next(self, timeout: float | None) -> Any:
        """The next batch in order, waiting at most `timeout` seconds (None: no limit)."""
        ...

    def stop(self, wait: bool = True) -> None:
        """Abandons the epoch (wait=False: asks the workers to end, as a finalizer must)."""
        ...


def sampling(loader: Any) -> dict:
    """The sampler's arguments, as every C source takes them."""
    return dict(batch_size=loader.batch_size, shuffle=loader.shuffle, seed=loader.seed, rank=loader.rank,
                world_size=loader.world_size, drop_last=loader.drop_last)


def worker_seed(seed: int, worker_id: int) -> int:
    """A worker's own seed (WorkerInfo.seed): distinct per worker, reproducible."""
    return (seed * 1_000_003 + worker_id) % 2**32


def dataset_length(fetch: Fetcher) -> int:
    """Samples the sampler draws from: the dataset's, or a sampler's."""
    return len(fetch.dataset) if fetch.order is None else fetch.order.n


class ArraysDataset:
    """Samples of several arrays, as tuples: what a Python transform over arrays receives."""

    def __init__(self, arrays: Sequence[np.ndarray]) -> None:
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, i: int) -> Any:
        return tuple(a[i] for a in self.arrays) if len(self.arrays) > 1 else self.arrays[0][i]


def fused_geometry(pipeline: Pipeline) -> Callable[[Any, int, int], np.ndarray]:
    """(image, epoch seed, id) -> the image cropped/resized by the pipeline's first step."""

    def apply(image: Any, seed: int, index: int) -> np.ndarray:
        return pipeline._apply_geometry(np.asarray(image), seed, [index])

    return apply


def python_fields(fetch: Fetcher, first: Any, pipeline: Pipeline | None) -> tuple[list, Any]:
    """((dtype, sample shape) per slot field as the workers store them, the C part of the
    pipeline): a Pipeline's fused crop/resize runs on each fetched image in the worker."""
    layout = fetch.layout
    assert layout is not None
    fields = list(layout.specs)
    if pipeline is not None and pipeline.geometry is not None:
        # the crop/resize runs in the worker on each fetched image, the later steps in C
        if pipeline.fixed_size() is None:
            raise ValueError(f"Resize({pipeline.steps[0].size}) gives images of different sizes: "
                             f"{_GEOMETRY_HINT}")
        fetch.geometry = fused_geometry(pipeline)
        image = np.asarray(fetch.geometry(layout.flatten(first, [])[0], 0, 0))
        fields[0] = (image.dtype, tuple(image.shape))
    core_pipeline = pipeline._core(pipeline.channels_of(fields[0][1])) if pipeline is not None else None
    return fields, core_pipeline
