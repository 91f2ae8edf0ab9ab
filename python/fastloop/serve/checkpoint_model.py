"""The fastloop.nn model a checkpoint holds: ``arch_of(model)`` is the JSON string saved beside
its parameters, ``model_from_arch`` builds a fresh model from it and ``load_model`` reads a
checkpoint directory or file (``python -m fastloop serve --model CKPT``).

    >>> ckpt.save(fl.nn.training_state(model, arch=arch_of(model)), step)
    >>> model = load_model("ckpts")
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from .. import nn
from ..checkpoint import Checkpointer, read_checkpoint

__all__ = ["arch_of", "model_from_arch", "load_model"]


def arch_of(model: Any) -> str:
    """The JSON string that describes `model`'s layers, to save beside its parameters.

    >>> ckpt.save(fl.nn.training_state(model, arch=arch_of(model)), step)
    """
    if isinstance(model, nn.Linear):
        model = nn.Sequential(nn.Linear(model.in_features, model.out_features, bias=model.has_bias))
    layers: list[list[Any]] = []
    for layer in model:
        if isinstance(layer, nn.Linear):
            layers.append(["Linear", layer.in_features, layer.out_features, layer.has_bias])
        else:
            layers.append([type(layer).__name__])
    return json.dumps({"dtype": np.dtype(model.dtype).name, "layers": layers})


def model_from_arch(arch: str) -> nn.Sequential:
    """A fresh Sequential built from an arch_of() string; ValueError naming what is wrong."""
    try:
        spec = json.loads(arch)
        kinds = {"Linear": lambda a, b, bias=True: nn.Linear(int(a), int(b), bias=bool(bias)),
                 "ReLU": nn.ReLU, "Flatten": nn.Flatten}
        layers = [kinds[entry[0]](*entry[1:]) for entry in spec["layers"]]
        return nn.Sequential(*layers, dtype=spec.get("dtype", "float32"))
    except (ValueError, KeyError, TypeError, IndexError) as error:
        raise ValueError(f"the checkpoint's arch {arch[:200]!r} is not a model description: {error}") from None


def _layers_arch(layers: str) -> str:
    sizes = [int(n) for n in layers.split(",")]
    if len(sizes) < 2:
        raise ValueError("--layers takes at least two sizes: in,out (e.g. 784,512,10)")
    spec: list[list[Any]] = []
    for a, b in zip(sizes, sizes[1:]):
        spec += [["Linear", a, b, True], ["ReLU"]]
    return json.dumps({"layers": spec[:-1]})


def load_model(path: str, layers: str | None = None) -> nn.Sequential:
    """The model a checkpoint directory (latest checkpoint) or checkpoint file holds."""
    state = Checkpointer(path).load() if os.path.isdir(path) else read_checkpoint(path)
    if layers is not None:
        arch = _layers_arch(layers)
    elif "arch" in state:
        arch = str(state["arch"])
    else:
        raise ValueError(f"{path} holds no 'arch' entry: save it with training_state(model, arch=arch_of(model)) "
                         "or pass --layers (e.g. 784,512,10)")
    model = model_from_arch(arch)
    nn.load_training_state(state, model)
    return model
