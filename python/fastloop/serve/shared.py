"""SharedInferenceService: an InferenceService whose queue lives in Redis (a RedisQueue), so
that any process sharing the RedisStore accepts, runs, answers and cancels any job.

    >>> svc = create_service(model, store=RedisStore(url), queue=RedisQueue())  # this class
    >>> job = svc.submit(x, priority="high")   # any process may run it
    >>> svc.result(job)                        # from any process

What changes from the in-memory queue: submit() creates and queues a job in one Redis script
(QueueFull when ``max_queue`` jobs wait or are held by workers, across all processes);
workers take batches from Redis (up to max_batch, waiting at most max_delay_s after the
first, highest priority first); status, result and cancel read and write Redis, so they
answer for jobs of every process. close() does not fail what is queued: the queue belongs to
every process sharing it (entries this process took but had not started go back at once).
Jobs of a process that died are reclaimed by the others after the visibility timeout
(redisqueue.py states the rules). A keeper thread sends the heartbeat of held entries,
reclaims, and caches the queue depth; a publisher thread sends status changes to the other
fronts, and a listener thread (started by subscribe()) receives theirs.
"""

from __future__ import annotations

import collections
import threading
import time
import warnings
from typing import Any, Callable

import numpy as np

from ..errors import Closed, QueueFull
from .batching import group_by_input, run_group
from .jobs import DONE, FAILED, QUEUED, RUNNING, JobRecord, StoreError, check_job_id
from .priority import apply_to_this_thread
from .redisqueue import LEVELS, Entry, RedisQueue, Started, check_level
from .rows import assemble
from ._admission import Admission
from ._deadlines import _DEADLINE_TICK_S, _check_timeout
from .service import InferenceService, _join

__all__ = ["SharedInferenceService"]

_BLOCK_S = 0.1  # a worker's blocking read, so that close() is seen this often
_RETRY_S = 0.1  # after a Redis error, a worker or the keeper waits this long
_WAIT_WINDOW = 10000  # queue waits kept per priority level for the percentiles


class SharedInferenceService(InferenceService):
    """An InferenceService whose queue is a RedisQueue (create_service(..., queue=RedisQueue())
    builds one); see the module."""

    _least_workers = 0  # a front-only process of a shared queue runs no worker

    def __init__(self, model: Callable[[np.ndarray], Any], num_workers: int = 2, max_queue: int = 1024,
                 max_batch: int = 32, max_delay_s: float = 0.002, store: Any = None, *, queue: RedisQueue,
                 **kwargs: Any) -> None:
        if not isinstance(queue, RedisQueue):
            raise TypeError(f"queue must be a fastloop.serve.RedisQueue, not {type(queue).__name__}")
        queue.bind(store)
        self.queue = queue
        self._held_back: collections.deque[Entry] = collections.deque()  # reclaimed or extra entries to run here
        self._waits = {level: collections.deque(maxlen=_WAIT_WINDOW) for level in LEVELS}
        self._depth = dict.fromkeys(LEVELS, 0)  # the keeper's last look at the queue
        self._reclaimed = {"rerun": 0, "failed": 0, "resumed": 0}
        self._events: list[tuple[str, str]] = []
        self._events_ready = threading.Event()
        self._remote_thread: threading.Thread | None = None
        self._pubsub: Any = None
        self._running = 0  # jobs started here and not yet stored
        super().__init__(model, num_workers=num_workers, max_queue=max_queue, max_batch=max_batch,
                         max_delay_s=max_delay_s, store=store, **kwargs)
        self._keeper = threading.Thread(target=self._keep_queue, name="fastloop-serve-keeper", daemon=True)
        self._publisher = threading.Thread(target=self._publish, name="fastloop-serve-publisher", daemon=True)
        self._keeper.start()
        self._publisher.start()

    # ------------------------------------------------------------ the public calls
    def submit(self, inputs: Any, job_id: str | None = None, timeout: float | None = None,
               priority: str = "normal", admission: Admission | None = None) -> str:
        """Creates and queues a job in Redis; returns its id. ``priority``: "high", "normal"
        or "low" (workers take higher levels first). QueueFull when max_queue jobs wait or
        are held across all processes (an ``admission`` reserves nothing here: Redis
        decides); StoreUnavailable when Redis cannot be reached.
        ``timeout`` (default: the service's): the deadline, stored with the job (it holds
        across processes and restarts): a job not yet started by then fails "deadline
        exceeded" and never runs (the process that takes it fails it, or any process's
        keeper within about a second when none takes it); a job still in a model call then
        fails and the process running it replaces the stuck worker (as InferenceService).
        Several rows along a leading axis are one job, as with the in-memory queue, except
        that max_queue counts it once (the queue in Redis counts entries)."""
        job_id = self.new_id() if job_id is None else check_job_id(job_id)
        timeout = self.timeout if timeout is None else _check_timeout(timeout)
        level = check_level(priority)
        x, rows = self._spec.check_rows(inputs)
        if self._closed:
            raise Closed("submit() on a closed InferenceService")
        record = JobRecord.new(job_id, time.time(), x.shape, x.dtype.str, rows=rows)
        if timeout is not None:
            record.deadline = record.submitted + timeout
        answer = self.queue.push(record, x, level, self.max_queue)
        if answer < 0:
            self._stats.count("rejected")
            raise QueueFull(f"the shared queue is full ({self.max_queue} jobs waiting or held): retry later")
        if answer > 0:
            self._stats.count("submitted")
            self._notify(job_id, QUEUED)
        return job_id

    def admit(self) -> Admission | None:
        """None (counting a rejection) when reject_if_full(); else an Admission that holds
        no slot: the queue's bound is kept in Redis, across processes, so a submit after it
        may still raise QueueFull."""
        return None if self.reject_if_full() else Admission(self, held=False)

    def reject_if_full(self) -> bool:
        """True (counting a rejection) when the keeper's last look found max_queue jobs
        waiting; submit() checks exactly, in Redis."""
        if sum(self._depth.values()) >= self.max_queue and not self._closed:
            self._stats.count("rejected")
            return True
        return False

    def busy(self) -> int:
        """Jobs this process holds: running here, or taken and waiting for a worker (what is
        queued in Redis belongs to every process sharing it)."""
        return self._running + len(self._held_back)

    def cancel(self, job_id: str) -> bool:
        """Cancels a queued job wherever it waits (its entry leaves the queue); False for a
        job already running or finished; KeyError for an unknown id."""
        record = self.store.get(job_id)
        if record.status != QUEUED:
            return False
        record.status, record.finished = FAILED, time.time()
        record.error, record.cancelled = "cancelled before it ran", True
        if not self.queue.finish_if(record, None, QUEUED, unqueue=True):
            return False
        self._stats.count("cancelled")
        self._notify(job_id, FAILED)
        return True

    def stats(self) -> dict[str, Any]:
        """InferenceService.stats(), with queue_depth across all processes (also by
        priority: queue_depth_by_priority), wait_s_by_priority (submit to start, jobs
        started here) and reclaimed ({"rerun": n, "failed": n}, by this process)."""
        snap = super().stats()
        try:
            self._depth = self.queue.depth()
        except StoreError:
            pass  # the keeper's last look
        snap["queue_depth"] = sum(self._depth.values())
        snap["queue_depth_by_priority"] = dict(self._depth)
        snap["running"] = self._running
        waits = {}
        for level, window in self._waits.items():
            s = np.array(window, dtype=np.float64)
            waits[level] = ({"p50": float(np.percentile(s, 50)), "p99": float(np.percentile(s, 99)),
                             "max": float(s.max()), "samples": int(s.size)} if s.size else
                            {"p50": 0.0, "p99": 0.0, "max": 0.0, "samples": 0})
        snap["wait_s_by_priority"] = waits
        snap["reclaimed"] = dict(self._reclaimed)
        return snap

    def subscribe(self, listener: Callable[[str, str], None]) -> Callable[[], None]:
        """As InferenceService.subscribe(), for the jobs of every process sharing the queue
        (changes made elsewhere arrive through Redis pub/sub, a few ms later)."""
        unsubscribe = super().subscribe(listener)
        with self._lock:
            if self._remote_thread is None and self.queue.events:
                self._pubsub = self.store.redis.client.pubsub(ignore_subscribe_messages=True)
                self._pubsub.subscribe(self.queue.channel)
                self._remote_thread = threading.Thread(target=self._listen, name="fastloop-serve-events", daemon=True)
                self._remote_thread.start()
        return unsubscribe

    def close(self, timeout: float = 10.0) -> None:
        """Stops accepting jobs and taking them; waits up to `timeout` for the batches in
        progress; gives back entries taken but not started. Jobs still running after that
        are reclaimed (failed) by another process after the visibility timeout."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        _join(self._threads, time.monotonic() + max(0.0, timeout))
        try:
            self.queue.requeue(list(self._held_back))
        except StoreError as error:
            warnings.warn(f"InferenceService.close(): could not give {len(self._held_back)} taken jobs back "
                          f"({error}); another process reclaims them after the visibility timeout",
                          RuntimeWarning, stacklevel=2)
        self._held_back.clear()
        self._events_ready.set()
        self._wake.set()
        for thread in (self._keeper, self._publisher, self._janitor, self._remote_thread):
            if thread is not None:
                thread.join(timeout=2.0)
        if self._pubsub is not None:
            self._pubsub.close()
        stuck = [t.name for t in self._threads if t.is_alive()]
        if stuck:
            warnings.warn(f"InferenceService.close(): {stuck} still inside the model after the close timeout; another "
                          "process fails their jobs after the visibility timeout", RuntimeWarning, stacklevel=2)
        self.store.close()

    def __repr__(self) -> str:
        return super().__repr__().replace("store=", f"queue={self.queue!r}, store=", 1)

    # ------------------------------------------------------------ workers
    def _recover(self) -> None:
        """Nothing at start: a stopped process's entries are reclaimed after the timeout."""

    def _work(self) -> None:
        try:
            apply_to_this_thread(self.worker_priority)
        except OSError:
            pass  # InferenceService warns about it; here the worker runs at normal priority
        while not self._stop.is_set():
            try:
                started = self._collect()
            except StoreError:
                self._stop.wait(_RETRY_S)
                continue
            if started:
                self._run_started(started)
            if self._leave_if_stuck():
                return  # replaced while stuck past a deadline: its replacement serves

    def _collect(self) -> list[Started]:
        """A batch, its jobs started: held-back (reclaimed) entries first, then Redis
        (blocking for the first); when that batch is not full, once more after max_delay_s.
        Each take is one script that also starts the jobs (and fails those past their
        deadline). One late take, not a poll every fraction of max_delay_s as the in-memory
        queue does: each is a round trip, and with several workers sharing the queue most of
        them found nothing (2 processes: ~4 scripts per job instead of ~2)."""
        started = self._take(self.max_batch, _BLOCK_S, self._take_held_back(self.max_batch))
        if started and len(started) < self.max_batch and self.max_delay_s > 0:
            time.sleep(self.max_delay_s)  # the batching window: let more jobs arrive
            try:
                started += self._take(self.max_batch - len(started), 0, [])
            except StoreError:
                pass  # run what is started; the next take waits for Redis
        return started

    def _take(self, count: int, block_s: float, held: list[Entry]) -> list[Started]:
        started, late = self.queue.take_start(count, block_s, held)
        now = time.time()
        for entry, record, _ in started:
            self._waits[LEVELS[entry.level]].append(max(0.0, (record.started or now) - record.submitted))
            self._notify(record.id, RUNNING)
        if started:
            with self._lock:
                self._running += len(started)
            if not self._any_deadline and any(record.deadline is not None for _, record, _ in started):
                self._any_deadline = True
                self._wake.set()  # the janitor starts looking for running jobs past their deadline
        self._failed_late(late)
        return started

    def _failed_late(self, records: list[JobRecord]) -> None:
        for record in records:
            self._stats.count("deadline_exceeded")
            self._stats.count("failed")
            self._notify(record.id, FAILED)

    def _take_held_back(self, count: int) -> list[Entry]:
        taken = []
        while self._held_back and len(taken) < count:
            try:
                taken.append(self._held_back.popleft())
            except IndexError:
                break
        return taken

    def _run_started(self, started: list[Started]) -> None:
        """Runs a batch's jobs: a job of several rows as its rows, each group of equal rows in
        model calls of at most max_batch rows; a job is stored once its last row has run."""
        runnable = [item for item in started if item[2] is not None]
        missing = [item for item in started if item[2] is None]
        if missing:
            self._finish(missing, [(None, "the store kept no input for the job", None)] * len(missing))
        pieces = []  # (index into runnable, row index or None, input)
        for k, (_, record, x) in enumerate(runnable):
            pieces += [(k, i, x[i]) for i in range(len(x))] if record.rows else [(k, None, x)]
        outs: list[Any] = [[None] * len(x) if record.rows else None for _, record, x in runnable]
        left = [len(x) if record.rows else 1 for _, record, x in runnable]
        me = threading.current_thread()
        for group in group_by_input(pieces, lambda piece: (piece[2].shape, piece[2].dtype.str)):
            for start in range(0, len(group), self.max_batch):
                chunk = group[start:start + self.max_batch]
                jobs = list(dict.fromkeys(k for k, _, _ in chunk))
                self._busy[me] = [runnable[k] for k in jobs]
                try:
                    outcomes = run_group(self._runner, [x for _, _, x in chunk])
                except BaseException as error:  # not an Exception from the model
                    outcomes = [(None, f"{type(error).__name__}: {error}")] * len(chunk)
                finally:
                    self._call_ended(me)
                self._stats.batch(len(chunk))
                for (k, i, _), outcome in zip(chunk, outcomes):
                    if i is None:
                        outs[k] = (*outcome, None)
                    else:
                        outs[k][i] = outcome
                    left[k] -= 1
                ended = [k for k in jobs if left[k] == 0]
                self._finish([runnable[k] for k in ended],
                             [outs[k] if runnable[k][1].rows is None else assemble(outs[k]) for k in ended])

    def _deadline_wait(self) -> float | None:
        """While jobs have deadlines, the janitor looks at the running ones every tick."""
        return _DEADLINE_TICK_S if self._deadlines_used() else None

    def _enforce_deadlines(self) -> None:
        """The janitor's: a job of this process still in a model call at its deadline fails
        (running -> failed, compare-and-set in Redis: the call's late result is then not
        written) and the stuck worker is replaced, as with the in-memory queue. Queued jobs
        past their deadline are the take script's and the keeper's."""
        now = time.time()
        for thread, group in list(self._busy.items()):
            late = [record for _, record, _ in group if record.deadline is not None and record.deadline <= now]
            if not late or thread in self._stuck:
                continue
            for record in late:
                final = JobRecord(**vars(record))
                final.status, final.finished = FAILED, now
                final.error = f"deadline exceeded: the model call was still running {now - record.submitted:.3g} s after submit"
                try:
                    failed = self.queue.finish_if(final, None, RUNNING)
                except StoreError:
                    continue  # the next tick tries again
                if failed:
                    self._stats.count("deadline_exceeded")
                    self._stats.count("failed")
                    self._notify(record.id, FAILED)
            self._replace_stuck(thread)

    def _finish(self, items: list[tuple[Entry, JobRecord, Any]], outcomes: list[tuple[Any, str | None, Any]]) -> None:
        """Stores the final records of jobs ((result, error, row_errors) each); retries while
        Redis is down, up to the visibility timeout (after it a reclaimer fails the jobs)."""
        if not items:
            return
        now = time.time()
        finals = []
        for (entry, record, _), (row, error, row_errors) in zip(items, outcomes):
            final = JobRecord(**vars(record))
            final.status, final.finished, final.error = (DONE if error is None else FAILED), now, error
            final.row_errors = row_errors
            finals.append((entry, final, row if error is None else None))
        give_up = time.monotonic() + self.queue.visibility_timeout_s
        try:
            self._store_finals(finals, give_up)
        finally:
            with self._lock:
                self._running -= len(finals)

    def _store_finals(self, finals: list[tuple[Entry, JobRecord, Any]], give_up: float) -> None:
        while True:
            try:
                written = self.queue.finish_many(finals)
                break
            except StoreError as error:
                self._stats.count("store_errors")
                if time.monotonic() >= give_up or self._abandon:
                    self.queue.forget([entry for entry, _, _ in finals])
                    warnings.warn(f"InferenceService: could not store {len(finals)} results ({error}); "
                                  "a reclaimer fails those jobs", RuntimeWarning, stacklevel=2)
                    return
                time.sleep(_RETRY_S)
        for (_, final, _), ok in zip(finals, written):
            if not ok:
                continue  # a reclaimer failed it meanwhile: its record stands
            self._stats.count("done" if final.status == DONE else "failed")
            if final.status == DONE:
                self._stats.latency(max(0.0, final.finished - final.submitted))
            self._notify(final.id, final.status)

    # ------------------------------------------------------------ keeper, events
    def _keep_queue(self) -> None:
        """Heartbeat of held entries, this process's orphans (redisqueue.py), reclaim of
        stopped workers' entries, queue depth. Orphans are looked for once idle 1.5 periods
        (held entries never are: the heartbeat refreshes them every period), before the
        visibility timeout (3 periods or more) would let a reclaimer fail them."""
        period = min(self.queue.visibility_timeout_s / 3, 1.0)
        next_reclaim = 0.0
        while not self._stop.wait(period):
            try:
                self.queue.heartbeat()
                self._depth = self.queue.depth()
                self._failed_late(self.queue.fail_late())
                if self.num_workers:
                    resumed = self.queue.orphans(1.5 * period)
                    self._held_back.extend(resumed)
                    self._reclaimed["resumed"] += len(resumed)
                if self.num_workers and time.monotonic() >= next_reclaim:  # a front-only process leaves it to workers
                    next_reclaim = time.monotonic() + self.queue.visibility_timeout_s / 2
                    rerun, failed = self.queue.reclaim()
                    self._held_back.extend(rerun)
                    self._reclaimed["rerun"] += len(rerun)
                    self._reclaimed["failed"] += failed
            except StoreError as error:
                if "NOGROUP" in str(error):  # Redis lost the streams (restarted without persistence)
                    try:
                        self.queue.ensure_group()
                    except StoreError:
                        pass

    def _notify(self, job_id: str, status: str) -> None:
        super()._notify(job_id, status)
        if self.queue.events:
            with self._lock:
                self._events.append((job_id, status))
            self._events_ready.set()

    def _publish(self) -> None:
        """Sends the status changes made here, a batch per message."""
        while True:
            self._events_ready.wait()
            self._events_ready.clear()
            with self._lock:
                events, self._events = self._events, []
            try:
                self.queue.publish(events)
            except StoreError:
                pass  # a front's WebSocket misses these; status() still answers
            if self._stop.is_set():
                return

    def _listen(self) -> None:
        """Delivers the status changes other processes published to this one's listeners."""
        while not self._stop.is_set():
            try:
                message = self._pubsub.get_message(timeout=_BLOCK_S)
            except Exception:  # Redis away: redis-py reconnects and resubscribes on the next call
                self._stop.wait(_RETRY_S)
                continue
            if not message or message.get("type") != "message":
                continue
            lines = message["data"].decode().split("\n")
            if lines[0] == self.queue.consumer:
                continue
            for line in lines[1:]:
                job_id, _, status = line.partition(" ")
                InferenceService._notify(self, job_id, status)
