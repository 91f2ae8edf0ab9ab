"""fastloop.serve: a queued inference service with dynamic batching.

Callers submit one input at a time; a bounded fastloop.Queue holds the jobs; worker threads
take up to ``max_batch`` of them (waiting at most ``max_delay_ms`` for the batch to fill),
run the model once on the stacked batch (a fastloop.nn model computes with the GIL
released) and store each job's row; callers poll ``status()`` or wait in ``result()``.

    >>> from fastloop.serve import InferenceService, FileStore
    >>> with InferenceService(model, workers=2, max_batch=32, store=FileStore("jobs")) as svc:
    ...     y = svc.result(svc.submit(x), timeout=5.0)

See docs/serve.md.
"""

from __future__ import annotations

from .filestore import FileStore
from .jobs import JobCancelled, JobExpired, JobFailed, JobRecord, StoreError
from .redisstore import RedisStore, StoreUnavailable
from .service import InferenceService
from .stores import MemoryStore, Store

__all__ = [
    "InferenceService",
    "FileStore",
    "MemoryStore",
    "RedisStore",
    "Store",
    "JobRecord",
    "JobFailed",
    "JobCancelled",
    "JobExpired",
    "StoreError",
    "StoreUnavailable",
]
