"""The torch-serving target: a torch nn.Module served with dynamic batching against one job
per model call, side by side in one run (target >= 3x).

The model is a float32 torch MLP, 784-2048-2048-10 (~20 MB of weights: one row costs ~0.8 ms
on one core, far more than the service's own per-job work, so the ratio is about the model),
and 784-4096-4096-10 in the full run. The service runs it under ``torch.inference_mode()``
with declared inputs (``Input(torch.float32, (784,))``), 2 worker threads and torch set to
one intra-op thread (the two workers are the parallelism), on a MemoryStore; 64 client
threads submit one row each and wait for its result (a closed loop), for ``max_batch=32``
(``max_delay_s=0.002``) and ``max_batch=1``. Reported: throughput, p50/p99 latency, mean batch
jobs per CPU-second of the process (what a busy shared machine distorts least) and the
ratios per model, beside the model called directly with 32 rows a call and with 1
(what batching gains on the model alone; the service's max_batch=1 also pays its own
per-job Python with 64 client threads on the GIL, so its ratio is larger).

    $ python benchmarks/bench_serve_torch.py [--quick]
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from fastloop.serve import Input, MemoryStore

from .serve import CLIENTS, Run, measure
from .targets import Result
from .timing import best_times

HIDDEN = (2048, 4096)  # 784-h-h-10
HEADERS = ["model", "variant", "jobs/s", "jobs/CPU-s", "p50 ms", "p99 ms", "mean batch", "jobs"]


def row(run: Run) -> list[object]:
    """A run's row under HEADERS."""
    cells = run.row()
    return cells[:3] + [round(run.jobs_per_cpu_s)] + cells[3:]


def torch_mlp(hidden: int, seed: int = 0) -> Any:
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(784, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, 10)).eval()


def compare(quick: bool = False) -> list[Run]:
    """Per model: max_batch=32 and max_batch=1, measured interleaved (rounds alternate the
    two; each keeps its best round, so both see the same disturbances of a busy machine)."""
    import torch

    seconds, warmup, rounds = (0.8, 0.3, 1) if quick else (2.0, 0.5, 3)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runs = []
        rows = np.random.default_rng(1).standard_normal((CLIENTS, 784)).astype(np.float32)
        for hidden in HIDDEN[:1] if quick else HIDDEN:
            model, name = torch_mlp(hidden), f"torch 784-{hidden}-{hidden}-10"
            best: dict[int, Run] = {}
            for _ in range(rounds):
                for max_batch in (32, 1):
                    run = measure(model, f"max_batch={max_batch}", max_batch, MemoryStore(), seconds=seconds,
                                  warmup_s=warmup, rows=rows, name=name, inputs=Input("float32", (784,)))
                    if max_batch not in best or run.jobs_per_s > best[max_batch].jobs_per_s:
                        best[max_batch] = run
            runs += [best[32], best[1]]
        return runs
    finally:
        torch.set_num_threads(threads)


def model_alone(hidden: int) -> dict[int, float]:
    """Rows/s of the model called directly (one thread, inference_mode), 1 row and 32 rows a
    call, interleaved: what batching can gain on the model itself, without the service."""
    import torch

    model = torch_mlp(hidden)
    inputs = {n: torch.randn(n, 784) for n in (1, 32)}

    def call(n: int) -> Callable[[], object]:
        def once() -> object:
            with torch.inference_mode():
                return model(inputs[n])
        return once

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seconds = best_times({str(n): call(n) for n in inputs}, rounds=5, min_round_s=0.1)
    finally:
        torch.set_num_threads(threads)
    return {n: n / seconds[str(n)] for n in inputs}


def results(runs: list[Run], alone: dict[str, dict[int, float]] | None = None) -> list[Result]:
    rows = [Result(f"serve {r.model} {r.variant}: throughput", r.jobs_per_s, "jobs/s", "", None,
                   f"p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms, mean batch {r.mean_batch:.1f}") for r in runs]
    for model in dict.fromkeys(r.model for r in runs):
        batched, single = (next(r for r in runs if r.model == model and r.variant == v)
                           for v in ("max_batch=32", "max_batch=1"))
        ratio = batched.jobs_per_s / single.jobs_per_s
        rows.append(Result(f"serve {model}: dynamic batching / max_batch=1 throughput", ratio, "x", ">= 3",
                           ratio >= 3, f"{CLIENTS} client threads, 2 workers, torch 1 thread, max_delay_s=0.002"))
        per_cpu = batched.jobs_per_cpu_s / single.jobs_per_cpu_s
        rows.append(Result(f"serve {model}: dynamic batching / max_batch=1 jobs per CPU-second", per_cpu, "x", "",
                           None, f"{batched.jobs_per_cpu_s:.0f} vs {single.jobs_per_cpu_s:.0f} jobs per CPU-s"))
        if alone and model in alone:
            speeds = alone[model]
            rows.append(Result(f"{model} called directly: 32 rows a call / 1 row a call", speeds[32] / speeds[1], "x",
                               "", None, f"reference: {speeds[1]:.0f} vs {speeds[32]:.0f} rows/s, one thread"))
    return rows


def alone_all(quick: bool = False) -> dict[str, dict[int, float]]:
    return {f"torch 784-{h}-{h}-10": model_alone(h) for h in (HIDDEN[:1] if quick else HIDDEN)}


def run(quick: bool = False, log: Callable[[str], object] = lambda s: None) -> list[Result]:
    runs, alone = compare(quick), alone_all(quick)
    for r in runs:
        log(f"serve {r.model} {r.variant}: {r.jobs_per_s:.0f} jobs/s, p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms")
    return results(runs, alone)
