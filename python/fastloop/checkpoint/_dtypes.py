"""The safetensors dtype codes, in one table that the reader (_safetensors.py) and the state
flattener (_state.py) both derive theirs from. The C writer keeps its own (code, item size)
table in csrc/checkpoint/fl_safetensors.c, since the core builds without Python;
tests/test_checkpoint_format.py checks the two agree, code for code and size for size.
"""

from __future__ import annotations

import numpy as np

# code -> (the NumPy dtype its bytes are read as, whether that is only the raw bits of a dtype
# NumPy lacks, torch's name for the dtype)
TABLE: dict[str, tuple[type, bool, str]] = {
    "BOOL": (np.bool_, False, "bool"),
    "U8": (np.uint8, False, "uint8"),
    "I8": (np.int8, False, "int8"),
    "F8_E5M2": (np.uint8, True, "float8_e5m2"),
    "F8_E4M3": (np.uint8, True, "float8_e4m3fn"),
    "F8_E4M3FNUZ": (np.uint8, True, "float8_e4m3fnuz"),
    "F8_E5M2FNUZ": (np.uint8, True, "float8_e5m2fnuz"),
    "I16": (np.int16, False, "int16"),
    "U16": (np.uint16, False, "uint16"),
    "F16": (np.float16, False, "float16"),
    "BF16": (np.uint16, True, "bfloat16"),
    "I32": (np.int32, False, "int32"),
    "U32": (np.uint32, False, "uint32"),
    "F32": (np.float32, False, "float32"),
    "I64": (np.int64, False, "int64"),
    "U64": (np.uint64, False, "uint64"),
    "F64": (np.float64, False, "float64"),
    "C64": (np.complex64, False, "complex64"),
}

# code -> the NumPy dtype a reader views its bytes as
NUMPY_OF = {code: np.dtype(numpy) for code, (numpy, _, _) in TABLE.items()}
# code -> torch's dtype name, for files without fastloop's manifest
TORCH_NAME_OF = {code: torch for code, (_, _, torch) in TABLE.items()}
# NumPy kind + item size ("f4") -> code, for the dtypes NumPy has
CODE_OF_NUMPY = {NUMPY_OF[code].kind + str(NUMPY_OF[code].itemsize): code
                 for code, (_, raw, _) in TABLE.items() if not raw}
# torch dtype name -> code, for the torch dtypes NumPy lacks (stored as their raw bits)
CODE_OF_TORCH_RAW = {torch: code for code, (_, raw, torch) in TABLE.items() if raw}
