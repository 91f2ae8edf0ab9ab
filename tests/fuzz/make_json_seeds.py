"""Writes the seed corpus for fuzz_json_numbers: the bodies tests/test_serve_json_inputs.py
checks (the usual ones, every other shape, syntax errors, numbers left to Python), each named
by its SHA-1.

    python3 tests/fuzz/make_json_seeds.py DIR
"""
import hashlib
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from test_serve_json_inputs import FAST_BODIES, OVERFLOWING, REFUSED_BY_CHECKS, SLOW_BODIES  # noqa: E402


def main(out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for body in FAST_BODIES + SLOW_BODIES + REFUSED_BY_CHECKS + OVERFLOWING:
        if len(body) <= 4096:  # the 784-number row and the image stay in the tests
            (out / hashlib.sha1(body).hexdigest()).write_bytes(body)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
