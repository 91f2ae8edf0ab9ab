"""The worker loop: take a batch from the queue (dynamic batching: batching.collect), fail
what is past its deadline, start the rest, run the model once per group of equal inputs and
end each job with its row.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

from ..errors import Closed
from .batching import collect, group_by_input, run_group
from .priority import apply_to_this_thread

__all__: list[str] = []


class _Workers:
    """The worker threads' loop (a part of InferenceService)."""

    def _worker(self, number: int) -> threading.Thread:
        return threading.Thread(target=self._work, name=f"fastloop-serve-worker-{number}", daemon=True)

    def _work(self) -> None:
        """A worker: collect a batch, start its jobs, run each same-shape group, store rows.
        A worker replaced while stuck past a deadline ends once its model call returns."""
        try:
            apply_to_this_thread(self.worker_priority)
        except OSError as error:  # e.g. a sandbox that forbids it: serve at normal priority
            warnings.warn(f"InferenceService: worker_priority={self.worker_priority!r} refused by the system "
                          f"({error}); this worker runs at normal priority", RuntimeWarning, stacklevel=2)
        while True:
            try:  # items: jobs of one row, and rows (rows.Row) of jobs of several
                items = collect(self._queue, self.max_batch, self.max_delay_s, more_coming=self._more_coming)
            except Closed:
                return
            with self._lock:
                self._queued -= len(items)
                self._held += len(items)
            try:
                self._handle(items)
            finally:
                with self._lock:
                    self._held -= len(items)
            if self._leave_if_stuck():
                return

    def _handle(self, items: list[Any]) -> None:
        """A taken batch: fails what is past its deadline, starts the rest, runs each group of
        equal rows and stores the outcomes."""
        if self._abandon:
            return  # close() fails them
        if self._any_deadline:  # one taken past its deadline fails here, never runs
            now = time.monotonic()
            items = [item for item in items if item.job.deadline is None or item.job.deadline > now
                     or not self._fail_queued_late(item.job, now)]
        started = self._start_all(items)
        if len(started) == 1:  # a lone job: its own group
            self._run(started)
            return
        for group in group_by_input(started, lambda item: item.key):
            self._run(group)

    def _more_coming(self, holding: int) -> bool:
        """Whether a batch still filling (this worker holds `holding` items) should wait for
        more; the HTTP front's rule, in process too: when a request is on its way (admitted by
        a front, not yet submitted: admit()), or jobs arrive less than max_delay_s apart while
        others than this batch's are in progress (queued, or held by another worker: many
        clients). So a lone caller's job runs at once instead of waiting max_delay_s, and
        clients that submit and fetch in two requests still fill batches."""
        if self._admitted > 0:
            return True
        others = self._queued - holding + self._held  # _queued still counts the items this worker holds
        return self._gap < self.max_delay_s and others > 0

    def _run(self, group: list[Any]) -> None:
        me = threading.current_thread()
        self._busy[me] = group
        try:
            outcomes = run_group(self._runner, [item.x for item in group])
        except BaseException as error:  # np.stack and the like; the model's own are caught in run_group
            outcomes = [(None, f"{type(error).__name__}: {error}")] * len(group)
        finally:
            self._call_ended(me)
        self._stats.batch(len(group))
        self._end_all(group, outcomes)
