"""What ``python -m fastloop serve --model`` serves: a fastloop.nn checkpoint (a
Checkpointer directory or a checkpoint file), a factory in the user's code (``module:function``), a
TorchScript file (``torch.jit.save``) or a ``torch.export`` program (``.pt2``). Nothing is
unpickled: a ``torch.save`` file (a state_dict, a pickled module) is refused with the way
to serve it (a factory that builds the model and loads the state dict).

    >>> model, inputs = load_source("mypkg.models:build")      # build() -> model or (model, inputs)
    >>> model, inputs = load_source("model.ts", [parse_input("image=float32:3,32,32")])

``--input`` reads ``[NAME=]DTYPE:SHAPE``: SHAPE is comma-separated sizes, ``*`` for an axis
of any length, empty for one number per row (``float32:784``, ``ids=int64:*``, ``t=float32:``).
"""

from __future__ import annotations

import importlib
import os
import sys
import zipfile
from typing import Any, Callable

from .spec import Input, Spec

__all__ = ["load_source", "parse_input", "inputs_of"]

_TORCH_FILES = (".pt", ".pth", ".ts", ".pt2", ".torchscript")


def parse_input(text: str) -> Input:
    """An Input from ``[NAME=]DTYPE:SHAPE``; ValueError saying the form."""
    name, _, rest = text.rpartition("=") if "=" in text else ("", "", text)
    dtype, colon, shape = rest.partition(":")
    if not colon or not dtype:
        raise ValueError(f"--input {text!r}: write [NAME=]DTYPE:SHAPE, e.g. float32:3,32,32 or ids=int64:*")
    try:
        sizes = [None if s.strip() in ("*", "None") else int(s) for s in shape.split(",") if s.strip()]
        return Input(dtype, sizes, name=name or None)
    except (TypeError, ValueError) as error:
        raise ValueError(f"--input {text!r}: {error}") from None


def inputs_of(declared: list[Input]) -> Any:
    """The --input options as an InferenceService's inputs (None when none were given)."""
    if not declared:
        return None
    return declared[0] if len(declared) == 1 else declared


def _factory(target: str) -> Callable[[], Any]:
    module_name, _, attr = target.partition(":")
    if "" not in sys.path and os.getcwd() not in sys.path:  # as `python -m` does: the user's modules
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"--model {target}: cannot import {module_name!r}: {error}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"--model {target}: module {module_name!r} has no {attr!r}") from None
    if not callable(obj):
        raise ValueError(f"--model {target}: {attr!r} is a {type(obj).__name__}, not a function that builds the model")
    return obj


def _from_factory(target: str) -> tuple[Any, Any]:
    built = _factory(target)()
    if isinstance(built, tuple):
        if len(built) != 2:
            raise ValueError(f"--model {target}: the factory must return the model or (model, inputs), "
                             f"not a tuple of {len(built)}")
        return built[0], built[1]
    return built, None


def _pickled_archive(path: str) -> bool:
    """A torch.save zip (its objects in data.pkl), told apart without unpickling anything."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        return any(name.endswith("data.pkl") for name in archive.namelist())


def _torch_file(path: str) -> Any:
    try:
        import torch
    except ImportError:
        raise ValueError(f"{path} is a torch file: serving it needs torch (pip install torch)") from None
    if path.endswith(".pt2"):
        return torch.export.load(path).module()
    try:
        return torch.jit.load(path, map_location="cpu")
    except (RuntimeError, ValueError) as error:
        if _pickled_archive(path):
            raise ValueError(f"{path} is a torch.save file (a state_dict or a pickled module), not TorchScript: "
                             "fastloop does not unpickle it. Serve it with --model module:factory, a function "
                             "that builds the model and loads it (model.load_state_dict(torch.load(...))), "
                             "or save the model with torch.jit.save(torch.jit.script(model), ...)") from None
        raise ValueError(f"{path} is not a TorchScript file: {error}") from None


def _exported(model: Any) -> bool:
    """A torch.export program's module: its mode is baked into the graph (eval() refuses)."""
    fx = sys.modules.get("torch.fx")
    return fx is not None and isinstance(model, fx.GraphModule)


def load_source(target: str, declared: list[Input] | None = None, layers: str | None = None) -> tuple[Any, Any]:
    """(model, inputs) for --model `target`; inputs from --input (`declared`) win over a
    factory's. ValueError/OSError naming what is wrong."""
    declared_inputs = inputs_of(declared or [])
    if not os.path.exists(target) and ":" in target:
        model, inputs = _from_factory(target)
        inputs = declared_inputs if declared_inputs is not None else inputs
    elif target.endswith(_TORCH_FILES) and os.path.isfile(target):
        model, inputs = _torch_file(target), declared_inputs
    else:
        from .checkpoint_model import load_model
        return load_model(target, layers), declared_inputs
    if getattr(model, "training", False) and not _exported(model):
        model.eval()  # a server only infers: dropout off, batch norm on its running statistics
    if inputs is not None and not isinstance(inputs, (Input, Spec, dict, list, tuple)):
        raise ValueError(f"--model {target}: the inputs must be an Input, a dict or list of Inputs, not {inputs!r}")
    return model, inputs
