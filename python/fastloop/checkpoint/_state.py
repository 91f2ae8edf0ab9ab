"""Nested training state <-> a flat dict of tensors plus a JSON manifest, with no pickle.

A state is any nesting of dicts (keys: str, int, float, bool or None), lists and tuples whose
leaves are NumPy arrays, torch tensors (any dtype torch has), NumPy scalars, Python numbers,
strings, bytes, bools and None. flatten() returns the tensors to store, each under its dotted
path (``model.fc.weight``) with its safetensors dtype code, and a manifest (JSON text)
describing the structure and types; unflatten() rebuilds the same nested types from them.
Tensors NumPy has no dtype for (bfloat16, float8) travel as their raw bits in an unsigned
integer array of the same width, under their own safetensors code (BF16, F8_E4M3); a dtype
safetensors lacks (complex128, a NumPy string or record) travels as bytes (U8) with its
dtype and shape in the manifest. Floats are kept as float.hex() text, so they round-trip
bit-exactly.
"""

from __future__ import annotations

import json
import sys
from collections import OrderedDict
from typing import Any, Callable, NamedTuple

import numpy as np

from ._dtypes import CODE_OF_NUMPY, CODE_OF_TORCH_RAW

MANIFEST = "__fastloop_state__"  # the .npz member holding the manifest (older checkpoints)
_NAME_MAX = 200  # member names longer than this are replaced by a short one
_RAW_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}

def st_code(dtype: np.dtype) -> str | None:
    """The safetensors code of a native-order NumPy dtype, or None when it has none."""
    return CODE_OF_NUMPY.get(dtype.kind + str(dtype.itemsize)) if dtype.isnative and dtype.fields is None else None


def _torch() -> Any:
    """torch when it is importable (already imported or not), else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")  # a tensor exists only if torch was imported
    return torch is not None and isinstance(value, torch.Tensor)


def _fits(name: str) -> bool:
    """Whether a dotted path can be a tensor's name: UTF-8 of at most _NAME_MAX bytes, no NUL."""
    try:
        return len(name.encode()) <= _NAME_MAX and "\0" not in name
    except UnicodeEncodeError:  # a lone surrogate
        return False


def _where(path: tuple) -> str:
    return "state" + "".join(f"[{key!r}]" for key in path)


class _Flattener:
    """Walks a state once, collecting arrays under unique member names."""

    def __init__(self, cuda_copy: Callable[[Any, tuple], Any] | None) -> None:
        self.arrays: dict[str, tuple[np.ndarray, str]] = {}
        self.cuda_copy = cuda_copy
        self.has_tensors = False

    def member(self, path: tuple, array: np.ndarray, node: dict, code: str | None = None) -> dict:
        """Stores `array` under the dotted path (or a short made-up name when that is taken or
        too long) with its safetensors code; a dtype safetensors lacks goes as bytes, its
        dtype and shape in node["raw"]. Returns node with its member name in "k"."""
        name = ".".join(str(key) for key in path) or "value"
        if not _fits(name) or name in self.arrays or name == "__metadata__":
            name = f"_{len(self.arrays)}"
            while name in self.arrays:
                name += "_"
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)  # a copy only for a non-contiguous view
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        code = code or st_code(array.dtype)
        if code is None:
            node["raw"] = [array.dtype.descr if array.dtype.fields else array.dtype.str, list(array.shape)]
            array, code = array.reshape(-1).view(np.uint8), "U8"
        self.arrays[name] = (array, code)
        node["k"] = name
        return node

    def node(self, value: Any, path: tuple) -> dict:
        if isinstance(value, np.generic):  # before float: np.float64 is a float subclass
            return self.member(path, self.array(np.asarray(value), path), {"t": "npscalar"})
        if value is None or isinstance(value, (bool, str)):
            return {"t": "const", "v": value}
        if isinstance(value, int):
            return {"t": "int", "v": str(value)}  # text: JSON readers may round big ints
        if isinstance(value, float):
            return {"t": "float", "v": value.hex()}
        if isinstance(value, bytes):
            return self.member(path, np.frombuffer(value, np.uint8), {"t": "bytes"})
        if isinstance(value, np.ndarray):
            return self.member(path, self.array(value, path), {"t": "ndarray"})
        if _is_tensor(value):
            return self.tensor(value, path)
        if isinstance(value, dict):
            return self.mapping(value, path)
        if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
            return {"t": type(value).__name__,
                    "v": [self.node(item, path + (i,)) for i, item in enumerate(value)]}
        raise TypeError(f"{_where(path)} is a {type(value).__module__}.{type(value).__qualname__}; "
                        "checkpoints hold dicts, lists and tuples of tensors, arrays, numbers, "
                        "strings, bytes, bools and None (nothing is pickled)")

    def array(self, array: np.ndarray, path: tuple) -> np.ndarray:
        if array.dtype.hasobject:
            raise TypeError(f"{_where(path)} is an array of Python objects; checkpoints hold "
                            "arrays of numbers, bools and strings (nothing is pickled)")
        return array

    def mapping(self, value: dict, path: tuple) -> dict:
        items = []
        for key, item in value.items():
            if not (key is None or isinstance(key, (str, int, float))):
                raise TypeError(f"{_where(path)} has a key of type {type(key).__name__} ({key!r}); "
                                "keys must be str, int, float, bool or None")
            items.append([self.node(key, ()), self.node(item, path + (key,))])
        node = {"t": "odict" if isinstance(value, OrderedDict) else "dict", "v": items}
        metadata = getattr(value, "_metadata", None)  # nn.Module.state_dict()'s version info
        if isinstance(metadata, dict):
            node["meta"] = self.node(dict(metadata), path + ("_metadata",))
        return node

    def tensor(self, tensor: Any, path: tuple) -> dict:
        torch = _torch()
        if tensor.layout != torch.strided or tensor.is_quantized:
            raise TypeError(f"{_where(path)} is a {tensor.layout} tensor; checkpoints hold dense "
                            "tensors (call .to_dense() first)")
        node = {"t": "tensor", "dtype": str(tensor.dtype).replace("torch.", ""),
                "device": str(tensor.device)}
        if tensor.requires_grad:
            node["grad"] = True
        tensor = tensor.detach()
        if tensor.device.type != "cpu":
            tensor = self.cuda_copy(tensor, path) if self.cuda_copy else tensor.cpu()
        tensor = tensor.resolve_conj().resolve_neg()
        self.has_tensors = True
        array = tensor_to_numpy(tensor)
        code = CODE_OF_TORCH_RAW.get(node["dtype"])
        if code is None and array.dtype.kind == "u" and node["dtype"] not in ("uint8", "uint16", "uint32", "uint64"):
            array = array.reshape(-1).view(np.uint8)  # raw bits of a dtype safetensors lacks: bytes
            node["raw"] = [None, list(tensor.shape)]
            code = "U8"
        return self.member(path, array, node, code)


def tensor_to_numpy(tensor: Any) -> np.ndarray:
    """A NumPy view of a CPU tensor; dtypes NumPy lacks (bfloat16, float8, ...) as their raw
    bits in an unsigned integer array of the same width."""
    torch = _torch()
    tensor = tensor.contiguous()
    try:
        return tensor.numpy()
    except TypeError:
        pass  # no NumPy dtype for it: view the bits
    width = tensor.element_size()
    signed = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[width]
    if tensor.dim() == 0:
        tensor = tensor.reshape(1)
        return tensor.view(signed).numpy().view(_RAW_BITS[width]).reshape(())
    return tensor.view(signed).numpy().view(_RAW_BITS[width])


class Flat(NamedTuple):
    """What flatten() gives: (array, safetensors code) by member name, the manifest, and
    whether the state held torch tensors."""

    arrays: dict[str, tuple[np.ndarray, str]]
    manifest: str
    has_tensors: bool


def flatten(state: Any, cuda_copy: Callable[[Any, tuple], Any] | None = None) -> Flat:
    """The tensors and manifest of `state`; TypeError names the path of what cannot be
    stored. `cuda_copy(tensor, path)` returns a CPU copy of a device tensor."""
    flattener = _Flattener(cuda_copy)
    root = flattener.node(state, ())
    manifest = json.dumps({"version": 1, "root": root}, separators=(",", ":"))
    return Flat(flattener.arrays, manifest, flattener.has_tensors)


class _Builder:
    """Rebuilds a state from its manifest and the arrays read back."""

    def __init__(self, arrays: Any, map_location: Any) -> None:
        self.arrays = arrays
        self.map_location = map_location

    def node(self, node: dict) -> Any:
        kind = node["t"]
        if kind == "const":
            return node["v"]
        if kind == "int":
            return int(node["v"])
        if kind == "float":
            return float.fromhex(node["v"])
        if kind == "bytes":
            return self.arrays[node["k"]].tobytes()
        if kind == "npscalar":
            return self.array(node)[()]
        if kind == "ndarray":
            return self.array(node)
        if kind == "tensor":
            return self.tensor(node)
        if kind in ("list", "tuple"):
            items = [self.node(item) for item in node["v"]]
            return items if kind == "list" else tuple(items)
        if kind in ("dict", "odict"):
            result = (OrderedDict if kind == "odict" else dict)(
                (self.node(key), self.node(value)) for key, value in node["v"])
            if "meta" in node:
                result._metadata = self.node(node["meta"])  # type: ignore[attr-defined]
            return result
        raise ValueError(f"unknown node type {kind!r} in the checkpoint's manifest")

    def array(self, node: dict) -> np.ndarray:
        """The member's array; one stored as bytes (node["raw"]) viewed as its dtype and shape."""
        array = self.arrays[node["k"]]
        if "raw" not in node or node["raw"][0] is None:
            return array
        descr, shape = node["raw"]
        dtype = np.dtype([tuple(field) for field in descr] if isinstance(descr, list) else descr)
        return array.view(dtype).reshape(shape)

    def tensor(self, node: dict) -> Any:
        array = self.array(node)
        torch = _torch()  # imported only when the state holds tensors
        dtype_name = node["dtype"]
        if torch is None:  # NumPy only: bfloat16 as float32 values (exact); others as stored
            if dtype_name == "bfloat16":
                return (array.astype(np.uint32) << 16).view(np.float32)
            return array
        dtype = getattr(torch, dtype_name)
        if "raw" in node and node["raw"][0] is None:  # bytes of a dtype NumPy lacks
            tensor = torch.from_numpy(array.reshape(-1)).view(dtype).reshape(node["raw"][1])
        elif array.dtype in (np.uint16, np.uint32, np.uint64) and dtype not in (torch.uint16, torch.uint32, torch.uint64):
            signed = array.view(array.dtype.str.replace("u", "i"))
            tensor = torch.from_numpy(signed.reshape(-1) if signed.ndim == 0 else signed)
            tensor = tensor.view(dtype).reshape(array.shape)
        elif array.dtype == np.uint8 and dtype != torch.uint8:
            flat = torch.from_numpy(array.reshape(-1) if array.ndim == 0 else array)
            tensor = flat.view(dtype).reshape(array.shape)
        else:
            tensor = torch.from_numpy(array)
        tensor = self.place(tensor, node["device"])
        if node.get("grad"):
            tensor.requires_grad_(True)
        return tensor

    def place(self, tensor: Any, device: str) -> Any:
        location = self.map_location
        if callable(location):
            return location(tensor, device)
        if isinstance(location, dict):
            location = location.get(device, device if device == "cpu" else None)
        if location is None:
            location = device
        return tensor if str(location) == "cpu" else tensor.to(location)


def unflatten(arrays: Any, manifest: str, map_location: Any = None) -> Any:
    """The state that flatten() described, from `arrays` (a mapping of member names)."""
    document = json.loads(manifest)
    if document.get("version") != 1:
        raise ValueError(f"checkpoint manifest version {document.get('version')!r} is not supported")
    return _Builder(arrays, map_location).node(document["root"])
