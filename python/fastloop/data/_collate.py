"""torch's default_collate with NumPy output, for the samples a Loader does not lay out in its
batch slots (strings, None, nested containers, arrays of varying shape), and the conversion of
batches and samples to tensors for output="torch".

The rules are DataLoader's: arrays, tensors and NumPy scalars are stacked (equal shapes, else
torch's RuntimeError), ints give int64 (float32 when floats are among them, as torch.tensor
infers), floats float64, bools bool, str and bytes stay a list (a tuple inside a tuple or list
sample, as default_collate returns them), mappings and sequences are collated per key and per
position (sequences of equal length, else torch's RuntimeError), namedtuples keep their type,
anything else raises torch's TypeError. Two differences, both fastloop's: a tuple stays a
tuple (default_collate makes it a list), and each error names the field and the sample index.
"""

from __future__ import annotations

import collections.abc
import copy
from typing import Any, Sequence

import numpy as np

from ._sample_codec import describe, what
from ._torch_interop import import_torch_for_output, is_tensor, tensor_as_array

NOT_COLLATABLE = "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
_STR_OR_OBJECT = "SaUO"  # the dtype kinds default_collate refuses to stack ([SaUO] in dtype.str)


def _where(path: tuple, indices: Sequence[int] | None, i: int) -> str:
    return f" ({describe(path)} of sample {indices[i]})" if indices is not None else f" ({describe(path)})"


def collate(batch: Sequence[Any], path: tuple = (), indices: Sequence[int] | None = None) -> Any:
    """default_collate(batch) with arrays for tensors; `path` and the samples' dataset
    `indices` name the field and sample in errors."""
    elem = batch[0]
    if isinstance(elem, np.ndarray) or is_tensor(elem):
        return _stack(batch, path, indices)
    if isinstance(elem, (np.bool_, np.number, np.object_)):
        return _numbers(batch, None, path, indices)
    if isinstance(elem, float):
        return _numbers(batch, np.float64, path, indices)
    if isinstance(elem, int):
        return _numbers(batch, None, path, indices)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        return _mapping(batch, path, indices)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # a namedtuple
        return type(elem)(*(collate(column, path + (k,), indices) for k, column in enumerate(zip(*batch))))
    if isinstance(elem, collections.abc.Sequence):
        return _sequence(batch, path, indices)
    raise TypeError(NOT_COLLATABLE.format(type(elem)) + _where(path, indices, 0))


def _as_array(value: Any, path: tuple, indices: Sequence[int] | None, i: int) -> np.ndarray:
    if is_tensor(value):
        return tensor_as_array(value, lambda: f"sample {indices[i] if indices is not None else i}'s "
                                              f"{describe(path)}")
    return np.asarray(value)


def _stack(batch: Sequence[Any], path: tuple, indices: Sequence[int] | None) -> np.ndarray:
    arrays = [_as_array(v, path, indices, i) for i, v in enumerate(batch)]
    first = arrays[0]
    if first.dtype.char in _STR_OR_OBJECT or first.dtype.kind in "OSUV":
        raise TypeError(NOT_COLLATABLE.format(first.dtype) + _where(path, indices, 0))
    for i, a in enumerate(arrays):
        if a.shape != first.shape:
            where = (f" ({describe(path)} of samples {indices[0]} and {indices[i]}" if indices is not None
                     else f" ({describe(path)}")
            raise RuntimeError(f"stack expects each tensor to be equal size, but got {list(first.shape)} at "
                               f"entry 0 and {list(a.shape)} at entry {i}{where}; a collate_fn can take "
                               f"samples of different shapes)")
    dtypes = {a.dtype for a in arrays}
    if len(dtypes) == 1:
        return np.stack(arrays)
    return np.stack(arrays, dtype=_promoted(dtypes), casting="unsafe")


_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def _promoted(dtypes: set) -> np.dtype:
    """torch.stack's dtype for tensors of these dtypes: the highest category's (bool < int <
    float < complex) promoted among themselves, so int64 with float32 gives float32 (NumPy's
    rule would give float64)."""
    top = max(_CATEGORY.get(d.kind, 4) for d in dtypes)
    return np.result_type(*[d for d in dtypes if _CATEGORY.get(d.kind, 4) == top])


def _numbers(batch: Sequence[Any], dtype: Any, path: tuple, indices: Sequence[int] | None) -> np.ndarray:
    def sample(i: int) -> Any:
        return indices[i] if indices is not None else i

    def refuse(cause: str) -> TypeError:
        for i, v in enumerate(batch):
            if not isinstance(v, (int, float, complex, np.bool_, np.number)):
                return TypeError(f"{describe(path)} of sample {sample(i)} is a {type(v).__name__}, where the batch's "
                                 f"first sample has a {type(batch[0]).__name__}: its values cannot form one tensor")
        return TypeError(f"{describe(path)}: the values cannot form one tensor ({cause})")

    try:
        out = np.array(batch, dtype=dtype)
    except OverflowError:
        out = np.array(batch, dtype=object)
    except (TypeError, ValueError) as e:
        raise refuse(str(e)) from None
    if out.dtype.hasobject and all(isinstance(v, int) for v in batch):  # beyond 64 bits, as torch refuses them
        i = next(i for i, v in enumerate(batch) if not -2**63 <= v < 2**64)
        raise ValueError(f"Overflow when unpacking long long ({describe(path)} of sample {sample(i)} does not fit "
                         f"in 64 bits)")
    if out.ndim != 1 or out.dtype.kind not in "biufc":
        raise refuse(f"they make an array of {out.dtype} and shape {out.shape}")
    if isinstance(batch[0], int) and not isinstance(batch[0], np.generic) and out.dtype.kind == "f":
        out = out.astype(np.float32)  # torch.tensor([1, 2.5]) infers the default float dtype
    return out


def _mapping(batch: Sequence[Any], path: tuple, indices: Sequence[int] | None) -> Any:
    elem = batch[0]
    out = {}
    for key in elem:
        column = []
        for i, d in enumerate(batch):
            try:
                column.append(d[key])
            except KeyError:
                raise KeyError(f"{describe(path + (key,))} is missing from sample "
                               f"{indices[i] if indices is not None else i}, which the batch's first sample "
                               f"has") from None
        out[key] = collate(column, path + (key,), indices)
    if type(elem) is dict:
        return out
    try:  # the mapping's own type, as default_collate keeps it
        if isinstance(elem, collections.abc.MutableMapping):
            clone = copy.copy(elem)
            clone.update(out)
            return clone
        return type(elem)(out)
    except TypeError:
        return out


def _sequence(batch: Sequence[Any], path: tuple, indices: Sequence[int] | None) -> Any:
    size = len(batch[0])
    for i, s in enumerate(batch):
        if len(s) != size:
            where = (f"{describe(path)} has {len(s)} elements in sample {indices[i]}, {size} in sample "
                     f"{indices[0]}" if indices is not None else f"{describe(path)}")
            raise RuntimeError(f"each element in list of batch should be of equal size ({where}; a collate_fn "
                               f"can take samples of different structure)")
    columns = [collate(column, path + (k,), indices) for k, column in enumerate(zip(*batch))]
    elem = batch[0]
    if isinstance(elem, tuple):
        return tuple(columns)
    if type(elem) is list:
        return columns
    try:
        if isinstance(elem, collections.abc.MutableSequence):
            clone = copy.copy(elem)
            for k, column in enumerate(columns):
                clone[k] = column
            return clone
        return type(elem)(columns)
    except TypeError:
        return columns


def as_arrays(value: Any, path: tuple = ()) -> Any:
    """A sample with its tensors as NumPy views (containers rebuilt as they were), as a worker
    sends them, so samples look alike whatever the mode."""
    if is_tensor(value):
        return tensor_as_array(value, lambda: what(path))
    kind = type(value)
    if kind is tuple or kind is list:
        return kind(as_arrays(v, path + (k,)) for k, v in enumerate(value))
    if kind is dict:
        return {k: as_arrays(v, path + (k,)) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(kind, "_fields"):
        return kind(*(as_arrays(v, path + (k,)) for k, v in enumerate(value)))
    return value


def to_torch(value: Any, pin: bool = False) -> Any:
    """Arrays (but of strings and objects) and NumPy scalars as tensors, recursively through
    dicts, lists and tuples, as DataLoader's default_convert; the rest unchanged."""
    torch = import_torch_for_output()
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "OSUV":
            return value
        tensor = torch.from_numpy(value) if value.flags.writeable else torch.as_tensor(value.copy())
        return tensor.pin_memory() if pin else tensor
    if isinstance(value, (np.bool_, np.number)):
        return torch.as_tensor(value)
    kind = type(value)
    if kind is tuple or kind is list:
        return kind(to_torch(v, pin) for v in value)
    if kind is dict:
        return {k: to_torch(v, pin) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(kind, "_fields"):
        return kind(*(to_torch(v, pin) for v in value))
    return value
