"""Admission: submit() and the queue slots a front reserves before parsing a request
(admit(), Admission), bounded by max_queue.
"""

from __future__ import annotations

import time
from typing import Any


from ..errors import Closed, QueueFull
from .jobs import FAILED, QUEUED, JobRecord, check_job_id
from .redisqueue import check_level
from ._deadlines import _check_timeout
from ._job_table import _Job
from ._persistence import _IN_DOUBT

__all__ = ["Admission"]


class Admission:
    """A queue slot reserved for one submit by InferenceService.admit(): a front that
    admits a request before parsing it answers every 429 at once, and a request it admitted
    is not refused later for a queue that filled meanwhile. ``submit(..., admission=a)``
    uses the slot; ``release()`` gives it back when no submit used it (a no-op otherwise, so
    call it in a ``finally``).

    >>> a = svc.admit()                   # None: the queue is full, answer 429
    >>> try: svc.submit(parse(body), admission=a)
    ... finally: a.release()
    """

    __slots__ = ("_service", "held")

    def __init__(self, service: "InferenceService", held: bool) -> None:
        self._service, self.held = service, held  # held: the slot is still reserved

    def release(self) -> None:
        if self.held:
            self._service._release(self)


class _Admitting:
    """submit(), admit() and reject_if_full() (a part of InferenceService)."""

    def submit(self, inputs: Any, job_id: str | None = None, timeout: float | None = None,
               priority: str = "normal", admission: Admission | None = None) -> str:
        """Queues one input; returns the job id (a new one, or `job_id`). An input with a
        leading batch axis over the model's row shape (e.g. (8, 784) for a model of 784
        inputs; a model with declared inputs or a fastloop.nn model) is one job of several
        rows: each row batches alone, they count as that many jobs against max_queue, and
        result() returns the rows in order.

        ``timeout`` (default: the service's): the job fails ("deadline exceeded ...")
        unless it has ended that many seconds after submit, whether it is still queued or
        running then (see the class docstring for what happens to the worker).

        Raises QueueFull at once when max_queue jobs wait, fastloop.Closed after close(),
        TypeError/ValueError for an input the model cannot take. Submitting a `job_id` that
        exists (queued, running or finished) returns it and queues nothing. ``priority``
        other than "normal" needs the queue in Redis (queue=RedisQueue(...)). ``admission``
        (from admit()): the slot it holds is used, so QueueFull is not raised; it is
        released whatever happens.
        """
        try:
            return self._submit(inputs, job_id, timeout, priority, admission)
        finally:
            if admission is not None:
                admission.release()

    def _submit(self, inputs: Any, job_id: str | None, timeout: float | None, priority: str,
                admission: Admission | None) -> str:
        if priority != "normal":
            check_level(priority)  # one that is no priority at all: its own message, naming them
            raise ValueError(f"priority={priority!r} needs a queue with priorities: create_service(..., queue=RedisQueue())")
        job_id = self.new_id() if job_id is None else check_job_id(job_id)
        timeout = self.timeout if timeout is None else _check_timeout(timeout)
        x, rows = self._spec.check_rows(inputs)
        if rows is not None and rows > self.max_queue:
            raise ValueError(f"inputs hold {rows} rows, more than the queue holds (max_queue={self.max_queue}): "
                             "send them in several requests")
        job = _Job(JobRecord.new(job_id, time.time(), x.shape, x.dtype.str, rows=rows), x)
        size = rows or 1  # queue slots the job takes: one per row
        if timeout is not None:
            job.deadline = job.t0 + timeout
            job.record.deadline = job.record.submitted + timeout  # stored: a restart keeps it
            self._any_deadline = True
        with self._lock:
            reserved = admission is not None and admission.held
            if reserved:  # the slot becomes this job's (or is freed below)
                admission.held = False  # type: ignore[union-attr]
                self._admitted -= 1
            if self._closed:
                raise Closed("submit() on a closed InferenceService")
            if job_id in self._jobs:
                return job_id
            # an admitted one-row job has its slot; the rest of a job of several rows must fit
            if (not reserved or size > 1) and self._queued + self._admitted + size > self.max_queue:
                self._stats.count("rejected")
                raise QueueFull(f"the service's queue is full ({self.max_queue} jobs waiting): retry later")
            self._jobs[job_id] = job
            self._queued += size
            self._gap += 0.1 * (job.t0 - self._arrived - self._gap)
            self._arrived = job.t0
            if job.deadline is not None:
                self._add_deadline(job)
        try:
            if job_id in self._in_doubt:  # the janitor must not remove it while this submit decides
                with self._doubt_lock:
                    self._in_doubt.pop(job_id, None)
                    created = self._create(job, x)
            else:
                created = self._create(job, x)
        except BaseException as error:
            if isinstance(error, _IN_DOUBT):
                # The store may have taken the create and lost its answer. The caller is told
                # "not accepted", so the janitor removes it once the store answers (unless a
                # retry of this id adopts it first). Other errors are the store's refusal.
                with self._doubt_lock:
                    self._in_doubt[job_id] = time.monotonic()
                self._wake.set()
            self._unreserve(job)
            raise
        if not created:  # the store knows this id: a finished job (or one recover() failed)
            self._unreserve(job)
            return job_id
        job.visible = True
        # "queued" before a worker can take the job: its "running" and "done" come from the
        # worker's thread, which with free threading may run them before this one goes on
        self._notify(job_id, QUEUED)
        items = job.items()
        for put, item in enumerate(items):
            try:
                self._queue.put_nowait(item)  # never full: _queued bounds what it holds
            except Closed:
                with self._lock:
                    self._queued -= len(items) - put
                self._end(job, QUEUED, FAILED, error="service closed before the job was queued")
                raise Closed("submit() on a closed InferenceService") from None
        self._stats.count("submitted")
        return job_id

    def admit(self) -> Admission | None:
        """A reserved queue slot for one submit, or None (counting a rejection) when
        max_queue jobs wait or hold a slot: a front calls it before parsing a request and
        answers 429 at once for None. Never blocks on the store. See Admission.

        >>> a = svc.admit()
        >>> if a is None: answer_429()
        """
        with self._lock:
            if self._closed:
                return Admission(self, held=False)  # submit() raises Closed
            if self._queued + self._admitted >= self.max_queue:
                self._stats.count("rejected")
                return None
            self._admitted += 1
        return Admission(self, held=True)

    def _release(self, admission: Admission) -> None:
        with self._lock:
            if admission.held:
                admission.held = False
                self._admitted -= 1

    def reject_if_full(self) -> bool:
        """True, counting a rejection, when max_queue jobs wait (or hold a slot from admit()):
        admit() without the reservation. The answer is as current as any answer to "is it
        full?" can be: a submit that follows may still find the queue full.

        >>> if svc.reject_if_full(): answer_429()
        """
        with self._lock:
            if self._queued + self._admitted >= self.max_queue and not self._closed:
                self._stats.count("rejected")
                return True
        return False
