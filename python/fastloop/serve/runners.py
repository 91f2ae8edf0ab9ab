"""How a worker calls the model on a stacked batch: the model's arguments from the batch (one
array, or one per declared input) and its outputs packed into one array of rows
(fastloop.serve.outputs). A torch module gets tensors and runs under inference_mode
(fastloop.serve.torch_model).

    >>> run = runner_for(model, spec)
    >>> rows = run(np.stack(inputs))      # n rows, structured for dict/tuple outputs
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .outputs import pack
from .spec import Spec, is_torch_module

__all__ = ["runner_for"]

Runner = Callable[[np.ndarray], np.ndarray]


def runner_for(model: Any, spec: Any) -> Runner:
    """The batch -> rows call for `model`: a torch module under inference_mode, a callable
    with declared inputs given one NumPy array per input, any other callable as it is."""
    if is_torch_module(model):
        from .torch_model import TorchRunner
        return TorchRunner(model, spec)
    if isinstance(spec, Spec):
        return lambda batch: pack(model(*spec.split(batch)), len(batch))
    return lambda batch: pack(model(batch), len(batch))
