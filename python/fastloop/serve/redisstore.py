"""RedisStore: an InferenceService's jobs in Redis (redis-py against a redis-server), every
key with a TTL so that Redis itself drops old jobs.

Keys (``prefix`` defaults to "fastloop:")::

    <prefix>job:<id>     a hash: "record" (the JobRecord as JSON), "input" (.npy bytes, while
                         the job is queued or running), "result" (.npy bytes of a done job)
    <prefix>pending      sorted set: ids of queued/running jobs by submit time (recover())
    <prefix>finished     sorted set: ids of done/failed jobs by finish time (expire())
    <prefix>expired      sorted set: ids of expired jobs by expiry time (forgetting them)

Every write is one Lua script, so it is atomic: a job exists whole or not at all, and a
reader that sees "done" finds the result. Arrays are ``.npy`` bytes written and read with
``allow_pickle=False``; records are JSON. Nothing is unpickled.

TTLs: an unfinished job's hash lives ``ttl_s`` (default one day) after its last write, so a
job no service ever finishes is dropped by Redis. Once the service's janitor has called
expire() the store knows its result_ttl_s and expired_ttl_s: a finished job's hash then
lives result_ttl_s + expired_ttl_s + 60 s, an expired one's expired_ttl_s + 60 s (the
janitor forgets it before Redis does). Index entries whose hash Redis dropped are removed
when expire() or recover() comes across them.

Outages: a command that cannot reach Redis raises StoreUnavailable (a StoreError) within
about ``socket_timeout_s`` (a refused connection: at once), and for the next 0.1 s the store
fails at once without trying, so a worker holding a batch does not wait a timeout per job.
redis-py reconnects by itself: after a Redis restart the next command goes through (a pooled
connection the restart closed is retried once on a fresh one).

    >>> store = RedisStore("redis://127.0.0.1:6379/0")
    >>> svc = InferenceService(model, store=store)
"""

from __future__ import annotations

import time
import warnings
from typing import Any, Iterator

import numpy as np

from .jobs import DONE, EXPIRED, FINISHED, QUEUED, RUNNING, JobRecord, StoreError
from .redisconn import (RedisConnection, RedisKeys, StoreUnavailable, as_str, npy_bytes, read_array, read_record,
                        record_bytes, seconds)
from .stores import Store

__all__ = ["RedisStore", "StoreUnavailable"]

_MARGIN_S = 60  # Redis keeps a finished or expired job this long after the janitor would forget it
_CHUNK = 1000  # ids per pipeline in recover() and expire()


# Creates a job, the one script that does (RedisQueue.push runs it too, to queue the job in
# the same step). KEYS: job, pending; when queued also its stream, deadlines, then every
# stream. ARGV: id, record, input ('' for none), submitted, ttl, index_ttl, max_queue ('' when
# not queued), deadline ('' for none). 1: created (the same record again, a retried call whose
# first try went through, also answers 1); 0: the id exists; -1: max_queue jobs wait.
CREATE_SCRIPT = """
local cur = redis.call('HGET', KEYS[1], 'record')
if cur then
  if cur == ARGV[2] then return 1 end
  return 0
end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local fields = {'record', ARGV[2]}
if ARGV[3] ~= '' then
  table.insert(fields, 'input'); table.insert(fields, ARGV[3])
end
if ARGV[7] ~= '' then
  local depth = 0
  for i = 5, #KEYS do depth = depth + redis.call('XLEN', KEYS[i]) end
  if depth >= tonumber(ARGV[7]) then return -1 end
  local entry = redis.call('XADD', KEYS[3], '*', 'id', ARGV[1])
  table.insert(fields, 'qkey'); table.insert(fields, KEYS[3])
  table.insert(fields, 'qentry'); table.insert(fields, entry)
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[6])
if ARGV[8] ~= '' then
  redis.call('ZADD', KEYS[4], ARGV[8], ARGV[1])
  redis.call('EXPIRE', KEYS[4], ARGV[6])
end
return 1
"""

# KEYS: job. ARGV: record. Returns 0 (and writes nothing) for an unknown job.
_UPDATE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'record', ARGV[1])
return 1
"""

# The end of finishing or expiring a job, whose script's KEYS begin job, the index it leaves,
# the index it enters, and ARGV with its id: moves the id to the new index at `at` and renews
# the TTLs of the job's hash and of the new index.
_MOVE_JOB = """
local function move_job(at, ttl, index_ttl)
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZADD', KEYS[3], at, ARGV[1])
  redis.call('EXPIRE', KEYS[3], index_ttl)
end
"""

# KEYS: job, pending, finished. ARGV: id, record, result, has_result, finished_at, ttl, index_ttl
# (RedisStore.finish_args). Writes the job even if Redis lost it (restarted without
# persistence): its final record wins. RedisQueue runs it behind a guard of its own.
FINISH_SCRIPT = _MOVE_JOB + """
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'result', ARGV[3], 'record', ARGV[2])
else
  redis.call('HDEL', KEYS[1], 'result')
  redis.call('HSET', KEYS[1], 'record', ARGV[2])
end
redis.call('HDEL', KEYS[1], 'input')
move_job(ARGV[5], ARGV[6], ARGV[7])
return 1
"""

# KEYS: job, finished, expired. ARGV: id, old record, new record, expired_at, ttl, index_ttl.
# 1: marked expired; 0: the job is gone (its index entry removed); -1: it changed meanwhile.
_EXPIRE = _MOVE_JOB + """
local cur = redis.call('HGET', KEYS[1], 'record')
if not cur then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
if cur ~= ARGV[2] then return -1 end
redis.call('HSET', KEYS[1], 'record', ARGV[3])
redis.call('HDEL', KEYS[1], 'result', 'input')
move_job(ARGV[4], ARGV[5], ARGV[6])
return 1
"""

# KEYS: job, expired. ARGV: id. Deletes the job only if it is (still) expired.
_FORGET = """
redis.call('ZREM', KEYS[2], ARGV[1])
local cur = redis.call('HGET', KEYS[1], 'record')
if not cur then return 0 end
local ok, rec = pcall(cjson.decode, cur)
if ok and type(rec) == 'table' and rec['status'] == 'expired' then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""


class RedisStore(Store):
    """Jobs in Redis at ``url`` (redis://host:port/db, rediss:// or unix://), under keys
    starting with ``prefix``. ``socket_timeout_s``: seconds a command (and a connect) may
    take before it raises StoreUnavailable. ``ttl_s``: how long Redis keeps an unfinished
    job after its last write. Several services may share one Redis if each has its own
    prefix; two services on one prefix would each recover the other's jobs.

    >>> svc = InferenceService(model, store=RedisStore("redis://127.0.0.1:6379/0"))
    """

    keeps_inputs = True
    writes_batches = True

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", prefix: str = "fastloop:", *,
                 socket_timeout_s: float = 1.0, ttl_s: float = 86400.0) -> None:
        if socket_timeout_s <= 0 or ttl_s <= 0:
            raise ValueError("socket_timeout_s and ttl_s must be > 0")
        self.url, self.prefix = url, prefix
        self.ttl_s = float(ttl_s)
        self.redis = RedisConnection(url, socket_timeout_s)  # RedisQueue shares it (and its outage state)
        self.keys = RedisKeys(prefix)
        self._client = self.redis.client
        self._create = self._client.register_script(CREATE_SCRIPT)
        self._update = self._client.register_script(_UPDATE)
        self._finish = self._client.register_script(FINISH_SCRIPT)
        self._expire = self._client.register_script(_EXPIRE)
        self._forget = self._client.register_script(_FORGET)
        self._service_ttls: tuple[float, float] | None = None  # (result_ttl_s, expired_ttl_s), from expire()
        self._problems: list[str] = []

    # ---- helpers (the TTLs and finish_args are RedisQueue's too)
    def key(self, job_id: str) -> str:
        """The hash that holds the job."""
        return self.keys.job(job_id)

    def finished_ttl(self) -> int:
        """Seconds Redis keeps a finished job's hash."""
        if self._service_ttls is None:
            return seconds(self.ttl_s)
        return seconds(sum(self._service_ttls) + _MARGIN_S)

    def index_ttl(self) -> int:
        """Seconds Redis keeps an index (sorted set) after its last write."""
        return max(seconds(self.ttl_s), self.finished_ttl())

    def _parse(self, job_id: str, data: bytes) -> JobRecord:
        return read_record(self.key(job_id), job_id, data)

    def _array(self, job_id: str, field: str, data: bytes) -> np.ndarray:
        return read_array(self.key(job_id), field, data)

    # ---- the Store interface
    def create(self, record: JobRecord, inputs: np.ndarray | None) -> bool:
        data = record_bytes(record)
        array = npy_bytes(inputs) if inputs is not None else b""
        args = [record.id, data, array, repr(float(record.submitted)), seconds(self.ttl_s), self.index_ttl(), "", ""]
        with self.redis.call(f"create job {record.id!r}"):
            return bool(self._create(keys=[self.key(record.id), self.keys.pending], args=args))

    def update(self, record: JobRecord) -> None:
        with self.redis.call(f"update job {record.id!r}"):
            found = self._update(keys=[self.key(record.id)], args=[record_bytes(record)])
        if not found:
            raise KeyError(record.id)

    def finish(self, record: JobRecord, result: np.ndarray | None) -> None:
        with self.redis.call(f"finish job {record.id!r}"):
            self._finish(keys=[self.key(record.id), self.keys.pending, self.keys.finished],
                         args=self.finish_args(record, result))

    def finish_args(self, record: JobRecord, result: np.ndarray | None) -> list[Any]:
        array = npy_bytes(result) if result is not None else b""
        finished = record.finished if record.finished is not None else time.time()
        return [record.id, record_bytes(record), array, "1" if result is not None else "0", repr(float(finished)),
                self.finished_ttl(), self.index_ttl()]

    def update_many(self, records: list[JobRecord]) -> list[Exception | None]:
        """The records of a batch in one round trip (a pipeline of the update scripts)."""
        if len(records) == 1:  # a plain call costs less Python than a pipeline of one
            return super().update_many(records)
        with self.redis.call(f"update {len(records)} jobs"):
            answers = self._pipelined(self._update, [([self.key(r.id)], [record_bytes(r)]) for r in records])
        return [KeyError(record.id) if answer == 0 else self._failed(f"update job {record.id!r}", answer)
                for record, answer in zip(records, answers)]

    def finish_many(self, items: list[tuple[JobRecord, np.ndarray | None]]) -> list[Exception | None]:
        """A batch's results and final records in one round trip."""
        if len(items) == 1:
            return super().finish_many(items)
        with self.redis.call(f"finish {len(items)} jobs"):
            answers = self._pipelined(self._finish, [([self.key(record.id), self.keys.pending, self.keys.finished],
                                                      self.finish_args(record, result)) for record, result in items])
        return [self._failed(f"finish job {record.id!r}", answer) for (record, _), answer in zip(items, answers)]

    def _pipelined(self, script: Any, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """Runs `script` once per (keys, args) in one round trip; each answer, or the error
        its call raised. Plain EVALSHAs: redis-py's pipelined scripts would first ask
        SCRIPT EXISTS, a second round trip. A Redis that lost its script cache (restarted)
        answers NOSCRIPT: load the script and run the calls again (every script here is
        idempotent)."""
        for attempt in (1, 2):
            pipe = self._client.pipeline(transaction=False)
            for keys, args in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            answers = pipe.execute(raise_on_error=False)
            if attempt == 1 and any(isinstance(a, self.redis.errors.NoScriptError) for a in answers):
                self._client.script_load(script.script)
                continue
            return answers
        return answers

    def _failed(self, what: str, answer: Any) -> Exception | None:
        """A pipeline's answer as an outcome: None, or the StoreError its command raised."""
        if isinstance(answer, Exception):
            return StoreError(f"RedisStore: cannot {what}: {type(answer).__name__}: {answer}")
        return None

    def get(self, job_id: str) -> JobRecord:
        with self.redis.call(f"read job {job_id!r}"):
            data = self._client.hget(self.key(job_id), "record")
        if data is None:
            raise KeyError(job_id)
        return self._parse(job_id, data)

    def get_with_result(self, job_id: str) -> tuple[JobRecord, np.ndarray | None]:
        with self.redis.call(f"read job {job_id!r}"):
            data, result = self._client.hmget(self.key(job_id), ["record", "result"])
        if data is None:
            raise KeyError(job_id)
        record = self._parse(job_id, data)
        if record.status != DONE or result is None:
            return record, None
        return record, self._array(job_id, "result", result)

    def get_input(self, job_id: str) -> np.ndarray | None:
        with self.redis.call(f"read the input of job {job_id!r}"):
            data = self._client.hget(self.key(job_id), "input")
        return None if data is None else self._array(job_id, "input", data)

    def get_result(self, job_id: str) -> np.ndarray:
        with self.redis.call(f"read the result of job {job_id!r}"):
            data = self._client.hget(self.key(job_id), "result")
        if data is None:
            raise KeyError(job_id)
        return self._array(job_id, "result", data)

    def delete(self, job_id: str) -> None:
        with self.redis.call(f"delete job {job_id!r}"):
            pipe = self._client.pipeline(transaction=True)
            pipe.delete(self.key(job_id))
            for index in (self.keys.pending, self.keys.finished, self.keys.expired):
                pipe.zrem(index, job_id)
            pipe.execute()

    def expire(self, now: float, ttl_s: float, forget_after_s: float) -> list[str]:
        self._service_ttls = (float(ttl_s), float(forget_after_s))
        with self.redis.call("expire old jobs"):
            due = [as_str(m) for m in self._client.zrangebyscore(self.keys.finished, "-inf", repr(now - ttl_s))]
            expired = [job_id for part in _chunks(due) for job_id in self._mark_expired(part, now, ttl_s)]
            gone = [as_str(m) for m in self._client.zrangebyscore(self.keys.expired, "-inf", repr(now - forget_after_s))]
            for part in _chunks(gone):
                pipe = self._client.pipeline(transaction=False)
                for job_id in part:
                    self._forget(keys=[self.key(job_id), self.keys.expired], args=[job_id], client=pipe)
                pipe.execute()
        return expired

    def _mark_expired(self, ids: list[str], now: float, ttl_s: float) -> list[str]:
        """Marks the due jobs among ids expired; returns those it marked."""
        pipe = self._client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(self.key(job_id), "record")
        olds = pipe.execute()
        pipe = self._client.pipeline(transaction=False)
        marked = []
        for job_id, old in zip(ids, olds):
            record = self._readable(job_id, old)
            if old is not None and (record is None or record.status not in FINISHED):
                continue  # unreadable (reported), or not finished: nothing to expire
            if record is not None and (record.finished is None or record.finished > now - ttl_s):
                continue  # finished again since: its new score is later
            new = b""
            if record is not None:
                record.status, record.expired_at = EXPIRED, now
                new = record_bytes(record)
            self._expire(keys=[self.key(job_id), self.keys.finished, self.keys.expired],
                         args=[job_id, old or b"", new, repr(now), seconds(_expired_ttl(self._service_ttls)),
                               self.index_ttl()], client=pipe)
            marked.append(job_id)
        outcomes = pipe.execute()
        return [job_id for job_id, outcome in zip(marked, outcomes) if outcome == 1]

    def _readable(self, job_id: str, data: bytes | None) -> JobRecord | None:
        """The parsed record, or None (reported once in problems) when it cannot be parsed."""
        if data is None:
            return None
        try:
            return self._parse(job_id, data)
        except StoreError as error:
            message = str(error).removeprefix("RedisStore: ")
            if message not in self._problems:
                self._problems.append(message)
                warnings.warn(f"RedisStore: {message}", RuntimeWarning, stacklevel=4)
            return None

    def recover(self) -> list[JobRecord]:
        left: list[JobRecord] = []
        with self.redis.call("list the unfinished jobs"):
            ids = [as_str(m) for m in self._client.zrange(self.keys.pending, 0, -1)]
            for part in _chunks(ids):
                pipe = self._client.pipeline(transaction=False)
                for job_id in part:
                    pipe.hget(self.key(job_id), "record")
                stale = []
                for job_id, data in zip(part, pipe.execute()):
                    record = self._readable(job_id, data)
                    if data is None:
                        stale.append(job_id)  # Redis dropped it (TTL)
                    elif record is not None and record.status in (QUEUED, RUNNING):
                        left.append(record)
                if stale:
                    self._client.zrem(self.keys.pending, *stale)
        return sorted(left, key=lambda r: r.submitted)

    def close(self) -> None:
        self.redis.close()

    @property
    def problems(self) -> list[str]:
        return list(self._problems)

    def __repr__(self) -> str:
        return f"RedisStore({self.redis.where!r}, prefix={self.prefix!r})"


def _expired_ttl(service_ttls: tuple[float, float] | None) -> float:
    """How long Redis keeps an expired job: the janitor forgets it first."""
    return (service_ttls[1] if service_ttls else 0.0) + _MARGIN_S


def _chunks(ids: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), _CHUNK):
        yield ids[start:start + _CHUNK]
