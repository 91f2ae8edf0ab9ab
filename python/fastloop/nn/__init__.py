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

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from .. import _core
from . import _blas
from .._args import SSIZE_MAX
from .._device import parse_device as _parse_device

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


def blas_info() -> str:
    """Which BLAS the CPU backend uses (loading one if none is yet).

    >>> fl.nn.blas_info()
    'libscipy_openblas64_-....so (scipy_cblas_sgemm64_, 64-bit integers) from ...'
    """
    return _blas.ensure_loaded()


def set_blas_threads(threads: int) -> None:
    """Sets the CPU BLAS's thread count, for the whole process (NumPy's matmul shares it when
    it is the same library). A server running several models at once, each on its own
    thread, wants 1: BLAS threads that spin beside busy workers slow every call.

    >>> fl.nn.set_blas_threads(1)
    """
    _blas.ensure_loaded()
    _core._blas_set_threads(int(threads))


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


# ---------------------------------------------------------------- optimizers


def _model_of(model: Any) -> Sequential:
    if isinstance(model, Linear):
        return model._as_model()
    if not isinstance(model, Sequential):
        raise TypeError(f"optimizers take the fastloop.nn model itself, not {type(model).__name__}")
    return model


class Optimizer:
    """Base of SGD, Adam and AdamW: the update runs in C on the model's device."""

    _kind = 0
    _buffer_names: tuple[str, ...] = ()

    def __init__(self, model: Any, hyper: dict[str, Any]) -> None:
        if hyper["lr"] < 0:
            raise ValueError(f"lr must be >= 0, not {hyper['lr']}")
        if hyper.get("weight_decay", 0) < 0:
            raise ValueError(f"weight_decay must be >= 0, not {hyper['weight_decay']}")
        self.model = _model_of(model)
        self._model_ref = self.model._model
        self._opt = _core._Optimizer(self._model_ref, self._kind, hyper)

    @property
    def lr(self) -> float:
        """The learning rate; set it between steps for a schedule."""
        return self._opt.get_hyper()["lr"]

    @lr.setter
    def lr(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"lr must be >= 0, not {value}")
        self._opt.set_hyper({"lr": float(value)})

    @property
    def steps(self) -> int:
        """Updates applied so far."""
        return self._opt.steps

    def step(self) -> None:
        """Applies one update from the model's current gradients (after model.backward())."""
        self._opt.step()

    def _group(self) -> dict[str, Any]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """torch-shaped state: {"state": {i: {name: array}}, "param_groups": [{...}]}."""
        count = len(self.model._param_names())
        state: dict[int, dict[str, Any]] = {}
        if self._opt.buffers and self._opt.steps > 0:
            for i in range(count):
                entry: dict[str, Any] = {n: self._opt.get_state(i, b) for b, n in enumerate(self._buffer_names)}
                if self._kind == 1:
                    entry["step"] = float(self._opt.steps)
                state[i] = entry
        group = self._group()
        group["params"] = list(range(count))
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restores what state_dict() returned (or torch's optimizer.state_dict() for the
        same model, tensors allowed)."""
        groups = state_dict.get("param_groups")
        if not groups or len(groups) != 1:
            raise ValueError("load_state_dict: expected exactly one param group")
        self._set_group(groups[0])
        entries = state_dict.get("state", {})
        steps = 0
        for key, entry in entries.items():
            for b, name in enumerate(self._buffer_names):
                if name in entry:
                    value = entry[name]
                    value = value.detach().cpu().numpy() if hasattr(value, "detach") else np.asarray(value)
                    self._opt.set_state(int(key), b, np.ascontiguousarray(value, dtype=self.model.dtype))
            step = entry.get("step", 1)
            steps = max(steps, int(float(step.item() if hasattr(step, "item") else step)))
        self._opt.steps = steps

    def _set_group(self, group: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._group()})"


class SGD(Optimizer):
    """Stochastic gradient descent with torch's momentum, Nesterov and weight decay rules."""

    _kind = 0
    _buffer_names = ("momentum_buffer",)

    def __init__(self, model: Any, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
                 nesterov: bool = False) -> None:
        if momentum < 0:
            raise ValueError(f"momentum must be >= 0, not {momentum}")
        if nesterov and momentum <= 0:
            raise ValueError("Nesterov momentum needs momentum > 0")
        super().__init__(model, {"lr": float(lr), "momentum": float(momentum),
                                 "weight_decay": float(weight_decay), "nesterov": bool(nesterov)})

    def _group(self) -> dict[str, Any]:
        h = self._opt.get_hyper()
        return {"lr": h["lr"], "momentum": h["momentum"], "dampening": 0, "weight_decay": h["weight_decay"],
                "nesterov": h["nesterov"]}

    def _set_group(self, group: Mapping[str, Any]) -> None:
        if group.get("dampening", 0):
            raise ValueError("load_state_dict: dampening is not supported")
        self._opt.set_hyper({k: group[k] for k in ("lr", "momentum", "weight_decay", "nesterov") if k in group})


class Adam(Optimizer):
    """Adam with torch's defaults and update (L2 weight decay added to the gradient)."""

    _kind = 1
    _buffer_names = ("exp_avg", "exp_avg_sq")
    _decoupled = False

    def __init__(self, model: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        beta1, beta2 = betas
        for name, beta in (("betas[0]", beta1), ("betas[1]", beta2)):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"{name} must be in [0, 1), not {beta}")
        if eps < 0:
            raise ValueError(f"eps must be >= 0, not {eps}")
        super().__init__(model, {"lr": float(lr), "beta1": float(beta1), "beta2": float(beta2), "eps": float(eps),
                                 "weight_decay": float(weight_decay), "decoupled": self._decoupled})

    def _group(self) -> dict[str, Any]:
        h = self._opt.get_hyper()
        return {"lr": h["lr"], "betas": (h["beta1"], h["beta2"]), "eps": h["eps"], "weight_decay": h["weight_decay"],
                "amsgrad": False}

    def _set_group(self, group: Mapping[str, Any]) -> None:
        if group.get("amsgrad", False):
            raise ValueError("load_state_dict: amsgrad is not supported")
        hyper = {k: group[k] for k in ("lr", "eps", "weight_decay") if k in group}
        if "betas" in group:
            hyper["beta1"], hyper["beta2"] = group["betas"]
        self._opt.set_hyper(hyper)


class AdamW(Adam):
    """Adam with decoupled weight decay (torch.optim.AdamW; default weight_decay 0.01)."""

    _decoupled = True

    def __init__(self, model: Any, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01) -> None:
        super().__init__(model, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


# ---------------------------------------------------------------- checkpoints


def training_state(model: Module, opt: Optimizer | None = None, **progress: Any) -> dict[str, Any]:
    """Model, optimizer and progress as one flat dict of arrays, what a fastloop.Checkpointer
    saves: "model.<name>" parameters, "optim.state.<i>.<buffer>", "optim.group.<key>", and
    each `progress` value (epoch=3, step=1200) under its own name.

    >>> ckpt.save(fl.nn.training_state(model, opt, epoch=epoch, step=step), step)
    """
    if isinstance(model, Linear):
        model = model._as_model()
    state: dict[str, Any] = {f"model.{name}": value for name, value in model.state_dict().items()}  # type: ignore[attr-defined]
    if opt is not None:
        opt_state = opt.state_dict()
        for index, buffers in opt_state["state"].items():
            for name, value in buffers.items():
                state[f"optim.state.{index}.{name}"] = np.asarray(value)
        for key, value in opt_state["param_groups"][0].items():
            if key != "params":
                state[f"optim.group.{key}"] = np.asarray(value)
    clashes = [key for key in progress if key.startswith(("model.", "optim."))]
    if clashes:
        raise ValueError(f"training_state: progress names may not start with 'model.' or 'optim.': {clashes}")
    state.update({key: np.asarray(value) for key, value in progress.items()})
    return state


def load_training_state(state: Mapping[str, Any], model: Module, opt: Optimizer | None = None) -> dict[str, Any]:
    """Loads what training_state() saved into `model` (and `opt`); returns the progress
    values as Python numbers (or arrays).

    >>> progress = fl.nn.load_training_state(ckpt.load(), model, opt); start = int(progress["epoch"])
    """
    if isinstance(model, Linear):
        model = model._as_model()
    model.load_state_dict({k[len("model."):]: v for k, v in state.items() if k.startswith("model.")})  # type: ignore[attr-defined]
    buffers: dict[int, dict[str, Any]] = {}
    group: dict[str, Any] = {}
    for key, value in state.items():
        if key.startswith("optim.state."):
            index, name = key[len("optim.state."):].split(".", 1)
            buffers.setdefault(int(index), {})[name] = value
        elif key.startswith("optim.group."):
            group[key[len("optim.group."):]] = np.asarray(value).tolist()  # 0-d -> number, betas -> list
    if opt is not None:
        if not group:
            raise KeyError("load_training_state: the state holds no optimizer (saved without opt?)")
        opt.load_state_dict({"state": buffers, "param_groups": [group]})
    return {k: (np.asarray(v).item() if np.ndim(v) == 0 else v) for k, v in state.items()
            if not k.startswith(("model.", "optim."))}
