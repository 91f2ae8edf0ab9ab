"""fastloop.nn: small multilayer perceptrons trained in C with the GIL released.

A training step (forward, loss, backward, optimizer update) is one C call, so other Python
threads keep running while it computes; on the CPU the matrix products go through a BLAS
(OpenBLAS from NumPy's wheel by default), on CUDA through cuBLAS.

    >>> import fastloop as fl
    >>> model = fl.nn.Sequential(fl.nn.Linear(10, 1))
    >>> opt = fl.nn.SGD(model, lr=0.01)
    >>> loss = model.train_step(x, y, loss="mse", opt=opt)   # x (N, 10), y (N, 1) float32

The layers, parameter names, shapes, initialization and update rules are torch's, so a
``state_dict()`` loads into the equivalent ``torch.nn.Sequential`` and back.
"""

from ._blas import blas_info, set_blas_threads
from ._training_state import load_training_state, training_state
from .modules import LOSSES, Flatten, Linear, Module, ReLU, Sequential, manual_seed
from .optim import SGD, Adam, AdamW, Optimizer

__all__ = [
    "Module",
    "Linear",
    "ReLU",
    "Flatten",
    "Sequential",
    "Optimizer",
    "SGD",
    "Adam",
    "AdamW",
    "LOSSES",
    "manual_seed",
    "blas_info",
    "set_blas_threads",
    "training_state",
    "load_training_state",
]
