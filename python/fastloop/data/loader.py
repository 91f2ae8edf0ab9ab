"""fastloop.Loader: batches from arrays, memory-mapped .npy files, folders of per-sample
files or any map-style dataset, assembled by worker threads (C pipelines, or Python code) or
by forked worker processes writing into shared memory (Python code), handed out as zero-copy
NumPy arrays.

    loader = fastloop.Loader((images, labels), batch_size=256, shuffle=True, seed=0, workers=2,
                             transform=Pipeline([RandomCrop(56), RandomHFlip(), Normalize(m, s)], layout="CHW"))
    for epoch in range(10):
        for x, y in loader:       # x: float32 (256, 3, 56, 56), y: the labels of those samples
            ...
"""

from __future__ import annotations

import glob
import importlib
import logging
import numbers
import math
import os
import re
import sys
import threading
import weakref
from typing import Any, Callable, Iterator, Sequence, Union

import numpy as np

from .._args import INT_MAX, SSIZE_MAX, int_arg, one_of
from ._batches import Assembler, Batch, check_same_shapes
from ._collate import as_arrays
from . import _dataloader_args as torch_args
from .. import _lifecycle
from .._core import (Metrics, _epoch_batches, _epoch_order, _epoch_seed, _Loader, _npy_header, _ProcLoader,
                     _ThreadLoader, load_npy)
from .._device import parse_device
from ._device_feed import dtype_name, memory_format_name
from ._sample_codec import describe
from ._samples import Fetcher, SampleLayout, SharedOrder
from ._worker import WorkerInfo, begin_sample, end_sample, get_worker_info, sample_rng, set_worker_info
from ._torch_feed import PinnedBatches
from ._torch_interop import (as_array_if_tensor, import_torch_for_output, is_tensor, pins_tensors,
                             seed_generators, setup_worker_torch, torch_single_threaded)
from ..errors import DecodeError, Error, WorkerError, retold
from .ops import _GEOMETRY_HINT, Pipeline

_log = logging.getLogger("fastloop")

__all__ = ["Loader", "Folder", "load_npy", "get_worker_info", "WorkerInfo", "sample_rng"]


class Folder:
    """A folder of per-sample files, one sample each: ``.npy`` files (checked against the
    first file's dtype and shape) or raw files of `dtype` and `shape`. Paths are made
    absolute and sorted now; files are opened lazily by the workers.

    >>> Loader((Folder("train/x", "*.npy"), labels), batch_size=64, workers=2)
    >>> Folder("frames", "*.raw", dtype="uint8", shape=(3, 64, 64))
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], pattern: str = "*.npy", *,
                 dtype: Any = None, shape: Sequence[int] | None = None) -> None:
        self.root = os.path.abspath(os.fspath(path))
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"not a directory: {self.root}")
        self.paths = sorted(glob.glob(os.path.join(glob.escape(self.root), pattern)))
        if not self.paths:
            raise FileNotFoundError(f"no files match {pattern!r} in {self.root}")
        self.raw = dtype is not None
        if self.raw:
            if shape is None:
                raise ValueError("raw files need both 'dtype' and 'shape'")
            self.dtype, self.shape = np.dtype(dtype), tuple(int_arg("shape", d, 0, SSIZE_MAX) for d in shape)
            if math.prod(self.shape) * self.dtype.itemsize > SSIZE_MAX:
                raise OverflowError(f"'shape' {self.shape} of {self.dtype} is too large: more bytes than a size holds")
        else:
            descr, fortran, sample_shape = _npy_header(self.paths[0])
            if fortran:
                raise ValueError(f"{self.paths[0]}: Fortran-ordered arrays are not supported; save C order")
            self.dtype, self.shape = np.dtype(descr), tuple(sample_shape)

    def __len__(self) -> int:
        return len(self.paths)

    def _field(self) -> tuple:
        nbytes = math.prod(self.shape) * self.dtype.itemsize  # Python ints: nothing wraps
        return ("files", [os.fsencode(p) for p in self.paths], self.raw, nbytes, self.dtype, self.shape,
                os.fsencode(self.paths[0]))

    def __repr__(self) -> str:
        return f"Folder({self.root!r}, {len(self.paths)} files of {self.dtype} {self.shape})"


def _field_dtype(field: Any) -> Any:
    """The dtype of a source field's samples as the workers read them (decoded images: uint8)."""
    return np.uint8 if _is_encoded(field) else field.dtype


def _is_encoded(source: Any) -> bool:
    """An image source (ImageFolder, Images, TarShards): its samples are encoded JPEG/PNG bytes."""
    return hasattr(source, "_encoded_spec") and not isinstance(source, type)


def _encoded_field(source: Any, pipeline: Pipeline | None, index: int, staged: bool = False) -> tuple:
    """The C loader's spec of an image source: where each sample's bytes are, and the fused
    decode -> crop -> resize that gives every image the same size; `staged`: the workers stage
    the images for the GPU decoder instead (_gpu_decode.py)."""
    from . import images

    size = pipeline.fixed_size() if pipeline is not None else None
    if size is None:
        raise ValueError(f"source[{index}] holds images of different sizes: give the Loader a "
                         f"transform=fastloop.ops.Pipeline whose first step fixes the size: "
                         f"RandomResizedCrop(224), Resize((h, w)), or Resize(256) then CenterCrop(224)")
    images.ensure_loaded()
    paths, file_index, offsets, lengths = source._encoded_spec()
    from ._gpu_decode import CAPACITY

    return ("encoded", [os.fsencode(p) for p in paths], np.ascontiguousarray(file_index, np.int32),
            np.ascontiguousarray(offsets, np.int64), np.ascontiguousarray(lengths, np.int64), pipeline.geometry,
            CAPACITY if staged else 0)


def _fused_geometry(pipeline: Pipeline) -> Callable[[Any, int, int], np.ndarray]:
    """(image, epoch seed, id) -> the image cropped/resized by the pipeline's first step."""

    def apply(image: Any, seed: int, index: int) -> np.ndarray:
        return pipeline._apply_geometry(np.asarray(image), seed, [index])

    return apply


def _failure(kind: str, worker: int, pid: int, signal: int, index: int, text: str) -> BaseException:
    """The exception to raise for a worker failure: the worker's own exception type when it
    can be re-created (as torch.utils.data does), carrying the sample index and traceback."""
    if kind == "died":
        return WorkerError(text, pid=pid, signal=signal or None, worker=worker)
    name, _, rest = text.partition("\x1e")
    message, _, traceback = rest.partition("\x1e")
    on = f" on sample {index}" if index >= 0 else ""  # -1: the message names the sample
    full = (f"{name.rsplit('.', 1)[-1]} in worker {worker} (pid {pid}){on}: {message}\n"
            f"Worker traceback:\n{traceback}")
    module, _, qualname = name.rpartition(".")
    try:
        cls: Any = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        if isinstance(cls, type) and issubclass(cls, Exception):
            error = cls(full)
            error.index = index  # type: ignore[attr-defined]
            return error
    except Exception:
        pass
    return WorkerError(full, pid=pid, worker=worker, index=index)


def _thread_failure(worker: int, index: int, error: BaseException) -> BaseException:
    """The exception next() raises for a worker thread's failure: the same type as the one
    raised in the worker (the original as its cause, traceback and all), naming the worker and
    the sample, as processes mode does."""
    on = f" on sample {index}" if index >= 0 else ""  # -1: the message names the sample
    full = f"{type(error).__name__} in worker thread {worker}{on}: {error}"
    try:
        raised = retold(error, full) if isinstance(error, Error) else type(error)(full)
    except Exception:  # a type that takes other arguments
        raised = WorkerError(full, worker=worker, index=index)
    raised.__cause__ = error
    try:
        raised.index = index  # type: ignore[attr-defined]
    except AttributeError:
        pass
    return raised


class _ArraysDataset:
    """Samples of several arrays, as tuples: what a Python transform over arrays receives."""

    def __init__(self, arrays: Sequence[np.ndarray]) -> None:
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, i: int) -> Any:
        return tuple(a[i] for a in self.arrays) if len(self.arrays) > 1 else self.arrays[0][i]


def _worker_seed(seed: int, worker_id: int) -> int:
    """A worker's own seed (WorkerInfo.seed): distinct per worker, reproducible."""
    return (seed * 1_000_003 + worker_id) % 2**32


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


class Loader:
    """Batches of `source` for training loops, as torch.utils.data.DataLoader gives them.

    source: an array or CPU torch tensor (or .npy memory map), a tuple of them (inputs,
      labels, ...: fields, not samples), a Folder, a tuple mixing arrays, tensors and
      Folders, or any map-style dataset (``__len__`` and ``__getitem__``, e.g. a torch
      Dataset) returning samples as DataLoader takes them: arrays, tensors, numbers,
      strings, bytes, None or any object, in tuples, lists, namedtuples and dicts, nested.
      Arrays, tensors and numbers go into the batch slots' fixed-shape fields (zero-copy
      NumPy views); the other values, and samples laid out unlike the first one, travel from
      the workers serialized. A batch is collated as torch's default_collate does (strings
      as lists, containers per key and position; a tuple stays a tuple), its arrays of
      different shapes raising default_collate's RuntimeError unless a collate_fn takes them.
    transform: a fastloop.ops.Pipeline (runs in C on the first field of each batch, no GIL
      at all) or a Python callable given each sample's input (field 0; the whole sample if
      it is one field or a dict), as torchvision's datasets apply it; target_transform: a
      Python callable given each sample's target (field 1).
    mode: "threads" (C threads fill batch slots; for arrays, files and C pipelines),
      "processes" (forked workers run Python code and write into shared memory) or "auto"
      (processes when a Python dataset or transform is involved, else threads).
    workers: worker threads (up to 1024) or processes (up to 256); 0: batches are made in the
      calling thread.

    Sampling: shuffle with `seed` (a new order each epoch, reproducible), sharded by
    rank/world_size (default: the RANK and WORLD_SIZE environment variables torchrun sets;
    shards are disjoint and together cover the data), drop_last, in-order delivery,
    `prefetch` batches in flight per worker. Random augmentations are drawn per sample from
    (seed, epoch, sample index), so they do not depend on the worker count; worker processes
    get numpy and random seeded from (seed, worker id), torch (if the program imported it)
    set to one intra-op thread as DataLoader's workers are, and `worker_init_fn(worker_id)`;
    then before each batch, random, numpy's global generator and torch's are seeded from
    (seed, epoch, the batch's first sample index), so Python augmentations too are
    reproducible run to run whatever worker draws them (this overrides seeds set in
    worker_init_fn).

    on_error: "raise" (a sample that cannot be read or decoded raises at the batch that needs
      it, naming the file, the sample index and the decoder's message; earlier batches are
      delivered) or "skip" (threads mode: the sample is dropped, its batch comes shorter, not
      refilled, so every rank keeps the same step count; counted in metrics
      "loader/skipped" and logged once on the "fastloop" logger).

    Image sources (ImageFolder, Images, TarShards: anything with ``_encoded_spec``) are read,
    decoded (libjpeg-turbo, libpng) and cropped/resized in C threads when `transform` is a
    Pipeline starting with RandomResizedCrop, Resize((h, w)) or Resize(n) + CenterCrop; they
    yield (images, labels). split_by: "sample" (rank/world_size split the samples, as for any
    source) or "shard" (TarShards only: each rank reads whole shards, rank, rank + world_size,
    ...; padded by wrapping, or trimmed with drop_last, to the same step count on every rank).

    Batches are zero-copy views of loader-owned slots, recycled when you drop them. While you
    hold up to two (the one in use and the next), workers * prefetch more are made meanwhile;
    a third batch you keep comes as a copy, so kept batches never reduce the prefetch.
    output: "numpy" (arrays) or "torch" (tensors sharing the slot memory, via
    torch.from_numpy). collate_fn: called with the batch's list of samples (as the dataset
    gives them, arrays or tensors as `output` says, shapes free) in this process; what it
    returns is the batch. batch_size=None: samples one by one, unbatched (each through the
    collate_fn if there is one), as DataLoader's batch_size=None.

    DataLoader's names work where the meaning is the same: num_workers (= workers),
    prefetch_factor (= prefetch: batches in flight per worker besides the ones you hold),
    collate_fn, sampler (an iterable of dataset indices, drawn anew each epoch, with
    set_epoch(epoch) called if it has one; it replaces shuffle and rank/world_size sharding),
    batch_sampler (an iterable of lists of indices, of any sizes; the first epoch's largest
    sizes the batch slots; with batch_size or drop_last it raises, as DataLoader does),
    timeout (seconds; 0 or None: no limit), generator (a torch.Generator: the seed is drawn
    from it once), multiprocessing_context (None or "fork": workers are always forked),
    pin_memory_device ("" or "cuda[:N]"), in_order (batches always come in order).
    persistent_workers: None (the default) keeps the workers between epochs when there are
    any (DataLoader's default is False); True with workers=0 raises, as does prefetch_factor.
    state_dict() / load_state_dict() resume mid-epoch with the same remaining batches.

    device: None/"cpu" (host batches) or "cuda"/"cuda:N": batches on that GPU ("cuda": the
      current device, torch's where torch started CUDA), copied from slots pinned once on a
      loading stream, one batch ahead of the consumer. A Pipeline
      ending in Normalize (and maybe Cast) on uint8 images is split: the workers stop at
      uint8 (same code, same random draws) and one kernel normalizes, lays out and casts on
      the GPU. output="torch" gives torch CUDA tensors, ready on the current stream;
      output="numpy" gives fastloop.cuda.DeviceArrays. dtype: the image batch's type on the
      GPU (float32, float16, bfloat16); memory_format: "contiguous" or "channels_last".
      decode: "cpu" (the workers decode), "gpu" (nvJPEG decodes JPEG batches on the GPU; the
      workers read files, parse headers and draw the crops; what nvJPEG cannot take is
      decoded by the workers as usual) or "auto" (the default with a device: the GPU where
      it can). See docs/loader.md, "Feeding a GPU".
    pin_memory: pin the slots (default: with a device); with output="torch" and no device,
      batches are tensors over pinned slots (pinned once, never copied per batch) where
      torch sees CUDA, ready for .to("cuda", non_blocking=True), each slot held until the
      copies queued from it on the current stream are done; where torch sees no CUDA, or
      with NumPy output and no device, a UserWarning says that nothing is pinned
      (DataLoader too warns and goes on unpinned).

    With Python code (a dataset or transform), the first sample is fetched once in this
    process to learn the batch layout (which values go into the slots), with torch
    held to one thread so its thread pool is not started before the workers fork; code
    calling get_worker_info() must accept None there, as with torch's num_workers=0.
    """

    def __init__(
        self,
        source: Any,
        batch_size: int | None = 1,
        *,
        shuffle: bool = False,
        seed: int = 0,
        workers: int = 0,
        mode: str = "auto",
        transform: Pipeline | Callable[[Any], Any] | None = None,
        drop_last: bool = False,
        prefetch: int = 2,
        persistent_workers: bool | None = None,
        pin_memory: bool | None = None,
        device: str | int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        timeout: float | None = None,
        worker_init_fn: Callable[[int], Any] | None = None,
        on_error: str = "raise",
        target_transform: Callable[[Any], Any] | None = None,
        output: str = "numpy",
        collate_fn: Callable[[list], Any] | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int | None = None,
        prefetch_factor: int | None = None,
        split_by: str = "sample",
        dtype: Any = None,
        memory_format: Any = None,
        decode: str | None = None,
        generator: Any = None,
        multiprocessing_context: Any = None,
        pin_memory_device: str = "",
        in_order: bool = True,
    ) -> None:
        workers = _alias("workers", workers, 0, "num_workers", num_workers)
        prefetch = _alias("prefetch", prefetch, 2, "prefetch_factor", prefetch_factor)
        persistent_workers = torch_args.check_worker_options(workers, prefetch_factor, persistent_workers)
        torch_args.check_batch_sampler(batch_sampler, batch_size, drop_last)
        timeout = torch_args.check_timeout(timeout)
        seed = torch_args.seed_of(seed, generator)
        torch_args.check_multiprocessing_context(multiprocessing_context)
        self.pin_memory_device = torch_args.check_pin_memory_device(pin_memory_device)
        self.in_order = torch_args.check_in_order(in_order)
        order = _sampler_order(sampler, batch_sampler, shuffle)
        batch_size, drop_last = self._init_batching(batch_size, drop_last, order, batch_sampler)
        self._init_output(output, collate_fn, target_transform, order)
        source = _normalize_source(source)
        batch_size = int_arg("batch_size", batch_size, 1, SSIZE_MAX)
        workers, prefetch = _worker_counts(workers, prefetch)
        one_of("mode", mode, ("auto", "threads", "processes"))
        self.on_error = one_of("on_error", on_error, ("raise", "skip"))
        self._skips_logged = False
        self._init_device(device, dtype, memory_format, decode, pin_memory, batch_size)
        self._source = self._init_sharding(source, rank, world_size, split_by, order, drop_last)
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.timeout, self.persistent_workers = timeout, persistent_workers
        self.metrics = Metrics()
        self._closing = threading.RLock()  # reentrant: a collection inside close() may run __del__s
        self._single = False
        self._layout = SampleLayout.of_fields(0, False)
        self._from_worker: str | None = None  # a core's batches end with their objects: "bytes" or "objects"
        self._epoch = 0
        self._active: weakref.ref[_Epoch] | None = None  # weak: a dropped iterator abandons its epoch
        fields, dataset = self._classify(self._source)
        pipeline, python_transform = _split_transform(transform)
        needs_python = (dataset is not None or python_transform is not None or target_transform is not None
                        or order is not None)
        self.mode, self.workers = _choose_mode(mode, workers, needs_python), workers
        dataset = self._python_dataset(fields, dataset, needs_python)
        if dataset is None:
            self._start_threads(fields, pipeline, workers, prefetch)
        else:
            fetch = Fetcher(dataset, python_transform, target_transform, order)
            self._start_python(fetch, pipeline, workers, prefetch, worker_init_fn)

    # ---- arguments, one group each ----

    def _init_batching(self, batch_size: Any, drop_last: bool, order: SharedOrder | None,
                       batch_sampler: Any) -> tuple[Any, bool]:
        """batch_size and drop_last as the sampler arguments leave them (checked for type)."""
        self._unbatched = batch_size is None and batch_sampler is None  # samples one by one
        if self._unbatched:
            if drop_last:
                raise ValueError("batch_size=None hands out samples one by one, so it cannot go with "
                                 "drop_last=True (as in DataLoader)")
            batch_size = 1
        if order is not None and batch_sampler is not None:
            batch_size, drop_last = order.batch_size, False
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral):
            raise TypeError(f"'batch_size' must be an int >= 1 or None, not {type(batch_size).__name__}")
        return int(batch_size), drop_last

    def _init_output(self, output: str, collate_fn: Any, target_transform: Any, order: SharedOrder | None) -> None:
        """What a batch is handed out as: output, collate_fn, target_transform."""
        one_of("output", output, ("numpy", "torch"))
        if target_transform is not None and not callable(target_transform):
            raise TypeError(f"'target_transform' must be a callable, not {type(target_transform).__name__}")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"'collate_fn' must be a callable, not {type(collate_fn).__name__}")
        if output == "torch":
            import_torch_for_output()
        self.output, self.collate_fn, self._order = output, collate_fn, order
        self._resume_at = 0
        self._progress: tuple[int, int] | None = None  # (epoch, batches handed out) of an unfinished pass

    def _init_device(self, device: Any, dtype: Any, memory_format: Any, decode: str | None, pin_memory: bool | None,
                     batch_size: int) -> None:
        """Where batches go: device, dtype, memory_format, decode, pin_memory."""
        kind, index = parse_device(device)
        self.device = index if kind == "cuda" else None
        self._device_dtype, self._memory_format = dtype_name(dtype), memory_format_name(memory_format)
        if self.device is None and (dtype is not None or memory_format is not None):
            raise ValueError("'dtype' and 'memory_format' shape the batches on a GPU: pass device='cuda' too")
        if decode is not None:
            one_of("decode", decode, ("cpu", "gpu", "auto"))
        if decode == "gpu" and self.device is None:
            raise ValueError("decode='gpu' decodes JPEGs on a CUDA device: pass device='cuda' too")
        self.decode = decode or ("auto" if self.device is not None else "cpu")
        self._jpeg: Any = None  # the nvJPEG decoder when decode="gpu" (or "auto") decodes on the GPU
        if self.device is not None and self.collate_fn is not None:
            raise ValueError("device='cuda' copies the batch's fields as the workers made them, which a collate_fn "
                             "would change: use device=None and move the collated batch yourself")
        if self.device is not None and self._unbatched:
            raise ValueError("device='cuda' copies batches: give a batch_size (batch_size=None hands out samples)")
        self.pin_memory = self.device is not None if pin_memory is None else bool(pin_memory)
        self._pinned: PinnedBatches | None = None  # pin_memory=True, output="torch", no device
        if self.device is None and pins_tensors(self.pin_memory, self.output):
            self._pinned = PinnedBatches(batch_size)
        self._feed: Any = None  # the DeviceFeed of a CUDA loader (_start_feed)

    def _init_sharding(self, source: Any, rank: int | None, world_size: int | None, split_by: str,
                       order: SharedOrder | None, drop_last: bool) -> Any:
        """rank, world_size (torchrun's environment by default) and split_by; the source this
        rank reads (its own shards with split_by="shard")."""
        self.world_size = int_arg("world_size", _env_int("WORLD_SIZE", 1) if world_size is None else world_size,
                                  1, INT_MAX)
        self.rank = int_arg("rank", _env_int("RANK", 0) if rank is None else rank, 0, self.world_size - 1)
        if order is not None:  # the sampler decides which indices, and shards if it is distributed
            self.rank, self.world_size = 0, 1
        if one_of("split_by", split_by, ("sample", "shard")) == "shard":
            # this rank reads its own shards whole; samples are not split again
            from .datasets import TarShards

            if not isinstance(source, TarShards):
                raise TypeError(f"split_by='shard' splits fastloop.TarShards, not {type(source).__name__}")
            source = source.shard(self.rank, self.world_size, drop_last)
            self.rank, self.world_size = 0, 1
        return source

    def _python_dataset(self, fields: list, dataset: Any, needs_python: bool) -> Any:
        """The map-style dataset Python code reads samples from, or None when C threads read the
        fields; raises for what the chosen mode cannot read."""
        if dataset is None and (needs_python or self.mode == "processes"):
            if any(isinstance(f, Folder) for f in fields):
                raise ValueError("Folder sources are read by C threads: use mode='threads'")
            # an image source alone is decoded in Python by its __getitem__ (images, label)
            dataset = self._source if _is_encoded(self._source) else _ArraysDataset(fields)
            if any(_is_encoded(f) for f in fields) and not _is_encoded(self._source):
                raise ValueError("an image source inside a tuple is read by C threads: use mode='threads'")
        if self.on_error == "skip" and dataset is not None:
            raise ValueError("on_error='skip' drops samples in C threads: use mode='threads' with arrays, "
                             "Folders or image sources")
        return dataset

    def _start_threads(self, fields: list, pipeline: Pipeline | None, workers: int, prefetch: int) -> None:
        """C threads read the fields (arrays, Folders, image sources) into the slots."""
        self._layout = SampleLayout.of_fields(len(fields), self._single)
        pipeline = self._start_feed(pipeline, _field_dtype(fields[0]), _is_encoded(fields[0]))
        self._core = self._threads(fields, pipeline, workers, prefetch)
        self._assemble = Assembler(self._layout, self.output, self.collate_fn, self._unbatched, self._pinned)

    def _start_python(self, fetch: Fetcher, pipeline: Pipeline | None, workers: int, prefetch: int,
                      worker_init_fn: Callable[[int], Any] | None) -> None:
        """Python code fetches the samples: in forked worker processes, or in this process."""
        with torch_single_threaded():  # not start torch's thread pool here before forking
            first = fetch.probe()
        assert fetch.layout is not None
        self._layout, self._single = fetch.layout, fetch.layout.single
        self._assemble = Assembler(self._layout, self.output, self.collate_fn, self._unbatched, self._pinned)
        if self.device is not None and not self._layout.flat:
            raise ValueError(f"device='cuda' takes samples of arrays, tensors and numbers (one, a tuple or a flat "
                             f"dict of them); these have {_first_non_array(self._layout)}: use output='torch' and "
                             f"move the tensors yourself")
        if pipeline is not None:
            _check_pipeline_field(self._layout)
        if self.device is not None:  # the first field as the workers' pipeline gets it
            geometry = pipeline is not None and pipeline.geometry is not None
            pipeline = self._start_feed(pipeline, np.uint8 if geometry else np.asarray(first[0]).dtype, False)
        if workers == 0:
            self._core = _InProcess(self, fetch, pipeline)
        elif self.mode == "processes":
            self._core = self._processes(fetch, first, pipeline, workers, prefetch, worker_init_fn)
            self._from_worker = "bytes"
        else:
            self._core = self._python_threads(fetch, first, pipeline, workers, prefetch, worker_init_fn)
            self._from_worker = "objects"
            _lifecycle.register(self)  # its workers run Python: stopped before the interpreter goes
        if self._order is not None and self._order.ends is not None and self._from_worker:
            self._core.batch_ends = self._order.ends

    # ---- construction ----

    def _start_feed(self, pipeline: Pipeline | None, field_dtype: Any, encoded: bool) -> Pipeline | None:
        """With a device: makes the feed (what the GPU finishes, and with decode="gpu" the
        nvJPEG decoder) and returns the part of `pipeline` the workers still run; without
        one, `pipeline` as it is."""
        if self.device is None:
            return pipeline
        from . import _gpu_decode
        from ._device_feed import DeviceArrayFeed, split_for_device

        host, finish = split_for_device(pipeline, field_dtype, self._device_dtype)
        if _gpu_decode.choose(self.decode, self.device, host, finish, encoded, workers=self.workers):
            self._jpeg = _gpu_decode.GpuJpeg(self.device, host, finish, self.seed, self.on_error)
        if finish is None and self._device_dtype is not None:
            raise ValueError("'dtype' is the type the GPU normalizes the images to: the transform must be a Pipeline "
                             "ending in Normalize (optionally Cast) on uint8 images")
        if self.output == "torch":
            from ._torch_feed import TorchFeed

            self._feed = TorchFeed(self.device, finish, self.pin_memory, self.batch_size, self._memory_format)
        elif self._memory_format == "channels_last":
            raise ValueError("memory_format='channels_last' needs output='torch' (a DeviceArray is C-ordered)")
        else:
            self._feed = DeviceArrayFeed(self.device, finish, self.pin_memory, self.batch_size)
        self._feed.jpeg = self._jpeg
        return host

    def _classify(self, source: Any) -> tuple[list, Any]:
        """(fields, None) for arrays/Folders, or ([], dataset) for a Python dataset."""
        if _is_encoded(source):  # an image source alone: (images, labels from its targets)
            return [source, np.ascontiguousarray(np.asarray(source.targets, np.int64))], None
        if isinstance(source, (np.ndarray, Folder)):
            self._single = True
            return [source], None
        if isinstance(source, (tuple, list)) and source and all(isinstance(s, (np.ndarray, Folder)) or _is_encoded(s)
                                                                for s in source):
            return list(source), None
        if hasattr(source, "__len__") and hasattr(source, "__getitem__"):
            return [], source
        raise TypeError(f"'source' must be an array, a Folder, a tuple of them, or a map-style dataset "
                        f"(__len__ and __getitem__), not {type(source).__name__}")

    def _sampling(self) -> dict:
        return dict(batch_size=self.batch_size, shuffle=self.shuffle, seed=self.seed, rank=self.rank,
                    world_size=self.world_size, drop_last=self.drop_last)

    def _threads(self, fields: list, pipeline: Pipeline | None, workers: int, prefetch: int) -> _Loader:
        specs = []
        for i, field in enumerate(fields):
            if _is_encoded(field):
                specs.append(_encoded_field(field, pipeline, i, self._jpeg is not None and i == 0))
            elif isinstance(field, Folder):
                specs.append(field._field())
            else:
                if not field.flags.c_contiguous:
                    raise ValueError(f"source[{i}] must be C-contiguous; pass numpy.ascontiguousarray(...)")
                specs.append(("array", field))
        core_pipeline = None
        if pipeline is not None and _is_encoded(fields[0]):
            core_pipeline = pipeline._core(3) if pipeline._rest else None  # after the fused decode/resize
        elif pipeline is not None:
            if pipeline.geometry is not None:
                raise ValueError(f"{type(pipeline.steps[0]).__name__} runs fused with decoding on image sources "
                                 "(ImageFolder, Images, TarShards); for arrays call the Pipeline on them")
            first = fields[0]
            shape = first.shape if isinstance(first, Folder) else first.shape[1:]
            core_pipeline = pipeline._core(pipeline.channels_of(shape))
        # `ahead` batches in flight besides the two the consumer may hold as views (the one in
        # use, the one being taken), as DataLoader's prefetch_factor * num_workers; 0 workers:
        # the consumer makes each batch when asked, into a third slot (with two, every other
        # batch of a `for` loop came as a copy: the loop variable still held the last one)
        ahead = workers * prefetch
        return _Loader(specs, workers=workers, slots=ahead + 2 if workers else 3, ahead=ahead, pipeline=core_pipeline,
                       metrics=self.metrics,
                       skip_errors=self.on_error == "skip",
                       **self._sampling())

    def _python_fields(self, fetch: Fetcher, first: Any, pipeline: Pipeline | None) -> tuple[list, Any]:
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
            fetch.geometry = _fused_geometry(pipeline)
            image = np.asarray(fetch.geometry(layout.flatten(first, [])[0], 0, 0))
            fields[0] = (image.dtype, tuple(image.shape))
        core_pipeline = pipeline._core(pipeline.channels_of(fields[0][1])) if pipeline is not None else None
        return fields, core_pipeline

    def _python_threads(self, fetch: Fetcher, first: Any, pipeline: Pipeline | None, workers: int,
                        prefetch: int, worker_init_fn: Callable | None) -> _ThreadLoader:
        """Worker threads of this process run the Python code: each its own Fetcher and
        WorkerInfo (thread-local), then worker_init_fn, as a worker process would."""
        fields, core_pipeline = self._python_fields(fetch, first, pipeline)
        seed, assemble = self.seed, self._assemble
        collate_here = self.collate_fn is not None and pipeline is None  # the pipeline needs the slot

        def worker_setup(worker_id: int) -> tuple:
            set_worker_info(WorkerInfo(worker_id, workers, _worker_seed(seed, worker_id), "threads"))
            if worker_init_fn is not None:
                worker_init_fn(worker_id)
            mine = fetch.for_thread(assemble.whole if collate_here else None)
            return mine, mine.finish_objects

        n = len(fetch.dataset) if fetch.order is None else fetch.order.n
        return _ThreadLoader(fields, worker_setup, _thread_failure, n, workers=workers, prefetch=prefetch,
                             pipeline=core_pipeline, metrics=self.metrics, **self._sampling())

    def _processes(self, fetch: Fetcher, first: Any, pipeline: Pipeline | None, workers: int,
                   prefetch: int, worker_init_fn: Callable | None) -> _ProcLoader:
        layout = fetch.layout
        assert layout is not None
        fields, core_pipeline = self._python_fields(fetch, first, pipeline)
        seed = self.seed

        def worker_setup(worker_id: int) -> None:
            setup_worker_torch()  # before any user code runs torch ops in this child
            worker_seed = _worker_seed(seed, worker_id)
            seed_generators(worker_seed)
            set_worker_info(WorkerInfo(worker_id, workers, worker_seed, "processes"))
            if worker_init_fn is not None:
                worker_init_fn(worker_id)

        n = len(fetch.dataset) if fetch.order is None else fetch.order.n
        return _ProcLoader(fields, fetch, _failure, n, workers=workers, prefetch=prefetch,
                           pipeline=core_pipeline, worker_setup=worker_setup, metrics=self.metrics,
                           finish=fetch.finish, objects_bytes=layout.objects_bytes(first, self.batch_size),
                           **self._sampling())

    # ---- iteration ----

    def __iter__(self) -> Iterator[Any]:
        self._abandon_active()
        epoch, first_batch = self._epoch, self._resume_at
        self._epoch, self._resume_at = epoch + 1, 0
        if self._order is not None:
            self._order.start_epoch(epoch)
            if self._order.ends is not None and self._from_worker:  # this epoch's batches, uneven
                self._core.batch_ends = self._order.ends
        self._core.start_epoch(epoch, first_batch)
        self._progress = (epoch, first_batch)
        active = _Epoch(self, epoch, first_batch, counts_taken=self._feed is None)
        self._active = weakref.ref(active)
        if self._feed is not None:
            return self._device_batches(active, epoch)
        return active

    def _device_batches(self, active: "_Epoch", epoch: int) -> Iterator[Any]:
        """The feed's device batches: the feed takes each host batch one ahead of the one it
        hands out, so the epoch's position counts here, as each batch reaches the user."""
        for batch in self._feed.iterate(active, epoch):
            if active.abandoned:  # close() or a new iteration: nothing more from this epoch
                return
            active.handed_out()
            yield self._layout.build(batch, None)
        active.finished()

    def _abandon_active(self) -> None:
        ref = self._active  # read once: a close() on another thread may set it to None meanwhile
        active = ref() if ref is not None else None
        if active is not None:
            active.abandon()
        self._active = None

    def _log_first_skip(self) -> None:
        """Logs the first sample on_error="skip" dropped, once; the rest are only counted."""
        count, message = self._core.skipped
        if count:
            self._skips_logged = True
            _log.warning("fastloop.Loader skipped a sample it could not read (%s); further skips are counted "
                         "in loader.metrics 'loader/skipped'", message)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (shuffle order and augmentations), as
        DistributedSampler.set_epoch; otherwise epochs count up from 0.

        >>> loader.set_epoch(5); next(iter(loader))
        """
        self._epoch = int(epoch)
        self._resume_at, self._progress = 0, None

    def state_dict(self) -> dict:
        """Where this loader is: {"epoch", "position" (batches of that epoch handed out),
        "seed"}. load_state_dict() of it in a new Loader (same source and arguments) gives the
        same remaining batches in the same order, with the same augmentations.

        >>> ckpt.save({"model": ..., "loader": loader.state_dict()}, step)
        """
        if self._progress is not None:  # mid-epoch, or that epoch was cut short (break, Ctrl-C, close)
            epoch, position = self._progress
            return {"epoch": epoch, "position": position, "seed": self.seed}
        return {"epoch": self._epoch, "position": self._resume_at, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        """Makes the next iteration resume where state_dict() was taken: its epoch, from
        batch `position` on (the batches before it are skipped, not made).

        >>> loader.load_state_dict(ckpt.load()["loader"]); for x, y in loader: ...
        """
        try:
            epoch, position, seed = int(state["epoch"]), int(state["position"]), int(state["seed"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a Loader state (needs integer 'epoch', 'position', 'seed'): {e!r}") from None
        if seed != self.seed:
            raise ValueError(f"the state was saved by a Loader with seed={seed}, this one has seed={self.seed}: "
                             "its order and augmentations would differ")
        if epoch < 0 or position < 0:
            raise ValueError(f"'epoch' and 'position' must be >= 0, not {epoch}, {position}")
        self._abandon_active()
        self._epoch, self._resume_at, self._progress = epoch, position, None

    def __len__(self) -> int:
        """Batches per epoch of this rank's shard."""
        return self._core.batches

    @property
    def worker_pids(self) -> list[int]:
        """Pids of the worker processes (processes mode; [] otherwise or before iterating)."""
        return list(getattr(self._core, "pids", []))

    def close(self) -> None:
        """Stop the workers (threads joined, processes ended and reaped). A later iteration
        starts them again. Safe from any thread, at once from many: an epoch being iterated
        on another thread ends (its next() raises StopIteration; state_dict() keeps where it
        was).

        >>> loader.close()
        """
        with self._closing:  # one close at a time: the feeds unpin once
            self._abandon_active()
            self._core.stop()
            if self._feed is not None:
                self._feed.close()
            if self._pinned is not None:
                self._pinned.close()

    def _deliver(self, made: Any) -> Any:
        """A batch as the user gets it: tensors or arrays, in the samples' structure, collated
        (or through the collate_fn, or one sample with batch_size=None); with a device, the
        slot fields as they are, for the feed."""
        if type(made) is tuple:  # a core's arrays (then, from workers, their objects)
            if self._from_worker:
                if made[-1] is not None:
                    made = Batch.from_worker(made) if self._from_worker == "bytes" else Batch.from_thread(made)
                    return self._deliver(made)
                made = made[:-1]
            if self._feed is not None:  # the feed takes the fields as they are
                return made
            return self._assemble.slots(made)
        if self._feed is not None:
            check_same_shapes(made)
            return tuple(made.fixed)
        return self._assemble(made)

    def _close_at_exit(self, deadline: float) -> None:
        """At interpreter exit (fastloop/_lifecycle.py): worker threads that run Python end
        before the interpreter does."""
        self.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        core = getattr(self, "_core", None)
        if core is not None:  # asked, not joined: a finalizer may run where a worker waits on it
            core.stop(wait=False)
        for feed in (getattr(self, "_feed", None), getattr(self, "_pinned", None)):
            if feed is not None:
                feed.close()  # unpin before the slots are freed


class _Epoch:
    """One pass over the loader: the iterator `for batch in loader` runs. Abandoning it
    (break, an exception, Ctrl-C, garbage collection) stops the workers at once."""

    def __init__(self, loader: Loader, epoch: int, position: int, counts_taken: bool = True) -> None:
        """counts_taken: each batch counts as handed out when next() takes it; False for a
        device feed, which takes a batch before it hands out the previous one and says when
        it hands one out (handed_out) and when the epoch's last one went (finished)."""
        self.loader, self.epoch, self.position = loader, epoch, position
        self.counts_taken = counts_taken
        self.done = False  # no batch left to take: the end reached, or abandoned
        self.abandoned = False

    def __iter__(self) -> "_Epoch":
        return self

    def __next__(self) -> Any:
        if self.done:
            raise StopIteration
        if self.loader._pinned is not None:  # slots whose copies are done go back before the next batch
            core = self.loader._core
            self.loader._pinned.make_room(lambda: getattr(core, "lent", 0))  # _InProcess lends no slots
        try:
            batch = self.loader._core.next(self.loader.timeout)
        except BaseException as error:
            self.abandon()
            named = _naming_member(self.loader._source, error)
            if named is not None:
                raise named from None
            raise
        if batch is None:
            if self.done:  # abandoned meanwhile (close() on another thread): the position stays
                raise StopIteration
            self.done = True
            if self.counts_taken:  # else the feed still holds the last batch: finished() says when it went
                self.loader._progress = None
            if not self.loader.persistent_workers:
                self.loader._core.stop()
            raise StopIteration
        if self.loader.on_error == "skip" and not self.loader._skips_logged:
            self.loader._log_first_skip()
        if self.counts_taken:
            self.handed_out()
        return self.loader._deliver(batch)

    def _current(self) -> bool:
        """Whether this epoch is the loader's pass now: an abandoned one (or one a later
        iteration replaced) no longer moves the loader's position."""
        active = self.loader._active
        return not self.abandoned and active is not None and active() is self

    def handed_out(self) -> None:
        """One more batch of the epoch reached the user: state_dict() resumes after it."""
        self.position += 1
        if self._current():
            self.loader._progress = (self.epoch, self.position)

    def finished(self) -> None:
        """The epoch's last batch reached the user (a device feed's): state_dict() names the next epoch."""
        if self._current():
            self.loader._progress = None

    def abandon(self, wait: bool = True) -> None:
        """Stops the epoch's workers (wait=False: asks them to, as a finalizer must)."""
        if not self.done:
            self.done = self.abandoned = True
            self.loader._core.stop(wait=wait)

    def __del__(self) -> None:
        if not self.done:
            self.abandon(wait=False)


class _InProcess:
    """workers=0 with Python code: samples fetched and collated in the calling thread (as
    torch's num_workers=0), in the same order and with the same augmentations as workers."""

    def __init__(self, loader: Loader, fetch: Fetcher, pipeline: Pipeline | None) -> None:
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
        L.metrics.add("loader/samples", len(ids))
        L.metrics.add("loader/batches")
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


def _first_non_array(layout: SampleLayout) -> str:
    """Where a layout first holds something other than a slot field, in words."""
    if layout.objects:
        return f"{describe(layout.objects[0])}, neither an array nor a number"
    return "nested tuples, lists or dicts"


def _check_pipeline_field(layout: SampleLayout) -> None:
    """A Pipeline transform runs on the samples' first value, which must be an array."""
    if not layout.fixed or layout.fixed[0] != layout.leaves[0]:
        raise TypeError(f"a Pipeline transform runs on the samples' first value, but "
                        f"{describe(layout.leaves[0])} is neither an array, a tensor nor a number")


def _naming_member(source: Any, error: BaseException) -> BaseException | None:
    """The C loader's error on a tar member names the shard; this adds the member's name."""
    match = re.match(r"sample (\d+): ", str(error)) if type(error) in (ValueError, DecodeError) else None
    if match is None or not hasattr(source, "members") or not int(match.group(1)) < len(source.members):
        return None
    return retold(error, f"{error} (member {source.members[int(match.group(1))]!r})")


_MAX_WORKERS = 1024  # threads; fl_procpool takes at most 256 processes


def _split_transform(transform: Any) -> tuple[Pipeline | None, Any]:
    """(the C Pipeline, the Python transform): one of them is None."""
    if isinstance(transform, Pipeline):
        return transform, None
    if transform is not None and not callable(transform):
        raise TypeError(f"'transform' must be a fastloop.ops.Pipeline or a callable, not {type(transform).__name__}")
    return None, transform


def free_threaded() -> bool:
    """Whether Python threads run in parallel here: a free-threaded build (3.13t, 3.14t) with
    the GIL off (PYTHON_GIL=0, or no module turned it back on)."""
    is_gil_enabled = getattr(sys, "_is_gil_enabled", None)
    return is_gil_enabled is not None and not is_gil_enabled()


def _choose_mode(mode: str, workers: int, needs_python: bool) -> str:
    """"threads" or "processes" for `mode` ("auto" picks), checked against the workers and
    whether Python code reads the samples. auto: Python code runs in worker threads where
    threads run Python in parallel (a free-threaded interpreter), else in worker processes."""
    if mode == "auto":
        mode = "processes" if needs_python and workers > 0 and not free_threaded() else "threads"
    if mode == "processes" and workers == 0:
        raise ValueError("mode='processes' needs workers >= 1")
    return mode


def _worker_counts(workers: Any, prefetch: Any) -> tuple[int, int]:
    """(workers, prefetch) checked by name; their batch slots (workers x prefetch + 2) count in a C int."""
    workers, prefetch = int_arg("workers", workers, 0, _MAX_WORKERS), int_arg("prefetch", prefetch, 1, INT_MAX)
    if workers * prefetch + 2 > INT_MAX:
        raise ValueError(f"'workers' x 'prefetch' is too large: {workers} x {prefetch} batches in flight, more "
                         f"than {INT_MAX - 2}")
    return workers, prefetch


def _alias(ours: str, value: int, default: int, theirs: str, alias: int | None) -> int:
    """A DataLoader name for one of ours (num_workers for workers, prefetch_factor for prefetch)."""
    if alias is None:
        return value
    if value not in (default, alias):
        raise ValueError(f"'{theirs}' is DataLoader's name for '{ours}': pass one (got {value} and {alias})")
    return alias


def _sampler_order(sampler: Any, batch_sampler: Any, shuffle: bool) -> SharedOrder | None:
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


def _normalize_source(source: Any) -> Any:
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
