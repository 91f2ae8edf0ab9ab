"""fastloop: the logistics of a Python training loop in C that releases the GIL.

Plain threads run fastloop's work in parallel, because it never holds the GIL while it
computes or waits.

    >>> import fastloop, numpy
    >>> q = fastloop.Queue(maxsize=1024); q.put(numpy.ones(3)); q.get()
    array([1., 1., 1.])
"""

from __future__ import annotations

import sys

from . import errors
from ._core import Event, MetricStats, Metrics, Queue
from .errors import *  # noqa: F403 - every exception, listed once in errors.__all__
from . import cuda, data, nn
from ._version import __version__
from .checkpoint import Checkpoint, Checkpointer, read_checkpoint
from .data import datasets, images, loader, ops
from .data import Folder, ImageFolder, Images, Loader, TarShards, WorkerInfo, get_worker_info, load_npy, sample_rng
from .monitor import CallbackSink, CSVSink, JSONLSink, Monitor, TensorBoardSink

# The module paths from before data/ existed stay importable as the same module objects:
# `import fastloop.ops`, `from fastloop.images import decode`, `fastloop.loader`, `fastloop.datasets`.
for _module in (datasets, images, loader, ops):
    sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module
del _module

__all__ = [
    "Queue",
    "Event",
    "ops",
    "cuda",
    "nn",
    "images",
    "Loader",
    "Folder",
    "ImageFolder",
    "Images",
    "TarShards",
    "load_npy",
    "get_worker_info",
    "WorkerInfo",
    "sample_rng",
    "Monitor",
    "CSVSink",
    "JSONLSink",
    "TensorBoardSink",
    "CallbackSink",
    "Metrics",
    "MetricStats",
    "Checkpointer",
    "read_checkpoint",
    "Checkpoint",
    *errors.__all__,
    "__version__",
]
