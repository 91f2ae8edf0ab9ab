"""The HTTP front's JSON body parsing: parse_body through json.loads (and the model check's
cast of the nested list to float32) against the C fast path (fastloop._core.parse_json_inputs,
GIL released), on a 784-number row and a 3x32x32 image: microseconds per call, the part of
it spent in C without the GIL, and calls/s from 1 and 2 threads at once.

A second table puts the bare parsers side by side, body bytes to a float32 array, on a
784-float row (16 KB, numbers as Python's repr writes them: 16-17 digits) and a 32x784 batch
(518 KB): the C parser, orjson + np.asarray (when orjson is installed) and json.loads +
np.asarray.

As a script: prints the tables.
    python benchmarks/bench_json_inputs.py [--quick] [--markdown]
Under pytest: the quick run, checking every row was measured.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np

from fastloop import _core
from fastloop.bench.report import format_table, machine_summary
from fastloop.bench.timing import best_times
from fastloop.serve.http_inputs import parse_body
from fastloop.serve.inputs import InputSpec

HEADERS = ["body", "path", "parse_body us", "+ check us", "C parse us (no GIL)", "GIL held us",
           "calls/s 1 thread", "calls/s 2 threads"]
F32 = np.dtype(np.float32)


def bodies() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    return {
        "784 floats": json.dumps({"inputs": rng.standard_normal(784).tolist(), "id": "x", "priority": "high",
                                  "timeout_s": 2}).encode(),
        "3x32x32 floats": json.dumps({"inputs": rng.standard_normal((3, 32, 32)).tolist(), "id": "x"}).encode(),
    }


def calls_per_s(fn, threads: int, seconds: float) -> float:
    """Calls/s of `fn` run by `threads` threads at once for `seconds`."""
    counts = [0] * threads
    stop = time.perf_counter() + seconds

    def work(i: int) -> None:
        while time.perf_counter() < stop:
            fn()
            counts[i] += 1

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts) / seconds


def measure(quick: bool = False) -> list[list[object]]:
    spec = InputSpec(F32)
    rows = []
    for name, body in bodies().items():
        fns = {"json.loads": lambda b=body: parse_body(b), "C fast path": lambda b=body: parse_body(b, F32)}
        checked = {"json.loads": lambda b=body: spec.check(parse_body(b)["inputs"]),
                   "C fast path": lambda b=body: spec.check(parse_body(b, F32)["inputs"])}
        rounds = 2 if quick else 7
        times = best_times({**fns, **{k + " checked": v for k, v in checked.items()},
                            "C": lambda b=body: _core.parse_json_inputs(b)}, rounds=rounds,
                           min_round_s=0.02 if quick else 0.1)
        for path in fns:
            c_us = times["C"] * 1e6 if path == "C fast path" else 0.0
            total = times[path] * 1e6
            rate = [calls_per_s(checked[path], n, 0.2 if quick else 1.0) for n in (1, 2)]
            rows.append([name, path, round(total, 1), round(times[path + " checked"] * 1e6, 1), round(c_us, 1),
                         round(total - c_us, 1), round(rate[0]), round(rate[1])])
    return rows


PARSER_HEADERS = ["body", "bytes", "parser", "us per body", "ns per number", "x C parser"]


def parser_bodies() -> dict[str, bytes]:
    rng = np.random.default_rng(1)
    return {"784 floats": json.dumps({"inputs": rng.standard_normal(784).tolist(), "id": "x"}).encode(),
            "32x784 floats": json.dumps({"inputs": rng.standard_normal((32, 784)).tolist()}).encode()}


def parsers() -> dict[str, object]:
    """body -> float32 array, by each parser at hand."""
    found = {"C parser": lambda b: _core.parse_json_inputs(b)[0].astype(F32),
             "json.loads + np.asarray": lambda b: np.asarray(json.loads(b)["inputs"], F32)}
    try:
        import orjson
    except ImportError:
        return found
    return {"C parser": found["C parser"], "orjson + np.asarray": lambda b: np.asarray(orjson.loads(b)["inputs"], F32),
            "json.loads + np.asarray": found["json.loads + np.asarray"]}


def measure_parsers(quick: bool = False) -> list[list[object]]:
    rows = []
    for name, body in parser_bodies().items():
        fns = parsers()
        want = fns["C parser"](body)
        for fn in fns.values():
            assert fn(body).tobytes() == want.tobytes()  # every parser reads the same float32 values
        times = best_times({k: lambda f=f: f(body) for k, f in fns.items()}, rounds=2 if quick else 7,
                           min_round_s=0.02 if quick else 0.2)
        for parser, seconds in times.items():
            rows.append([name, len(body), parser, round(seconds * 1e6, 1), round(seconds * 1e9 / want.size, 1),
                         round(seconds / times["C parser"], 2)])
    return rows


def test_quick_json_inputs_bench_measures_every_row():
    rows = measure(quick=True)
    assert len(rows) == 4 and all(r[2] > 0 and r[6] > 0 for r in rows)


def test_quick_parser_comparison_measures_every_parser():
    rows = measure_parsers(quick=True)
    assert len(rows) == 2 * len(parsers()) and all(r[3] > 0 for r in rows)


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    print(format_table(HEADERS, measure(quick), markdown="--markdown" in sys.argv))
    print()
    print(format_table(PARSER_HEADERS, measure_parsers(quick), markdown="--markdown" in sys.argv))
    print(f"command: python benchmarks/bench_json_inputs.py{' --quick' if quick else ''}; {machine_summary()}")
