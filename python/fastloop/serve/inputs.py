"""Checking a job's input at submit, so a bad one fails in the caller's thread with a clear
message instead of inside a batch.

For a fastloop.nn model the input is one sample: shape ``(in_features,)`` (any shape with
``in_features`` elements when the model starts with Flatten) of the model's dtype, or several
along a leading axis, ``(n, in_features)`` (``(n, ...)`` with ``in_features`` elements per row). A NumPy
array of another dtype is a TypeError saying how to convert; a list (which has no dtype) is
converted. For any other callable the input is any numeric NumPy array (or a list that makes
one). Nothing is ever read with pickle: object arrays are refused.

    >>> spec = InputSpec.for_model(model)
    >>> x = spec.check([0.0] * 784)          # float32 (784,), a private copy
    >>> x, rows = spec.check_rows(np.zeros((8, 784), np.float32))   # rows == 8
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import nn

__all__ = ["InputSpec"]

_NUMERIC_KINDS = "biufc"


class InputSpec:
    """What one job's input must look like: ``dtype`` and ``features`` (None: anything
    numeric), and whether only the element count matters (a Flatten-first model)."""

    def __init__(self, dtype: np.dtype | None = None, features: int | None = None, flatten: bool = False) -> None:
        self.dtype, self.features, self.flatten = dtype, features, flatten

    @classmethod
    def for_model(cls, model: Any) -> "InputSpec":
        if isinstance(model, nn.Sequential):
            return cls(model.dtype, model.in_features, isinstance(model[0], nn.Flatten))
        if isinstance(model, nn.Linear):
            return cls(np.dtype(np.float32), model.in_features)  # a lone Linear computes in float32
        if not callable(model):
            raise TypeError(f"model must be a fastloop.nn model or a callable on a NumPy batch, "
                            f"not {type(model).__name__}")
        return cls()

    def check(self, inputs: Any) -> np.ndarray:
        """Returns a private C-contiguous copy of one sample, or raises TypeError/ValueError
        naming what is wrong."""
        array, rows = self.check_rows(inputs)
        if rows is not None:
            raise ValueError(f"inputs have shape {array.shape}: several rows where one sample is expected")
        return array

    def check_rows(self, inputs: Any) -> tuple[np.ndarray, int | None]:
        """(a private C-contiguous copy, rows): rows is None for one sample, n for n samples
        along a leading axis (only for a model whose sample shape is known). TypeError or
        ValueError naming what is wrong."""
        typed = isinstance(inputs, np.ndarray)
        if not typed and self.dtype is not None:
            try:
                with np.errstate(over="raise"):  # 1e300 as float32 would silently be inf
                    array = np.array(inputs, dtype=self.dtype)
            except (OverflowError, FloatingPointError) as error:
                raise ValueError(f"inputs hold a number too large for {self.dtype}: {error}") from None
            except (TypeError, ValueError) as error:
                raise TypeError(f"inputs cannot be read as {self.dtype} numbers: {error}") from None
        else:
            try:
                array = np.array(inputs)
            except OverflowError as error:  # an int past float64's range
                raise ValueError(f"inputs hold a number too large for any NumPy dtype: {error}") from None
            except (TypeError, ValueError) as error:  # ragged lists and the like
                raise TypeError(f"inputs cannot be read as a NumPy array: {error}") from None
        if array.dtype.kind not in _NUMERIC_KINDS:
            raise TypeError(f"inputs must be numbers, not dtype {array.dtype} ({type(inputs).__name__})")
        if self.dtype is not None and array.dtype != self.dtype:
            raise TypeError(f"inputs have dtype {array.dtype}, the model computes in {self.dtype}: "
                            f"convert with x.astype(np.{self.dtype})")
        rows = self._rows(array.shape)
        if rows == 0:
            raise ValueError(f"inputs have shape {array.shape}: no rows")
        return np.ascontiguousarray(array), rows

    def _rows(self, shape: tuple[int, ...]) -> int | None:
        """None for one sample of this shape, n for n samples; ValueError for neither."""
        if self.features is None:
            return None  # a plain callable: any array is one sample
        if self.flatten:
            if len(shape) >= 1 and math.prod(shape) == self.features:
                return None
            if len(shape) >= 2 and math.prod(shape[1:]) == self.features:
                return shape[0]
            want = f"{self.features} elements in any shape"
        else:
            if shape == (self.features,):
                return None
            if len(shape) == 2 and shape[1] == self.features:
                return shape[0]
            want = f"shape ({self.features},)"
        raise ValueError(f"inputs have shape {shape}, the model takes one sample of {want}, "
                         f"or several along a leading axis")
