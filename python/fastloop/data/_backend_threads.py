"""The threads backend over a Python dataset: worker threads of this process run the
dataset's code (and transforms), each with its own Fetcher and WorkerInfo, and write into the
batch slots; the C thread loader (csrc/py/py_thread_loader.c) as a BatchSource
(_backend.py). Python code runs in parallel there on a free-threaded interpreter."""

from __future__ import annotations

from typing import Any, Callable

from .._core import _ThreadLoader
from ._backend import dataset_length, python_fields, sampling, worker_seed
from ._failures import thread_failure
from ._samples import Fetcher
from ._worker import WorkerInfo, set_worker_info
from .ops import Pipeline


def python_threads_source(loader: Any, fetch: Fetcher, first: Any, pipeline: Pipeline | None, num_workers: int,
                          prefetch_factor: int, worker_init_fn: Callable | None) -> _ThreadLoader:
    """Worker threads of this process run the Python code: each its own Fetcher and
    WorkerInfo (thread-local), then worker_init_fn, as a worker process would."""
    fields, core_pipeline = python_fields(fetch, first, pipeline)
    seed, assemble = loader.seed, loader._assemble
    collate_here = loader.collate_fn is not None and pipeline is None  # the pipeline needs the slot

    def worker_setup(worker_id: int) -> tuple:
        set_worker_info(WorkerInfo(worker_id, num_workers, worker_seed(seed, worker_id), "threads"))
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
        mine = fetch.for_thread(assemble.whole if collate_here else None)
        return mine, mine.finish_objects

    return _ThreadLoader(fields, worker_setup, thread_failure, dataset_length(fetch), workers=num_workers,
                         prefetch=prefetch_factor, pipeline=core_pipeline, metrics=loader._metrics,
                         **sampling(loader))
