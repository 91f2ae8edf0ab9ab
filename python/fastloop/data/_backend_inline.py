"""The inline backend: num_workers=0 with Python code (a dataset or transform). The calling
thread fetches and collates each batch when asked, as torch's num_workers=0 does, in the same
order and with the same augmentations as the worker backends; a BatchSource (_backend.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._core import _epoch_batches, _epoch_order, _epoch_seed
from ._batches import Batch
from ._collate import as_arrays
from ._sample_codec import describe
from ._samples import Fetcher
from ._worker import begin_sample, end_sample
from .ops import Pipeline


class InProcess:
    """num_workers=0 with Python code: samples fetched and collated in the calling thread (as
    torch's num_workers=0), in the same order and with the same augmentations as workers."""

    def __init__(self, loader: Any, fetch: Fetcher, pipeline: Pipeline | None) -> None:
        self.loader, self.fetch, self.pipeline = loader, fetch, pipeline
        self.n = len(fetch.dataset) if fetch.order is None else fetch.order.n
        self.order = np.empty(0, np.int64)
        self.position = 0
        self.batch = 0  # batches of the epoch made
        self.seed = 0

    def _ends(self) -> np.ndarray | None:
        """Where a batch_sampler's (uneven) batches end in the order, else None."""
        return self.fetch.order.ends if self.fetch.order is not None else None

    @property
    def batches(self) -> int:
        """Batches per epoch: a batch_sampler's, or the C sampler's rule, as in both worker
        modes (the same on every rank)."""
        ends = self._ends()
        if ends is not None:
            return len(ends)
        L = self.loader
        return _epoch_batches(self.n, L.rank, L.world_size, L.batch_size, L.drop_last)

    def start_epoch(self, epoch: int, first_batch: int = 0) -> None:
        L = self.loader
        self.order = _epoch_order(self.n, L.shuffle, L.seed, epoch, L.rank, L.world_size, L.drop_last)
        self.seed = _epoch_seed(L.seed, epoch)
        self.position = min(first_batch, self.batches) * L.batch_size
        self.batch = min(first_batch, self.batches)

    def _next_positions(self) -> np.ndarray | None:
        """The order's positions of the next batch; None after the last."""
        L, ends = self.loader, self._ends()
        if ends is not None:
            if self.batch >= len(ends):
                return None
            start, stop = (int(ends[self.batch - 1]) if self.batch else 0), int(ends[self.batch])
        else:
            if self.position >= self.batches * L.batch_size or self.position >= len(self.order):
                return None
            start, stop = self.position, self.position + L.batch_size
            self.position = stop
        self.batch += 1
        return self.order[start:stop]

    def next(self, timeout: float | None) -> Batch | None:
        L = self.loader
        ids = self._next_positions()
        if ids is None:
            return None
        indices = [self.fetch.index(int(i)) for i in ids]
        samples = [self._sample(int(i)) for i in ids]
        L._metrics.add("loader/samples", len(ids))
        L._metrics.add("loader/batches")
        return self._collect(samples, indices, ids)

    def _sample(self, position: int) -> Any:
        begin_sample(self.seed, position)  # sample_rng() draws as a worker's would
        try:
            return self.fetch.sample(position)
        finally:
            end_sample()

    def _collect(self, samples: list, indices: list, ids: np.ndarray) -> Batch:
        """The batch's slot fields stacked in the first sample's dtypes and shapes (field 0
        through the pipeline) and its object values; or its samples whole when one does not
        fit that layout, as a worker sends them."""
        layout = self.fetch.layout
        assert layout is not None
        objects: list = []
        rows = []
        for i, sample in enumerate(samples):
            try:
                row = layout.flatten(sample, objects)
            except TypeError as e:  # a tensor NumPy cannot view: name the sample, as workers do
                raise TypeError(f"sample {indices[i]}: {e}") from None
            if row is None:
                return self._whole(samples, indices, i, "is laid out unlike the first sample")
            rows.append(row)
        fixed = []
        for k, (dtype, shape) in enumerate(layout.specs):
            column = [np.asarray(row[k]) for row in rows]
            odd = next((i for i, c in enumerate(column) if c.shape != shape), None)
            if odd is not None:
                return self._whole(samples, indices, odd, f"has {describe(layout.fixed[k])} of shape "
                                                          f"{column[odd].shape}, the first sample's is {shape}")
            odd = next((i for i, c in enumerate(column) if c.dtype != dtype), None)
            if odd is not None and self.pipeline is None:  # collated from its samples, promoted as torch does
                return self._whole(samples, indices, odd, "")
            if odd is not None and not all(np.can_cast(c.dtype, dtype, "safe") for c in column):
                odd = next(i for i, c in enumerate(column) if not np.can_cast(c.dtype, dtype, "safe"))
                raise TypeError(f"sample {indices[odd]}: {describe(layout.fixed[k])} is {column[odd].dtype}, but "
                                f"the batch slots hold {dtype} (the first sample's dtype), which it does not cast "
                                f"to without changing values: with a Pipeline transform every sample needs the "
                                f"first sample's dtype (or one that casts to it safely); cast it in the dataset or "
                                f"a transform")
            fixed.append(np.stack(column).astype(dtype, copy=False))  # the same dtype, or a safe cast
        if self.pipeline is not None:
            fixed[0] = self.pipeline(fixed[0], seed=self.seed, ids=ids)
        columns = [list(c) for c in zip(*objects)] if layout.objects else None
        return Batch(tuple(fixed), columns, None, indices)

    def _whole(self, samples: list, indices: list, odd: int, why: str) -> Batch:
        if self.pipeline is not None:
            raise ValueError(f"sample {indices[odd]} {why}: a Pipeline transform needs every sample laid out "
                             f"as the first")
        return Batch((), None, [as_arrays(s) for s in samples], indices)

    def stop(self, wait: bool = True) -> None:
        self.position = len(self.order)
        self.batch = self.batches
