"""Samples of a Python dataset for fastloop.Loader: fetching one (a sampler's index mapped,
transform / target_transform applied as torchvision's datasets do, generators seeded per
batch in workers), its structure (one field, a tuple, a dict) flattened into the fields a
batch slot holds, and batches given back in that structure or to a collate_fn."""

from __future__ import annotations

import mmap
from typing import Any, Callable, Iterable

import numpy as np

from ._torch_interop import loaded_torch, sample_seed, seed_generators, tensor_as_array


class SampleStructure:
    """How samples are shaped: one field, a tuple/list of fields, or a flat dict of them."""

    def __init__(self, first: Any) -> None:
        self.keys: tuple | None = tuple(first) if isinstance(first, dict) else None
        self.single = self.keys is None and not isinstance(first, (tuple, list))

    def flatten(self, sample: Any) -> tuple:
        """The sample's fields in order (tensors as NumPy views)."""
        if self.keys is not None:
            if not isinstance(sample, dict) or tuple(sample) != self.keys:
                got = tuple(sample) if isinstance(sample, dict) else type(sample).__name__
                raise ValueError(f"the sample has keys {got}, but the first sample had {self.keys}")
            values: Any = sample.values()
        elif self.single:
            values = (sample,)
        else:
            values = sample
        torch = loaded_torch()
        if torch is None or not any(isinstance(v, torch.Tensor) for v in values):  # the common, fast path
            return values if type(values) is tuple else tuple(values)
        return tuple([tensor_as_array(v, lambda i=i: f"sample field {i}") if isinstance(v, torch.Tensor) else v
                      for i, v in enumerate(values)])

    def build(self, fields: tuple) -> Any:
        """Fields (batched or not) in the samples' structure."""
        if self.keys is not None:
            return dict(zip(self.keys, fields))
        return fields[0] if self.single else tuple(fields)

    def unbatch(self, fields: tuple) -> list:
        """A batch as the list of its samples (views of its rows), for a collate_fn."""
        return [self.build(tuple(f[i] for f in fields)) for i in range(len(fields[0]))]


def apply_transforms(sample: Any, transform: Callable | None, target_transform: Callable | None) -> Any:
    """transform on the input (the sample itself if it is one field, else its field 0) and
    target_transform on the target (field 1), as torchvision's datasets apply them."""
    if isinstance(sample, (tuple, list)) and len(sample) >= 1:
        fields = list(sample)
        if transform is not None:
            fields[0] = transform(fields[0])
        if target_transform is not None:
            if len(fields) < 2:
                raise ValueError("target_transform transforms field 1 of (input, target) samples, "
                                 "but these samples have 1 field")
            fields[1] = target_transform(fields[1])
        return tuple(fields)
    if target_transform is not None:
        raise ValueError(f"target_transform transforms field 1 of (input, target) samples, "
                         f"but these samples are a {type(sample).__name__}")
    return transform(sample) if transform is not None else sample


class Fetcher:
    """index -> the sample's fields. `order` (a sampler's indices for this epoch) maps the
    loader's indices to dataset indices. In workers, a batch's first sample comes with the
    epoch seed: random, numpy and torch are then seeded from (epoch seed, index), once per
    batch (~12 us), so augmentations are reproducible whichever worker draws them."""

    def __init__(self, dataset: Any, transform: Callable | None, target_transform: Callable | None,
                 order: "SharedOrder | None") -> None:
        self.dataset, self.transform, self.target_transform, self.order = dataset, transform, target_transform, order
        self.structure: SampleStructure | None = None
        # a Pipeline's fused crop/resize: (image, epoch seed, id) -> image, run on field 0 here
        # (before the C pipeline's later steps), drawn from the seed and id the threads use
        self.geometry: Callable[[Any, int, int], Any] | None = None
        self._epoch_seed = 0  # the seed comes with a batch's first sample only

    def sample(self, position: int) -> Any:
        index = position if self.order is None else int(self.order.indices[position])
        sample = self.dataset[index]
        if self.transform is not None or self.target_transform is not None:
            sample = apply_transforms(sample, self.transform, self.target_transform)
        return sample

    def probe(self) -> tuple:
        """The first sample's fields; learns the structure."""
        first = self.sample(0)
        self.structure = SampleStructure(first)
        return self.structure.flatten(first)

    def __call__(self, position: int, epoch_seed: int | None = None) -> tuple:
        if epoch_seed is not None:
            seed_generators(sample_seed(epoch_seed, position))
            self._epoch_seed = epoch_seed
        if self.order is None and self.transform is None and self.target_transform is None:
            fields = self.structure.flatten(self.dataset[position])  # type: ignore[union-attr]
        else:
            fields = self.structure.flatten(self.sample(position))  # type: ignore[union-attr]
        if self.geometry is not None:
            fields = (self.geometry(fields[0], self._epoch_seed, position), *fields[1:])
        return fields


class SharedOrder:
    """A sampler's (or batch_sampler's) indices, drawn anew each epoch into memory shared
    with the worker processes (an anonymous shared mapping made before they fork)."""

    def __init__(self, sampler: Iterable | None, batch_sampler: Iterable | None) -> None:
        self.sampler, self.batch_sampler = sampler, batch_sampler
        first = self._draw(0)
        self.n = len(first)
        if self.n == 0:
            raise ValueError("the sampler gave no indices")
        self._map = mmap.mmap(-1, self.n * 8)
        self.indices = np.frombuffer(self._map, dtype=np.int64)
        self.indices[:] = first

    def _draw(self, epoch: int) -> np.ndarray:
        source = self.sampler if self.sampler is not None else self.batch_sampler
        if hasattr(source, "set_epoch"):  # DistributedSampler and the like draw per epoch
            source.set_epoch(epoch)
        if self.sampler is not None:
            return np.fromiter((int(i) for i in self.sampler), dtype=np.int64)
        batches = [list(b) for b in self.batch_sampler]  # type: ignore[union-attr]
        size = len(batches[0]) if batches else 0
        if any(len(b) != size for b in batches[:-1]) or (batches and len(batches[-1]) > size):
            raise ValueError("batch_sampler must give batches of one size (the last may be smaller): "
                             "the Loader's batch slots have a fixed size")
        self.batch_size = size
        return np.asarray([i for b in batches for i in b], dtype=np.int64)

    def start_epoch(self, epoch: int) -> None:
        """Draws this epoch's indices (before any worker is given a batch of it)."""
        indices = self._draw(epoch)
        if len(indices) != self.n:
            raise ValueError(f"the sampler gave {len(indices)} indices this epoch, {self.n} before: "
                             "the Loader needs the same number every epoch")
        self.indices[:] = indices
