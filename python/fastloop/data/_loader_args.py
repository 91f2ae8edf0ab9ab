"""fastloop.Loader's arguments, one group each: checked by name, and turned into what the
Loader keeps (the functions given the loader set its attributes for their group)."""

from __future__ import annotations

import numbers
import os
from typing import Any

from .._args import INT_MAX, int_arg, one_of
from ._backend import ArraysDataset
from ._backend_arrays import is_encoded
from ._folder import Folder
from ._sample_codec import describe
from ._samples import SampleLayout, SharedOrder
from ._torch_interop import as_array_if_tensor, import_torch_for_output, is_tensor
from .ops import Pipeline

MAX_WORKERS = 1024  # threads; fl_procpool takes at most 256 processes
DEFAULT_PREFETCH_FACTOR = 2  # batches in flight per worker, DataLoader's default


def worker_counts(num_workers: Any, prefetch_factor: Any) -> tuple[int, int]:
    """(num_workers, prefetch_factor) checked by name (prefetch_factor None: 2); their batch
    slots (num_workers x prefetch_factor + 2) count in a C int."""
    if prefetch_factor is None:
        prefetch_factor = DEFAULT_PREFETCH_FACTOR
    num_workers = int_arg("num_workers", num_workers, 0, MAX_WORKERS)
    prefetch_factor = int_arg("prefetch_factor", prefetch_factor, 1, INT_MAX)
    if num_workers * prefetch_factor + 2 > INT_MAX:
        raise ValueError(f"'num_workers' x 'prefetch_factor' is too large: {num_workers} x {prefetch_factor} "
                         f"batches in flight, more than {INT_MAX - 2}")
    return num_workers, prefetch_factor


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def split_transform(transform: Any) -> tuple[Pipeline | None, Any]:
    """(the C Pipeline, the Python transform): one of them is None."""
    if isinstance(transform, Pipeline):
        return transform, None
    if transform is not None and not callable(transform):
        raise TypeError(f"'transform' must be a fastloop.ops.Pipeline or a callable, not {type(transform).__name__}")
    return None, transform


def sampler_order(sampler: Any, batch_sampler: Any, shuffle: bool) -> SharedOrder | None:
    if sampler is None and batch_sampler is None:
        return None
    if sampler is not None and batch_sampler is not None:
        raise ValueError("pass 'sampler' or 'batch_sampler', not both")
    if shuffle:
        raise ValueError("'sampler'/'batch_sampler' decide the order: leave shuffle=False (as DataLoader)")
    for name, value in (("sampler", sampler), ("batch_sampler", batch_sampler)):
        if value is not None and not hasattr(value, "__iter__"):
            raise TypeError(f"'{name}' must be an iterable of indices, not {type(value).__name__}")
    return SharedOrder(sampler, batch_sampler)


def normalize_source(source: Any) -> Any:
    """Tensors as zero-copy arrays; a path refused (a str is a sequence of characters)."""
    paths = (str, bytes, os.PathLike)
    if isinstance(source, paths) or (isinstance(source, (tuple, list)) and any(isinstance(s, paths) for s in source)):
        raise TypeError(f"'source' holds a path ({source!r}), not data: open a .npy file with "
                        f"fastloop.load_npy(path) (a memory map) or a folder of per-sample files with "
                        f"fastloop.Folder(path)")
    if is_tensor(source):
        return as_array_if_tensor(source, "source")
    if isinstance(source, (tuple, list)) and source and any(is_tensor(s) for s in source):
        return [as_array_if_tensor(s, f"source[{i}]") for i, s in enumerate(source)]
    return source


def first_non_array(layout: SampleLayout) -> str:
    """Where a layout first holds something other than a slot field, in words."""
    if layout.objects:
        return f"{describe(layout.objects[0])}, neither an array nor a number"
    return "nested tuples, lists or dicts"


def check_pipeline_field(layout: SampleLayout) -> None:
    """A Pipeline transform runs on the samples' first value, which must be an array."""
    if not layout.fixed or layout.fixed[0] != layout.leaves[0]:
        raise TypeError(f"a Pipeline transform runs on the samples' first value, but "
                        f"{describe(layout.leaves[0])} is neither an array, a tensor nor a number")


def init_batching(loader: Any, batch_size: Any, drop_last: bool, order: SharedOrder | None,
                  batch_sampler: Any) -> tuple[Any, bool]:
    """batch_size and drop_last as the sampler arguments leave them (checked for type)."""
    loader._unbatched = batch_size is None and batch_sampler is None  # samples one by one
    if loader._unbatched:
        if drop_last:
            raise ValueError("batch_size=None hands out samples one by one, so it cannot go with "
                             "drop_last=True (as in DataLoader)")
        batch_size = 1
    if order is not None and batch_sampler is not None:
        batch_size, drop_last = order.batch_size, False
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral):
        raise TypeError(f"'batch_size' must be an int >= 1 or None, not {type(batch_size).__name__}")
    return int(batch_size), drop_last


def init_output(loader: Any, output: str, collate_fn: Any, target_transform: Any,
                order: SharedOrder | None) -> None:
    """What a batch is handed out as: output, collate_fn, target_transform."""
    one_of("output", output, ("numpy", "torch"))
    if target_transform is not None and not callable(target_transform):
        raise TypeError(f"'target_transform' must be a callable, not {type(target_transform).__name__}")
    if collate_fn is not None and not callable(collate_fn):
        raise TypeError(f"'collate_fn' must be a callable, not {type(collate_fn).__name__}")
    if output == "torch":
        import_torch_for_output()
    loader.output, loader.collate_fn, loader._order = output, collate_fn, order
    loader._resume_at = 0
    loader._progress = None  # (epoch, batches handed out) of an unfinished pass


def init_sharding(loader: Any, source: Any, rank: int | None, world_size: int | None, split_by: str,
                  order: SharedOrder | None, drop_last: bool) -> Any:
    """rank, world_size (torchrun's environment by default) and split_by; the source this
    rank reads (its own shards with split_by="shard")."""
    loader.world_size = int_arg("world_size", env_int("WORLD_SIZE", 1) if world_size is None else world_size,
                                1, INT_MAX)
    loader.rank = int_arg("rank", env_int("RANK", 0) if rank is None else rank, 0, loader.world_size - 1)
    if order is not None:  # the sampler decides which indices, and shards if it is distributed
        loader.rank, loader.world_size = 0, 1
    if one_of("split_by", split_by, ("sample", "shard")) == "shard":
        # this rank reads its own shards whole; samples are not split again
        from .datasets import TarShards

        if not isinstance(source, TarShards):
            raise TypeError(f"split_by='shard' splits fastloop.TarShards, not {type(source).__name__}")
        source = source.shard(loader.rank, loader.world_size, drop_last)
        loader.rank, loader.world_size = 0, 1
    return source


def python_dataset(loader: Any, fields: list, dataset: Any, needs_python: bool) -> Any:
    """The map-style dataset Python code reads samples from, or None when C threads read the
    fields; raises for what the chosen mode cannot read."""
    if dataset is None and (needs_python or loader.mode == "processes"):
        if any(isinstance(f, Folder) for f in fields):
            raise ValueError("Folder sources are read by C threads: use mode='threads'")
        # an image source alone is decoded in Python by its __getitem__ (images, label)
        dataset = loader._source if is_encoded(loader._source) else ArraysDataset(fields)
        if any(is_encoded(f) for f in fields) and not is_encoded(loader._source):
            raise ValueError("an image source inside a tuple is read by C threads: use mode='threads'")
    if loader.on_error == "skip" and dataset is not None:
        raise ValueError("on_error='skip' drops samples in C threads: use mode='threads' with arrays, "
                         "Folders or image sources")
    return dataset
