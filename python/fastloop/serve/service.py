"""InferenceService: submit inputs, a few worker threads run the model on dynamic batches,
results go to a store, callers poll status() or wait in result().

    >>> with InferenceService(model, workers=2, max_batch=32) as svc:
    ...     job = svc.submit(x)                  # x: one sample, e.g. float32 (784,)
    ...     y = svc.result(job, timeout=5.0)     # its row of model(batch)

Threads: ``workers`` Python threads pop jobs from a fastloop.Queue (its waits release the
GIL) and call the model (a fastloop.nn model computes with the GIL released), and one
janitor thread expires old results. ``_lock`` guards the table of unfinished jobs and the
count of queued ones; each job's own lock orders its status changes and their store writes.
Status listeners run on whichever thread changed the status.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import warnings
from typing import Any, Callable

import numpy as np

from .. import _lifecycle
from .._core import Queue
from ..errors import Closed, QueueFull
from .batching import collect, group_by_input, run_group
from .filestore import FileStore
from .outputs import unpack
from .runners import runner_for
from .spec import Input, Spec, spec_for
from .jobs import (DONE, EXPIRED, FAILED, FINISHED, QUEUED, RUNNING, JobCancelled, JobExpired, JobFailed,
                   JobRecord, RowsFailed, StoreError, check_job_id, new_job_id)
from .priority import apply_to_this_thread, check_priority
from .rows import Row, assemble, row_errors_of
from .redisqueue import check_level
from .redisstore import StoreUnavailable
from .stats import ServiceStats
from .stores import Store

__all__ = ["InferenceService", "Admission"]

Listener = Callable[[str, str], None]

_WAIT_SLICE_S = 0.1  # result() waits in slices so that Ctrl-C gets through at once
_CLOSE_GRACE_S = 2.0  # after drain_s, how long close() waits for a model call in progress
_RESAVE_S = 0.25  # while the store holds back final records, how often the janitor retries them
_DEADLINE_TICK_S = 0.02  # with the queue in Redis, while jobs have deadlines, how often the janitor looks
_IN_DOUBT = (StoreUnavailable, ConnectionError, TimeoutError)  # a create that may have been applied
RESTARTED_RUNNING = "server restarted while the job was running"
RESTARTED_NO_INPUT = "server restarted before the job ran, and the store kept no input to run it"


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
        self.finished = threading.Event()
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


class InferenceService:
    """A bounded queue of inference jobs served by worker threads with dynamic batching.

    ``model``: a fastloop.nn model (inputs are checked against its in_features and dtype at
    submit), a torch ``nn.Module`` (TorchScript too: it gets tensors and runs under
    ``torch.inference_mode()``; ``eval()`` is yours to call) or any callable taking a NumPy
    batch (N, ...) and returning N rows; with workers > 1 a plain callable must be
    thread-safe. ``inputs``: what one job's input is, checked at submit (required for a
    torch module): ``Input(dtype, shape)``, or several as a dict name -> Input (or a list of
    named Inputs), passed to the model as positional arguments in that order. Outputs may
    be an array/tensor, a tuple or a dict of them: result() returns the same per job. ``max_queue`` bounds the jobs waiting
    (submit raises QueueFull beyond it). A worker takes up to ``max_batch`` queued jobs,
    waiting at most ``max_delay_ms`` for more after the first. ``store``: FileStore (default:
    one in a fresh temporary directory) or MemoryStore; the service closes it on close().
    Done and failed jobs report "expired" ``result_ttl_s`` after they finish and are
    forgotten (unknown id) ``expired_ttl_s`` later (default: result_ttl_s).
    ``worker_priority``: "normal", or "idle" to run the worker threads under Linux's
    SCHED_IDLE policy, so that a front in the same process (429s, /healthz) preempts them at
    once under overload; on a shared machine other busy processes preempt them too
    (fastloop.serve.priority says more). ``timeout_s``: the default deadline of a job,
    from submit (None: none): a job still queued then fails without running; one still in
    a model call fails, and its worker, stuck, is replaced by a new thread (at most
    ``workers`` stuck at once; beyond that health() reports "degraded" until a stuck call
    returns: a worker back from one serves again while fewer than ``workers`` do). ``queue``: None (the in-memory queue of this
    process), or a RedisQueue: the queue then lives in Redis beside a RedisStore, shared by
    every process and machine serving it, with priorities (shared.py says more).
    ``new_id``: how submit() names a job given no id (a fresh 32-hex id by default; the
    share-nothing processes of peers.py give each process ids it owns).
    ``preprocess`` / ``postprocess`` (default: the model's methods of those names, if it has
    them): hooks for the HTTP front. ``preprocess(body) -> row`` turns a request's raw body
    (any content type: JPEG bytes, say) into the input submit() takes, in the front's thread
    pool; ``postprocess(output) -> JSON`` turns a done job's output (what result() returns)
    into the JSON result the front answers. submit() and result() themselves do not call them.

    >>> svc = InferenceService(fl.nn.Sequential(fl.nn.Linear(4, 2)), store=MemoryStore())
    >>> svc.result(svc.submit(np.ones(4, np.float32)))
    >>> svc = InferenceService(torch_cnn.eval(), inputs=Input(torch.float32, (3, 32, 32)))
    """

    def __new__(cls, *args: Any, queue: Any = None, **kwargs: Any) -> "InferenceService":
        if queue is not None and cls is InferenceService:  # the queue in Redis: see shared.py
            from .shared import SharedInferenceService
            return super().__new__(SharedInferenceService)
        return super().__new__(cls)

    def __init__(self, model: Callable[[np.ndarray], Any], workers: int = 2, max_queue: int = 1024,
                 max_batch: int = 32, max_delay_ms: float = 2.0, store: Store | None = None,
                 result_ttl_s: float = 600.0, expired_ttl_s: float | None = None,
                 worker_priority: str = "normal", timeout_s: float | None = None,
                 inputs: Input | dict[str, Input] | list[Input] | Spec | None = None, queue: Any = None,
                 new_id: Callable[[], str] = new_job_id, preprocess: Callable[[bytes], Any] | None = None,
                 postprocess: Callable[[Any], Any] | None = None) -> None:
        for name, value in (("workers", workers), ("max_queue", max_queue), ("max_batch", max_batch)):
            least = 0 if name == "workers" and queue is not None else 1  # a front-only process of a shared queue
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} must be an int >= {least}, not {value!r}")
        if max_delay_ms < 0 or result_ttl_s <= 0 or (expired_ttl_s is not None and expired_ttl_s < 0):
            raise ValueError("max_delay_ms must be >= 0, result_ttl_s > 0 and expired_ttl_s >= 0")
        if store is not None and not isinstance(store, Store):
            raise TypeError(f"store must be a fastloop.serve store (FileStore, MemoryStore), not {type(store).__name__}")
        self.worker_priority = check_priority(worker_priority)
        self.timeout_s = _check_timeout(timeout_s)
        self._spec = spec_for(model, inputs)
        self.model = model
        self.new_id = new_id  # names a job submitted without an id
        self.preprocess = preprocess if preprocess is not None else _hook(model, "preprocess")
        self.postprocess = postprocess if postprocess is not None else _hook(model, "postprocess")
        self._runner = runner_for(model, self._spec)
        self.workers, self.max_queue, self.max_batch = workers, max_queue, max_batch
        self.max_delay_s = max_delay_ms / 1e3
        self.result_ttl_s = float(result_ttl_s)
        self.expired_ttl_s = self.result_ttl_s if expired_ttl_s is None else float(expired_ttl_s)
        self.store = store if store is not None else FileStore()
        self._queue: Queue = Queue(maxsize=max_queue)
        self._lock = threading.Lock()
        self._jobs: dict[str, _Job] = {}
        self._unsaved: dict[str, _Job] = {}  # ended while the store was down; also still in _jobs
        self._queued = 0  # submitted and not yet taken by a worker: bounds the queue
        self._admitted = 0  # slots reserved by admit() for submits not yet made: bound with _queued
        self._held = 0  # items workers took and have not finished with (recording, running, storing)
        self._fronted = False  # a front admits its requests (admit()): it says when more are coming
        self._arrived = time.monotonic()  # the last submit
        self._gap = 1.0  # seconds between submits, a moving average: short when many clients submit
        self._closed = False
        self._close_done = threading.Event()  # set once the first close() has finished
        self._abandon = False  # close() ran out of drain time: fail instead of run
        self._listeners: list[Listener] = []
        self._stats = ServiceStats()
        self._stop = threading.Event()
        self._wake = threading.Event()  # wakes the janitor: a job the store did not take, or close()
        self._any_deadline = False  # a job has a deadline: the janitor looks for late jobs
        self._deadlines: list[tuple[float, int, _Job]] = []  # a heap of (deadline, seq, job): the next one first
        self._deadline_seq = itertools.count()
        self._recover()
        self._in_doubt: dict[str, float] = {}  # ids whose create raised: maybe stored -> when
        self._doubt_lock = threading.Lock()  # one decision at a time on an in-doubt id
        self._busy: dict[threading.Thread, list[Any]] = {}  # a worker -> the group in its model call (_Jobs here)
        self._stuck: set[threading.Thread] = set()  # workers in a model call past a job's deadline
        self._pool_lock = threading.Lock()  # orders a model call's end against the janitor marking it stuck
        self._worker_numbers = itertools.count(workers)  # names of replacement workers
        self._threads = [self._worker(i) for i in range(workers)]
        self._janitor = threading.Thread(target=self._sweep, name="fastloop-serve-janitor", daemon=True)
        for thread in self._threads + [self._janitor]:
            thread.start()
        _lifecycle.register(self)

    # ------------------------------------------------------------ the public calls
    def submit(self, inputs: Any, job_id: str | None = None, timeout_s: float | None = None,
               priority: str = "normal", admission: Admission | None = None) -> str:
        """Queues one input; returns the job id (a new one, or `job_id`). An input with a
        leading batch axis over the model's row shape (e.g. (8, 784) for a model of 784
        inputs; a model with declared inputs or a fastloop.nn model) is one job of several
        rows: each row batches alone, they count as that many jobs against max_queue, and
        result() returns the rows in order.

        ``timeout_s`` (default: the service's): the job fails ("deadline exceeded ...")
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
            return self._submit(inputs, job_id, timeout_s, priority, admission)
        finally:
            if admission is not None:
                admission.release()

    def _submit(self, inputs: Any, job_id: str | None, timeout_s: float | None, priority: str,
                admission: Admission | None) -> str:
        if priority != "normal":
            check_level(priority)  # one that is no priority at all: its own message, naming them
            raise ValueError(f"priority={priority!r} needs a queue with priorities: InferenceService(..., queue=RedisQueue())")
        job_id = self.new_id() if job_id is None else check_job_id(job_id)
        timeout_s = self.timeout_s if timeout_s is None else _check_timeout(timeout_s)
        x, rows = self._spec.check_rows(inputs)
        if rows is not None and rows > self.max_queue:
            raise ValueError(f"inputs hold {rows} rows, more than the queue holds (max_queue={self.max_queue}): "
                             "send them in several requests")
        job = _Job(JobRecord.new(job_id, time.time(), x.shape, x.dtype.str, rows=rows), x)
        size = rows or 1  # queue slots the job takes: one per row
        if timeout_s is not None:
            job.deadline = job.t0 + timeout_s
            job.record.deadline = job.record.submitted + timeout_s  # stored: a restart keeps it
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
                return JobRecord(**vars(job.record))
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
        record = unsaved.record if unsaved is not None else self.store.get(job_id)
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

    def admit(self) -> Admission | None:
        """A reserved queue slot for one submit, or None (counting a rejection) when
        max_queue jobs wait or hold a slot: a front calls it before parsing a request and
        answers 429 at once for None. Never blocks on the store. See Admission.

        >>> a = svc.admit()
        >>> if a is None: answer_429()
        """
        self._fronted = True
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

    def _outcome(self, job_id: str) -> tuple[JobRecord, np.ndarray | None]:
        """record() and, for a done job, its result row (None otherwise, or when it is gone):
        what a front answers a result request with, in one store read where the store allows
        it. KeyError for an unknown id."""
        with self._lock:
            job, unsaved = self._jobs.get(job_id), self._unsaved.get(job_id)
        if unsaved is not None:  # ended while the store was down: memory has the truth
            record, row = JobRecord(**vars(unsaved.record)), unsaved.result
        elif job is not None and job.visible and job.record.status in (QUEUED, RUNNING):
            with job.lock:
                record, row = JobRecord(**vars(job.record)), None
            if record.status not in (QUEUED, RUNNING):  # ended meanwhile: the store has it
                record, row = self.store.get_with_result(job_id)
        else:
            record, row = self.store.get_with_result(job_id)
        record.status = self._status_of(record)
        return record, (row if record.status == DONE else None)

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

    def busy(self) -> int:
        """Rows this process still has to run or store: queued, held by a worker (being
        recorded as running, run or stored), or admitted by a front and not yet submitted.
        What a draining server waits on."""
        with self._lock:
            return self._queued + self._admitted + self._held

    def cancel(self, job_id: str) -> bool:
        """Takes a queued job off the queue: it never runs, ends "failed" and result() raises
        JobCancelled. Returns False (and changes nothing) for a job already running or
        finished; KeyError for an unknown id."""
        with self._lock:
            job = self._jobs.get(job_id)
        if job is None or not job.visible:
            self.store.get(job_id)  # KeyError when unknown
            return False
        return self._end(job, QUEUED, FAILED, error="cancelled before it ran", cancelled=True)

    def stats(self) -> dict[str, Any]:
        """Counters: queue_depth (jobs waiting), running, submitted, done, failed (cancelled
        not included), cancelled, rejected (QueueFull), expired, requeued_at_start and
        failed_at_start (restart recovery), submits_adopted (a retried submit that found its
        first try stored but unanswered, so queued that job), batches, batch_sizes ({size: batches}),
        mean_batch_size, latency_ms (p50/p90/p99/max of submit-to-done over the last 10^4
        jobs)."""
        snap = self._stats.snapshot()
        with self._lock:
            running = sum(1 for j in self._jobs.values() if j.record.status == RUNNING)
            snap["queue_depth"] = self._queued
            snap["unsaved"] = len(self._unsaved)
        snap["in_doubt"] = len(self._in_doubt)
        snap["running"] = running
        snap["workers"] = sum(t.is_alive() for t in self._threads if t not in self._stuck)
        snap["stuck_workers"] = sum(t.is_alive() for t in list(self._stuck))
        return snap

    def health(self) -> dict[str, Any]:
        """{"status": "ok" | "degraded" | "closed", "workers", "stuck_workers"}: degraded when
        fewer than ``workers`` workers serve: one stuck in a model call past a job's deadline
        could not be replaced (``workers`` of them are stuck already). /healthz answers 503
        then, so an orchestrator restarts the process."""
        snap = {"workers": sum(t.is_alive() for t in self._threads if t not in self._stuck),
                "stuck_workers": sum(t.is_alive() for t in list(self._stuck))}
        if self._closed:
            return {"status": "closed", **snap}
        healthy = snap["workers"] >= self.workers  # a stuck worker not replaced leaves fewer
        return {"status": "ok" if healthy else "degraded", **snap}

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Calls listener(job_id, status) after every status change of every job (queued,
        running, done, failed, expired); returns a function that unsubscribes. A listener
        runs on the thread that made the change, so it must be quick and must not block (hand
        the event to a loop, e.g. loop.call_soon_threadsafe); its exceptions are counted
        in stats()["listener_errors"] and otherwise ignored."""
        with self._lock:
            self._listeners = self._listeners + [listener]

        def unsubscribe() -> None:
            with self._lock:
                self._listeners = [fn for fn in self._listeners if fn is not listener]
        return unsubscribe

    def close(self, drain_s: float = 10.0) -> None:
        """Stops accepting jobs, lets the workers run what is queued for up to `drain_s`
        seconds, then fails what is left ("service closed ..."), joins the workers and closes
        the store. No job is left "running". Safe from any thread, at once from many: the
        first call closes, the others return once it has (at once on the service's own worker
        threads, which that close is waiting for)."""
        with self._lock:
            first, self._closed = not self._closed, True
        if not first:
            if threading.current_thread() not in self._threads:
                self._close_done.wait()
            return
        try:
            self._close(drain_s)
        finally:
            self._close_done.set()

    def _close(self, drain_s: float) -> None:
        self._queue.close()
        deadline = time.monotonic() + max(0.0, drain_s)
        _join(self._threads, deadline)
        me = threading.current_thread()
        if any(t.is_alive() and t is not me for t in self._threads):
            self._abandon = True
            self._queue.close(immediate=True)
            self._fail_all(QUEUED, f"service closed before the job ran (drain_s={drain_s:g})")
            _join(self._threads, time.monotonic() + _CLOSE_GRACE_S)
            self._fail_all(RUNNING, "service closed while the job was running")
        self._stop.set()
        self._wake.set()
        self._janitor.join(timeout=_CLOSE_GRACE_S)
        stuck = [t.name for t in self._threads if t.is_alive() and t is not me]
        if stuck:
            warnings.warn(f"InferenceService.close(): {stuck} still inside the model after drain; "
                          "their jobs were marked failed", RuntimeWarning, stacklevel=2)
        if self._unsaved and not self._save_unsaved():
            warnings.warn(f"InferenceService.close(): the store did not take the final records of "
                          f"{len(self._unsaved)} jobs; it keeps them as it last had them (a restart "
                          "requeues or fails them)", RuntimeWarning, stacklevel=2)
        if self._in_doubt:
            self._resolve_in_doubt()
            if self._in_doubt:
                warnings.warn(f"InferenceService.close(): {len(self._in_doubt)} submits that raised may still be "
                              "queued in the store (it did not answer); a restart runs them", RuntimeWarning,
                              stacklevel=2)
        self.store.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "InferenceService":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"InferenceService({type(self.model).__name__}, workers={self.workers}, max_batch={self.max_batch}, "
                f"max_delay_ms={self.max_delay_s * 1e3:g}, store={self.store!r}"
                f"{', worker_priority=' + repr(self.worker_priority) if self.worker_priority != 'normal' else ''}"
                f"{', closed' if self._closed else ''})")

    def _close_at_exit(self, deadline: float) -> None:
        self.close(drain_s=max(0.0, min(5.0, deadline - time.monotonic())))

    # ------------------------------------------------------------ job state changes
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

    def _create(self, job: _Job, x: np.ndarray) -> bool:
        return self.store.create(job.record, x if self.store.keeps_inputs else None) or self._adopt_lost_create(job)

    def _resolve_in_doubt(self) -> None:
        """The janitor's: removes from the store each in-doubt create (a submit that raised)
        still queued there and not adopted by a retry, keeping "an error means not
        accepted" true; ids the store cannot answer for yet stay for the next round."""
        for job_id in list(self._in_doubt):
            with self._doubt_lock:
                if job_id not in self._in_doubt:
                    continue
                with self._lock:
                    retried = job_id in self._jobs  # a retry reserved it: it decides
                if not retried:
                    try:
                        if self.store.get(job_id).status == QUEUED:
                            self.store.delete(job_id)
                            self._stats.count("in_doubt_removed")
                    except KeyError:  # the create never reached the store
                        pass
                    except _IN_DOUBT:  # still unreachable: try again later
                        continue
                    except Exception:  # the store refuses to read that id: not this submit's job
                        pass
                del self._in_doubt[job_id]

    def _adopt_lost_create(self, job: _Job) -> bool:
        """For a submit whose id the store knows: True when the store holds it queued, which
        means an earlier submit of that id here was written but answered with an error (Redis
        went down before its reply came): no worker holds that job, so this submit queues it,
        with the stored record and input. A queued job of a previous process is already in
        memory (recovered at start), so it cannot be mistaken for one."""
        try:
            stored = self.store.get(job.record.id)
            if stored.status != QUEUED:
                return False
            kept = self.store.get_input(stored.id) if self.store.keeps_inputs else None
        except KeyError:  # deleted meanwhile
            return False
        job.record = stored
        if kept is not None:
            job.inputs = kept
        self._stats.count("submits_adopted")
        return True

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
            record = JobRecord(**vars(job.record))
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
            self._stats.count("done")
            self._stats.latency(time.monotonic() - job.t0)
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

    # ------------------------------------------------------------ threads
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
        for group in group_by_input(started, lambda item: item.key):
            self._run(group)

    def _more_coming(self) -> bool:
        """Whether a batch still filling should wait for more: without a front, always; with
        one (it admits its requests: admit()), when a request is on its way (admitted, not
        yet submitted) or jobs arrive less than max_delay_ms apart while others are in
        progress (many clients). So a lone client's job runs at once instead of waiting
        max_delay_ms, and clients that submit and fetch in two requests still fill batches."""
        if not self._fronted or self._admitted > 0:
            return True
        return self._gap < self.max_delay_s and len(self._jobs) > self._held

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
        the stuck one ends when its call returns), up to `workers` stuck at once."""
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
        place, unless `workers` stuck ones are in their calls already (health() says
        "degraded" until one returns: _leave_if_stuck). Nothing if its call returned meanwhile."""
        with self._pool_lock:
            if thread not in self._busy or thread in self._stuck:
                return
            self._stuck.add(thread)
            self._stats.count("workers_stuck")
            self._threads = [t for t in self._threads if t.is_alive()]  # replacements come and go
            if len(self._stuck) > self.workers or self._closed or self._serving() >= self.workers:
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
        its replacement serves; it serves again when fewer than ``workers`` do (more were
        stuck at once than could be replaced), so the count always comes back to ``workers``
        once the stuck calls return: a client's deadline costs no capacity past its call."""
        me = threading.current_thread()
        if me not in self._stuck:
            return False
        with self._pool_lock:
            self._stuck.discard(me)
            if self._serving() <= self.workers:  # itself counted: it rejoins
                return False
            self._threads = [t for t in self._threads if t is not me]
            return True

    def _fail_queued_late(self, job: _Job, now: float) -> bool:
        """A queued job past its deadline fails; False (nothing done) if it is not queued."""
        if not self._end(job, QUEUED, FAILED, error=f"deadline exceeded: still queued after {now - job.t0:.3g} s"):
            return False
        self._stats.count("deadline_exceeded")
        return True

    def _store_final(self, record: JobRecord, result: np.ndarray | None) -> JobRecord | None:
        """Stores a finished job: the record stored (failed "could not store the result"
        when only the result was refused, e.g. a full disk), or None when the store took
        neither (it is down)."""
        try:
            self.store.finish(record, result)
            return record
        except _IN_DOUBT:  # unreachable, not a refusal: kept as it is for the janitor to write
            self._stats.count("store_errors")  # (a failed record written once Redis is back
            return None  # would turn a done job into "could not store the result")
        except Exception as store_error:
            error = store_error
        self._stats.count("store_errors")
        failed = JobRecord(**vars(record))
        if record.status == DONE:
            failed.status, failed.error = FAILED, f"could not store the result: {error}"
        try:
            self.store.finish(failed, None)
            return failed
        except Exception:
            return None

    def _save_unsaved(self) -> bool:
        """Stores the jobs that ended while the store was down, in the order they ended;
        stops at the first the store does not take. True when none is left."""
        with self._lock:
            jobs = list(self._unsaved.values())
        for job in jobs:
            stored = self._store_final(job.record, job.result)
            if stored is None:
                return False
            changed = stored.status != job.record.status
            job.record, job.result = stored, None
            with self._lock:
                del self._unsaved[stored.id]
                if self._jobs.get(stored.id) is job:
                    del self._jobs[stored.id]
            if changed:
                self._notify(stored.id, stored.status)
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
        return self.timeout_s is not None or self._any_deadline

    # ------------------------------------------------------------ restart
    def _recover(self) -> None:
        """Jobs a previous process left behind: queued ones with a stored input run again
        (oldest first, up to max_queue); running ones fail (their input may be what brought
        the process down); the rest fail with the reason."""
        for record in self.store.recover():
            reason = RESTARTED_RUNNING if record.status == RUNNING else None
            x = None
            if reason is None:
                x = self.store.get_input(record.id) if self.store.keeps_inputs else None
                reason = RESTARTED_NO_INPUT if x is None else None
            if x is not None:
                try:
                    x, rows = self._spec.check_rows(x)
                    if rows != record.rows:
                        raise ValueError(f"it has {rows or 1} rows, the job {record.rows or 1}")
                except (TypeError, ValueError) as error:
                    reason = f"server restarted, and the model no longer takes the stored input: {error}"
            if reason is None and self._queued + (record.rows or 1) > self.max_queue:
                reason = f"server restarted with more than max_queue={self.max_queue} jobs queued"
            if reason is not None:
                record.status, record.finished, record.error = FAILED, time.time(), reason
                self.store.finish(record, None)
                self._stats.count("failed_at_start")
                continue
            job = _Job(record, x)  # type: ignore[arg-type]
            job.t0 -= max(0.0, time.time() - record.submitted)  # its waits count from the first submit
            if record.deadline is not None:  # stored at submit: it holds across the restart
                job.deadline = time.monotonic() + (record.deadline - time.time())
                self._any_deadline = True
                self._add_deadline(job)
            job.visible = True
            self._jobs[record.id] = job
            for item in job.items():
                self._queued += 1
                self._queue.put_nowait(item)
            self._stats.count("requeued_at_start")


def _hook(model: Any, name: str) -> Callable[..., Any] | None:
    """The model's own preprocess/postprocess method, if it has one."""
    fn = getattr(model, name, None)
    return fn if callable(fn) else None


def _check_timeout(timeout_s: float | None) -> float | None:
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise ValueError(f"timeout_s must be a number of seconds > 0 (or None), not {timeout_s!r}")
    return float(timeout_s)


def _slice(deadline: float | None) -> float:
    if deadline is None:
        return _WAIT_SLICE_S
    return max(0.0, min(_WAIT_SLICE_S, deadline - time.monotonic()))


def _join(threads: list[threading.Thread], deadline: float) -> None:
    """Joins each thread by the deadline; not the calling one (a close from a worker's model call)."""
    for thread in list(threads):
        if thread is not threading.current_thread():
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def _acquire_all(jobs: list[_Job]) -> None:
    """Takes every job's lock. Only a worker holds several, its own batch's; two batches share
    only jobs of several rows, and the locks are taken in one global order (by id), so no two
    workers wait on each other."""
    for job in sorted(jobs, key=id):
        job.lock.acquire()


def _release_all(jobs: list[_Job]) -> None:
    for job in jobs:
        job.lock.release()


def _changed(record: JobRecord, status: str, **fields: Any) -> JobRecord:
    """A copy of `record` with a new status and other fields (a store keeps what it is given)."""
    new = JobRecord(**vars(record))
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
