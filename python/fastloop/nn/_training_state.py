"""A model and its optimizer as one flat dict of arrays (what a fastloop.Checkpointer saves),
and back.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .modules import Linear, Module
from .optim import Optimizer

__all__ = ["training_state", "load_training_state"]

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
