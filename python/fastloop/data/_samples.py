"""Samples of a Python dataset for fastloop.Loader: fetching one (a sampler's index mapped,
transform / target_transform applied as torchvision's datasets do, generators seeded per
batch in workers), its layout (which values go into the batch slots' fixed-shape fields, which
travel as objects), the samples a worker keeps until its batch is sent, and a sampler's
indices shared with the workers."""

from __future__ import annotations

import copy
import mmap
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ._collate import collate
from ._sample_codec import COLUMNS, SAMPLES, encode, what
from ._torch_interop import is_tensor, loaded_torch, sample_seed, seed_generators, tensor_as_array
from ._worker import begin_sample, end_sample

FIXED, OBJECT, SEQUENCE, MAPPING = range(4)
COLLATED = b"C"  # a worker thread's batch, already what the Loader hands out (its collate_fn ran there)
MAX_FIXED = 64  # fields a batch slot holds (FL_SOURCE_MAX_FIELDS); further arrays travel as objects
_SCALARS = (bool, int, float, complex)


def _fixed_array(value: Any, path: tuple) -> np.ndarray | None:
    """The value as the array a slot field holds, or None if it travels as an object."""
    if is_tensor(value):
        array = tensor_as_array(value, lambda: what(path))  # a CUDA or bfloat16 tensor: TypeError naming it
    elif isinstance(value, np.ndarray):
        array = value
    elif isinstance(value, (np.bool_, np.number)) or type(value) in _SCALARS:
        array = np.asarray(value)  # an int beyond 64 bits gives an object array: an object
    else:
        return None
    return None if array.dtype.hasobject or array.dtype.kind in "USV" else array


class SampleLayout:
    """How samples are laid out in a batch, learnt from the first one. Tuples, lists,
    namedtuples and dicts are walked into; each array, tensor or number in them (up to 64) is
    a fixed-shape field of the batch slots (zero-copy), every other value (a string, bytes,
    None, any object) an object field, sent per batch. A node is (FIXED, field, Python scalar
    type or None, path), (OBJECT, field, parent is a sequence, path), (SEQUENCE, type,
    children) or (MAPPING, dict, keys, children)."""

    def __init__(self, first: Any) -> None:
        self.fixed: list[tuple] = []  # per slot field: its path in the sample
        self.specs: list[tuple[np.dtype, tuple]] = []  # per slot field: (dtype, shape) in the first sample
        self.objects: list[tuple] = []  # per object field: its path
        self.in_sequence: list[bool] = []  # per object field: whether a tuple or list holds it
        self.leaves: list[tuple] = []  # every value's path, in order
        self.root = self._learn(first, (), False)
        if not self.fixed and not self.objects:  # (), {}: one object, collated as default_collate does
            self.root, self.objects, self.in_sequence, self.leaves = (OBJECT, 0, False, ()), [()], [False], [()]
        self._finish()

    @classmethod
    def of_fields(cls, count: int, single: bool) -> "SampleLayout":
        """The layout of array sources: one field, or a tuple of `count` fields."""
        layout = cls.__new__(cls)
        layout.fixed = [()] if single else [(k,) for k in range(count)]
        layout.specs, layout.objects, layout.in_sequence, layout.leaves = [], [], [], list(layout.fixed)
        leaves = tuple((FIXED, k, None, path) for k, path in enumerate(layout.fixed))
        layout.root = leaves[0] if single else (SEQUENCE, tuple, leaves)
        layout._finish()
        return layout

    def _finish(self) -> None:
        root = self.root
        self.single = root[0] in (FIXED, OBJECT)
        children = root[-1] if root[0] in (SEQUENCE, MAPPING) else ()
        # the usual samples: one array, or a tuple / flat dict of arrays and numbers; flatten()
        # and build() take a short path for them
        self.flat = not self.objects and (root[0] == FIXED or (
            root[1] in (tuple, list, dict) and all(c[0] == FIXED for c in children)))
        self.keys = root[2] if root[0] == MAPPING else None
        self._kind = root[1] if root[0] == SEQUENCE else None

    def _learn(self, value: Any, path: tuple, in_sequence: bool) -> tuple:
        kind = type(value)
        if kind is tuple or kind is list or (isinstance(value, tuple) and hasattr(kind, "_fields")):
            return (SEQUENCE, kind, tuple(self._learn(v, path + (k,), True) for k, v in enumerate(value)))
        if kind is dict:
            keys = tuple(value)
            return (MAPPING, dict, keys, tuple(self._learn(value[k], path + (k,), False) for k in keys))
        self.leaves.append(path)
        array = _fixed_array(value, path) if len(self.fixed) < MAX_FIXED else None
        if array is not None:
            self.fixed.append(path)
            self.specs.append((array.dtype, tuple(array.shape)))
            return (FIXED, len(self.fixed) - 1, kind if kind in _SCALARS else None, path)
        self.objects.append(path)
        self.in_sequence.append(in_sequence)
        return (OBJECT, len(self.objects) - 1, in_sequence, path)

    # ---- in the worker: a sample into slot fields and object values ----

    def flatten(self, sample: Any, objects: list) -> tuple | None:
        """The sample's slot fields in order (tensors as NumPy views), its object values
        appended to `objects` as one tuple; None if the sample is laid out otherwise."""
        if not self.flat:
            fixed: list = []
            values: list = []
            if not self._walk(self.root, sample, fixed, values, loaded_torch()):
                return None
            objects.append(tuple(values))
            return tuple(fixed)
        if self.keys is not None:
            if not isinstance(sample, dict) or tuple(sample) != self.keys:
                return None
            values_view: Any = sample.values()
        elif self.single:
            values_view = (sample,)
        elif isinstance(sample, (tuple, list)) and len(sample) == len(self.fixed):
            values_view = sample
        else:
            return None
        torch = loaded_torch()
        if torch is None or not any(isinstance(v, torch.Tensor) for v in values_view):  # the common, fast path
            return values_view if type(values_view) is tuple else tuple(values_view)
        return tuple([tensor_as_array(v, lambda path=path: what(path)) if isinstance(v, torch.Tensor) else v
                      for v, path in zip(values_view, self.fixed)])

    def _walk(self, node: tuple, value: Any, fixed: list, objects: list, torch: Any) -> bool:
        kind = node[0]
        if kind == FIXED:
            is_t = torch is not None and isinstance(value, torch.Tensor)
            fixed.append(tensor_as_array(value, lambda: what(node[3])) if is_t else value)
            return True
        if kind == OBJECT:
            objects.append(value)
            return True
        children = node[-1]
        if type(value) is not node[1] or len(value) != len(children):
            return False
        if kind == SEQUENCE:
            return all(self._walk(c, v, fixed, objects, torch) for c, v in zip(children, value))
        return all(k in value and self._walk(c, value[k], fixed, objects, torch) for k, c in zip(node[2], children))

    # ---- in the main process: batches back in the samples' structure ----

    def build(self, fixed: Sequence[Any], columns: Sequence[Any] | None) -> Any:
        """The batch in the samples' structure: slot fields batched, object fields collated."""
        if self.flat:
            if self.keys is not None:
                return dict(zip(self.keys, fixed))
            return fixed[0] if self.single else self._kind(fixed)  # type: ignore[misc]
        return self._build(self.root, fixed, columns)

    def _build(self, node: tuple, fixed: Sequence[Any], columns: Any) -> Any:
        kind = node[0]
        if kind == FIXED:
            return fixed[node[1]]
        if kind == OBJECT:
            return columns[node[1]]
        items = [self._build(c, fixed, columns) for c in node[-1]]
        if kind == MAPPING:
            return dict(zip(node[2], items))
        kind = node[1]
        return kind(*items) if kind is not tuple and kind is not list else kind(items)

    def collate_columns(self, columns: Sequence[list], indices: Sequence[int] | None) -> list:
        """Each object field's values of a batch as default_collate batches them (str: a tuple
        inside a tuple or list sample, else a list, as default_collate gives them)."""
        return [collate(tuple(column) if in_sequence else column, path, indices)
                for path, in_sequence, column in zip(self.objects, self.in_sequence, columns)]

    def sample(self, fixed: Sequence[Any], columns: Sequence[list] | None, i: int,
               convert: Callable[[Any], Any]) -> Any:
        """Sample i of a batch: rows of the slot fields (numbers back to Python numbers where
        the dataset gave them), its object values through `convert`."""
        return self._sample(self.root, fixed, columns, i, convert)

    def _sample(self, node: tuple, fixed: Sequence[Any], columns: Any, i: int, convert: Callable) -> Any:
        kind = node[0]
        if kind == FIXED:
            row = fixed[node[1]][i]
            return row.item() if node[2] is not None else row
        if kind == OBJECT:
            return convert(columns[node[1]][i])
        items = [self._sample(c, fixed, columns, i, convert) for c in node[-1]]
        if kind == MAPPING:
            return dict(zip(node[2], items))
        kind = node[1]
        return kind(*items) if kind is not tuple and kind is not list else kind(items)

    def objects_bytes(self, first: Any, batch_size: int) -> int:
        """Room in a slot for what a batch sends besides its slot fields: twice what the first
        sample's object values take, plus its slot fields' size once (a batch of samples that
        differ from the first, sent whole, then fits too when they are about that size); 4 KiB
        at least, 64 MiB at most (a batch needing more sends it after itself). Pages a batch
        does not write are never touched, so they cost no memory."""
        one = sum(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize for dtype, shape in self.specs)
        if self.objects:
            values: list = []
            self.flatten(first, values)
            one += 2 * len(encode(COLUMNS, [0], [[v] for v in values[0]], self.objects))
        return int(min(64 << 20, max(4096, (one + 8) * batch_size)))


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
    """position -> the sample's slot fields. `order` (a sampler's indices for this epoch)
    maps the loader's positions to dataset indices. In workers, a batch's first sample comes
    with the epoch seed: in a worker process random, numpy and torch are then seeded from
    (epoch seed, index), once per batch (~12 us), so augmentations are reproducible whichever
    worker draws them (worker threads share those generators: they leave them alone, and
    sample_rng() serves every mode); the batch's samples are kept until finish() sends their
    object values (or the samples whole, when one did not fit the slots' fields). Each worker
    thread fetches with its own copy (for_thread()), as each worker process has its own."""

    def __init__(self, dataset: Any, transform: Callable | None, target_transform: Callable | None,
                 order: "SharedOrder | None") -> None:
        self.dataset, self.transform, self.target_transform, self.order = dataset, transform, target_transform, order
        self.layout: SampleLayout | None = None
        # a Pipeline's fused crop/resize: (image, epoch seed, id) -> image, run on field 0 here
        # (before the C pipeline's later steps), drawn from the seed and id the threads use
        self.geometry: Callable[[Any, int, int], Any] | None = None
        self._epoch_seed = 0  # the seed comes with a batch's first sample only
        self._kept: list = []  # this batch's (dataset index, sample), for finish()
        self._objects: list = []  # this batch's object values, a tuple per sample
        self._seeds_globals = True  # a worker process's; a worker thread's copy leaves them alone
        self._collate: Callable[[list, list], Any] | None = None  # a worker thread's: (samples, indices) -> batch

    def for_thread(self, collate: Callable[[list, list], Any] | None = None) -> "Fetcher":
        """A copy for one worker thread: its own per-batch state; the dataset, transforms,
        layout and order shared (read only). collate: the whole batch is made on the thread
        from its samples as fetched (a collate_fn runs there, as in DataLoader's workers);
        nothing goes through the batch slots."""
        mine = copy.copy(self)
        mine._kept, mine._objects, mine._seeds_globals, mine._collate = [], [], False, collate
        return mine

    def index(self, position: int) -> int:
        return position if self.order is None else int(self.order.indices[position])

    def sample(self, position: int) -> Any:
        """The sample at `position`, transformed."""
        sample = self.dataset[self.index(position)]
        if self.transform is not None or self.target_transform is not None:
            sample = apply_transforms(sample, self.transform, self.target_transform)
        return sample

    def probe(self) -> Any:
        """The first sample; learns the layout."""
        begin_sample(0, 0)  # a generator for sample_rng(); the probe's draws are only looked at
        try:
            first = self.sample(0)
        finally:
            end_sample()
        self.layout = SampleLayout(first)
        return first

    def __call__(self, position: int, epoch_seed: int | None = None) -> tuple | None:
        if epoch_seed is not None:  # a batch starts
            if self._seeds_globals:
                seed_generators(sample_seed(epoch_seed, position))
            self._epoch_seed = epoch_seed
            self._clear()
        begin_sample(self._epoch_seed, position)
        if self.order is None and self.transform is None and self.target_transform is None:
            index, sample = position, self.dataset[position]
        else:
            index, sample = self.index(position), self.sample(position)
        self._kept.append((index, sample))
        if self._collate is not None:
            return None  # the batch goes "raw": its samples to finish_objects, none into the slot
        fields = self.layout.flatten(sample, self._objects)  # type: ignore[union-attr]
        if fields is not None and self.geometry is not None:
            fields = (self.geometry(fields[0], self._epoch_seed, position), *fields[1:])
        return fields

    def finish(self, raw: int) -> bytearray | None:
        """The batch's object values (raw: its samples whole) as bytes for the main process,
        or None when there are none."""
        try:
            if not raw and not self.layout.objects:  # type: ignore[union-attr]
                return None  # the usual batch: all in the slot fields
            indices = [index for index, _ in self._kept]
            if raw:
                return encode(SAMPLES, indices, [sample for _, sample in self._kept])
            columns = [list(c) for c in zip(*self._objects)]
            return encode(COLUMNS, indices, columns, self.layout.objects)  # type: ignore[union-attr]
        finally:
            self._clear()

    def finish_objects(self, raw: int) -> tuple | None:
        """finish() for a worker thread: the same values as Python objects, not bytes (the
        main thread takes them as they are): (kind, indices, samples or columns), or None."""
        try:
            if not raw and not self.layout.objects:  # type: ignore[union-attr]
                return None
            indices = [index for index, _ in self._kept]
            if self._collate is not None:
                return COLLATED, indices, self._collate([sample for _, sample in self._kept], indices)
            if raw:
                return SAMPLES, indices, [sample for _, sample in self._kept]
            return COLUMNS, indices, [list(c) for c in zip(*self._objects)]
        finally:
            self._clear()

    def _clear(self) -> None:
        self._kept.clear()
        self._objects.clear()


class SharedOrder:
    """A sampler's (or batch_sampler's) indices, drawn anew each epoch into memory shared
    with the worker processes (an anonymous shared mapping made before they fork). A
    batch_sampler's batches may differ in size: `ends` says where each ends in the indices,
    and `batch_size`, the first epoch's largest, sizes the batch slots."""

    def __init__(self, sampler: Iterable | None, batch_sampler: Iterable | None) -> None:
        self.sampler, self.batch_sampler = sampler, batch_sampler
        first, self.ends = self._draw(0)
        self.n = len(first)
        if self.n == 0:
            raise ValueError("the sampler gave no indices")
        self.batch_size = int(np.diff(self.ends, prepend=np.uint64(0)).max()) if self.ends is not None else 0
        self._map = mmap.mmap(-1, self.n * 8)
        self.indices = np.frombuffer(self._map, dtype=np.int64)
        self.indices[:] = first

    def _draw(self, epoch: int) -> tuple[np.ndarray, np.ndarray | None]:
        source = self.sampler if self.sampler is not None else self.batch_sampler
        if hasattr(source, "set_epoch"):  # DistributedSampler and the like draw per epoch
            source.set_epoch(epoch)
        if self.sampler is not None:
            return np.fromiter((int(i) for i in self.sampler), dtype=np.int64), None
        batches = [list(b) for b in self.batch_sampler]  # type: ignore[union-attr]
        sizes = np.array([len(b) for b in batches], dtype=np.uint64)
        empty = np.flatnonzero(sizes == 0)
        if len(empty):
            raise ValueError(f"the batch_sampler gave an empty batch (batch {empty[0]} of epoch {epoch})")
        return np.asarray([i for b in batches for i in b], dtype=np.int64), np.cumsum(sizes, dtype=np.uint64)

    def start_epoch(self, epoch: int) -> None:
        """Draws this epoch's indices (before any worker is given a batch of it)."""
        indices, ends = self._draw(epoch)
        if len(indices) != self.n:
            raise ValueError(f"the sampler gave {len(indices)} indices this epoch, {self.n} before: "
                             "the Loader needs the same number every epoch")
        if ends is not None:
            sizes = np.diff(ends, prepend=np.uint64(0))
            if sizes.max() > self.batch_size:
                big = int(np.argmax(sizes))
                raise ValueError(f"the batch_sampler gave a batch of {sizes[big]} indices (batch {big} of epoch "
                                 f"{epoch}): the batch slots hold {self.batch_size}, the first epoch's largest")
        self.indices[:] = indices
        self.ends = ends
