"""A model's declared inputs: ``Input(dtype, shape)`` per row, one or several (named), checked
at submit so that a wrong dtype, shape or count fails in the caller's thread (a 400 over
HTTP) with a message naming the input, never inside the model.

    >>> spec = Spec(Input("float32", (3, 32, 32)))
    >>> x = spec.check(image_as_nested_lists)           # float32 (3, 32, 32), a private copy
    >>> spec = Spec({"ids": Input("int64", (None,)), "mask": Input("bool", (None,))})
    >>> row = spec.check({"ids": [1, 2, 3], "mask": [1, 1, 0]})   # one structured row
    >>> rows, n = spec.check_rows({"ids": [[1, 2], [3, 4]], "mask": [[1, 1], [1, 0]]})   # n == 2

Several inputs travel as one NumPy structured row (a field per input, in declared order): it
stacks into a batch, sits in any store as one ``.npy`` and is read without pickle. Lists
(JSON) are cast to the declared dtype: integers and floats only, and no silent truncation
(1.5 for an int input, 300 for uint8 are refused). Arrays (and torch tensors) must already
have the declared dtype.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["Input", "Spec", "spec_for", "is_torch_module"]

_NUMERIC_KINDS = "biufc"


def _as_numpy_dtype(dtype: Any) -> np.dtype:
    """A NumPy dtype from a NumPy dtype-like or a torch dtype (torch.float32 -> float32)."""
    if type(dtype).__module__ == "torch":  # a torch.dtype: named like NumPy's, "torch." aside
        dtype = str(dtype).rsplit(".", 1)[-1]
        if dtype == "bfloat16":
            raise TypeError("Input dtype bfloat16 has no NumPy equivalent: declare float32 and convert "
                            "inside the model (x.to(torch.bfloat16))")
    try:
        numpy_dtype = np.dtype(dtype)
    except TypeError as error:
        raise TypeError(f"Input dtype {dtype!r} is not a dtype: {error}") from None
    if numpy_dtype.kind not in _NUMERIC_KINDS or numpy_dtype.shape or numpy_dtype.names:
        raise TypeError(f"Input dtype must be a plain numeric dtype (float32, int64, bool, ...), not {numpy_dtype}")
    return numpy_dtype


class Input:
    """One input of a model, per row (one job): its dtype (NumPy's or torch's) and shape,
    None on an axis of any length (e.g. a sequence); ``name`` for a model of several inputs.

    >>> Input(torch.float32, (3, 224, 224))
    >>> [Input("int64", (None,), name="ids"), Input("bool", (None,), name="mask")]
    """

    def __init__(self, dtype: Any, shape: Iterable[int | None] = (), name: str | None = None) -> None:
        self.dtype = _as_numpy_dtype(dtype)
        self.shape = tuple(shape)
        for size in self.shape:
            if size is not None and (not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 0):
                raise ValueError(f"Input shape {self.shape}: each size must be an int >= 0 or None (any)")
        if name is not None and not (isinstance(name, str) and name):
            raise TypeError(f"Input name must be a non-empty str, not {name!r}")
        self.name = name

    def shape_text(self) -> str:
        """The shape as messages show it: (3, any) for (3, None)."""
        sizes = ", ".join("any" if size is None else str(size) for size in self.shape)
        return f"({sizes}{',' if len(self.shape) == 1 else ''})"

    def describe(self) -> str:
        return f"{self.dtype.name} {self.shape_text()}"

    def __repr__(self) -> str:
        name = "" if self.name is None else f", name={self.name!r}"
        return f"Input({self.dtype.name!r}, {self.shape}{name})"

    def check(self, value: Any, label: str, rows: bool = False) -> np.ndarray:
        """`value` as a private C-contiguous array of this dtype and shape (with `rows`, also
        several rows along a leading axis); TypeError (dtype, not numbers) or ValueError
        (shape, values the dtype cannot hold) naming `label`."""
        array = _cast_list(value, self.dtype, label) if _untyped(value) else _typed(value, self.dtype, label)
        shape = array.shape[1:] if rows and array.ndim == len(self.shape) + 1 else array.shape
        if len(shape) != len(self.shape) or any(w is not None and w != g for w, g in zip(self.shape, shape)):
            several = " (or several along a leading axis)" if rows else ""
            raise ValueError(f"{label}: expected shape {self.shape_text()} per row{several}, "
                             f"got {tuple(array.shape)}")
        return np.array(array, order="C", copy=True)

    def rows_of(self, array: np.ndarray) -> int | None:
        """None when `array` (as check() returned it) is one row, else its number of rows."""
        return array.shape[0] if array.ndim == len(self.shape) + 1 else None


def _untyped(value: Any) -> bool:
    return isinstance(value, (list, tuple, int, float, bool)) and not isinstance(value, np.generic)


def _typed(value: Any, dtype: np.dtype, label: str) -> np.ndarray:
    if type(value).__module__.startswith("torch") and hasattr(value, "numpy"):  # a tensor
        try:
            value = value.detach().cpu().numpy()
        except (TypeError, RuntimeError) as error:  # bfloat16 and the like
            raise TypeError(f"{label}: expected dtype {dtype.name}, got a tensor NumPy cannot hold: {error}") from None
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(f"{label}: expected {dtype.name} numbers (an array, a tensor or a nested list), "
                        f"not {type(value).__name__}")
    array = np.asarray(value)
    if array.dtype != dtype:
        raise TypeError(f"{label}: expected dtype {dtype.name}, got {array.dtype}: "
                        f"convert with x.astype(np.{dtype.name})")
    return array


def _cast_list(value: Any, dtype: np.dtype, label: str) -> np.ndarray:
    """A nested list (JSON's numbers) cast to `dtype`, refusing what the cast would change."""
    try:
        array = np.array(value)
    except (TypeError, ValueError) as error:  # ragged lists
        raise TypeError(f"{label}: cannot be read as an array of numbers: {error}") from None
    if array.dtype.kind not in _NUMERIC_KINDS:
        first = array.flat[0] if array.size else None
        first = first.item() if isinstance(first, np.generic) else first
        kind = "object" if array.dtype.kind == "O" else array.dtype.name
        raise TypeError(f"{label}: expected {dtype.name} numbers, got {kind} values (e.g. {first!r})")
    if array.size and dtype.kind in "biu" and array.dtype.kind in "fc":
        if not np.all(np.isfinite(array)) or np.any(array != np.round(array.real)):
            raise ValueError(f"{label}: expected {dtype.name}, got numbers that are not integers")
    if array.size and dtype.kind in "iu" and array.dtype.kind in "biuf":
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise ValueError(f"{label}: values from {array.min()} to {array.max()} do not fit {dtype.name}")
    if array.size and dtype.kind == "b" and not np.isin(array, (0, 1)).all():
        raise ValueError(f"{label}: expected bool (true/false or 0/1), got other numbers")
    if array.dtype.kind == "c" and dtype.kind != "c":
        raise TypeError(f"{label}: expected {dtype.name}, got complex numbers")
    with np.errstate(over="ignore"):  # an overflow is refused just below, naming the input
        cast = array.astype(dtype)
    if dtype.kind in "fc" and array.size and np.any(np.isinf(cast) & np.isfinite(array)):
        raise ValueError(f"{label}: values up to {np.abs(array).max()} overflow {dtype.name}")
    return cast


class Spec:
    """A model's inputs: one Input, or several (a dict name -> Input, or a sequence of named
    Inputs). ``names``: the inputs in the order the model takes them; ``dtype``: the dtype of
    a single input (None for several)."""

    def __init__(self, inputs: Input | Mapping[str, Input] | Sequence[Input]) -> None:
        if isinstance(inputs, Input):
            self.inputs, self.single = [inputs], True
            self.names = [inputs.name or "input"]
        else:
            self.inputs, self.names = _named(inputs)
            self.single = False
        self.dtype = self.inputs[0].dtype if self.single else None

    def __repr__(self) -> str:
        if self.single:
            return f"Spec({self.inputs[0]!r})"
        return "Spec({" + ", ".join(f"{n!r}: {i!r}" for n, i in zip(self.names, self.inputs)) + "})"

    def describe(self) -> str:
        return ", ".join(f"{n!r}: {i.describe()}" for n, i in zip(self.names, self.inputs))

    def check(self, value: Any) -> np.ndarray:
        """One job's input, checked: an array (one input) or a structured row (several)."""
        array, rows = self.check_rows(value)
        if rows is not None:
            raise ValueError(f"inputs: {rows} rows where one is expected")
        return array

    def check_rows(self, value: Any) -> tuple[np.ndarray, int | None]:
        """(array, rows): one job's input checked, as one row (rows None) or several along a
        leading axis (rows n): an array (one input) or structured rows (several inputs)."""
        if self.single:
            array = self.inputs[0].check(value, f"input {self.names[0]!r}", rows=True)
            return array, _no_empty(self.inputs[0].rows_of(array), array.shape)
        parts = self._parts(value)
        arrays = [spec.check(part, f"input {name!r}", rows=True) for name, spec, part in zip(self.names, self.inputs, parts)]
        counts = {spec.rows_of(array) for spec, array in zip(self.inputs, arrays)}
        if len(counts) > 1:
            described = ", ".join(f"{name!r}: {a.shape}" for name, a in zip(self.names, arrays))
            raise ValueError(f"inputs: every input needs the same number of rows (a leading axis) or none; got {described}")
        rows = counts.pop()
        lead = () if rows is None else (rows,)
        out = np.zeros(lead, dtype=[(name, a.dtype, a.shape[len(lead):]) for name, a in zip(self.names, arrays)])
        for name, array in zip(self.names, arrays):
            out[name] = array
        return out, _no_empty(rows, out.shape)

    def _parts(self, value: Any) -> list[Any]:
        """The per-input values of a dict, a sequence in declared order or a structured row."""
        if isinstance(value, np.ndarray) and value.dtype.names is not None:
            if value.ndim > 1:
                raise ValueError(f"inputs: expected one structured row or a 1-d array of them, got shape {value.shape}")
            value = {name: value[name] for name in value.dtype.names}
        if isinstance(value, Mapping):
            missing = [n for n in self.names if n not in value]
            unknown = [str(k) for k in value if k not in self.names]
            if missing or unknown:
                raise ValueError(f"inputs: the model takes {self.describe()}"
                                 + (f"; missing {missing}" if missing else "") + (f"; unknown {unknown}" if unknown else ""))
            return [value[n] for n in self.names]
        if isinstance(value, (list, tuple)):
            if len(value) != len(self.names):
                raise ValueError(f"inputs: the model takes {len(self.names)} inputs ({self.describe()}), "
                                 f"got {len(value)}")
            return list(value)
        raise TypeError(f"inputs: the model takes {len(self.names)} inputs ({self.describe()}): give a dict "
                        f"name -> value or a tuple in that order, not {type(value).__name__}")

    def split(self, batch: np.ndarray) -> list[np.ndarray]:
        """A stacked batch as the model's arguments: contiguous arrays, one per input."""
        if self.single:
            return [batch]
        # a copy, not ascontiguousarray: that keeps a size-1 axis's record-sized stride, which torch refuses
        return [batch[name].copy() for name in self.names]


def _no_empty(rows: int | None, shape: tuple[int, ...]) -> int | None:
    if rows == 0:
        raise ValueError(f"inputs: shape {shape} holds no rows")
    return rows


def _named(inputs: Any) -> tuple[list[Input], list[str]]:
    if isinstance(inputs, Mapping):
        items = list(inputs.items())
        for key, spec in items:
            if not isinstance(key, str) or not isinstance(spec, Input):
                raise TypeError(f"inputs: a dict must map names (str) to Input, not {key!r}: {spec!r}")
    elif isinstance(inputs, (list, tuple)) and all(isinstance(spec, Input) for spec in inputs):
        items = [(spec.name or f"input{i}", spec) for i, spec in enumerate(inputs)]
    else:
        raise TypeError(f"inputs must be an Input, a dict name -> Input or a list of Inputs, not {inputs!r}")
    if not items:
        raise ValueError("inputs: declare at least one Input")
    names = [name for name, _ in items]
    if len(set(names)) != len(names):
        raise ValueError(f"inputs: names must differ, got {names}")
    return [spec for _, spec in items], names


def is_torch_module(model: Any) -> bool:
    """True for a torch.nn.Module (TorchScript included), without importing torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(model, torch.nn.Module)


def spec_for(model: Any, inputs: Any) -> Any:
    """The input check of `model`: the declared `inputs` (a Spec), else what InputSpec infers
    (fastloop.nn's in_features and dtype, any numbers for a plain callable)."""
    from .inputs import InputSpec

    if inputs is not None:
        return inputs if isinstance(inputs, Spec) else Spec(inputs)
    if is_torch_module(model):
        raise TypeError(f"a torch model ({type(model).__name__}) needs its inputs declared: "
                        "InferenceService(model, inputs=fastloop.serve.Input(DTYPE, SHAPE)), the dtype and "
                        "shape of one row as forward() takes it without the batch axis")
    return InputSpec.for_model(model)
