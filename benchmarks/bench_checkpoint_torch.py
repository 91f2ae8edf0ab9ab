"""Checkpointer.save stall for a torch model + Adam state (~288 MiB), side by side in one run,
against an inline torch.save of the same state to the same disk (the targets: the first save,
whose new Checkpointer maps its staging area then, no more than torch.save; later saves under
0.2x), with memcpys of the same bytes for reference (into fresh memory, into reused buffers).

As a script: prints the table (python benchmarks/bench_checkpoint_torch.py [--quick]).
Under pytest: runs the quick size and checks every row was measured (targets are read from
the table and recorded in BENCHMARKS.md, not asserted).
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fastloop  # noqa: E402
from fastloop.bench.report import format_table  # noqa: E402
from fastloop.bench.targets import HEADERS, Result, table_rows  # noqa: E402


def model_and_adam(width: int, layers: int) -> tuple[dict, int]:
    """{"model", "optim", "epoch"} after one Adam step, and its tensor bytes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, width)).sum().backward()
    optim.step()  # exp_avg and exp_avg_sq exist: the state is 3x the parameters
    state = {"model": model.state_dict(), "optim": optim.state_dict(), "epoch": 1}
    tensors = list(state["model"].values()) + [t for s in state["optim"]["state"].values() for t in s.values()]
    return state, sum(t.numel() * t.element_size() for t in tensors)


def tensors_of(state: dict) -> list:
    return list(state["model"].values()) + [t for s in state["optim"]["state"].values() for t in s.values()]


def memcpy_fresh(arrays: list, nbytes: int) -> float:
    start = time.perf_counter()
    fresh = np.empty(nbytes, np.uint8)  # one new mapping: every page faults once
    offset = 0
    for a in arrays:
        np.copyto(fresh[offset:offset + a.nbytes], a.reshape(-1).view(np.uint8))
        offset += a.nbytes
    return time.perf_counter() - start


def memcpy_reused(arrays: list, copies: list) -> float:
    start = time.perf_counter()
    for dst, src in zip(copies, arrays):
        np.copyto(dst, src)
    return time.perf_counter() - start


def measure(quick: bool) -> list[Result]:
    state, nbytes = model_and_adam(width=1024 if quick else 2048, layers=6)
    tensors = [t.numpy() for t in tensors_of(state)]  # memcpy baselines: np.copyto of the same bytes
    copies = [np.empty_like(t) for t in tensors]
    rounds = 2 if quick else 4
    best = {"fresh": math.inf, "first": math.inf, "reused": math.inf, "save": math.inf, "torch": math.inf}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):  # interleaved, best of each: the machine is shared
            best["fresh"] = min(best["fresh"], memcpy_fresh(tensors, nbytes))
            with fastloop.Checkpointer(os.path.join(tmp, f"first{r}"), keep=1) as ckpt:
                start = time.perf_counter()
                ckpt.save(state, 0)
                best["first"] = min(best["first"], time.perf_counter() - start)
            start = time.perf_counter()
            torch.save(state, os.path.join(tmp, f"inline{r}.pt"))  # a new file, as each first save writes
            best["torch"] = min(best["torch"], time.perf_counter() - start)
            os.unlink(os.path.join(tmp, f"inline{r}.pt"))
            shutil.rmtree(os.path.join(tmp, f"first{r}"))
        with fastloop.Checkpointer(os.path.join(tmp, "steady"), keep=1) as ckpt:
            ckpt.save(state, 0)
            for step in range(1, rounds + 2):
                best["reused"] = min(best["reused"], memcpy_reused(tensors, copies))
                ckpt.wait()  # untimed: the previous write finishes (a save would wait for it)
                start = time.perf_counter()
                ckpt.save(state, step)
                best["save"] = min(best["save"], time.perf_counter() - start)
    mib = nbytes / 2**20
    first, later = best["first"] / best["torch"], best["save"] / best["torch"]
    return [
        Result(f"first save stall (new Checkpointer) / inline torch.save ({mib:.0f} MiB)", first, "x", "<= 1.0",
               first <= 1.0, f"{best['first'] * 1e3:.0f} ms vs {best['torch'] * 1e3:.0f} ms"),
        Result(f"later save stall / inline torch.save ({mib:.0f} MiB)", later, "x", "< 0.2",
               later < 0.2, f"{best['save'] * 1e3:.0f} ms vs {best['torch'] * 1e3:.0f} ms"),
        Result("first save stall / memcpy into fresh memory", best["first"] / best["fresh"], "x", "(reference)",
               None, f"{best['fresh'] * 1e3:.0f} ms memcpy"),
        Result("later save stall / memcpy into reused buffers", best["save"] / best["reused"], "x", "(reference)",
               None, f"{best['reused'] * 1e3:.0f} ms memcpy"),
    ]


def test_quick_torch_checkpoint_suite_measures_every_row():
    results = measure(quick=True)
    assert len(results) == 4 and all(math.isfinite(r.measured) for r in results)


if __name__ == "__main__":
    print(format_table(HEADERS, table_rows(measure(quick="--quick" in sys.argv))))
