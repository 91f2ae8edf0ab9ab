"""fastloop.nn's optimizers: SGD, Adam and AdamW with torch's update rules (torch.optim), each
step run in C on the model's device; their state_dict() is torch's shape.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .. import _core
from .modules import Linear, Sequential

__all__ = ["Optimizer", "SGD", "Adam", "AdamW"]

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
