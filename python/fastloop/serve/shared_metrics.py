"""The /metrics families of the queue in Redis (a SharedInferenceService's stats()): queue
depth per priority across all processes, queue waits per priority of the jobs this process
started, and the entries this process reclaimed from stopped workers. Empty for the
in-memory queue.

    >>> print(render_shared(svc.stats()))
    # HELP fastloop_serve_queue_depth_by_priority Jobs waiting in the shared queue, all processes.
    ...
"""

from __future__ import annotations

from typing import Any

from .metrics_text import _Out

__all__ = ["render_shared"]


def render_shared(stats: dict[str, Any]) -> str:
    if "queue_depth_by_priority" not in stats:
        return ""
    out = _Out()
    out.family("fastloop_serve_queue_depth_by_priority", "gauge",
               "Jobs waiting in the shared queue, all processes, by priority.")
    for level, n in stats["queue_depth_by_priority"].items():
        out.sample("fastloop_serve_queue_depth_by_priority", n, priority=level)
    out.family("fastloop_serve_queue_wait_seconds", "summary",
               "Submit-to-start wait of the jobs this process started, by priority; quantiles over the last 10^4.")
    for level, wait in stats["wait_ms_by_priority"].items():
        for quantile, key in (("0.5", "p50"), ("0.99", "p99")):
            out.sample("fastloop_serve_queue_wait_seconds", wait[key] / 1e3, priority=level, quantile=quantile)
        out.sample("fastloop_serve_queue_wait_seconds_count", wait["samples"], priority=level)
    out.family("fastloop_serve_reclaimed_total", "counter",
               "Jobs of stopped workers this process reclaimed: rerun (still queued) or failed (were running).")
    for outcome, n in stats["reclaimed"].items():
        out.sample("fastloop_serve_reclaimed_total", n, outcome=outcome)
    return "\n".join(out.lines) + "\n"
