"""RedisQueue: the queue of an InferenceService kept in Redis, so that several server
processes, on one machine or several, share one queue beside one RedisStore.

    >>> store = RedisStore("redis://10.0.0.1:6379/0")
    >>> svc = create_service(model, store=store, queue=RedisQueue(visibility_timeout_s=30))
    >>> svc.submit(x, priority="high")

Why Redis Streams with a consumer group (XADD / XREADGROUP / XACK / XAUTOCLAIM): it is the
reliable queue Redis documents for several consumers. An entry read by a worker stays in the
group's pending list, owned by that consumer, until it is acknowledged, so a worker process
killed with -9 loses nothing: once the entry has been idle ``visibility_timeout_s`` another
process claims it (XAUTOCLAIM). A live worker keeps the entries it holds fresh (XCLAIM JUSTID
every third of the timeout), so a long model call is not mistaken for a dead worker. A
blocking XREADGROUP wakes the moment a job is added (no polling), and one script reads the
streams in priority order. (The older list pattern, BLMOVE into a per-worker list, needs a
hand-made reaper of those lists and a side table of claim times; streams have both built in.)

Keys, beside the store's (``prefix`` is the store's)::

    <prefix>queue:<level>   a stream per priority level ("high", "normal", "low"); an entry
                            holds the job id; it is deleted once acknowledged, so the streams'
                            lengths are the jobs waiting or held by a worker
    <prefix>events          pub/sub channel of status changes (for the fronts' WebSockets)

A job's hash (RedisStore's) also holds "qkey"/"qentry": where its entry is, so that cancel()
deletes the entry. Every change of a job's status is a compare-and-set script (queued ->
running only from queued, running -> done/failed only from running), so a job is started at
most once even when a slow worker and a reclaimer race for it, and a late result never
overwrites a failure.

Reclaim rules (the restart rules of a single process): an entry reclaimed while its job is
still queued (the dead worker took it but never started it) runs again; a job that was
running is failed with the reason, not retried (its input may be what killed the worker), so
no job runs twice without saying so.

Entries a live process lost track of (``orphans``): entries pending for this process's
consumer that none of its workers holds. Redis makes them in two ways: the answer to a take
was lost (the script ran and started the jobs; the worker saw an error), or Redis came back
from a snapshot older than its last writes (kill -9 with RDB persistence: jobs this process
had finished show "running" again, their entries pending for it; jobs finished later than
the snapshot and ones submitted after it are lost with it). The process is alive, so no model
call of those jobs killed it: it runs them again (``resumed``) instead of leaving them to a
reclaimer, which would fail them as "a worker process stopped while the job was running".
A finish that finds its job queued again (the rollback) leaves the job's entry in place.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .jobs import JobRecord
from .redisconn import as_str, npy_bytes, read_array, read_record, record_bytes, seconds
from .redisqueue_scripts import _FAIL_LATE, _FINISH_BATCH, _FINISH_IF, _TAKE_START
from .redisstore import CREATE_SCRIPT, RedisStore

__all__ = ["RedisQueue", "LEVELS", "check_level", "Entry"]

LEVELS = ("high", "normal", "low")  # job priorities, served in this order
GROUP = "workers"
RECLAIMED_RUNNING = ("a worker process stopped while the job was running (no heartbeat for {v:g} s); "
                     "not retried: its input may be what stopped it")


@dataclass(frozen=True)
class Entry:
    """A queue entry a worker holds: its priority level (index into LEVELS), stream entry id
    and job id; ``resume``: an orphan (see the module), whose job may be started again even
    though Redis shows it running."""

    level: int
    entry_id: str
    job_id: str
    resume: bool = field(default=False, compare=False)


Started = tuple[Entry, JobRecord, "np.ndarray | None"]  # an entry whose job runs here, its record and input


def check_level(priority: Any) -> int:
    """The index of a priority name in LEVELS; ValueError naming the choices."""
    if priority not in LEVELS:
        raise ValueError(f"priority must be one of {', '.join(map(repr, LEVELS))}, not {priority!r}")
    return LEVELS.index(priority)


class RedisQueue:
    """The jobs' queue in Redis streams with a consumer group, shared by every service whose
    RedisStore has the same Redis and prefix. ``visibility_timeout_s``: how long an entry a
    worker took may go without that worker's heartbeat before another process reclaims it
    (a killed worker's jobs wait this long). ``events``: publish status changes so that every
    front's WebSocket streams see jobs run elsewhere.

    >>> svc = create_service(model, store=RedisStore(url), queue=RedisQueue())
    """

    def __init__(self, visibility_timeout_s: float = 30.0, *, events: bool = True, consumer: str | None = None) -> None:
        if not visibility_timeout_s > 0:
            raise ValueError(f"visibility_timeout_s must be > 0, not {visibility_timeout_s!r}")
        self.visibility_timeout_s = float(visibility_timeout_s)
        self.events = bool(events)
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.store: RedisStore | None = None
        self._held: dict[str, Entry] = {}  # entry id -> entry taken by this process, not yet acknowledged
        self._held_lock = threading.Lock()

    # ---- setup
    def bind(self, store: Any) -> None:
        """Attaches the queue to the service's store (a RedisStore); creates the group."""
        if not isinstance(store, RedisStore):
            raise TypeError(f"RedisQueue needs the service's store to be a RedisStore, not {type(store).__name__}")
        if self.store is not None:
            raise ValueError("this RedisQueue already serves a service: give each service its own")
        self.store = store
        self.redis, self.keys = store.redis, store.keys  # one connection (and outage state) with the store
        self.streams = [self.keys.queue(level) for level in LEVELS]
        self.channel = self.keys.events
        self.deadlines = self.keys.deadlines
        client = self.redis.client
        self._enqueue = client.register_script(CREATE_SCRIPT)
        self._take_start = client.register_script(_TAKE_START)
        self._finish_if = client.register_script(_FINISH_IF)
        self._finish_batch = client.register_script(_FINISH_BATCH)
        self._fail_late = client.register_script(_FAIL_LATE)
        self.ensure_group()

    def ensure_group(self) -> None:
        """Creates the consumer group on every stream (again after a Redis that lost them)."""
        with self._redis("create the queue's consumer group"):
            for stream in self.streams:
                try:
                    self._client.xgroup_create(stream, GROUP, id="0", mkstream=True)
                except self.redis.errors.ResponseError as error:
                    if "BUSYGROUP" not in str(error):
                        raise

    def _redis(self, what: str) -> Any:
        return self.redis.call(what)

    @property
    def _client(self) -> Any:
        return self.redis.client

    # ---- submitting and cancelling
    def push(self, record: JobRecord, inputs: np.ndarray, level: int, max_queue: int) -> int:
        """Creates the job in the store and queues it, in one script: 1 queued, 0 the id
        exists (nothing done), -1 the queue holds max_queue jobs (nothing done)."""
        store = self.store
        keys = [self.keys.job(record.id), self.keys.pending, self.streams[level], self.deadlines, *self.streams]
        args = [record.id, record_bytes(record), npy_bytes(inputs), repr(float(record.submitted)),
                seconds(store.ttl_s), store.index_ttl(), max_queue,
                "" if record.deadline is None else repr(float(record.deadline))]
        with self._redis(f"queue job {record.id!r}"):
            return int(self._enqueue(keys=keys, args=args))

    def finish_if(self, record: JobRecord, result: np.ndarray | None, expected: str, unqueue: bool = False) -> bool:
        """Stores `record` (a final one) only while the job's status is `expected`; True when
        written. `unqueue`: also delete its queue entry (cancel)."""
        with self._redis(f"finish job {record.id!r}"):
            return bool(self._finish_if(keys=self._finish_keys(record), args=self._finish_args(record, result, expected, unqueue)))

    def _finish_keys(self, record: JobRecord) -> list[str]:
        return [self.keys.job(record.id), self.keys.pending, self.keys.finished]

    def _finish_args(self, record: JobRecord, result: np.ndarray | None, expected: str, unqueue: bool) -> list[Any]:
        return self.store.finish_args(record, result) + [expected, "1" if unqueue else "0"]

    # ---- a worker's side
    def take_start(self, count: int, block_s: float, held: list[Entry] | None = None
                   ) -> tuple[list[Started], list[JobRecord]]:
        """Moves the jobs of `held` (entries this process holds already: reclaimed ones) and
        of up to `count` - len(held) new entries, highest priority first, queued -> running,
        in one script (one round trip); with nothing to take, waits up to `block_s` for a
        first entry (a blocking read; then a second script starts it with the others).
        Returns the started (entry, record, input) and the final records of jobs past their
        deadline (failed there, never run). Entries of jobs cancelled, finished or gone are
        acknowledged and dropped; those of jobs running elsewhere are left to their owner."""
        given = list(held or ())
        try:
            with self._redis("take jobs from the queue"):
                flat = self._call_take_start(count, given)
                if not flat and not given and block_s > 0:
                    got = self._client.xreadgroup(GROUP, self.consumer, dict.fromkeys(self.streams, ">"), count=1,
                                                  block=max(1, int(block_s * 1e3)))
                    given = [Entry(self.streams.index(as_str(stream)), as_str(eid), as_str(fields[b"id"]))
                             for stream, items in got or () for eid, fields in items if fields]
                    if given:
                        self._hold(given)  # until the script below answers for them
                        flat = self._call_take_start(count, given)
        except BaseException:
            self._release(given)  # their fate is unknown here: a reclaimer decides after the timeout
            raise
        started, late = self._parse_take_start(flat)
        ours = {entry for entry, _, _ in started}
        self._release([entry for entry in given if entry not in ours])
        return started, late

    def _call_take_start(self, count: int, taken: list[Entry]) -> list[Any]:
        store = self.store
        args: list[Any] = [GROUP, self.consumer, count, repr(time.time()), self.keys.job(""), store.finished_ttl(),
                           store.index_ttl()]
        for entry in taken:
            args += [entry.level + 1, entry.entry_id, entry.job_id, "1" if entry.resume else "0"]
        return self._take_start(keys=[*self.streams, self.keys.pending, self.keys.finished], args=args)

    def _parse_take_start(self, flat: list[Any]) -> tuple[list[Started], list[JobRecord]]:
        started: list[Started] = []
        late: list[JobRecord] = []
        for i in range(0, len(flat), 6):
            entry = Entry(int(flat[i]) - 1, as_str(flat[i + 1]), as_str(flat[i + 2]))
            outcome = int(flat[i + 3])
            if outcome == 1:
                data = flat[i + 5]
                inputs = read_array(self.keys.job(entry.job_id), "input", data) if data else None
                started.append((entry, read_record(self.keys.job(entry.job_id), entry.job_id, flat[i + 4]), inputs))
            elif outcome == 2:
                late.append(read_record(self.keys.job(entry.job_id), entry.job_id, flat[i + 4]))
        self._hold([entry for entry, _, _ in started])
        return started, late

    def finish_many(self, items: list[Started]) -> list[bool]:
        """Stores each running job's final record (and row) and acknowledges its entry, in one
        script (one round trip). False for a job no longer running (a reclaimer failed it):
        not written."""
        args: list[Any] = [GROUP]
        for entry, record, row in items:
            args += [self.keys.job(record.id), self.streams[entry.level], entry.entry_id,
                     *self._finish_args(record, row, "running", False)]
        with self._redis("finish jobs"):
            answers = self._finish_batch(keys=[self.keys.pending, self.keys.finished], args=args)
        self._release([entry for entry, _, _ in items])
        return [bool(a) for a in answers]

    def fail_late(self, limit: int = 100) -> list[JobRecord]:
        """Fails queued jobs whose deadline has passed (whichever process looks: no worker
        may take them soon), up to `limit`; their final records."""
        store = self.store
        with self._redis("fail queued jobs past their deadline"):
            flat = self._fail_late(keys=[self.deadlines, self.keys.pending, self.keys.finished],
                                   args=[repr(time.time()), self.keys.job(""), store.finished_ttl(), store.index_ttl(),
                                         limit])
        return [read_record(self.keys.job(as_str(flat[i])), as_str(flat[i]), flat[i + 1]) for i in range(0, len(flat), 2)]

    def ack(self, entries: list[Entry]) -> None:
        """Acknowledges and deletes entries (their jobs are finished or gone)."""
        if not entries:
            return
        with self._redis("acknowledge queue entries"):
            pipe = self._client.pipeline(transaction=False)
            self._ack_into(pipe, entries)
            pipe.execute()
        self._release(entries)

    def _ack_into(self, pipe: Any, entries: list[Entry]) -> None:
        for entry in entries:
            pipe.xack(self.streams[entry.level], GROUP, entry.entry_id)
            pipe.xdel(self.streams[entry.level], entry.entry_id)

    def requeue(self, entries: list[Entry]) -> None:
        """Gives entries this process took but will not run (it is closing) back to the
        queue at once: a fresh entry each, the old one acknowledged, in one transaction."""
        if not entries:
            return
        with self._redis("give jobs back to the queue"):
            pipe = self._client.pipeline(transaction=True)
            for entry in entries:
                pipe.xadd(self.streams[entry.level], {"id": entry.job_id})
            self._ack_into(pipe, entries)
            answers = pipe.execute()
            fix = self._client.pipeline(transaction=False)
            for entry, new_id in zip(entries, answers):
                fix.hset(self.keys.job(entry.job_id), "qentry", as_str(new_id))
            fix.execute()
        self._release(entries)

    # ---- held entries, heartbeat and reclaim
    def _hold(self, entries: list[Entry]) -> None:
        with self._held_lock:
            for entry in entries:
                self._held[entry.entry_id] = entry

    def _release(self, entries: list[Entry]) -> None:
        with self._held_lock:
            for entry in entries:
                self._held.pop(entry.entry_id, None)

    def forget(self, entries: list[Entry]) -> None:
        """Stops the heartbeat of entries whose fate this process no longer knows (Redis
        failed mid-call): after the visibility timeout a reclaimer decides from the job's
        status."""
        self._release(entries)

    def heartbeat(self) -> None:
        """Resets the idle time of every entry this process holds (XCLAIM ... JUSTID)."""
        with self._held_lock:
            held = list(self._held.values())
        if not held:
            return
        with self._redis("refresh held queue entries"):
            pipe = self._client.pipeline(transaction=False)
            for level, stream in enumerate(self.streams):
                ids = [e.entry_id for e in held if e.level == level]
                if ids:
                    pipe.xclaim(stream, GROUP, self.consumer, 0, ids, justid=True)
            pipe.execute()

    def orphans(self, min_idle_s: float) -> list[Entry]:
        """Entries pending for this process's consumer, idle at least `min_idle_s`, that none
        of its workers holds (see the module): claimed again, held here, marked to resume.
        `min_idle_s` keeps out an entry a take has just delivered and a worker is about to
        hold (held entries are refreshed by the heartbeat, so they are never that idle)."""
        idle_ms = max(1, int(min_idle_s * 1e3))
        with self._redis("look for entries this process lost track of"):
            pipe = self._client.pipeline(transaction=False)
            for stream in self.streams:
                pipe.xpending_range(stream, GROUP, min="-", max="+", count=100, consumername=self.consumer,
                                    idle=idle_ms)
            pending = pipe.execute()
            with self._held_lock:
                lost = [[as_str(p["message_id"]) for p in rows if as_str(p["message_id"]) not in self._held]
                        for rows in pending]
            if not any(lost):
                return []
            pipe = self._client.pipeline(transaction=False)
            for stream, ids in zip(self.streams, lost):
                if ids:  # min idle again: an entry a worker took meanwhile stays its own
                    pipe.xclaim(stream, GROUP, self.consumer, idle_ms, ids)
            claimed = pipe.execute()
        streams = [level for level, ids in enumerate(lost) if ids]
        found = [Entry(level, as_str(eid), as_str(fields[b"id"]), resume=True)
                 for level, items in zip(streams, claimed) for eid, fields in items or () if fields]
        with self._held_lock:
            found = [entry for entry in found if entry.entry_id not in self._held]
            for entry in found:
                self._held[entry.entry_id] = entry
        return found

    def reclaim(self) -> tuple[list[Entry], int]:
        """Claims entries idle longer than the visibility timeout (their worker is gone).
        Returns the entries whose jobs are still queued (now held here, to run) and how many
        running jobs were failed with RECLAIMED_RUNNING."""
        idle_ms = int(self.visibility_timeout_s * 1e3)
        claimed: list[Entry] = []
        with self._redis("reclaim the entries of stopped workers"):
            for level, stream in enumerate(self.streams):
                start = "0-0"
                while True:
                    answer = self._client.xautoclaim(stream, GROUP, self.consumer, idle_ms, start, count=100)
                    start, items = as_str(answer[0]), answer[1]
                    claimed += [Entry(level, as_str(eid), as_str(fields[b"id"])) for eid, fields in items if fields]
                    if start == "0-0":
                        break
        if not claimed:
            return [], 0
        self._hold(claimed)
        with self._redis("read reclaimed jobs"):
            raw = self._client.pipeline(transaction=False)
            for entry in claimed:
                raw.hget(self.keys.job(entry.job_id), "record")
            records = raw.execute()
        rerun, done, failed = [], [], 0
        for entry, data in zip(claimed, records):
            record = read_record(self.keys.job(entry.job_id), entry.job_id, data) if data else None
            if record is not None and record.status == "queued":
                rerun.append(entry)
                continue
            if record is not None and record.status == "running":
                record.status, record.finished = "failed", time.time()
                record.error = RECLAIMED_RUNNING.format(v=self.visibility_timeout_s)
                failed += self.finish_if(record, None, "running")
            done.append(entry)
        self.ack(done)
        return rerun, failed

    # ---- what /metrics shows
    def depth(self) -> dict[str, int]:
        """Jobs waiting (not yet taken by a worker) per priority level, across all processes."""
        with self._redis("measure the queue"):
            pipe = self._client.pipeline(transaction=False)
            for stream in self.streams:
                pipe.xlen(stream)
                pipe.xpending(stream, GROUP)
            answers = pipe.execute()
        return {level: max(0, int(answers[2 * i]) - int(answers[2 * i + 1]["pending"]))
                for i, level in enumerate(LEVELS)}

    def publish(self, events: list[tuple[str, str]]) -> None:
        """Sends status changes to every front (one message: origin, then "id status" lines)."""
        if self.events and events:
            message = "\n".join([self.consumer] + [f"{job_id} {status}" for job_id, status in events])
            with self._redis("publish job events"):
                self._client.publish(self.channel, message)

    def __repr__(self) -> str:
        return f"RedisQueue(visibility_timeout_s={self.visibility_timeout_s:g}, consumer={self.consumer!r})"

