"""The processes backend: forked worker processes run the Python dataset's code and write
each batch into shared-memory slots, its objects sent as bytes; the C process pool
(csrc/data/fl_procpool.c) as a BatchSource (_backend.py)."""

from __future__ import annotations

from typing import Any, Callable

from .._core import _ProcLoader
from ._backend import dataset_length, python_fields, sampling, worker_seed
from ._failures import process_failure
from ._samples import Fetcher
from ._torch_interop import seed_generators, setup_worker_torch
from ._worker import WorkerInfo, set_worker_info
from .ops import Pipeline


def processes_source(loader: Any, fetch: Fetcher, first: Any, pipeline: Pipeline | None, num_workers: int,
                     prefetch_factor: int, worker_init_fn: Callable | None) -> _ProcLoader:
    """Worker processes, forked at each epoch's start (or once, with persistent workers): each
    seeds numpy, random and torch from (seed, worker id), sets its WorkerInfo, then calls
    worker_init_fn, as DataLoader's workers do."""
    layout = fetch.layout
    assert layout is not None
    fields, core_pipeline = python_fields(fetch, first, pipeline)
    seed = loader.seed

    def worker_setup(worker_id: int) -> None:
        setup_worker_torch()  # before any user code runs torch ops in this child
        own_seed = worker_seed(seed, worker_id)
        seed_generators(own_seed)
        set_worker_info(WorkerInfo(worker_id, num_workers, own_seed, "processes"))
        if worker_init_fn is not None:
            worker_init_fn(worker_id)

    return _ProcLoader(fields, fetch, process_failure, dataset_length(fetch), workers=num_workers,
                       prefetch=prefetch_factor, pipeline=core_pipeline, worker_setup=worker_setup,
                       metrics=loader._metrics, finish=fetch.finish,
                       objects_bytes=layout.objects_bytes(first, loader.batch_size), **sampling(loader))
