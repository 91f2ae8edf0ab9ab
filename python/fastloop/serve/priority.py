"""The CPU priority of the service's worker threads.

"normal" leaves them as they are. "idle" puts each worker thread (only that thread) under
Linux's SCHED_IDLE policy: it runs on CPU time that no other thread wants. On a busy
machine a thread woken by a request (the HTTP front's event loop, its thread pool) then
preempts a worker at once, instead of waiting for the worker's time slice to end (~3 ms on
Linux 6.x, measured as the 429 and /healthz tails in benchmarks/bench_serve_http.py). The
price: any other busy process on the machine also preempts the workers, so use it where the
machine serves and little else.

    >>> check_priority("idle")          # at construction: ValueError if unsupported
    >>> apply_to_this_thread("idle")    # first thing in each worker thread
"""

from __future__ import annotations

import os

__all__ = ["PRIORITIES", "check_priority", "apply_to_this_thread"]

PRIORITIES = ("normal", "idle")


def check_priority(priority: str) -> str:
    """The priority, or ValueError naming what is wrong with it on this platform."""
    if priority not in PRIORITIES:
        raise ValueError(f"worker_priority must be one of {PRIORITIES}, not {priority!r}")
    if priority == "idle" and not hasattr(os, "SCHED_IDLE"):
        raise ValueError("worker_priority='idle' needs Linux's SCHED_IDLE scheduling policy, "
                         "which this platform does not have")
    return priority


def apply_to_this_thread(priority: str) -> None:
    """Applies `priority` to the calling thread; OSError if the kernel refuses."""
    if priority == "idle":
        # pid 0 is the calling thread on Linux (the scheduler works on threads, not processes).
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
