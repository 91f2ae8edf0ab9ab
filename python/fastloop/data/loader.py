"""fastloop.Loader: batches from arrays, memory-mapped .npy files, folders of per-sample
files or any map-style dataset, assembled by worker threads (C pipelines, or Python code) or
by forked worker processes writing into shared memory (Python code), handed out as zero-copy
NumPy arrays.

    loader = fastloop.Loader((images, labels), batch_size=256, shuffle=True, seed=0, num_workers=2,
                             transform=Pipeline([RandomCrop(56), RandomHFlip(), Normalize(m, s)], layout="CHW"))
    for epoch in range(10):
        for x, y in loader:       # x: float32 (256, 3, 56, 56), y: the labels of those samples
            ...

This file is the facade: the arguments (_loader_args.py, _loader_device.py), the choice of
backend, and the epochs over its BatchSource (_backend.py): C threads over arrays
(_backend_arrays.py), Python code in threads (_backend_threads.py), in processes
(_backend_processes.py) or in the calling thread (_backend_inline.py).
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from typing import Any, Callable, Iterator

import numpy as np

from .._args import SSIZE_MAX, int_arg, one_of
from .. import _lifecycle
from .._core import Metrics, load_npy
from . import _dataloader_args as torch_args
from . import _loader_args as args
from ._backend_arrays import arrays_source, classify, field_dtype, is_encoded
from ._backend_inline import InProcess
from ._backend_processes import processes_source
from ._backend_threads import python_threads_source
from ._batches import Assembler, Batch, check_same_shapes
from ._epoch import Epoch
from ._folder import Folder
from ._loader_device import init_device, start_feed
from ._samples import Fetcher, SampleLayout
from ._torch_interop import torch_single_threaded
from ._worker import WorkerInfo, get_worker_info, sample_rng
from .ops import Pipeline

_log = logging.getLogger("fastloop")

__all__ = ["Loader", "Folder", "load_npy", "get_worker_info", "WorkerInfo", "sample_rng"]


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
    num_workers: worker threads (up to 1024) or processes (up to 256); 0 (the default, as
      DataLoader's): batches are made in the calling thread.

    Sampling: shuffle with `seed` (a new order each epoch, reproducible), sharded by
    rank/world_size (default: the RANK and WORLD_SIZE environment variables torchrun sets;
    shards are disjoint and together cover the data), drop_last, in-order delivery,
    `prefetch_factor` batches in flight per worker (None: 2). Random augmentations are drawn
    per sample from (seed, epoch, sample index), so they do not depend on the worker count;
    worker processes get numpy and random seeded from (seed, worker id), torch (if the
    program imported it) set to one intra-op thread as DataLoader's workers are, and
    `worker_init_fn(worker_id)`; then before each batch, random, numpy's global generator
    and torch's are seeded from (seed, epoch, the batch's first sample index), so Python
    augmentations too are reproducible run to run whatever worker draws them (this
    overrides seeds set in worker_init_fn).

    on_error: "raise" (a sample that cannot be read or decoded raises at the batch that needs
      it, naming the file, the sample index and the decoder's message; earlier batches are
      delivered) or "skip" (threads mode: the sample is dropped, its batch comes shorter, not
      refilled, so every rank keeps the same step count; counted in stats()
      "skipped" and logged once on the "fastloop" logger).

    Image sources (ImageFolder, Images, TarShards: anything with ``_encoded_spec``) are read,
    decoded (libjpeg-turbo, libpng) and cropped/resized in C threads when `transform` is a
    Pipeline starting with RandomResizedCrop, Resize((h, w)) or Resize(n) + CenterCrop; they
    yield (images, labels). split_by: "sample" (rank/world_size split the samples, as for any
    source) or "shard" (TarShards only: each rank reads whole shards, rank, rank + world_size,
    ...; padded by wrapping, or trimmed with drop_last, to the same step count on every rank).

    Batches are zero-copy views of loader-owned slots, recycled when you drop them. While you
    hold up to two (the one in use and the next), num_workers * prefetch_factor more are made
    meanwhile; a third batch you keep comes as a copy, so kept batches never reduce the
    prefetch.
    output: "numpy" (arrays) or "torch" (tensors sharing the slot memory, via
    torch.from_numpy). collate_fn: called with the batch's list of samples (as the dataset
    gives them, arrays or tensors as `output` says, shapes free) in this process; what it
    returns is the batch. batch_size=None: samples one by one, unbatched (each through the
    collate_fn if there is one), as DataLoader's batch_size=None.

    DataLoader's names work where the meaning is the same: num_workers, prefetch_factor
    (batches in flight per worker besides the ones you hold; with num_workers=0 it raises, as
    in DataLoader), collate_fn, sampler (an iterable of dataset indices, drawn anew each
    epoch, with set_epoch(epoch) called if it has one; it replaces shuffle and
    rank/world_size sharding),
    batch_sampler (an iterable of lists of indices, of any sizes; the first epoch's largest
    sizes the batch slots; with batch_size or drop_last it raises, as DataLoader does),
    timeout (seconds; 0 or None: no limit), generator (a torch.Generator: the seed is drawn
    from it once), multiprocessing_context (None or "fork": workers are always forked),
    pin_memory_device ("" or "cuda[:N]"), in_order (batches always come in order).
    persistent_workers: None (the default) keeps the workers between epochs when there are
    any (DataLoader's default is False); True with num_workers=0 raises.
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

    stats(): a snapshot of the loader's counters (samples and batches made, samples skipped);
    Monitor.attach(loader) logs them per second.
    """

    def __init__(
        self,
        source: Any,
        batch_size: int | None = 1,
        *,
        shuffle: bool = False,
        seed: int = 0,
        num_workers: int = 0,
        mode: str = "auto",
        transform: Pipeline | Callable[[Any], Any] | None = None,
        drop_last: bool = False,
        prefetch_factor: int | None = None,
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
        split_by: str = "sample",
        dtype: Any = None,
        memory_format: Any = None,
        decode: str | None = None,
        generator: Any = None,
        multiprocessing_context: Any = None,
        pin_memory_device: str = "",
        in_order: bool = True,
    ) -> None:
        persistent_workers = torch_args.check_worker_options(num_workers, prefetch_factor, persistent_workers)
        torch_args.check_batch_sampler(batch_sampler, batch_size, drop_last)
        timeout = torch_args.check_timeout(timeout)
        seed = torch_args.seed_of(seed, generator)
        torch_args.check_multiprocessing_context(multiprocessing_context)
        self.pin_memory_device = torch_args.check_pin_memory_device(pin_memory_device)
        self.in_order = torch_args.check_in_order(in_order)
        order = args.sampler_order(sampler, batch_sampler, shuffle)
        batch_size, drop_last = args.init_batching(self, batch_size, drop_last, order, batch_sampler)
        args.init_output(self, output, collate_fn, target_transform, order)
        source = args.normalize_source(source)
        batch_size = int_arg("batch_size", batch_size, 1, SSIZE_MAX)
        num_workers, prefetch_factor = args.worker_counts(num_workers, prefetch_factor)
        one_of("mode", mode, ("auto", "threads", "processes"))
        self.on_error = one_of("on_error", on_error, ("raise", "skip"))
        self._skips_logged = False
        init_device(self, device, dtype, memory_format, decode, pin_memory, batch_size)
        self._source = args.init_sharding(self, source, rank, world_size, split_by, order, drop_last)
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.timeout, self.persistent_workers = timeout, persistent_workers
        self._metrics = Metrics()
        self._closing = threading.RLock()  # reentrant: a collection inside close() may run __del__s
        self._layout = SampleLayout.of_fields(0, False)
        self._from_worker: str | None = None  # a core's batches end with their objects: "bytes" or "objects"
        self._epoch = 0
        self._active: weakref.ref[Epoch] | None = None  # weak: a dropped iterator abandons its epoch
        fields, dataset, self._single = classify(self._source)
        pipeline, python_transform = args.split_transform(transform)
        needs_python = (dataset is not None or python_transform is not None or target_transform is not None
                        or order is not None)
        self.mode, self.num_workers = _choose_mode(mode, num_workers, needs_python), num_workers
        dataset = args.python_dataset(self, fields, dataset, needs_python)
        if dataset is None:
            self._start_threads(fields, pipeline, num_workers, prefetch_factor)
        else:
            fetch = Fetcher(dataset, python_transform, target_transform, order)
            self._start_python(fetch, pipeline, num_workers, prefetch_factor, worker_init_fn)

    # ---- the backend: one BatchSource (_backend.py) ----

    def _start_threads(self, fields: list, pipeline: Pipeline | None, num_workers: int,
                       prefetch_factor: int) -> None:
        """C threads read the fields (arrays, Folders, image sources) into the slots."""
        self._layout = SampleLayout.of_fields(len(fields), self._single)
        pipeline = start_feed(self, pipeline, field_dtype(fields[0]), is_encoded(fields[0]))
        self._core = arrays_source(self, fields, pipeline, num_workers, prefetch_factor)
        self._assemble = Assembler(self._layout, self.output, self.collate_fn, self._unbatched, self._pinned)

    def _start_python(self, fetch: Fetcher, pipeline: Pipeline | None, num_workers: int, prefetch_factor: int,
                      worker_init_fn: Callable[[int], Any] | None) -> None:
        """Python code fetches the samples: in worker processes or threads, or in this thread."""
        with torch_single_threaded():  # not start torch's thread pool here before forking
            first = fetch.probe()
        assert fetch.layout is not None
        self._layout, self._single = fetch.layout, fetch.layout.single
        self._assemble = Assembler(self._layout, self.output, self.collate_fn, self._unbatched, self._pinned)
        if self.device is not None and not self._layout.flat:
            raise ValueError(f"device='cuda' takes samples of arrays, tensors and numbers (one, a tuple or a flat "
                             f"dict of them); these have {args.first_non_array(self._layout)}: use output='torch' "
                             f"and move the tensors yourself")
        if pipeline is not None:
            args.check_pipeline_field(self._layout)
        if self.device is not None:  # the first field as the workers' pipeline gets it
            geometry = pipeline is not None and pipeline.geometry is not None
            pipeline = start_feed(self, pipeline, np.uint8 if geometry else np.asarray(first[0]).dtype, False)
        if num_workers == 0:
            self._core = InProcess(self, fetch, pipeline)
        elif self.mode == "processes":
            self._core = processes_source(self, fetch, first, pipeline, num_workers, prefetch_factor, worker_init_fn)
            self._from_worker = "bytes"
        else:
            self._core = python_threads_source(self, fetch, first, pipeline, num_workers, prefetch_factor,
                                               worker_init_fn)
            self._from_worker = "objects"
            _lifecycle.register(self)  # its workers run Python: stopped before the interpreter goes
        if self._order is not None and self._order.ends is not None and self._from_worker:
            self._core.batch_ends = self._order.ends

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
        active = Epoch(self, epoch, first_batch, counts_taken=self._feed is None)
        self._active = weakref.ref(active)
        if self._feed is not None:
            return self._device_batches(active, epoch)
        return active

    def _device_batches(self, active: Epoch, epoch: int) -> Iterator[Any]:
        """The feed's device batches: the feed takes each host batch one ahead of the one it
        hands out, so the epoch's position counts here, as each batch reaches the user."""
        for batch in self._feed.iterate(active, epoch):
            if not active.hand_out():  # close() or a new iteration: nothing more from this epoch
                return
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
                         "in loader.stats()['skipped']", message)

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

    def stats(self) -> dict[str, Any]:
        """A fresh snapshot of the loader's counters: samples and batches made so far (by
        every epoch), and samples dropped by on_error="skip".

        >>> loader.stats()
        {'samples': 60000, 'batches': 235, 'skipped': 0}
        """
        counts = self._metrics.snapshot()

        def total(name: str) -> int:
            stat = counts.get(name)
            return int(stat.sum) if stat is not None else 0

        return {"samples": total("loader/samples"), "batches": total("loader/batches"),
                "skipped": total("loader/skipped")}

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


def free_threaded() -> bool:
    """Whether Python threads run in parallel here: a free-threaded build (3.13t, 3.14t) with
    the GIL off (PYTHON_GIL=0, or no module turned it back on)."""
    is_gil_enabled = getattr(sys, "_is_gil_enabled", None)
    return is_gil_enabled is not None and not is_gil_enabled()


def _choose_mode(mode: str, num_workers: int, needs_python: bool) -> str:
    """"threads" or "processes" for `mode` ("auto" picks), checked against the workers and
    whether Python code reads the samples. auto: Python code runs in worker threads where
    threads run Python in parallel (a free-threaded interpreter), else in worker processes."""
    if mode == "auto":
        mode = "processes" if needs_python and num_workers > 0 and not free_threaded() else "threads"
    if mode == "processes" and num_workers == 0:
        raise ValueError("mode='processes' needs num_workers >= 1")
    return mode
