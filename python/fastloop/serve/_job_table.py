"""The job table: each unfinished job (_Job) and its status changes (queued -> running ->
done/failed), with their store writes batched per model call. InferenceService holds the
state (``_lock``, ``_jobs``, ``_unsaved``, ``_stats``, ``_listeners``, ``store``); this part
changes it. Each job's own lock orders its status changes and their store writes.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any, Callable

import numpy as np

from .jobs import DONE, EXPIRED, FAILED, FINISHED, QUEUED, RUNNING, JobRecord, StoreError
from .rows import Row, assemble

__all__: list[str] = []


class _Finished:
    """A job's end, waited for by result(): threading.Event's interface (set, is_set, wait)
    on one lock held until the job ends. An Event builds a Condition per job and a waiter
    lock per wait(): ~6x the cost, on every job's path (measured: 3.0 us -> 0.5 us)."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._set = False
        self._lock = threading.Lock()
        self._lock.acquire()  # released by set(): every waiter then takes and gives it back in turn

    def set(self) -> None:
        if not self._set:  # once: _ended runs once per job, after its status turned final
            self._set = True
            self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """True once set (at once if it was), False after `timeout` seconds; the lock, not
        the flag, answers, so a True orders what set() followed (free threading too)."""
        if self._lock.acquire(timeout=-1 if timeout is None else timeout):
            self._lock.release()
            return True
        return False


class _Job:
    """An unfinished job: its record (the truth while it is in memory), input, and an event
    set when it finishes. A job of one row is its own queue item (``job``, ``x``, ``key``);
    a job of several queues one Row per row (rows.py), their outcomes gathered in ``outs``."""

    __slots__ = ("record", "inputs", "result", "lock", "finished", "visible", "t0", "deadline", "outs", "left",
                 "watchers")

    def __init__(self, record: JobRecord, inputs: np.ndarray) -> None:
        self.record, self.inputs = record, inputs
        self.result: np.ndarray | None = None  # kept only while the store cannot take it
        self.lock = threading.Lock()
        self.finished = _Finished()  # set once the job has ended
        self.visible = False  # recorded in the store (status() answers for it)
        self.t0 = time.monotonic()
        self.deadline: float | None = None  # time.monotonic() by which it must have ended
        rows = record.rows or 0
        self.outs: list[Any] = [None] * rows  # each row's (output, error), once it has run
        self.left = rows  # rows not yet run
        self.watchers: list[Callable[[JobRecord, Any], None]] = []  # watch(): called once it ends

    @property
    def job(self) -> "_Job":
        return self

    @property
    def x(self) -> np.ndarray:
        return self.inputs

    @property
    def key(self) -> tuple[tuple[int, ...], str]:
        return self.inputs.shape, self.inputs.dtype  # a structured dtype holds its fields' shapes

    def items(self) -> list[Any]:
        """What the queue holds for this job: itself, or one Row per row."""
        return [Row(self, i) for i in range(self.record.rows)] if self.record.rows else [self]


class _JobTable:
    """The status changes of InferenceService's jobs (a part of it: see service.py)."""

    def _status_of(self, record: JobRecord) -> str:
        if record.status in FINISHED and record.finished is not None \
                and record.finished <= time.time() - self.result_ttl_s:
            return EXPIRED  # due; the janitor drops the result soon
        return record.status

    def _unreserve(self, job: _Job) -> None:
        with self._lock:
            if self._jobs.get(job.record.id) is job:
                del self._jobs[job.record.id]
            self._queued -= job.record.rows or 1
    def _start_all(self, items: list[Any]) -> list[Any]:
        """queued -> running for the jobs of a batch's items, recorded in one store call
        (update_many); returns the items whose job runs (started now, or a job of several
        rows an earlier row started), not those cancelled (or failed) meanwhile."""
        jobs = list(dict.fromkeys(item.job for item in items))
        _acquire_all(jobs)
        try:
            started = [job for job in jobs if job.record.status == QUEUED]
            now = time.time()
            records = [_changed(job.record, RUNNING, started=now) for job in started]
            errors = _each_outcome(self.store.update_many, records)
            refused = [(record.id, error) for record, error in zip(records, errors) if error is not None]
            if refused:  # the job runs anyway; a restart would find it queued and run it again
                self._stats.count("store_errors", len(refused))
                warnings.warn(f"InferenceService: could not record {len(refused)} job(s) as running "
                              f"(first: {refused[0][0]!r}: {refused[0][1]})", RuntimeWarning, stacklevel=2)
            for job, record in zip(started, records):
                job.record = record
            running = [item for item in items if item.job.record.status == RUNNING]
        finally:
            _release_all(jobs)
        for job in started:
            self._notify(job.record.id, RUNNING)
        return running

    def _end(self, job: _Job, expected: str, status: str, result: np.ndarray | None = None,
             error: str | None = None, cancelled: bool = False, row_errors: list[list[Any]] | None = None) -> bool:
        """expected -> done/failed, stored; False (nothing done) if the job was elsewhere."""
        with job.lock:
            if job.record.status != expected:
                return False
            record = copy_record(job.record)
            record.status, record.finished, record.error, record.cancelled = status, time.time(), error, cancelled
            record.row_errors = row_errors
            self._count_end(job, record)
            stored = self._store_final(record, result)
            self._keep(job, record, stored, result)
        self._ended(job, stored is not None, result)
        return True

    def _end_all(self, items: list[Any], outcomes: list[tuple[np.ndarray | None, str | None]]) -> None:
        """running -> done/failed for a batch's jobs, their final records (and rows) stored in
        one store call (finish_many); jobs no longer running (failed by close) are skipped.
        A store that gains nothing from it (writes_batches False) gets them one by one. A
        row of a job of several is kept until the job's last row has run (_rows_ended)."""
        jobs, finals = self._rows_ended(items, outcomes)
        if not self.store.writes_batches:
            for job, (row, error, row_errors) in zip(jobs, finals):
                self._end(job, RUNNING, DONE if error is None else FAILED, result=row, error=error,
                          row_errors=row_errors)
            return
        _acquire_all(jobs)
        try:
            now, ending = time.time(), []
            for job, (row, error, row_errors) in zip(jobs, finals):
                if job.record.status == RUNNING:
                    record = _changed(job.record, DONE if error is None else FAILED, finished=now, error=error,
                                      row_errors=row_errors)
                    ending.append((job, record, row if error is None else None))
                    self._count_end(job, record)
            items = [(record, row) for _, record, row in ending]
            errors = _each_outcome(self.store.finish_many, items)
            # A refused job is written again alone: a pipeline cut by an outage may take it now
            saved = [record if error is None else self._store_final(record, row)
                     for (record, row), error in zip(items, errors)]
            for (job, record, row), stored in zip(ending, saved):
                self._keep(job, record, stored, row)
        finally:
            _release_all(jobs)
        for (job, _, row), stored in zip(ending, saved):
            self._ended(job, stored is not None, row=row)

    @staticmethod
    def _rows_ended(items: list[Any], outcomes: list[tuple[Any, str | None]]) -> tuple[list[_Job], list[Any]]:
        """The jobs that ended with this batch and their (result, error, row_errors): a job of
        one row with its outcome; a job of several once its last row has run (rows.assemble).
        Rows of a job no longer running (failed meanwhile) are dropped."""
        jobs, finals = [], []
        for item, (row, error) in zip(items, outcomes):
            if item is item.job:
                jobs.append(item)
                finals.append((row, error, None))
                continue
            job = item.job
            with job.lock:
                if job.record.status != RUNNING or job.outs[item.index] is not None:
                    continue
                job.outs[item.index] = (row, error)
                job.left -= 1
                if job.left:
                    continue
            jobs.append(job)
            finals.append(assemble(job.outs))
        return jobs, finals

    @staticmethod
    def _keep(job: _Job, record: JobRecord, stored: JobRecord | None, result: np.ndarray | None) -> None:
        """Under job.lock: the job's final record (as stored, or as meant when the store is
        down: then the janitor saves it later, and status() answers from memory meanwhile)."""
        job.record, job.inputs = stored or record, None
        if stored is None:
            job.result = result

    def _count_end(self, job: _Job, record: JobRecord) -> None:
        """Counts a job's end in stats() before its final record is stored: a caller that
        sees the job done (result(), status(), another process reading the store) finds it
        counted too."""
        if record.status == DONE:
            self._stats.done(time.monotonic() - job.t0)
        else:
            self._stats.count("cancelled" if record.cancelled else "failed")

    def _ended(self, job: _Job, saved: bool, row: np.ndarray | None = None) -> None:
        """After a job's final record is kept (and counted: _count_end): drop it from memory
        (or hand it to the janitor), wake result(), the watchers (with the result `row`) and
        the listeners."""
        record = job.record
        with self._lock:
            if saved:
                self._jobs.pop(record.id, None)
            else:
                self._unsaved[record.id] = job
                self._wake.set()
        job.finished.set()
        for watcher in job.watchers:  # set before the status turned final, under job.lock
            try:
                watcher(record, row if record.status == DONE else None)
            except Exception:
                self._stats.count("listener_errors")
        self._notify(record.id, record.status)

    def _fail_all(self, expected: str, reason: str) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            if job.visible:
                self._end(job, expected, FAILED, error=reason)

    def _notify(self, job_id: str, status: str) -> None:
        for listener in self._listeners:
            try:
                listener(job_id, status)
            except Exception:
                self._stats.count("listener_errors")


def _acquire_all(jobs: list[_Job]) -> None:
    """Takes every job's lock. Only a worker holds several, its own batch's; two batches share
    only jobs of several rows, and the locks are taken in one global order (by id), so no two
    workers wait on each other."""
    for job in sorted(jobs, key=id):
        job.lock.acquire()


def _release_all(jobs: list[_Job]) -> None:
    for job in jobs:
        job.lock.release()


def copy_record(record: JobRecord) -> JobRecord:
    """A copy of `record` (a store keeps what it is given): its fields copied as they are,
    without JobRecord(**vars(record))'s keyword call (twice as slow; two copies per job)."""
    new = _new_record(JobRecord)
    new.__dict__.update(record.__dict__)
    return new


_new_record = JobRecord.__new__


def _changed(record: JobRecord, status: str, **fields: Any) -> JobRecord:
    """A copy of `record` with a new status and other fields (a store keeps what it is given)."""
    new = copy_record(record)
    new.status = status
    for name, value in fields.items():
        setattr(new, name, value)
    return new


def _each_outcome(write_many: Callable[[list[Any]], list[Exception | None]], items: list[Any]) -> list[Exception | None]:
    """A store's *_many call: what each item got (None: written); if the call itself raised
    (the store is down), that error for every item."""
    if not items:
        return []
    try:
        errors = write_many(items)
    except Exception as error:
        return [error] * len(items)
    if len(errors) != len(items):  # a store that broke the contract: trust none of its writes
        return [StoreError(f"{getattr(write_many, '__qualname__', write_many)} answered {len(errors)} "
                           f"outcomes for {len(items)} items")] * len(items)
    return errors
