"""The seed's question, answered for this machine from the numbers just measured:
"threads or processes?" — which work to give threads, which to give processes, and why.

Every sentence quotes the rows it rests on; a suite that did not run (torch missing, say)
simply leaves its sentence out.
"""

from __future__ import annotations

from typing import Any, Sequence


def _workers(n: int) -> str:
    return f"{n} worker{'s' if n != 1 else ''}"


def _find(results: Sequence[Any], prefix: str) -> Any | None:
    return next((r for r in results if r.name.startswith(prefix)), None)


def _best(rows: Sequence[Any], **match: Any) -> Any | None:
    chosen = [r for r in rows if all(getattr(r, k) == v for k, v in match.items())]
    return max(chosen, key=lambda r: r.samples_per_s) if chosen else None


def _preprocess_best(rows: Sequence[Any], workload: str, way: str) -> Any | None:
    chosen = [r for r in rows if r.workload == workload and r.way == way and r.chunking.startswith("large")]
    return max(chosen, key=lambda r: r.speedup) if chosen else None


def threads_lines(results: Sequence[Any], loader_rows: Sequence[Any], model_rows: Sequence[Any],
                  preprocess_rows: Sequence[Any]) -> list[str]:
    """Where threads win: the work is C that releases the GIL."""
    lines = []
    threads = _preprocess_best(preprocess_rows, "normalize", "threads + fastloop")
    procs = _preprocess_best(preprocess_rows, "normalize", "processes + numpy")
    if threads and procs:
        lines.append(f"preprocessing batches with fastloop.ops: threads + fastloop {threads.speedup:.1f}x serial NumPy "
                     f"vs processes + NumPy {procs.speedup:.2f}x (normalize, {threads.chunking})")
    c_threads = _best(loader_rows, loader="fastloop threads", dataset="arrays + C ops")
    c_procs = _best(loader_rows, loader="fastloop processes", dataset="arrays + C ops")
    torch_best = _best(loader_rows, loader="torch DataLoader", dataset="arrays + C ops")
    if c_threads and c_procs:
        text = (f"loading batches through a C pipeline: fastloop threads {c_threads.samples_per_s:,.0f} samples/s "
                f"vs the same pipeline in processes {c_procs.samples_per_s:,.0f}/s")
        if torch_best:
            text += f" and torch's DataLoader at best {torch_best.samples_per_s:,.0f}/s ({_workers(torch_best.workers)})"
        lines.append(text)
    scalar, writer = _find(results, "Monitor.scalar"), _find(results, "SummaryWriter.add_scalar")
    if scalar:
        text = f"logging: Monitor.scalar costs {scalar.measured:.0f} ns a call, the writing happens on a C thread"
        if writer and writer.measured:
            text += f" ({writer.measured:.0f}x cheaper than SummaryWriter.add_scalar)"
        lines.append(text)
    stall = _find(results, "Checkpointer.save stall")
    if stall:
        lines.append(f"checkpointing: save() stalls the loop {stall.measured:.2f}x a memcpy of the state; "
                     "a C thread writes the file")
    model = next((r for r in model_rows if r.name == "fastloop.nn SGD" and r.python_thread_rate is not None), None)
    if model:
        lines.append(f"training with fastloop.nn: a Python thread beside train_step keeps {model.python_thread_rate:.0%} "
                     "of its idle rate (the step releases the GIL)")
    return lines


def processes_lines(results: Sequence[Any], loader_rows: Sequence[Any]) -> list[str]:
    """Where processes win: per-sample Python code, which the GIL runs one thread at a time."""
    lines = []
    py_threads = _best(loader_rows, loader="Python threads", dataset="Python transform")
    py_procs = _best(loader_rows, loader="fastloop processes", dataset="Python transform")
    if py_threads and py_procs:
        lines.append(f"a Python transform per sample: fastloop processes {py_procs.samples_per_s:,.0f} samples/s "
                     f"({_workers(py_procs.workers)}) vs Python threads {py_threads.samples_per_s:,.0f}/s "
                     f"({_workers(py_threads.workers)}): {py_procs.samples_per_s / py_threads.samples_per_s:.1f}x")
    pure = _find(results, "2 threads vs 1: pure Python loop")
    if pure:
        lines.append(f"any pure-Python loop: 2 threads run it {pure.measured:.2f}x as fast as 1")
    return lines


def answer(results: Sequence[Any], loader_rows: Sequence[Any], model_rows: Sequence[Any],
           preprocess_rows: Sequence[Any]) -> list[str]:
    """The markdown lines of the report's answer section."""
    out = ["## The answer for this machine", ""]
    threads = threads_lines(results, loader_rows, model_rows, preprocess_rows)
    if threads:
        out.append("**Use threads** for work done in C that releases the GIL:")
        out += [f"- {line}" for line in threads]
        out.append("")
    processes = processes_lines(results, loader_rows)
    if processes:
        out.append("**Use processes** for per-sample Python code (the GIL runs it one thread at a time):")
        out += [f"- {line}" for line in processes]
        out.append("")
    out.append("Serving (fastloop.serve) is measured on its own: benchmarks/bench_serve.py (in process) and "
               "benchmarks/bench_serve_http.py (over HTTP, the server in its own process).")
    return out


HEADERS = ["work", "threads", "processes", "reference", "unit"]


def side_by_side(results: Sequence[Any], loader_rows: Sequence[Any], model_rows: Sequence[Any],
                 preprocess_rows: Sequence[Any]) -> list[list[object]]:
    """One row per kind of work: its best threaded and process-based numbers, and a yardstick."""
    rows: list[list[object]] = []

    def rate(row: Any) -> str:
        return f"{row.samples_per_s:,.0f} (x{row.workers})" if row else "-"

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
                     f"{rate(torch_c)} torch" if torch_c else "-", "samples/s"])
        rows.append(["load batches, Python transform", rate(_best(loader_rows, loader="Python threads", dataset=py)),
                     rate(_best(loader_rows, loader="fastloop processes", dataset=py)),
                     f"{rate(torch_py)} torch" if torch_py else "-", "samples/s"])
    pure = _find(results, "2 threads vs 1: pure Python loop")
    if pure:
        rows.append(["pure-Python loop, 2 threads vs 1", f"{pure.measured:.2f}", "-", "2.0 (ideal)", "x one thread"])
    scalar, writer = _find(results, "Monitor.scalar"), _find(results, "SummaryWriter.add_scalar")
    if scalar:
        rows.append(["log a scalar", f"{scalar.measured:.0f} (C writer thread)", "-",
                     f"{scalar.measured * writer.measured:,.0f} SummaryWriter" if writer and writer.measured else "-",
                     "ns a call"])
    stall, inline = _find(results, "Checkpointer.save stall"), _find(results, "inline np.savez")
    if stall:
        rows.append(["checkpoint stall", f"{stall.measured:.2f} (C writer thread)", "-",
                     f"{stall.measured * inline.measured:.1f} inline np.savez" if inline else "-", "x a memcpy"])
    model = next((r for r in model_rows if r.name == "fastloop.nn SGD"), None)
    torch_model = next((r for r in model_rows if r.name == "torch SGD"), None)
    if model:
        rows.append(["train step, MLP 784-512-512-10", f"{model.step_ms:.2f} (fastloop.nn)", "-",
                     f"{torch_model.step_ms:.2f} torch" if torch_model else "-", "ms"])
    return rows
