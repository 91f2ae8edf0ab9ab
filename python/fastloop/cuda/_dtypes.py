"""The float types the CUDA kernels write, by name: what fastloop.cuda.preprocess and the
loader's device feed accept as a dtype."""

from __future__ import annotations

from typing import Any

import numpy as np

DTYPES = ("float32", "float16", "bfloat16")


def dtype_name(value: Any, arg: str = "dtype") -> str | None:
    """'float32', 'float16' or 'bfloat16' from a name, a NumPy dtype or a torch dtype; None
    for None. Anything else raises ValueError naming `arg`."""
    if value is None:
        return None
    if isinstance(value, type) and issubclass(value, np.generic):  # numpy.float16 and the like
        value = np.dtype(value)
    text = str(value).replace("torch.", "")
    aliases = {"float": "float32", "half": "float16"}
    text = aliases.get(text, text)
    if text not in DTYPES:
        raise ValueError(f"'{arg}' must be float32, float16 or bfloat16 (a name, NumPy or torch dtype), not {value!r}")
    return text
