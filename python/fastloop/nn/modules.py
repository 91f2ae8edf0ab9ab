"""fastloop.nn's layers and models: Linear, ReLU and Flatten, applied in order by a Sequential
that owns the C model (parameters on its device) and trains it in one C call per step.

Parameter names, shapes and initialization are torch's (torch.nn.modules), so a state_dict()
loads into the equivalent torch.nn.Sequential and back.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

import numpy as np

from .. import _core
from . import _blas
from .._args import SSIZE_MAX
from .._device import parse_device as _parse_device

if TYPE_CHECKING:
    from .optim import Optimizer

__all__ = ["Module", "Linear", "ReLU", "Flatten", "Sequential", "LOSSES", "manual_seed"]

LOSSES = {"mse": 0, "cross_entropy": 1}
_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

_rng_lock = threading.Lock()
_rng = np.random.default_rng()


def manual_seed(seed: int) -> None:
    """Seeds the generator that initializes new Linear layers (like torch.manual_seed).

    >>> fl.nn.manual_seed(0); a = fl.nn.Linear(3, 2).weight
    """
    global _rng
    with _rng_lock:
        _rng = np.random.default_rng(seed)

def _is_cuda_array(obj: Any) -> bool:
    return hasattr(obj, "__cuda_array_interface__")


class _CudaView:
    """A reshaped view of a CUDA array (same memory), for Flatten and 1-D inputs."""

    def __init__(self, base: Any, shape: tuple[int, ...]) -> None:
        self._base = base  # keeps the memory alive
        iface = dict(base.__cuda_array_interface__)
        iface["shape"] = shape
        iface["strides"] = None
        self.__cuda_array_interface__ = iface
        self.shape = shape


# ---------------------------------------------------------------- layers


class Module:
    """Base of layers and models. A model (a Sequential, or a layer used on its own) owns a
    C model holding the parameters on its device; layers inside a Sequential read theirs
    from it."""

    def _specs(self) -> list[tuple]:
        raise NotImplementedError

    def _named_layers(self) -> list[tuple[str, "Module"]]:
        """(state_dict prefix, leaf layer) in order."""
        return [("", self)]

    def __call__(self, x: Any) -> Any:
        return self.forward(x)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"


class Linear(Module):
    """y = x @ weight.T + bias, with torch's shapes ((out, in) and (out,)) and torch's default
    initialization: uniform in +-1/sqrt(in_features) for both.

    Used on its own it is a model (``Linear(10, 1).train_step(...)``); inside a Sequential its
    ``weight``/``bias`` read the Sequential's current values.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Linear: {name} must be a positive int, not {value!r}")
        self.in_features, self.out_features, self.has_bias = int(in_features), int(out_features), bool(bias)
        if self.in_features * self.out_features * 8 > SSIZE_MAX:  # float64 weights, made below
            raise OverflowError(f"Linear: in_features x out_features ({self.in_features} x {self.out_features}) "
                                f"weights are too large: more bytes than a size holds")
        bound = 1.0 / math.sqrt(self.in_features)
        with _rng_lock:
            weight = _rng.uniform(-bound, bound, (self.out_features, self.in_features))
            bias_value = _rng.uniform(-bound, bound, self.out_features) if bias else None
        self._initial = {"weight": weight, "bias": bias_value}
        self._owner: Sequential | None = None  # the model that holds the live values
        self._param_index = 0  # index of weight in the owner's parameter list
        self._own_model: Sequential | None = None

    def _specs(self) -> list[tuple]:
        return [("linear", self.in_features, self.out_features, self.has_bias)]

    def _as_model(self) -> "Sequential":
        if self._own_model is None:
            if self._owner is not None:
                raise ValueError("this Linear belongs to a Sequential: call that model instead")
            self._own_model = Sequential(self, _prefixes=False)
        return self._own_model

    # A Linear on its own behaves as a one-layer model.
    def forward(self, x: Any) -> Any:
        """This layer alone as a model: x (batch, in_features) -> (batch, out_features)."""
        return self._as_model().forward(x)

    def train_step(self, x: Any, y: Any, loss: str = "mse", opt: "Optimizer | None" = None) -> float:
        """One training step of this layer alone (see Sequential.train_step)."""
        return self._as_model().train_step(x, y, loss=loss, opt=opt)

    def backward(self, x: Any, y: Any, loss: str = "mse") -> float:
        """Loss and gradients without an update (see Sequential.backward)."""
        return self._as_model().backward(x, y, loss=loss)

    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """{"weight": ..., "bias": ...} copies, as torch.nn.Linear's."""
        return self._as_model().state_dict()

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> None:
        """Loads {"weight", "bias"} (NumPy arrays or torch tensors), checked first."""
        self._as_model().load_state_dict(state, strict=strict)

    def grads(self) -> "OrderedDict[str, np.ndarray]":
        """Copies of the gradients of the last backward()/train_step()."""
        return self._as_model().grads()

    def to(self, device: str | int) -> "Linear":
        """Moves this layer-as-a-model to `device`; returns self."""
        self._as_model().to(device)
        return self

    def _value(self, which: str) -> np.ndarray | None:
        if which == "bias" and not self.has_bias:
            return None
        if self._owner is None:
            return self._initial[which].copy()
        return self._owner._model.get_param(self._param_index + (which == "bias"))

    @property
    def weight(self) -> np.ndarray:
        """A copy of the current weight, shape (out_features, in_features)."""
        return self._value("weight")  # type: ignore[return-value]

    @property
    def bias(self) -> np.ndarray | None:
        """A copy of the current bias, shape (out_features,), or None."""
        return self._value("bias")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.has_bias}"


class ReLU(Module):
    """max(x, 0), elementwise."""

    def _specs(self) -> list[tuple]:
        return [("relu",)]


class Flatten(Module):
    """Flattens every dimension after the first: (N, C, H, W) -> (N, C*H*W). A view, no copy."""

    def _specs(self) -> list[tuple]:
        return []


# ---------------------------------------------------------------- the model


class Sequential(Module):
    """Layers applied in order, trained in C: ``Sequential(Linear(784, 512), ReLU(), ...)``.

    ``dtype`` is float32 (default) or float64; ``device`` is "cpu" (default), "cuda" or
    "cuda:N". Parameter names and order follow torch.nn.Sequential ("0.weight", "0.bias",
    "2.weight", ...). Every call is safe from several threads (they run one at a time) and
    releases the GIL while it computes.
    """

    def __init__(self, *layers: Module, dtype: Any = np.float32, device: str | int | None = "cpu",
                 _prefixes: bool = True) -> None:
        if not layers:
            raise ValueError("Sequential needs at least one layer")
        for i, layer in enumerate(layers):
            if not isinstance(layer, Module) or isinstance(layer, Sequential):
                raise TypeError(f"layer {i} must be a fastloop.nn Linear, ReLU or Flatten, not {type(layer).__name__}")
            if isinstance(layer, Linear) and (layer._owner is not None or layer._own_model is not None):
                raise ValueError(f"layer {i} ({layer!r}) already belongs to a model")
        if not any(isinstance(layer, Linear) for layer in layers):
            raise ValueError("Sequential needs at least one Linear layer")
        flatten_at = [i for i, layer in enumerate(layers) if isinstance(layer, Flatten)]
        if flatten_at and flatten_at != [0]:
            raise ValueError("Flatten is supported as the first layer only")
        self.dtype = np.dtype(dtype)
        if self.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"dtype must be float32 or float64, not {self.dtype}")
        self._layers = list(layers)
        self._prefixes = _prefixes
        self._flatten = bool(flatten_at)
        linears = [layer for layer in layers if isinstance(layer, Linear)]
        self.in_features, self.out_features = linears[0].in_features, linears[-1].out_features
        self.device = "cpu"
        self._device_index = 0
        self._model = self._build(*_parse_device(device))
        initial = [(layer._initial["weight"], layer._initial["bias"]) for layer in linears]
        self._bind_and_fill([v for pair in initial for v in pair if v is not None])

    def _build(self, kind: str, index: int) -> Any:
        specs = [spec for layer in self._layers for spec in layer._specs()]
        backend = None
        if kind == "cuda":
            from .. import cuda

            cuda.require()  # raises CudaUnavailable saying why
            backend = cuda.nn_backend()
        else:
            _blas.ensure_loaded()
        try:
            model = _core._Model(specs, self.dtype, backend, index)
        except ValueError as error:
            raise ValueError(f"Sequential: {error}") from None
        self.device = "cpu" if kind == "cpu" else f"cuda:{index}"
        self._device_index = index
        return model

    def _bind_and_fill(self, values: Sequence[np.ndarray]) -> None:
        """Points each Linear at this model and writes `values` (torch order) into it."""
        index = 0
        for layer in self._layers:
            if isinstance(layer, Linear):
                layer._owner, layer._param_index = self, index
                index += 2 if layer.has_bias else 1
        for i, value in enumerate(values):
            self._model.set_param(i, np.ascontiguousarray(value, dtype=self.dtype))

    def _named_layers(self) -> list[tuple[str, Module]]:
        return [(f"{i}." if self._prefixes else "", layer) for i, layer in enumerate(self._layers)]

    def _param_names(self) -> list[str]:
        names = []
        for prefix, layer in self._named_layers():
            if isinstance(layer, Linear):
                names += [prefix + "weight"] + ([prefix + "bias"] if layer.has_bias else [])
        return names

    # ---- containers
    def __getitem__(self, index: int) -> Module:
        return self._layers[index]

    def __len__(self) -> int:
        return len(self._layers)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._layers)

    def __repr__(self) -> str:
        inner = "".join(f"\n  ({i}): {layer!r}" for i, layer in enumerate(self._layers))
        return f"Sequential({inner}\n) on {self.device}, {self.dtype}"

    def num_parameters(self) -> int:
        """How many scalars the model trains."""
        return sum(int(np.prod(shape)) for _, _, shape in self._model.param_info())

    # ---- inputs
    def _input(self, x: Any, name: str = "x") -> tuple[Any, int, bool]:
        """Returns (2-D array the C model takes, rows, was_1d), with errors naming the cause."""
        cuda_input = _is_cuda_array(x)
        if cuda_input:
            shape = tuple(x.__cuda_array_interface__["shape"])
        else:
            if not isinstance(x, np.ndarray):
                x = np.asarray(x)
            shape = x.shape
            if x.dtype != self.dtype:
                raise TypeError(f"{name} has dtype {x.dtype}, the model computes in {self.dtype}: "
                                f"convert with {name}.astype(np.{self.dtype})")
        one_row = len(shape) == 1
        if self._flatten and len(shape) >= 2:
            shape = (shape[0], int(np.prod(shape[1:])))
        elif one_row:
            shape = (1, shape[0])
        if len(shape) != 2 or shape[1] != self.in_features:
            raise ValueError(f"{name} has shape {tuple(shape) if not one_row else (shape[1],)}, the model takes "
                             f"(batch, {self.in_features})" + (" (Flatten is first)" if self._flatten else ""))
        if cuda_input:
            if tuple(x.__cuda_array_interface__["shape"]) != shape:
                x = _CudaView(x, shape)
        else:
            x = np.ascontiguousarray(x).reshape(shape)
        return x, shape[0], one_row

    def _target(self, y: Any, rows: int, loss: str) -> Any:
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {sorted(LOSSES)}, not {loss!r}")
        if _is_cuda_array(y):
            return y  # the C layer checks its dtype and shape
        y = np.asarray(y)
        if loss == "cross_entropy":
            if y.dtype.kind not in "iu":
                raise TypeError(f"cross_entropy takes integer class labels, not {y.dtype}")
            if y.shape != (rows,):
                raise ValueError(f"y has shape {y.shape}, expected ({rows},): one label per row of x")
            return np.ascontiguousarray(y, dtype=np.int64)
        if y.dtype != self.dtype:
            raise TypeError(f"y has dtype {y.dtype}, the model computes in {self.dtype}")
        if y.shape == (rows,) and self.out_features == 1:
            y = y.reshape(rows, 1)
        if y.shape != (rows, self.out_features):
            raise ValueError(f"y has shape {y.shape}, expected ({rows}, {self.out_features}) for mse")
        return np.ascontiguousarray(y)

    # ---- compute
    def forward(self, x: Any) -> Any:
        """model(x): x (batch, in_features) (or (in_features,)) -> (batch, out_features).

        Returns a NumPy array on the CPU and a fastloop.cuda.DeviceArray on CUDA.
        """
        x2, rows, one_row = self._input(x)
        if self.device == "cpu":
            out = np.empty((rows, self.out_features), self.dtype)
        else:
            from .. import cuda

            out = cuda.empty((rows, self.out_features), self.dtype, device=self._device_index)
        self._model.forward(x2, out, rows)
        if one_row:
            return out.reshape(self.out_features) if isinstance(out, np.ndarray) else _CudaView(out, (self.out_features,))
        return out

    def backward(self, x: Any, y: Any, loss: str = "mse") -> float:
        """Forward and backward without an update: returns the loss and leaves the gradients
        in grads() (they replace the previous ones; torch adds them up until zero_grad())."""
        x2, rows, _ = self._input(x)
        return self._model.backward(x2, self._target(y, rows, loss), rows, LOSSES[loss])

    def train_step(self, x: Any, y: Any, loss: str = "mse", opt: "Optimizer | None" = None) -> float:
        """One training step in one C call with the GIL released: forward, the loss
        ("mse" or "cross_entropy" with integer labels), backward and opt's update. Returns the
        loss (the mean over the batch). Bad labels raise ValueError before anything changes.
        """
        from .optim import Optimizer  # optim imports this module: imported here, once cached

        if not isinstance(opt, Optimizer):
            raise TypeError(f"opt must be a fastloop.nn optimizer (SGD, Adam, AdamW), not {type(opt).__name__}")
        if opt._model_ref is not self._model:
            raise ValueError("opt was made for another model (or for this one before .to()): make it again")
        x2, rows, _ = self._input(x)
        return self._model.train_step(x2, self._target(y, rows, loss), rows, LOSSES[loss], opt._opt)

    # ---- parameters
    def state_dict(self) -> "OrderedDict[str, np.ndarray]":
        """Parameter copies, in torch's names, order and shapes (host NumPy arrays), taken
        together: from another thread it is the model between two steps, never a mix."""
        return OrderedDict(zip(self._param_names(), self._model.get_all(False)))

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> None:
        """Loads parameters from a state_dict (NumPy arrays, torch tensors, anything array-like).
        Checks every name and shape before writing any; with strict, missing or unexpected
        names are errors (as in torch)."""
        names = self._param_names()
        missing = [n for n in names if n not in state]
        unexpected = [n for n in state if n not in names]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing {missing}, unexpected {unexpected}")
        shapes = [shape for _, _, shape in self._model.param_info()]
        values = {}
        for i, name in enumerate(names):
            if name not in state:
                continue
            value = state[name]
            if hasattr(value, "detach"):  # a torch tensor
                value = value.detach().cpu().numpy()
            value = np.asarray(value)
            if value.shape != tuple(shapes[i]):
                raise ValueError(f"load_state_dict: {name} has shape {value.shape}, the model's is {tuple(shapes[i])}")
            values[i] = np.ascontiguousarray(value, dtype=self.dtype)
        for i, value in values.items():
            self._model.set_param(i, value)

    def grads(self) -> "OrderedDict[str, np.ndarray]":
        """Copies of the gradients of the last backward()/train_step(), named as state_dict()."""
        return OrderedDict(zip(self._param_names(), self._model.get_all(True)))

    def set_grads(self, grads: Mapping[str, Any]) -> None:
        """Replaces gradients (e.g. after an all-reduce across ranks) before opt.step()."""
        names = self._param_names()
        for name, value in grads.items():
            if name not in names:
                raise KeyError(f"set_grads: unknown parameter {name!r}; the model has {names}")
            self._model.set_grad(names.index(name), np.ascontiguousarray(value, dtype=self.dtype))

    def to(self, device: str | int) -> "Sequential":
        """Moves the parameters to `device` ("cpu", "cuda", "cuda:N"); returns self. Make
        optimizers after moving (their state lives on the old device)."""
        kind, index = _parse_device(device)
        if (kind, index) == _parse_device(self.device):
            return self
        values = [self._model.get_param(i) for i in range(len(self._param_names()))]
        self._model = self._build(kind, index)
        self._bind_and_fill(values)
        return self
