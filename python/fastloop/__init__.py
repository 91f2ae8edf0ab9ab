"""fastloop: the logistics of a Python training loop in C that releases the GIL.

Plain threads run fastloop's work in parallel, because it never holds the GIL while it
computes or waits.

    >>> import fastloop, numpy
    >>> q = fastloop.Queue(maxsize=1024); q.put(numpy.ones(3)); q.get()
    array([1., 1., 1.])
"""

from __future__ import annotations

from . import errors
from ._core import Event, Queue
from .errors import Closed, CudaError, CudaUnavailable, Empty, Error, QueueFull
from . import ops
from . import cuda

__version__ = "0.1.0"

__all__ = [
    "Queue",
    "Event",
    "ops",
    "cuda",
    "Error",
    "Closed",
    "Empty",
    "QueueFull",
    "CudaError",
    "CudaUnavailable",
    "__version__",
]
