"""fastloop.serve over HTTP on loopback (the server in its own process, 64 asyncio clients
here): dynamic batching (max_batch=32) against max_batch=1 on 784-512-512-10 and
784-2048-2048-10 MLPs (throughput, p50/p99, ratio; target >= 3x), and an open-loop overload at
2x capacity (queue depth levels at max_queue, 429 p99 < 5 ms, RSS bounded, /healthz p99 < 10 ms).

As a script: prints the tables and the command.
    python benchmarks/bench_serve_http.py [--quick] [--markdown]
    python benchmarks/bench_serve_http.py --predict [--quick] [--markdown]
``--predict``: the one-call targets instead (fastloop.bench.serve_predict): POST /v1/predict
against a plain FastAPI POST /predict on a torch MLP, one client's p50, the in-process rate,
and a SIGTERM under load.
    python benchmarks/bench_serve_http.py --anchors [--quick] [--fastloop-only] [--markdown] [--litserve-python PY]
        [--mlserver-python PY] [--torch-python PY]
``--anchors``: issue 36's side-by-side (fastloop.bench.serve_anchors) on a torch MLP: LitServe
(batching, 1 and 2 workers), MLServer (a custom runtime, v2 JSON), fastloop /v1/predict and /v2
infer with JSON and binary tensors, at 64 clients and one; each from its own Python (a venv with
it and torch), a row skipped, saying why, where its Python lacks it.
Under pytest: runs the quick suite and checks every row was measured (the targets are
reported, not asserted: a loaded test machine must not fail them). Skipped without uvicorn.
"""

from __future__ import annotations

import math
import sys

import pytest

from fastloop.bench import targets
from fastloop.bench.report import format_table, machine_summary


def test_quick_http_serve_suite_measures_every_row():
    pytest.importorskip("uvicorn")
    from fastloop.bench import serve_http

    suite = serve_http.compare(quick=True)
    assert all(r.jobs > 0 and math.isfinite(r.p99_ms) for r in suite.runs)
    assert suite.overloads and all(o.accepted > 0 and o.health_probes > 0 and o.depth for o in suite.overloads)
    # an overload's 429 latency is nan only when it rejected nothing (its queue never filled); one
    # overload may reject while another does not, so each is judged by its own count
    nothing_rejected = {f"HTTP overload {o.model} {o.variant}: 429 latency p99" for o in suite.overloads if not o.rejected}
    unmeasured = [r.name for r in serve_http.results(suite) if not math.isfinite(r.measured)]
    assert set(unmeasured) <= nothing_rejected, unmeasured


def test_quick_predict_suite_measures_every_row_and_loses_no_job():
    pytest.importorskip("uvicorn")
    pytest.importorskip("fastapi")
    pytest.importorskip("torch")
    from fastloop.bench import serve_predict

    suite = serve_predict.compare(quick=True)
    assert all(r.jobs > 0 and math.isfinite(r.p50_ms) for r in suite.runs)
    assert suite.drain["rc"] == 0 and suite.drain["lost"] == 0 and suite.drain["log_found"]
    assert all(math.isfinite(r.measured) for r in serve_predict.results(suite))


def test_quick_anchor_suite_measures_every_row_it_can_start():
    """The smoke: every server that starts is measured; one whose library is missing is skipped with
    the reason (the interpreters come from $FASTLOOP_BENCH_*_PYTHON, else this one)."""
    pytest.importorskip("uvicorn")
    from fastloop.bench import serve_anchors

    suite = serve_anchors.compare(quick=True, litserve_workers=(1,))
    started = {r.server for r in suite.runs}
    assert all(r.jobs > 0 and math.isfinite(r.p50_ms) for r in suite.runs)
    assert all(reason for reason in suite.skipped.values()) and not started & set(suite.skipped)
    if not suite.runs:
        pytest.skip(f"no server could run the torch model: {suite.skipped}")


def _option(name: str) -> str | None:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None


def _anchors(quick: bool, markdown: bool) -> None:
    from fastloop.bench import serve_anchors

    ours_only = "--fastloop-only" in sys.argv  # /v1 against /v2 alone: no LitServe, no MLServer
    suite = serve_anchors.compare(quick=quick, litserve_python=_option("--litserve-python"),
                                  mlserver_python=_option("--mlserver-python"),
                                  torch_python=_option("--torch-python"),
                                  **(dict(litserve_workers=(), mlserver_workers=()) if ours_only else {}))
    print(format_table(serve_anchors.HEADERS, [r.row() for r in suite.runs], markdown=markdown))
    print()
    print(format_table(targets.HEADERS, targets.table_rows(serve_anchors.results(suite)), markdown=markdown))
    for name, reason in suite.skipped.items():
        print(f"skipped {name}: {reason}")
    idle = ", ".join(f"{name} {share * 100:.0f}%" for name, share in suite.idle_cpu.items())
    print(f"versions: {suite.versions}; idle CPU of each server (of one core): {idle}")
    print(f"command: {serve_anchors.COMMAND}{' --quick' if quick else ''}{' --fastloop-only' if ours_only else ''}; load average (1 min) at the start "
          f"{suite.load[0]:.1f}, at the end {suite.load[1]:.1f}; {machine_summary()}")


if __name__ == "__main__":
    try:
        import uvicorn  # noqa: F401
    except ImportError:
        sys.exit("needs uvicorn: pip install 'fastloop[serve]'")
    from fastloop.bench import serve_http

    quick = "--quick" in sys.argv
    markdown = "--markdown" in sys.argv
    if "--anchors" in sys.argv:
        _anchors(quick, markdown)
        sys.exit(0)
    if "--predict" in sys.argv:
        from fastloop.bench import serve_predict

        one_call = serve_predict.compare(quick=quick)
        print(format_table(serve_predict.HEADERS, [r.row() for r in one_call.runs], markdown=markdown))
        print(f"in process: {one_call.in_process.jobs_per_s:.0f} jobs/s (p50 {one_call.in_process.p50_ms:.2f} ms, "
              f"mean batch {one_call.in_process.mean_batch:.1f})")
        print()
        print(format_table(targets.HEADERS, targets.table_rows(serve_predict.results(one_call)), markdown=markdown))
        print(f"command: {serve_predict.COMMAND}{' --quick' if quick else ''}; load average at the end "
              f"{one_call.load:.1f}; {machine_summary()}")
        sys.exit(0)
    suite = serve_http.compare(quick=quick)
    print(format_table(serve_http.HEADERS, [r.row() for r in suite.runs], markdown=markdown))
    print()
    print(format_table(targets.HEADERS, targets.table_rows(serve_http.results(suite)), markdown=markdown))
    print()
    for o in suite.overloads:
        print(f"queue depth over time, overload {o.model} {o.variant} (max_queue {o.max_queue}): {o.depth_line()}")
    print(f"command: {serve_http.COMMAND}{' --quick' if quick else ''}; {machine_summary()}")
