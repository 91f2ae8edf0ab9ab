"""Integer arguments checked by name at the API's edge, against the ranges the C core takes:
a value past them is a clear TypeError/ValueError naming the argument here, never a wrapped
size or a C parser's "signed integer is greater than maximum" further down."""

from __future__ import annotations

import operator
from typing import Any

INT_MAX = 2**31 - 1  # a C int: worker, slot and rank counts
SSIZE_MAX = 2**63 - 1  # a size: batch sizes, image sides before the core's own limits


def int_arg(name: str, value: Any, low: int, high: int) -> int:
    """value as an int in [low, high], else TypeError/ValueError naming `name`.

    >>> int_arg("batch_size", 0, 1, SSIZE_MAX)   # ValueError: 'batch_size' must be positive and at most ..., not 0
    """
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"'{name}' must be an int, not {type(value).__name__}") from None
    if not low <= number <= high:
        bounds = f"positive and at most {high}" if low == 1 else f"in [{low}, {high}]"
        raise ValueError(f"'{name}' must be {bounds}, not {number}")
    return number


def one_of(name: str, value: Any, choices: tuple[str, ...]) -> str:
    """value if it is one of `choices`, else ValueError naming `name` and the choices.

    >>> one_of("mode", "thread", ("threads", "processes"))  # ValueError: 'mode' must be 'threads' or 'processes', not 'thread'
    """
    if value not in choices:
        *most, last = [repr(choice) for choice in choices]
        raise ValueError(f"'{name}' must be {', '.join(most)} or {last}, not {value!r}")
    return value
