"""Reading a job: status(), record(), result() (waiting for it), watch() and the
record-and-row answer a front gives (_outcome).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from .jobs import DONE, EXPIRED, QUEUED, RUNNING, JobCancelled, JobExpired, JobFailed, JobRecord, RowsFailed
from .outputs import unpack
from .rows import row_errors_of
from ._job_table import copy_record

__all__: list[str] = []

_WAIT_SLICE_S = 0.1  # result() waits in slices so that Ctrl-C gets through at once


class _Results:
    """A job's status and outcome (a part of InferenceService)."""

    def status(self, job_id: str) -> str:
        """"queued", "running", "done", "failed" or "expired"; KeyError for an unknown id."""
        with self._lock:
            job = self._jobs.get(job_id)
        if job is not None and job.visible:
            return job.record.status
        return self._status_of(self.store.get(job_id))

    def record(self, job_id: str) -> JobRecord:
        """The job's record (status, times, error, input shape/dtype); KeyError if unknown."""
        with self._lock:
            job = self._jobs.get(job_id)
        if job is not None and job.visible:
            with job.lock:
                return copy_record(job.record)
        record = self.store.get(job_id)
        record.status = self._status_of(record)
        return record

    def result(self, job_id: str, timeout: float | None = None) -> Any:
        """Waits until the job finishes; returns its output row (a dict or tuple of arrays
        for a model that returns one); for a job of several rows, their outputs stacked in
        order.

        Raises TimeoutError after `timeout` seconds, JobFailed (JobCancelled) carrying the
        reason for a failed (cancelled) job, RowsFailed (a JobFailed: ``.errors`` by row,
        ``.result`` with the others' outputs) when some rows of a job of several failed,
        JobExpired once its result was dropped, KeyError for an unknown id. Ctrl-C
        interrupts the wait.
        """
        return unpack(self._result_row(job_id, timeout))

    def _result_row(self, job_id: str, timeout: float | None) -> np.ndarray:
        """result() as stored: one array (structured for dict/tuple outputs)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            job = self._jobs.get(job_id)
        if job is not None:
            while not job.finished.wait(_slice(deadline)):
                if deadline is not None and time.monotonic() >= deadline:
                    # The status turns terminal just before the job is stored and `finished`
                    # set: a caller that saw "done" must get the result, not a timeout.
                    if job.record.status in (QUEUED, RUNNING) or not job.finished.wait(1.0):
                        raise TimeoutError(f"job {job_id!r} did not finish within {timeout} s "
                                           f"(status: {job.record.status})")
                    break
        with self._lock:
            unsaved = self._unsaved.get(job_id)
        if unsaved is not None and unsaved.result is not None:  # done while the store was down
            return unsaved.result.copy()
        if unsaved is not None:
            record = unsaved.record
        elif job is not None and job.finished.is_set():  # ended here and stored: its final record as stored
            record = job.record
        else:
            record = self.store.get(job_id)
        while record.status in (QUEUED, RUNNING):  # run by another process sharing the store
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id!r} did not finish within {timeout} s (status: {record.status})")
            time.sleep(min(0.02, _slice(deadline)))
            record = self.store.get(job_id)
        status = self._status_of(record)
        if status == DONE:
            try:
                row = self.store.get_result(job_id)
            except KeyError:  # expired since we read the record
                status = EXPIRED
            else:
                if record.row_errors:
                    raise RowsFailed(job_id, row_errors_of(record), unpack(row), record.rows)
                return row
        if status == EXPIRED:
            raise JobExpired(job_id, f"job {job_id!r} expired: its result was kept {self.result_ttl_s:g} s")
        if record.cancelled:
            raise JobCancelled(job_id, record.error or "cancelled")
        raise JobFailed(job_id, record.error or "unknown error")

    def _outcome(self, job_id: str) -> tuple[JobRecord, np.ndarray | None]:
        """record() and, for a done job, its result row (None otherwise, or when it is gone):
        what a front answers a result request with, in one store read where the store allows
        it. KeyError for an unknown id."""
        with self._lock:
            job, unsaved = self._jobs.get(job_id), self._unsaved.get(job_id)
        if unsaved is not None:  # ended while the store was down: memory has the truth
            record, row = copy_record(unsaved.record), unsaved.result
        elif job is not None and job.visible and job.record.status in (QUEUED, RUNNING):
            with job.lock:
                record, row = copy_record(job.record), None
            if record.status not in (QUEUED, RUNNING):  # ended meanwhile: the store has it
                record, row = self.store.get_with_result(job_id)
        else:
            record, row = self.store.get_with_result(job_id)
        record.status = self._status_of(record)
        return record, (row if record.status == DONE else None)

    def watch(self, job_id: str, callback: Callable[[JobRecord, Any], None]) -> bool:
        """Calls ``callback(record, row)`` once the job ends (row: its result when done, else
        None), on the thread that ended it, after its final record is stored; False (and
        nothing registered) when the job is not running or queued in this process: it has
        ended, or another process holds it, and the caller reads its outcome itself. A
        callback must be quick and must not block (hand the result to a loop). This is how
        POST /v1/predict waits without a poll or a store read."""
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None or not job.visible:
            return False
        with job.lock:
            if job.record.status not in (QUEUED, RUNNING):
                return False
            job.watchers.append(callback)
        return True


def _slice(deadline: float | None) -> float:
    if deadline is None:
        return _WAIT_SLICE_S
    return max(0.0, min(_WAIT_SLICE_S, deadline - time.monotonic()))
