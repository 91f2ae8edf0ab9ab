"""fastloop.serve: a queued inference service with dynamic batching.

Callers submit one input at a time (checked against the model's declared ``Input``s, if any); a bounded fastloop.Queue holds the jobs; worker threads
take up to ``max_batch`` of them (waiting at most ``max_delay_s`` for the batch to fill),
run the model once on the stacked batch (a fastloop.nn model computes with the GIL
released; a torch module gets tensors under ``torch.inference_mode()``) and store each job's row; callers poll ``status()`` or wait in ``result()``.

    >>> from fastloop.serve import InferenceService, FileStore
    >>> with InferenceService(model, num_workers=2, max_batch=32, store=FileStore("jobs")) as svc:
    ...     y = svc.result(svc.submit(x), timeout=5.0)

A torch ``nn.Module`` is served with its inputs declared:

    >>> svc = InferenceService(cnn.eval(), inputs=Input(torch.float32, (3, 32, 32)))

Over HTTP: ``python -m fastloop serve --model CHECKPOINT`` (or ``--model module:factory``, a
TorchScript or ``torch.export`` file; or ``App(service)`` under uvicorn), and
``Client(base_url)`` to submit and fetch results. See docs/serve.md.
"""

from __future__ import annotations

from .checkpoint_model import arch_of
from .client import BadRequest, Client, ServiceUnavailable
from .factory import create_service
from .filestore import FileStore
from .http import App
from . import jobs
from .jobs import *  # noqa: F403 - the job record and exceptions, listed once in jobs.__all__
from .redisqueue import RedisQueue
from .redisstore import RedisStore, StoreUnavailable
from .service import Admission, InferenceService
from .shared import SharedInferenceService
from .spec import Input
from .stores import MemoryStore, Store

__all__ = [
    "InferenceService",
    "SharedInferenceService",
    "create_service",
    "Admission",
    "Input",
    "FileStore",
    "MemoryStore",
    "RedisStore",
    "RedisQueue",
    "Store",
    "StoreUnavailable",
    "App",
    "Client",
    "BadRequest",
    "ServiceUnavailable",
    "arch_of",
]
__all__ += jobs.__all__
