"""Serving a torch ``nn.Module`` (TorchScript too): a worker's NumPy batch becomes tensors
sharing its memory (``torch.from_numpy``; moved to the module's device when it has one),
the module runs under ``torch.inference_mode()`` with one positional argument per declared
input, and its outputs (a tensor, a tuple or a dict of tensors) come back as NumPy rows.
Imported only when a torch module is served: torch stays optional.

``eval()`` is the caller's job (as for any torch inference): a module still in training
mode gets a warning, since dropout and batch norm then change its answers (not a
``torch.export`` program's module, whose graph has the mode it was exported in).
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import numpy as np
import torch

from .outputs import pack
from .spec import Spec

__all__ = ["TorchRunner"]


def _device_of(module: torch.nn.Module) -> torch.device:
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return torch.device("cpu")


def to_numpy(value: Any) -> np.ndarray:
    """A tensor's values as a NumPy array (bfloat16, which NumPy lacks, as float32)."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.dtype == torch.bfloat16:
            value = value.float()
        return value.cpu().numpy()
    return np.asarray(value)


def _apply_torch_threads() -> None:
    """Gives the calling thread torch's intra-op thread count (torch.set_num_threads): OpenMP
    keeps that count per thread, and a thread that never asked torch for it (a worker, say)
    runs the BLAS on every core instead (e.g. 0.5 ms on 2 cores where 1 was set, 0.9 ms)."""
    torch.set_num_threads(torch.get_num_threads())  # the get applies the count to this thread


class TorchRunner:
    """Calls `module` on a stacked batch of rows checked by `spec`; returns its rows."""

    def __init__(self, module: torch.nn.Module, spec: Spec) -> None:
        if not isinstance(spec, Spec):
            raise TypeError(f"a torch model needs its inputs declared as a Spec, not {spec!r}")
        if module.training and not isinstance(module, torch.fx.GraphModule):  # export bakes the mode in
            warnings.warn(f"InferenceService: the {type(module).__name__} is in training mode (dropout, "
                          "batch norm statistics): call model.eval() before serving it", UserWarning, stacklevel=4)
        self.module, self.spec = module, spec
        self.device = _device_of(module)
        self._threads_applied = threading.local()

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        if not getattr(self._threads_applied, "done", False):
            _apply_torch_threads()
            self._threads_applied.done = True
        tensors = [torch.from_numpy(array) for array in self.spec.split(batch)]  # shares the batch's memory
        if self.device.type != "cpu":
            tensors = [t.to(self.device, non_blocking=True) for t in tensors]
        with torch.inference_mode():
            out = self.module(*tensors)
        return pack(out, len(batch), to_numpy)
