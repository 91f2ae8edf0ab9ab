"""create_service(): the one call that builds a service for a model, whichever queue it uses.

    >>> svc = create_service(model, store=MemoryStore())                         # InferenceService
    >>> svc = create_service(model, store=RedisStore(url), queue=RedisQueue())   # SharedInferenceService

``queue=None`` (the default) gives an InferenceService, whose queue lives in this process; a
RedisQueue gives a SharedInferenceService, whose queue lives in Redis beside a RedisStore,
shared by every process and machine serving it. The name says what it does (it creates, and
picks the class): InferenceService(queue=...) itself refuses, so a class never quietly
returns an instance of another. This module imports both classes; neither imports the other
(shared.py subclasses service.py, and service.py knows nothing of shared.py).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .service import InferenceService
from .shared import SharedInferenceService

__all__ = ["create_service"]


def create_service(model: Callable[[np.ndarray], Any], *, queue: Any = None, **kwargs: Any) -> InferenceService:
    """An InferenceService for `model` (``queue=None``), or a SharedInferenceService when
    `queue` is a fastloop.serve.RedisQueue. The other keywords are the class's own
    (InferenceService's docstring lists them)."""
    if queue is None:
        return InferenceService(model, **kwargs)
    return SharedInferenceService(model, queue=queue, **kwargs)
