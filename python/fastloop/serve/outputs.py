"""A model's outputs as one array per job: a tensor or array stays one; a dict of them (or a
tuple) becomes a NumPy structured array, a field per key (``"0"``, ``"1"``, ... for a tuple),
so that every store keeps a job's result as one ``.npy`` and a batch splits into rows as
before. ``unpack`` turns a row back into what the model returned (dict, tuple or array).

    >>> rows = pack({"logits": l, "embedding": e}, n=32)   # structured (32,)
    >>> unpack(rows[0])                                     # {"logits": ..., "embedding": ...}
    >>> as_json(rows[0])                                    # {"dtype": {...}, "shape": {...}, "result": {...}}
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["pack", "unpack", "as_json", "from_json"]


def _plain(value: Any) -> np.ndarray:
    if hasattr(value, "to_numpy"):  # a fastloop.cuda.DeviceArray from a model on a GPU
        value = value.to_numpy()
    return np.asarray(value)


def pack(out: Any, n: int, to_numpy: Callable[[Any], np.ndarray] = _plain) -> np.ndarray:
    """A model's output for a batch of `n` as one array of n rows; ValueError naming the
    output whose rows do not match."""
    if isinstance(out, dict) or isinstance(out, tuple):
        items = list(out.items()) if isinstance(out, dict) else [(str(i), v) for i, v in enumerate(out)]
        if not items:
            raise ValueError("the model returned an empty dict or tuple")
        for key, _ in items:
            if not isinstance(key, str):
                raise TypeError(f"the model returned a dict with key {key!r}: output keys must be str")
        arrays = [(key, to_numpy(value)) for key, value in items]
        for key, array in arrays:
            if array.ndim == 0 or array.shape[0] != n:
                raise ValueError(f"the model's output {key!r} has shape {array.shape} for a batch of {n}: "
                                 "expected one row per input")
            if array.dtype.kind not in "biufc":
                raise TypeError(f"the model's output {key!r} has dtype {array.dtype}: outputs must be numbers")
        rows = np.empty(n, dtype=[(key, a.dtype, a.shape[1:]) for key, a in arrays])
        for key, array in arrays:
            rows[key] = array
        return rows
    array = to_numpy(out)
    if array.ndim == 0 or array.shape[0] != n:
        raise ValueError(f"the model returned shape {array.shape} for a batch of {n}: expected one row per input")
    return array


def _is_tuple(names: tuple[str, ...]) -> bool:
    return names == tuple(str(i) for i in range(len(names)))


def unpack(row: np.ndarray) -> Any:
    """One job's result as the model gave it: a dict of arrays (a tuple when the keys are
    "0", "1", ...), or the array itself."""
    names = row.dtype.names
    if names is None:
        return row
    values = [np.array(row[name]) for name in names]
    return tuple(values) if _is_tuple(names) else dict(zip(names, values))


def json_safe(array: np.ndarray) -> Any:
    """`array` as nested lists for a JSON body: NaN and +-inf become null, since strict JSON
    has no token for them (Python's bare NaN is refused by other parsers)."""
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        return np.where(np.isfinite(array), array, None).tolist()
    return array.tolist()


def as_json(row: np.ndarray, failed: Sequence[int] = ()) -> dict[str, Any]:
    """The "dtype", "shape" and "result" of a result's JSON answer: per key for a dict
    (lists for a tuple); NaN and +-inf as null. `failed`: rows of a job of several whose
    entry is null (they failed; their row in `row` is a placeholder)."""
    value = unpack(row)
    if isinstance(value, np.ndarray):
        return {"dtype": value.dtype.name, "shape": list(value.shape), "result": _rows_safe(value, failed)}
    if isinstance(value, tuple):
        return {"dtype": [v.dtype.name for v in value], "shape": [list(v.shape) for v in value],
                "result": [_rows_safe(v, failed) for v in value]}
    return {"dtype": {k: v.dtype.name for k, v in value.items()}, "shape": {k: list(v.shape) for k, v in value.items()},
            "result": {k: _rows_safe(v, failed) for k, v in value.items()}}


def _rows_safe(array: np.ndarray, failed: Sequence[int]) -> Any:
    out = json_safe(array)
    for i in failed:
        out[i] = None
    return out


def from_json(body: dict[str, Any]) -> Any:
    """What as_json() wrote, read back: an array, a tuple or a dict of arrays."""
    result, dtype = body["result"], body.get("dtype")
    if isinstance(dtype, dict):
        return {k: np.asarray(result[k], dtype=dtype[k]) for k in dtype}
    if isinstance(dtype, list):
        return tuple(np.asarray(r, dtype=d) for r, d in zip(result, dtype))
    return np.asarray(result, dtype=dtype)
