"""The seed's question, answered for this machine from the numbers just measured:
"threads or processes?" — which work to give threads, which to give processes, and why.

Every line quotes the rows it rests on. A comparison of threads and processes goes under the
heading its own numbers pick (threads, processes, or either when they are within EVEN of each
other), so the answer cannot contradict the tables above it; what has no such pair (pure-Python
scaling, the cost of logging and checkpointing) is listed apart, as measured. A row that did
not run (torch missing, say) is listed as not run, without a number.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

# Two rates within 10% of each other are no clear winner on a shared, noisy machine.
EVEN = 1.10
# A pure-Python loop on 2 threads at 1.5x one thread or more: this interpreter ran Python
# threads in parallel (free-threaded CPython); below it, the GIL ran them one at a time.
PARALLEL_PYTHON = 1.5
# A Python thread beside train_step keeping this share of its idle rate shows the step
# leaves the GIL free (the target in bench/model.py).
GIL_FREE_SHARE = 0.3
NO_TORCH = "not run (torch is not installed)"


@dataclass
class Finding:
    """One comparison and the side its numbers favour: "threads", "processes" or "even"."""

    winner: str
    text: str


def _workers(n: int) -> str:
    return f"{n} worker{'s' if n != 1 else ''}"


def _find(results: Sequence[Any], prefix: str) -> Any | None:
    return next((r for r in results if r.name.startswith(prefix)), None)


def _measured(result: Any | None) -> bool:
    return result is not None and result.measured is not None


def _best(rows: Sequence[Any], **match: Any) -> Any | None:
    chosen = [r for r in rows if all(getattr(r, k) == v for k, v in match.items())]
    return max(chosen, key=lambda r: r.samples_per_s) if chosen else None


def _preprocess_best(rows: Sequence[Any], workload: str, way: str) -> Any | None:
    chosen = [r for r in rows if r.workload == workload and r.way == way and r.chunking.startswith("large")]
    return max(chosen, key=lambda r: r.speedup) if chosen else None


def _winner(threads: float, processes: float) -> str:
    """Which of two higher-is-better numbers wins, or "even" within EVEN of each other."""
    if threads >= processes * EVEN:
        return "threads"
    if processes >= threads * EVEN:
        return "processes"
    return "even"


def findings(results: Sequence[Any], loader_rows: Sequence[Any], preprocess_rows: Sequence[Any]) -> list[Finding]:
    """Every threads-vs-processes comparison this run measured, each with its winner."""
    out = []
    threads = _preprocess_best(preprocess_rows, "normalize", "threads + fastloop")
    procs = _preprocess_best(preprocess_rows, "normalize", "processes + numpy")
    if threads and procs:
        out.append(Finding(_winner(threads.speedup, procs.speedup),
                           f"preprocessing batches ({threads.chunking}): threads + fastloop.ops {threads.speedup:.1f}x "
                           f"serial NumPy vs processes + NumPy {procs.speedup:.2f}x"))
    c_threads = _best(loader_rows, loader="fastloop threads", dataset="arrays + C ops")
    c_procs = _best(loader_rows, loader="fastloop processes", dataset="arrays + C ops")
    if c_threads and c_procs:
        text = (f"loading batches through a C pipeline: fastloop threads {c_threads.samples_per_s:,.0f} samples/s "
                f"({_workers(c_threads.workers)}) vs the same pipeline in processes {c_procs.samples_per_s:,.0f}/s "
                f"({_workers(c_procs.workers)})")
        torch_best = _best(loader_rows, loader="torch DataLoader", dataset="arrays + C ops")
        if torch_best:
            text += f"; torch's DataLoader at best {torch_best.samples_per_s:,.0f}/s ({_workers(torch_best.workers)})"
        out.append(Finding(_winner(c_threads.samples_per_s, c_procs.samples_per_s), text))
    py_threads = _best(loader_rows, loader="Python threads", dataset="Python transform")
    py_procs = _best(loader_rows, loader="fastloop processes", dataset="Python transform")
    if py_threads and py_procs:
        out.append(Finding(_winner(py_threads.samples_per_s, py_procs.samples_per_s),
                           f"a Python transform per sample: fastloop processes {py_procs.samples_per_s:,.0f} samples/s "
                           f"({_workers(py_procs.workers)}) vs Python threads {py_threads.samples_per_s:,.0f}/s "
                           f"({_workers(py_threads.workers)}): {py_procs.samples_per_s / py_threads.samples_per_s:.2f}x"))
    return out


def other_lines(results: Sequence[Any], model_rows: Sequence[Any]) -> list[str]:
    """What was measured without a threads-vs-processes pair: how Python threads scale on
    pure-Python code, and what fastloop's own C threads cost the training loop."""
    lines = []
    pure = _find(results, "2 threads vs 1: pure Python loop")
    if _measured(pure):
        lines.append(f"any pure-Python loop: 2 threads run it {pure.measured:.2f}x as fast as 1 "
                     + ("(Python threads ran in parallel here)" if pure.measured >= PARALLEL_PYTHON
                        else "(the GIL runs one thread at a time)"))
    scalar, writer = _find(results, "Monitor.scalar"), _find(results, "SummaryWriter.add_scalar")
    if _measured(scalar):
        text = f"logging: Monitor.scalar costs {scalar.measured:.0f} ns a call; a C thread does the writing"
        if _measured(writer):
            text += (f" ({writer.measured:.0f}x cheaper than SummaryWriter.add_scalar)" if writer.measured >= 1
                     else f" ({1 / writer.measured:.1f}x the cost of SummaryWriter.add_scalar)")
        lines.append(text)
    stall = _find(results, "Checkpointer.save stall")
    if _measured(stall):
        lines.append(f"checkpointing: save() stalls the loop {stall.measured:.2f}x a memcpy of the state; "
                     "a C thread writes the file")
    model = next((r for r in model_rows if r.name == "fastloop.nn SGD" and r.python_thread_rate is not None), None)
    if model:
        share = model.python_thread_rate
        lines.append(f"training with fastloop.nn: a Python thread beside train_step keeps {share:.0%} of its idle rate"
                     + (" (the step leaves the GIL free)" if share >= GIL_FREE_SHARE else ""))
    return lines


def not_run_lines(results: Sequence[Any], loader_rows: Sequence[Any], model_rows: Sequence[Any],
                  preprocess_rows: Sequence[Any]) -> list[str]:
    """The rows and suites this run left out, each with why where it is known."""
    lines = [f"{r.name}: not run ({r.detail})" if r.detail else f"{r.name}: not run"
             for r in results if r.measured is None]
    if loader_rows and not any(r.loader == "torch DataLoader" for r in loader_rows):
        lines.append(f"torch's DataLoader: {NO_TORCH}")
    if model_rows and not any(r.name.startswith("torch") for r in model_rows):
        lines.append(f"torch's train step: {NO_TORCH}")
    for name, rows in (("the target suite", results), ("the loader suite", loader_rows),
                       ("the model suite", model_rows), ("the preprocessing suite", preprocess_rows)):
        if not rows:
            lines.append(f"{name}: not run")
    return lines


def answer(results: Sequence[Any], loader_rows: Sequence[Any], model_rows: Sequence[Any],
           preprocess_rows: Sequence[Any]) -> list[str]:
    """The markdown lines of the report's answer section."""
    out = ["## The answer for this machine", ""]
    found = findings(results, loader_rows, preprocess_rows)
    headings = {"threads": "**Use threads** for these (threads were faster in this run):",
                "processes": "**Use processes** for these (processes were faster in this run):",
                "even": f"**Either** (within {EVEN - 1:.0%} of each other in this run):"}
    for winner, heading in headings.items():
        lines = [f.text for f in found if f.winner == winner]
        if lines:
            out += [heading, *(f"- {line}" for line in lines), ""]
    other = other_lines(results, model_rows)
    if other:
        out += ["**Also measured** (no choice between threads and processes in these):",
                *(f"- {line}" for line in other), ""]
    missing = not_run_lines(results, loader_rows, model_rows, preprocess_rows)
    if missing:
        out += ["**Not run**, so not part of this answer:", *(f"- {line}" for line in missing), ""]
    out.append("Serving (fastloop.serve) is measured on its own: benchmarks/bench_serve.py (in process) and "
               "benchmarks/bench_serve_http.py (over HTTP, the server in its own process).")
    return out


HEADERS = ["work", "threads", "processes", "reference", "unit"]


def side_by_side(results: Sequence[Any], loader_rows: Sequence[Any], model_rows: Sequence[Any],
                 preprocess_rows: Sequence[Any]) -> list[list[object]]:
    """One row per kind of work: its best threaded and process-based numbers, and a yardstick
    ("-" where a column does not apply, "not run" where it did not run)."""
    rows: list[list[object]] = []

    def rate(row: Any) -> str:
        return f"{row.samples_per_s:,.0f} (x{row.workers})" if row else "not run"

    threads = _preprocess_best(preprocess_rows, "normalize", "threads + fastloop")
    procs = _preprocess_best(preprocess_rows, "normalize", "processes + numpy")
    if threads and procs:
        rows.append([f"normalize batches ({threads.chunking})", f"{threads.speedup:.1f} (fastloop x{threads.workers})",
                     f"{procs.speedup:.2f} (NumPy x{procs.workers})", "1.0 (serial NumPy)", "x serial NumPy"])
    divide_threads = _preprocess_best(preprocess_rows, "divide_by_max", "threads + fastloop")
    divide_procs = _preprocess_best(preprocess_rows, "divide_by_max", "processes + numpy")
    if divide_threads and divide_procs:
        rows.append([f"divide_by_max ({divide_threads.chunking})", f"{divide_threads.speedup:.1f} (fastloop)",
                     f"{divide_procs.speedup:.2f} (NumPy)", "1.0 (serial NumPy)", "x serial NumPy"])
    if loader_rows:
        c_ops, py = "arrays + C ops", "Python transform"
        torch_c, torch_py = _best(loader_rows, loader="torch DataLoader", dataset=c_ops), \
            _best(loader_rows, loader="torch DataLoader", dataset=py)
        rows.append(["load batches, C pipeline", rate(_best(loader_rows, loader="fastloop threads", dataset=c_ops)),
                     rate(_best(loader_rows, loader="fastloop processes", dataset=c_ops)),
                     f"{rate(torch_c)} torch" if torch_c else f"torch: {NO_TORCH}", "samples/s"])
        rows.append(["load batches, Python transform", rate(_best(loader_rows, loader="Python threads", dataset=py)),
                     rate(_best(loader_rows, loader="fastloop processes", dataset=py)),
                     f"{rate(torch_py)} torch" if torch_py else f"torch: {NO_TORCH}", "samples/s"])
    pure = _find(results, "2 threads vs 1: pure Python loop")
    if _measured(pure):
        rows.append(["pure-Python loop, 2 threads vs 1", f"{pure.measured:.2f}", "-", "2.0 (ideal)", "x one thread"])
    scalar, writer = _find(results, "Monitor.scalar"), _find(results, "SummaryWriter.add_scalar")
    if _measured(scalar):
        reference = f"{scalar.measured * writer.measured:,.0f} SummaryWriter" if _measured(writer) else \
            f"SummaryWriter: {NO_TORCH}" if writer else "-"
        rows.append(["log a scalar", f"{scalar.measured:.0f} (C writer thread)", "-", reference, "ns a call"])
    stall, inline = _find(results, "Checkpointer.save stall"), _find(results, "inline np.savez")
    if _measured(stall):
        rows.append(["checkpoint stall", f"{stall.measured:.2f} (C writer thread)", "-",
                     f"{stall.measured * inline.measured:.1f} inline np.savez" if _measured(inline) else "not run",
                     "x a memcpy"])
    model = next((r for r in model_rows if r.name == "fastloop.nn SGD"), None)
    torch_model = next((r for r in model_rows if r.name == "torch SGD"), None)
    if model:
        rows.append(["train step, MLP 784-512-512-10 (best)", f"{model.step_ms:.2f} (fastloop.nn)", "-",
                     f"{torch_model.step_ms:.2f} torch" if torch_model else f"torch: {NO_TORCH}", "ms"])
    return rows
