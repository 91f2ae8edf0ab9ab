"""fastloop: the logistics of a Python training loop in C that releases the GIL.

Plain threads run fastloop's work in parallel, because it never holds the GIL while it
computes or waits.

    >>> import fastloop, numpy
    >>> q = fastloop.Queue(maxsize=1024); q.put(numpy.ones(3)); q.get()
    array([1., 1., 1.])
"""

from __future__ import annotations

from . import errors
from ._core import Event, MetricStats, Metrics, Queue
from .errors import *  # noqa: F403 - every exception, listed once in errors.__all__
from . import ops
from . import cuda
from . import nn
from . import images
from .checkpoint import Checkpoint, Checkpointer, read_checkpoint
from .monitor import CallbackSink, CSVSink, JSONLSink, Monitor, TensorBoardSink
from .loader import Folder, Loader, WorkerInfo, get_worker_info, load_npy
from .datasets import ImageFolder, Images, TarShards

__version__ = "0.1.0"

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
