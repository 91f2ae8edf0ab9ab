"""Deadlines and stuck workers: a job past its deadline fails, queued or running; a worker
whose model call holds such a job is counted stuck and replaced by a new thread, and rejoins
(or ends) once its call returns, so the worker count always comes back to ``num_workers``.
Also the janitor thread that enforces them, rewrites held-back final records and expires
old results.
"""

from __future__ import annotations

import heapq
import threading
import time
import warnings

from .jobs import EXPIRED, FAILED, QUEUED, RUNNING
from ._job_table import _Job

__all__: list[str] = []

_RESAVE_S = 0.25  # while the store holds back final records, how often the janitor retries them
_DEADLINE_TICK_S = 0.02  # with the queue in Redis, while jobs have deadlines, how often the janitor looks


class _Deadlines:
    """Deadlines, stuck workers and the janitor (a part of InferenceService)."""

    def _add_deadline(self, job: _Job) -> None:
        """Under _lock: the janitor will look at `job` at its deadline (woken now when that is
        the next one). A heap, so a tick costs nothing while no deadline is due: POST
        /v1/predict gives every job one, and scanning every job each 20 ms cost a share of
        a core under load."""
        if len(self._deadlines) > 2 * len(self._jobs) + 64:  # mostly jobs that ended: drop them (amortized O(1))
            self._deadlines = [entry for entry in self._deadlines if entry[2].record.status in (QUEUED, RUNNING)]
            heapq.heapify(self._deadlines)
        heapq.heappush(self._deadlines, (job.deadline, next(self._deadline_seq), job))  # type: ignore[arg-type]
        if self._deadlines[0][2] is job:
            self._wake.set()

    def _deadline_wait(self) -> float | None:
        """Seconds until the janitor must look for late jobs (None: no deadline pending)."""
        with self._lock:
            if not self._deadlines:
                return None
            return max(0.0, self._deadlines[0][0] - time.monotonic())

    def _enforce_deadlines(self) -> None:
        """The janitor's: fails queued and running jobs past their deadline; a worker whose
        model call holds such a job is replaced by a new one (Python cannot stop a thread:
        the stuck one ends when its call returns), up to `num_workers` stuck at once."""
        now = time.monotonic()
        late = []
        with self._lock:
            while self._deadlines and self._deadlines[0][0] <= now:
                job = heapq.heappop(self._deadlines)[2]
                if job.visible and job.record.status in (QUEUED, RUNNING):
                    late.append(job)
        for job in late:
            if not self._fail_queued_late(job, now) and \
                    self._end(job, RUNNING, FAILED, error=f"deadline exceeded: the model call was still running "
                                                          f"{now - job.t0:.3g} s after submit"):
                self._stats.count("deadline_exceeded")
        for thread, group in list(self._busy.items()):
            if thread not in self._stuck and any(item.job.deadline is not None and item.job.deadline <= now
                                                 for item in group):
                self._replace_stuck(thread)

    def _replace_stuck(self, thread: threading.Thread) -> None:
        """Counts `thread` stuck in a model call past a deadline and starts a worker in its
        place, unless `num_workers` stuck ones are in their calls already (health() says
        "degraded" until one returns: _leave_if_stuck). Nothing if its call returned meanwhile."""
        with self._pool_lock:
            if thread not in self._busy or thread in self._stuck:
                return
            self._stuck.add(thread)
            self._stats.count("workers_stuck")
            self._threads = [t for t in self._threads if t.is_alive()]  # replacements come and go
            if len(self._stuck) > self.num_workers or self._closed or self._serving() >= self.num_workers:
                return
            replacement = self._worker(next(self._worker_numbers))
            self._threads = self._threads + [replacement]
            replacement.start()
        warnings.warn(f"InferenceService: {thread.name} is stuck in a model call past a job's deadline; "
                      f"{replacement.name} replaces it", RuntimeWarning, stacklevel=2)

    def _serving(self) -> int:
        """Workers serving the queue: alive and not stuck in a model call."""
        return sum(t.is_alive() for t in self._threads if t not in self._stuck)

    def _call_ended(self, me: threading.Thread) -> None:
        """A worker's model call returned: from now on the janitor does not count it stuck."""
        with self._pool_lock:
            self._busy.pop(me, None)

    def _leave_if_stuck(self) -> bool:
        """A worker back from model calls: True when it must end. One that was stuck ends if
        its replacement serves; it serves again when fewer than ``num_workers`` do (more were
        stuck at once than could be replaced), so the count always comes back to ``num_workers``
        once the stuck calls return: a client's deadline costs no capacity past its call."""
        me = threading.current_thread()
        if me not in self._stuck:
            return False
        with self._pool_lock:
            self._stuck.discard(me)
            if self._serving() <= self.num_workers:  # itself counted: it rejoins
                return False
            self._threads = [t for t in self._threads if t is not me]
            return True

    def _fail_queued_late(self, job: _Job, now: float) -> bool:
        """A queued job past its deadline fails; False (nothing done) if it is not queued."""
        if not self._end(job, QUEUED, FAILED, error=f"deadline exceeded: still queued after {now - job.t0:.3g} s"):
            return False
        self._stats.count("deadline_exceeded")
        return True

    def _sweep(self) -> None:
        """The janitor: writes the final records a store outage held back (every _RESAVE_S),
        marks old results expired and forgets old expired jobs."""
        interval = min(max(self.result_ttl_s / 4, 0.05), 5.0)
        next_sweep = time.monotonic() + interval
        while not self._stop.is_set():
            wait = _RESAVE_S if self._unsaved or self._in_doubt else max(0.0, next_sweep - time.monotonic())
            due = self._deadline_wait()
            self._wake.wait(wait if due is None else min(wait, due))
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._deadlines_used():
                self._enforce_deadlines()
            if self._unsaved:
                self._save_unsaved()
            if self._in_doubt:
                self._resolve_in_doubt()
            if time.monotonic() < next_sweep:
                continue
            next_sweep = time.monotonic() + interval
            try:
                expired = self.store.expire(time.time(), self.result_ttl_s, self.expired_ttl_s)
            except Exception as error:
                self._stats.count("store_errors")
                warnings.warn(f"InferenceService: expiring old jobs failed: {error}", RuntimeWarning, stacklevel=2)
                continue
            self._stats.count("expired", len(expired))
            for job_id in expired:
                self._notify(job_id, EXPIRED)

    def _deadlines_used(self) -> bool:
        return self.timeout is not None or self._any_deadline


def _check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout (timeout_s over HTTP) must be a number of seconds > 0 (or None), not {timeout!r}")
    return float(timeout)
