"""InferenceService: submit inputs, a few worker threads run the model on dynamic batches,
results go to a store, callers poll status() or wait in result().

    >>> with InferenceService(model, num_workers=2, max_batch=32) as svc:
    ...     job = svc.submit(x)                  # x: one sample, e.g. float32 (784,)
    ...     y = svc.result(job, timeout=5.0)     # its row of model(batch)

Threads: ``num_workers`` Python threads pop jobs from a fastloop.Queue (its waits release the
GIL) and call the model (a fastloop.nn model computes with the GIL released), and one
janitor thread expires old results. ``_lock`` guards the table of unfinished jobs and the
count of queued ones; each job's own lock orders its status changes and their store writes.
Status listeners run on whichever thread changed the status.
"""

from __future__ import annotations

import itertools
import threading
import time
import warnings
from typing import Any, Callable

import numpy as np

from .. import _lifecycle
from .._core import Queue
from .filestore import FileStore
from .jobs import FAILED, QUEUED, RUNNING, new_job_id
from .priority import check_priority
from .runners import runner_for
from .spec import Input, Spec, spec_for
from .stats import ServiceStats
from .stores import Store
from ._admission import Admission, _Admitting
from ._deadlines import _Deadlines, _check_timeout
from ._job_table import _Job, _JobTable
from ._persistence import _Persistence
from ._results import _Results
from ._workers import _Workers

__all__ = ["InferenceService", "Admission"]

Listener = Callable[[str, str], None]

_CLOSE_GRACE_S = 2.0  # after close()'s timeout, how long close() waits for a model call in progress


class InferenceService(_Admitting, _Results, _Workers, _Deadlines, _Persistence, _JobTable):
    """A bounded queue of inference jobs served by worker threads with dynamic batching.

    ``model``: a fastloop.nn model (inputs are checked against its in_features and dtype at
    submit), a torch ``nn.Module`` (TorchScript too: it gets tensors and runs under
    ``torch.inference_mode()``; ``eval()`` is yours to call) or any callable taking a NumPy
    batch (N, ...) and returning N rows; with num_workers > 1 a plain callable must be
    thread-safe. ``inputs``: what one job's input is, checked at submit (required for a
    torch module): ``Input(dtype, shape)``, or several as a dict name -> Input (or a list of
    named Inputs), passed to the model as positional arguments in that order. Outputs may
    be an array/tensor, a tuple or a dict of them: result() returns the same per job. ``max_queue`` bounds the jobs waiting
    (submit raises QueueFull beyond it). A worker takes up to ``max_batch`` queued jobs,
    waiting at most ``max_delay_s`` for more after the first. ``store``: FileStore (default:
    one in a fresh temporary directory) or MemoryStore; the service closes it on close().
    Done and failed jobs report "expired" ``result_ttl_s`` after they finish and are
    forgotten (unknown id) ``expired_ttl_s`` later (default: result_ttl_s).
    ``worker_priority``: "normal", or "idle" to run the worker threads under Linux's
    SCHED_IDLE policy, so that a front in the same process (429s, /healthz) preempts them at
    once under overload; on a shared machine other busy processes preempt them too
    (fastloop.serve.priority says more). ``timeout``: the default deadline (seconds) of a job,
    from submit (None: none): a job still queued then fails without running; one still in
    a model call fails, and its worker, stuck, is replaced by a new thread (at most
    ``num_workers`` stuck at once; beyond that health() reports "degraded" until a stuck call
    returns: a worker back from one serves again while fewer than ``num_workers`` do). The queue lives in this process:
    for one in Redis beside a RedisStore, shared by every process and machine serving it,
    with priorities, use ``create_service(model, queue=RedisQueue(), ...)`` (factory.py) or
    SharedInferenceService; ``queue`` here must stay None (TypeError otherwise).
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
    _least_workers = 1  # SharedInferenceService: 0 (a front-only process of a shared queue)

    def __init__(self, model: Callable[[np.ndarray], Any], num_workers: int = 2, max_queue: int = 1024,
                 max_batch: int = 32, max_delay_s: float = 0.002, store: Store | None = None,
                 result_ttl_s: float = 600.0, expired_ttl_s: float | None = None,
                 worker_priority: str = "normal", timeout: float | None = None,
                 inputs: Input | dict[str, Input] | list[Input] | Spec | None = None, queue: Any = None,
                 new_id: Callable[[], str] = new_job_id, preprocess: Callable[[bytes], Any] | None = None,
                 postprocess: Callable[[Any], Any] | None = None) -> None:
        if queue is not None:
            raise TypeError("InferenceService takes no queue: for a queue in Redis use "
                            "fastloop.serve.create_service(model, queue=RedisQueue(), ...) or SharedInferenceService")
        for name, value in (("num_workers", num_workers), ("max_queue", max_queue), ("max_batch", max_batch)):
            least = self._least_workers if name == "num_workers" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} must be an int >= {least}, not {value!r}")
        if max_delay_s < 0 or result_ttl_s <= 0 or (expired_ttl_s is not None and expired_ttl_s < 0):
            raise ValueError("max_delay_s must be >= 0, result_ttl_s > 0 and expired_ttl_s >= 0")
        if store is not None and not isinstance(store, Store):
            raise TypeError(f"store must be a fastloop.serve store (FileStore, MemoryStore), not {type(store).__name__}")
        self.worker_priority = check_priority(worker_priority)
        self.timeout = _check_timeout(timeout)
        self._spec = spec_for(model, inputs)
        self.model = model
        self.new_id = new_id  # names a job submitted without an id
        self.preprocess = preprocess if preprocess is not None else _hook(model, "preprocess")
        self.postprocess = postprocess if postprocess is not None else _hook(model, "postprocess")
        self._runner = runner_for(model, self._spec)
        self.num_workers, self.max_queue, self.max_batch = num_workers, max_queue, max_batch
        self.max_delay_s = float(max_delay_s)
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
        self._worker_numbers = itertools.count(num_workers)  # names of replacement workers
        self._threads = [self._worker(i) for i in range(num_workers)]
        self._janitor = threading.Thread(target=self._sweep, name="fastloop-serve-janitor", daemon=True)
        for thread in self._threads + [self._janitor]:
            thread.start()
        _lifecycle.register(self)

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
        mean_batch_size, latency_s (p50/p90/p99/max seconds of submit-to-done over the last 10^4
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
        fewer than ``num_workers`` workers serve: one stuck in a model call past a job's deadline
        could not be replaced (``num_workers`` of them are stuck already). /healthz answers 503
        then, so an orchestrator restarts the process."""
        snap = {"workers": sum(t.is_alive() for t in self._threads if t not in self._stuck),
                "stuck_workers": sum(t.is_alive() for t in list(self._stuck))}
        if self._closed:
            return {"status": "closed", **snap}
        healthy = snap["workers"] >= self.num_workers  # a stuck worker not replaced leaves fewer
        return {"status": "ok" if healthy else "degraded", **snap}

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Calls listener(job_id, status) after every status change of every job (queued,
        running, done, failed, expired); returns a function that unsubscribes. A listener
        runs on the thread that made the change, so it must be quick and must not block (hand
        the event to a loop, e.g. loop.call_soon_threadsafe); its exceptions are counted
        in stats()["listener_errors"] and otherwise ignored. A job's final status wakes
        result() first and the listeners next (as concurrent.futures runs done callbacks after
        waking waiters), so result() may return before a listener hears "done"."""
        with self._lock:
            self._listeners = self._listeners + [listener]

        def unsubscribe() -> None:
            with self._lock:
                self._listeners = [fn for fn in self._listeners if fn is not listener]
        return unsubscribe

    def close(self, timeout: float = 10.0) -> None:
        """Stops accepting jobs, lets the workers run what is queued for up to `timeout`
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
            self._close(timeout)
        finally:
            self._close_done.set()

    def _close(self, timeout: float) -> None:
        self._queue.close()
        deadline = time.monotonic() + max(0.0, timeout)
        _join(self._threads, deadline)
        me = threading.current_thread()
        if any(t.is_alive() and t is not me for t in self._threads):
            self._abandon = True
            self._queue.close(immediate=True)
            self._fail_all(QUEUED, f"service closed before the job ran (close timeout={timeout:g} s)")
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
        return (f"InferenceService({type(self.model).__name__}, num_workers={self.num_workers}, max_batch={self.max_batch}, "
                f"max_delay_s={self.max_delay_s:g}, store={self.store!r}"
                f"{', worker_priority=' + repr(self.worker_priority) if self.worker_priority != 'normal' else ''}"
                f"{', closed' if self._closed else ''})")

    def _close_at_exit(self, deadline: float) -> None:
        self.close(timeout=max(0.0, min(5.0, deadline - time.monotonic())))

def _hook(model: Any, name: str) -> Callable[..., Any] | None:
    """The model's own preprocess/postprocess method, if it has one."""
    fn = getattr(model, name, None)
    return fn if callable(fn) else None


def _join(threads: list[threading.Thread], deadline: float) -> None:
    """Joins each thread by the deadline; not the calling one (a close from a worker's model call)."""
    for thread in list(threads):
        if thread is not threading.current_thread():
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
