"""Writes the seed corpus for fuzz_json_numbers: the bodies tests/test_serve_json_inputs.py
checks (the usual ones, every other shape, syntax errors, numbers left to Python) and a few
Open Inference Protocol infer requests (JSON data of several datatypes, binary data, BOOL),
each named by its SHA-1.

    python3 tests/fuzz/make_json_seeds.py DIR
"""
import hashlib
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from test_serve_json_inputs import FAST_BODIES, OVERFLOWING, REFUSED_BY_CHECKS, SLOW_BODIES  # noqa: E402


V2_REQUESTS = [json.dumps(request).encode() for request in (
    {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [0.5, -1.25, 3e2, 0]}]},
    {"id": "r1", "inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP64", "data": [[1, 2], [3, 4]]},
                            {"name": "y", "datatype": "FP32", "shape": [1], "data": [7], "parameters": {}}],
     "outputs": [{"name": "output0", "parameters": {"binary_data": False}}], "parameters": {"timeout": 100}},
    {"inputs": [{"name": "t", "shape": [3], "datatype": "BOOL", "data": [True, False, True]}]},
    {"inputs": [{"name": "b", "shape": [1, 3], "datatype": "FP32", "parameters": {"binary_data_size": 12}}],
     "outputs": [{"name": "output0", "parameters": {"binary_data": True}}]},
)]


def main(out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for body in FAST_BODIES + SLOW_BODIES + REFUSED_BY_CHECKS + OVERFLOWING + V2_REQUESTS:
        if len(body) <= 4096:  # the 784-number row and the image stay in the tests
            (out / hashlib.sha1(body).hexdigest()).write_bytes(body)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
