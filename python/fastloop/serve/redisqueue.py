"""RedisQueue: the queue of an InferenceService kept in Redis, so that several server
processes, on one machine or several, share one queue beside one RedisStore.

    >>> store = RedisStore("redis://10.0.0.1:6379/0")
    >>> svc = InferenceService(model, store=store, queue=RedisQueue(visibility_timeout_s=30))
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
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from .jobs import JobRecord, StoreError
from .redisconn import as_str, npy_bytes, read_array, read_record, record_bytes, seconds
from .redisstore import FINISH_SCRIPT, RedisStore

__all__ = ["RedisQueue", "LEVELS", "check_level", "Entry"]

LEVELS = ("high", "normal", "low")  # job priorities, served in this order
GROUP = "workers"
RECLAIMED_RUNNING = ("a worker process stopped while the job was running (no heartbeat for {v:g} s); "
                     "not retried: its input may be what stopped it")

# KEYS: job, pending, its stream, then every stream. ARGV: id, record, input, submitted, ttl,
# index_ttl, max_queue. 1: created and queued; 0: the id exists; -1: max_queue jobs wait.
_ENQUEUE = """
local cur = redis.call('HGET', KEYS[1], 'record')
if cur then
  if cur == ARGV[2] then return 1 end
  return 0
end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local depth = 0
for i = 4, #KEYS do depth = depth + redis.call('XLEN', KEYS[i]) end
if depth >= tonumber(ARGV[7]) then return -1 end
local entry = redis.call('XADD', KEYS[3], '*', 'id', ARGV[1])
redis.call('HSET', KEYS[1], 'record', ARGV[2], 'input', ARGV[3], 'qkey', KEYS[3], 'qentry', entry)
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[6])
return 1
"""

# KEYS: the streams, highest priority first. ARGV: group, consumer, count. Up to `count` new
# entries, from the first stream that has them on: {level, entry id, job id, ...}.
_TAKE = """
local n = tonumber(ARGV[3])
local out = {}
for i = 1, #KEYS do
  if n <= 0 then break end
  local got = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', n, 'STREAMS', KEYS[i], '>')
  if got then
    for _, e in ipairs(got[1][2]) do
      out[#out + 1] = i
      out[#out + 1] = e[1]
      out[#out + 1] = e[2][2]
      n = n - 1
    end
  end
end
return out
"""

# KEYS: job. ARGV: started. queued -> running: {1, record, input}; otherwise {0, status}
# (running elsewhere, finished, cancelled, failed by a reclaimer) or {0} (gone).
_START = """
local cur = redis.call('HGET', KEYS[1], 'record')
if not cur then return {0} end
local ok, rec = pcall(cjson.decode, cur)
if not ok or type(rec) ~= 'table' then return {0} end
if rec['status'] ~= 'queued' then return {0, rec['status']} end
rec['status'] = 'running'
rec['started'] = tonumber(ARGV[1])
local new = cjson.encode(rec)
redis.call('HSET', KEYS[1], 'record', new)
return {1, new, redis.call('HGET', KEYS[1], 'input')}
"""

# RedisStore's finish, only while the job has status ARGV[8] (0 otherwise); a job Redis lost
# is written, as RedisStore.finish does. ARGV[9] == '1' also deletes its queue entry (cancel).
_GUARD = """
local cur = redis.call('HGET', KEYS[1], 'record')
if cur then
  local ok, rec = pcall(cjson.decode, cur)
  if not ok or type(rec) ~= 'table' or rec['status'] ~= ARGV[8] then return 0 end
end
if ARGV[9] == '1' then
  local q = redis.call('HMGET', KEYS[1], 'qkey', 'qentry')
  if q[1] and q[2] then redis.call('XDEL', q[1], q[2]) end
end
"""
_FINISH_IF = _GUARD + FINISH_SCRIPT


@dataclass(frozen=True)
class Entry:
    """A queue entry a worker holds: its priority level (index into LEVELS), stream entry id
    and job id."""

    level: int
    entry_id: str
    job_id: str


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

    >>> svc = InferenceService(model, store=RedisStore(url), queue=RedisQueue())
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
        client = self.redis.client
        self._enqueue = client.register_script(_ENQUEUE)
        self._take = client.register_script(_TAKE)
        self._start = client.register_script(_START)
        self._finish_if = client.register_script(_FINISH_IF)
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
        keys = [self.keys.job(record.id), self.keys.pending, self.streams[level], *self.streams]
        args = [record.id, record_bytes(record), npy_bytes(inputs), repr(float(record.submitted)),
                seconds(store.ttl_s), store.index_ttl(), max_queue]
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
    def take(self, count: int, block_s: float) -> list[Entry]:
        """Up to `count` new entries, highest priority first; waits up to `block_s` for the
        first when none is there."""
        with self._redis("take jobs from the queue"):
            entries = self._parse_take(self._take(keys=self.streams, args=[GROUP, self.consumer, count]))
            if not entries and block_s > 0:
                got = self._client.xreadgroup(GROUP, self.consumer, dict.fromkeys(self.streams, ">"), count=1,
                                              block=max(1, int(block_s * 1e3)))
                entries = [Entry(self.streams.index(as_str(stream)), as_str(eid), as_str(fields[b"id"]))
                           for stream, items in got or () for eid, fields in items if fields]
                entries.sort(key=lambda e: e.level)
        self._hold(entries)
        return entries

    def _parse_take(self, flat: list[Any]) -> list[Entry]:
        return [Entry(int(flat[i]) - 1, as_str(flat[i + 1]), as_str(flat[i + 2])) for i in range(0, len(flat), 3)]

    def start(self, entries: list[Entry], now: float) -> list[tuple[Entry, JobRecord, np.ndarray | None]]:
        """queued -> running for each entry's job, in one round trip; returns those started
        with their record and input. The others (cancelled, already finished, gone) are
        acknowledged and dropped."""
        with self._redis("start jobs"):
            pipe = self._client.pipeline(transaction=False)
            for entry in entries:
                self._start(keys=[self.keys.job(entry.job_id)], args=[repr(now)], client=pipe)
            answers = pipe.execute(raise_on_error=False)
        started, dropped, elsewhere = [], [], []
        for entry, answer in zip(entries, answers):
            if isinstance(answer, Exception):
                elsewhere.append(entry)  # unknown: a reclaimer decides after the timeout
                continue
            if not answer or int(answer[0]) != 1:
                # running: another process holds this entry too (a reclaimer took it from a
                # stalled worker); its owner acknowledges it, so that a death still gets it reclaimed
                (elsewhere if len(answer) > 1 and as_str(answer[1]) == "running" else dropped).append(entry)
                continue
            key = self.keys.job(entry.job_id)
            record = read_record(key, entry.job_id, answer[1])
            inputs = read_array(key, "input", answer[2]) if answer[2] else None
            started.append((entry, record, inputs))
        self._release(elsewhere)
        if dropped:
            self.ack(dropped)
        return started

    def finish_many(self, items: list[tuple[Entry, JobRecord, np.ndarray | None]]) -> list[bool]:
        """Stores each running job's final record (and row) and acknowledges its entry, in one
        round trip. False for a job no longer running (a reclaimer failed it): not written."""
        with self._redis("finish jobs"):
            pipe = self._client.pipeline(transaction=False)
            for _, record, row in items:
                self._finish_if(keys=self._finish_keys(record), args=self._finish_args(record, row, "running", False),
                                client=pipe)
            self._ack_into(pipe, [entry for entry, _, _ in items])
            answers = pipe.execute(raise_on_error=False)
        self._release([entry for entry, _, _ in items])
        errors = [a for a in answers[:len(items)] if isinstance(a, Exception)]
        if errors:
            raise StoreError(f"RedisQueue: could not finish {len(errors)} job(s): {errors[0]}")
        return [bool(a) for a in answers[:len(items)]]

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

