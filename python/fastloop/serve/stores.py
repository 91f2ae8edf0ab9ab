"""Where an InferenceService keeps its jobs: the Store interface and MemoryStore.

A store holds one JobRecord per job, the job's input (when it ``keeps_inputs``, so that a
restarted service can run queued jobs again) and its result array. The service calls it
from several threads; each call is atomic. Per job the calls come in order (create, then
updates, then finish), never two at once. FileStore (filestore.py) keeps jobs in a
directory; a Redis store implements the same methods.

    >>> store = MemoryStore()
    >>> store.create(JobRecord.new("a", time.time()), None)
    True
"""

from __future__ import annotations

import abc
import dataclasses
import operator
import threading
from typing import Any, Callable

import numpy as np

from .jobs import DONE, EXPIRED, FINISHED, QUEUED, RUNNING, JobRecord

__all__ = ["Store", "MemoryStore"]


class Store(abc.ABC):
    """The interface every store implements."""

    #: whether create() keeps the input, so that recover() can hand queued jobs back to run
    keeps_inputs: bool = False
    #: whether finish_many() writes a batch for less than its jobs one by one (Redis: one
    #: round trip); otherwise the service finishes a batch's jobs one by one, waking each
    #: job's caller as soon as its own result is stored
    writes_batches: bool = False

    @abc.abstractmethod
    def create(self, record: JobRecord, inputs: np.ndarray | None) -> bool:
        """Records a new job (status queued) and its input, atomically. Returns False, and
        changes nothing, when a job with that id exists already (submit is idempotent)."""

    @abc.abstractmethod
    def update(self, record: JobRecord) -> None:
        """Replaces the record of an existing job (a status change)."""

    @abc.abstractmethod
    def finish(self, record: JobRecord, result: np.ndarray | None) -> None:
        """Stores the result (for a done job) and then the final record: a reader that sees
        "done" finds the result."""

    def update_many(self, records: list[JobRecord]) -> list[Exception | None]:
        """update() for each record (a batch that starts running): what each one raised, or
        None when written. It may also raise, for all of them (the store is down). The
        default calls update() in turn; a store that can write several in one go (Redis: one
        round trip) overrides it."""
        return [_outcome(self.update, record) for record in records]

    def finish_many(self, items: list[tuple[JobRecord, np.ndarray | None]]) -> list[Exception | None]:
        """finish(record, result) for each item (a batch that ended), as update_many does."""
        return [_outcome(self.finish, record, result) for record, result in items]

    @abc.abstractmethod
    def get(self, job_id: str) -> JobRecord:
        """The job's record; KeyError for an unknown (or forgotten) id, StoreError for an
        unreadable one."""

    def get_with_result(self, job_id: str) -> tuple[JobRecord, np.ndarray | None]:
        """The job's record and, when it is done, its result (None when it is not done or
        its result is gone); KeyError for an unknown id. One read where the store allows it
        (Redis: one round trip): a front answering a result calls it once per request."""
        record = self.get(job_id)
        if record.status != DONE:
            return record, None
        try:
            return record, self.get_result(job_id)
        except KeyError:  # expired since the record was read
            return record, None

    @abc.abstractmethod
    def get_input(self, job_id: str) -> np.ndarray | None:
        """The stored input, or None when the store does not keep it (any more)."""

    @abc.abstractmethod
    def get_result(self, job_id: str) -> np.ndarray:
        """The result of a done job; KeyError when there is none."""

    @abc.abstractmethod
    def delete(self, job_id: str) -> None:
        """Forgets a job (nothing happens for an unknown id)."""

    @abc.abstractmethod
    def expire(self, now: float, ttl_s: float, forget_after_s: float) -> list[str]:
        """Marks done/failed jobs finished before ``now - ttl_s`` expired (dropping result and
        input) and forgets jobs expired before ``now - forget_after_s``. Returns the ids it
        marked expired."""

    @abc.abstractmethod
    def recover(self) -> list[JobRecord]:
        """The jobs a previous process left queued or running, oldest submit first. Called
        once, when a service starts on this store. Unreadable records are reported in
        ``problems`` (and by a warning), not skipped silently."""

    def close(self) -> None:
        """Releases the store (files, connections). The default does nothing."""

    @property
    def problems(self) -> list[str]:
        """What the store could not read (each naming the path or key)."""
        return []


def _outcome(write: Callable[..., None], *args: Any) -> Exception | None:
    try:
        write(*args)
    except Exception as error:
        return error
    return None


class MemoryStore(Store):
    """Jobs in a dict, for tests and for a service whose jobs need not outlive the process.

    Records are kept as tuples of their fields (strings, numbers, None), which the garbage
    collector stops tracking: a full collection over 180k finished jobs' records (the default
    10-minute TTL at 300 jobs/s) took ~38 ms as JobRecord objects, a stall of every thread
    of the server, and ~0 ms as tuples.

    >>> svc = InferenceService(model, store=MemoryStore())
    """

    keeps_inputs = False  # nothing survives the process, so nothing is ever requeued

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: dict[str, tuple[Any, ...]] = {}  # id -> the JobRecord's field values
        self._results: dict[str, np.ndarray] = {}

    def create(self, record: JobRecord, inputs: np.ndarray | None) -> bool:
        with self._lock:
            if record.id in self._records:
                return False
            self._records[record.id] = _fields(record)
            return True

    def update(self, record: JobRecord) -> None:
        with self._lock:
            if record.id not in self._records:
                raise KeyError(record.id)
            self._records[record.id] = _fields(record)

    def finish(self, record: JobRecord, result: np.ndarray | None) -> None:
        with self._lock:
            if result is not None:
                self._results[record.id] = result
            self._records[record.id] = _fields(record)

    def get(self, job_id: str) -> JobRecord:
        with self._lock:
            return JobRecord(*self._records[job_id])

    def get_input(self, job_id: str) -> np.ndarray | None:
        return None

    def get_result(self, job_id: str) -> np.ndarray:
        with self._lock:
            return self._results[job_id]

    def delete(self, job_id: str) -> None:
        with self._lock:
            self._records.pop(job_id, None)
            self._results.pop(job_id, None)

    def expire(self, now: float, ttl_s: float, forget_after_s: float) -> list[str]:
        # In chunks, the lock let go between them: the HTTP front submits on its event loop
        # to this store, and one hold over every record (0.4 us each: ~0.5 s at 1.2M, ten
        # minutes of results at 2,000 jobs/s) would stall the loop that long.
        expired = []
        with self._lock:
            ids = list(self._records)
        for start in range(0, len(ids), _SWEEP_CHUNK):
            with self._lock:
                for job_id in ids[start:start + _SWEEP_CHUNK]:
                    fields = self._records.get(job_id)
                    if fields is None:
                        continue
                    status, finished = fields[_STATUS], fields[_FINISHED]
                    if status in FINISHED and finished is not None and finished <= now - ttl_s:
                        rec = JobRecord(*fields)
                        rec.status, rec.expired_at = EXPIRED, now
                        self._records[job_id] = _fields(rec)
                        self._results.pop(job_id, None)
                        expired.append(job_id)
                    elif status == EXPIRED and (fields[_EXPIRED_AT] or 0.0) <= now - forget_after_s:
                        del self._records[job_id]
        return expired

    def recover(self) -> list[JobRecord]:
        with self._lock:
            left = [JobRecord(*fields) for fields in self._records.values()]
        return sorted((r for r in left if r.status in (QUEUED, RUNNING)), key=lambda r: r.submitted)

    def __repr__(self) -> str:
        return f"MemoryStore({len(self._records)} jobs)"


_FIELDS = tuple(field.name for field in dataclasses.fields(JobRecord))
_STATUS, _FINISHED, _EXPIRED_AT = (_FIELDS.index(name) for name in ("status", "finished", "expired_at"))
_SWEEP_CHUNK = 4096  # records MemoryStore.expire looks at per hold of its lock (~1 ms)


_fields_of = operator.attrgetter(*_FIELDS)  # one C call, not a generator of getattr (per status change)


def _fields(record: JobRecord) -> tuple[Any, ...]:
    """The record's field values in declaration order (JobRecord(*fields) rebuilds it)."""
    return _fields_of(record)
