"""A Loader's batch as the user gets it: the slot fields (zero-copy arrays or tensors) and the
collated object fields in the samples' structure, the samples to a collate_fn, or one sample
when batch_size=None, as DataLoader hands them out."""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ._collate import as_arrays, collate, to_torch
from ._sample_codec import COLUMNS, decode
from ._samples import COLLATED, SampleLayout
from ._torch_interop import to_tensors


class Batch:
    """One batch as a core made it: the slot fields (batched arrays), and either the object
    fields' values (a list per field) or, when some sample did not fit the slots' layout, the
    samples whole; `indices` are the samples' dataset indices, for error messages."""

    __slots__ = ("fixed", "columns", "samples", "indices", "collated")

    def __init__(self, fixed: Sequence[Any], columns: Sequence[list] | None = None, samples: list | None = None,
                 indices: Sequence[int] | None = None) -> None:
        self.fixed, self.columns, self.samples, self.indices = fixed, columns, samples, indices
        self.collated: tuple | None = None  # (the batch as handed out,) when a worker thread made it

    @classmethod
    def from_worker(cls, arrays: tuple) -> "Batch":
        """A processes-mode batch: its arrays, then the bytes of its objects (or None)."""
        *fixed, blob = arrays
        if blob is None:
            return cls(fixed)
        kind, indices, payload = decode(blob)
        if kind == COLUMNS:
            return cls(fixed, payload, None, indices)
        return cls((), None, payload, indices)


    @classmethod
    def from_thread(cls, arrays: tuple) -> "Batch":
        """A batch of worker threads: its arrays, then its objects as (kind, indices, payload)."""
        *fixed, (kind, indices, payload) = arrays
        if kind == COLUMNS:
            return cls(fixed, payload, None, indices)
        if kind == COLLATED:
            batch = cls((), None, None, indices)
            batch.collated = (payload,)
            return batch
        return cls((), None, [as_arrays(s) for s in payload], indices)


class Assembler:
    """Batch -> what the Loader yields, for one layout, output, collate_fn and batching."""

    def __init__(self, layout: SampleLayout, output: str, collate_fn: Callable[[Any], Any] | None,
                 unbatched: bool, pinned: Any = None) -> None:
        """pinned: the loader's _torch_feed.PinnedBatches (pin_memory=True, output="torch", no
        device), which hands out slot fields as tensors over pinned slots; None: plain tensors."""
        self.layout, self.collate_fn, self.unbatched, self.pinned = layout, collate_fn, unbatched, pinned
        self.pin = pinned is not None  # collated values are fresh arrays: pinned copies, as DataLoader's
        self.torch = output == "torch"

    def _tensors(self, fixed: Sequence[Any]) -> tuple:
        return self.pinned.tensors(tuple(fixed)) if self.pinned is not None else to_tensors(tuple(fixed))

    def slots(self, fixed: tuple) -> Any:
        """A batch that is only slot fields (the usual one): as __call__, with less to do."""
        if self.torch:
            fixed = self._tensors(fixed)
        if self.collate_fn is None and not self.unbatched:
            return self.layout.build(fixed, None)
        return self.deliver(fixed, None, None)

    def __call__(self, batch: Batch) -> Any:
        if batch.collated is not None:
            return batch.collated[0]
        if batch.samples is not None:
            return self._whole(batch.samples, batch.indices)
        fixed = self._tensors(batch.fixed) if self.torch else batch.fixed
        return self.deliver(fixed, batch.columns, batch.indices)

    def deliver(self, fixed: Sequence[Any], columns: Sequence[list] | None, indices: Sequence[int] | None) -> Any:
        """Slot fields (as handed out) and object values in the samples' structure."""
        if self.unbatched:
            sample = self.layout.sample(fixed, columns, 0, self._convert)
            return self.collate_fn(sample) if self.collate_fn is not None else sample
        if self.collate_fn is not None:
            count = len(fixed[0]) if fixed else len(columns[0])  # type: ignore[index]
            return self.collate_fn([self.layout.sample(fixed, columns, i, self._convert) for i in range(count)])
        if columns is None:
            return self.layout.build(fixed, None)
        collated = self.layout.collate_columns(columns, indices)
        return self.layout.build(fixed, [self._convert(c) for c in collated])

    def _convert(self, value: Any) -> Any:
        return to_torch(value, self.pin) if self.torch else value

    def whole(self, samples: list, indices: Sequence[int] | None) -> Any:
        """What the Loader hands out for these samples as the dataset gave them (in a worker
        thread, where a collate_fn runs)."""
        return self._whole([as_arrays(s) for s in samples], indices)

    def _whole(self, samples: list, indices: Sequence[int] | None) -> Any:
        """A batch whose samples came whole: collated here, or given to the collate_fn."""
        if self.unbatched:
            sample = self._convert(samples[0])
            return self.collate_fn(sample) if self.collate_fn is not None else sample
        if self.collate_fn is not None:
            return self.collate_fn([self._convert(s) for s in samples])
        return self._convert(collate(samples, (), indices))


def check_same_shapes(batch: Batch) -> None:
    """For device='cuda', whose copies need the first sample's shapes: a batch whose samples
    came whole raises default_collate's error, or says why it cannot go."""
    if batch.samples is None:
        return
    collate(batch.samples, (), batch.indices)  # raises on shapes or structures that differ
    first = batch.indices[0] if batch.indices is not None and len(batch.indices) else "?"
    raise ValueError(f"the samples of the batch starting at sample {first} differ from the first sample's "
                     f"shapes, dtypes or structure: device='cuda' needs the first sample's shapes and dtypes in every "
                     f"batch (cast in the dataset or a transform)")

