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
about ``socket_timeout`` (a refused connection: at once), and for the next 0.1 s the store
fails at once without trying, so a worker holding a batch does not wait a timeout per job.
redis-py reconnects by itself: after a Redis restart the next command goes through (a pooled
connection the restart closed is retried once on a fresh one).

    >>> store = RedisStore("redis://127.0.0.1:6379/0")
    >>> svc = InferenceService(model, store=store)
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import warnings
from typing import Any, Iterator

import numpy as np

from .jobs import DONE, EXPIRED, FINISHED, QUEUED, RUNNING, JobRecord, StoreError
from . import npy_codec
from .stores import Store

__all__ = ["RedisStore", "StoreUnavailable"]

_MARGIN_S = 60  # Redis keeps a finished or expired job this long after the janitor would forget it
_COOLDOWN_S = 0.1  # after a failed connection, fail at once for this long
_CHUNK = 1000  # ids per pipeline in recover() and expire()


class StoreUnavailable(StoreError):
    """The store cannot be reached (Redis down, restarting or not answering within its
    socket timeout). A front answers 503; retrying later may succeed.

    >>> svc.submit(x)  # raises StoreUnavailable while Redis is down
    """


# KEYS: job, pending. ARGV: id, record, input, has_input, submitted, ttl, index_ttl.
# Returns 1 when created, 0 when the id exists. The same record again (a retried call whose
# first try went through) also answers 1.
_CREATE = """
local cur = redis.call('HGET', KEYS[1], 'record')
if cur then
  if cur == ARGV[2] then return 1 end
  return 0
end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'record', ARGV[2], 'input', ARGV[3])
else
  redis.call('HSET', KEYS[1], 'record', ARGV[2])
end
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[7])
return 1
"""

# KEYS: job. ARGV: record. Returns 0 (and writes nothing) for an unknown job.
_UPDATE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'record', ARGV[1])
return 1
"""

# KEYS: job, pending, finished. ARGV: id, record, result, has_result, finished_at, ttl, index_ttl.
# Writes the job even if Redis lost it (restarted without persistence): its final record wins.
_FINISH = """
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'result', ARGV[3], 'record', ARGV[2])
else
  redis.call('HDEL', KEYS[1], 'result')
  redis.call('HSET', KEYS[1], 'record', ARGV[2])
end
redis.call('HDEL', KEYS[1], 'input')
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
redis.call('EXPIRE', KEYS[3], ARGV[7])
return 1
"""

# KEYS: job, finished, expired. ARGV: id, old record, new record, expired_at, ttl, index_ttl.
# 1: marked expired; 0: the job is gone (its index entry removed); -1: it changed meanwhile.
_EXPIRE = """
local cur = redis.call('HGET', KEYS[1], 'record')
if not cur then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
if cur ~= ARGV[2] then return -1 end
redis.call('HSET', KEYS[1], 'record', ARGV[3])
redis.call('HDEL', KEYS[1], 'result', 'input')
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
redis.call('EXPIRE', KEYS[3], ARGV[6])
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


def _import_redis() -> Any:
    try:
        import redis
    except ImportError:
        raise ImportError("fastloop.serve.RedisStore needs redis-py: pip install redis") from None
    return redis


class RedisStore(Store):
    """Jobs in Redis at ``url`` (redis://host:port/db, rediss:// or unix://), under keys
    starting with ``prefix``. ``socket_timeout``: seconds a command (and a connect) may
    take before it raises StoreUnavailable. ``ttl_s``: how long Redis keeps an unfinished
    job after its last write. Several services may share one Redis if each has its own
    prefix; two services on one prefix would each recover the other's jobs.

    >>> svc = InferenceService(model, store=RedisStore("redis://127.0.0.1:6379/0"))
    """

    keeps_inputs = True
    writes_batches = True

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", prefix: str = "fastloop:", *,
                 socket_timeout: float = 1.0, ttl_s: float = 86400.0) -> None:
        redis = _import_redis()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        if socket_timeout <= 0 or ttl_s <= 0:
            raise ValueError("socket_timeout and ttl_s must be > 0")
        self.url, self.prefix = url, prefix
        self.ttl_s = float(ttl_s)
        self._errors = redis.exceptions
        # One retry, and only on a connection error: it replaces a pooled connection that a
        # Redis restart closed. A timeout is not retried (the command may have run).
        retry = Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,))
        self._client = redis.Redis.from_url(url, socket_timeout=socket_timeout,
                                            socket_connect_timeout=socket_timeout, retry=retry)
        kwargs = self._client.connection_pool.connection_kwargs
        self._where = kwargs.get("path") or f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
        self._pending, self._finished, self._expired = prefix + "pending", prefix + "finished", prefix + "expired"
        self._create = self._client.register_script(_CREATE)
        self._update = self._client.register_script(_UPDATE)
        self._finish = self._client.register_script(_FINISH)
        self._expire = self._client.register_script(_EXPIRE)
        self._forget = self._client.register_script(_FORGET)
        self._service_ttls: tuple[float, float] | None = None  # (result_ttl_s, expired_ttl_s), from expire()
        self._down_until = 0.0
        self._down_reason = ""
        self._problems: list[str] = []

    # ---- helpers
    def key(self, job_id: str) -> str:
        """The hash that holds the job."""
        return f"{self.prefix}job:{job_id}"

    @contextlib.contextmanager
    def _redis(self, what: str) -> Iterator[None]:
        """Turns redis-py's errors into StoreUnavailable / StoreError naming what failed."""
        if time.monotonic() < self._down_until:
            raise StoreUnavailable(f"RedisStore: cannot {what}: Redis at {self._where} is unreachable "
                                   f"({self._down_reason})")
        try:
            yield
        except (self._errors.ConnectionError, self._errors.TimeoutError) as error:
            self._down_reason = str(error) or type(error).__name__
            self._down_until = time.monotonic() + _COOLDOWN_S
            raise StoreUnavailable(f"RedisStore: cannot {what}: Redis at {self._where} is unreachable "
                                   f"({self._down_reason})") from error
        except self._errors.RedisError as error:
            raise StoreError(f"RedisStore: cannot {what}: {type(error).__name__}: {error}") from error

    def _finished_ttl(self) -> int:
        if self._service_ttls is None:
            return _seconds(self.ttl_s)
        return _seconds(sum(self._service_ttls) + _MARGIN_S)

    def _index_ttl(self) -> int:
        return max(_seconds(self.ttl_s), self._finished_ttl())

    def _parse(self, job_id: str, data: bytes) -> JobRecord:
        try:
            record = JobRecord.from_json(json.loads(data))
            if record.id != job_id:
                raise ValueError(f"it holds the record of job {record.id!r}")
        except (ValueError, TypeError) as error:  # json's errors are ValueErrors
            raise StoreError(f"RedisStore: cannot read {self.key(job_id)!r} field 'record': {error}") from None
        return record

    def _array(self, job_id: str, field: str, data: bytes) -> np.ndarray:
        try:
            return npy_codec.decode(data)
        except (OSError, ValueError, EOFError) as error:
            raise StoreError(f"RedisStore: cannot read {self.key(job_id)!r} field {field!r}: {error}") from None

    # ---- the Store interface
    def create(self, record: JobRecord, inputs: np.ndarray | None) -> bool:
        data = _record_bytes(record)
        array = _npy(inputs) if inputs is not None else b""
        args = [record.id, data, array, "1" if inputs is not None else "0", repr(float(record.submitted)),
                _seconds(self.ttl_s), self._index_ttl()]
        with self._redis(f"create job {record.id!r}"):
            return bool(self._create(keys=[self.key(record.id), self._pending], args=args))

    def update(self, record: JobRecord) -> None:
        with self._redis(f"update job {record.id!r}"):
            found = self._update(keys=[self.key(record.id)], args=[_record_bytes(record)])
        if not found:
            raise KeyError(record.id)

    def finish(self, record: JobRecord, result: np.ndarray | None) -> None:
        with self._redis(f"finish job {record.id!r}"):
            self._finish(keys=[self.key(record.id), self._pending, self._finished],
                         args=self._finish_args(record, result))

    def _finish_args(self, record: JobRecord, result: np.ndarray | None) -> list[Any]:
        array = _npy(result) if result is not None else b""
        finished = record.finished if record.finished is not None else time.time()
        return [record.id, _record_bytes(record), array, "1" if result is not None else "0", repr(float(finished)),
                self._finished_ttl(), self._index_ttl()]

    def update_many(self, records: list[JobRecord]) -> list[Exception | None]:
        """The records of a batch in one round trip (a pipeline of the update scripts)."""
        if len(records) == 1:  # a plain call costs less Python than a pipeline of one
            return super().update_many(records)
        with self._redis(f"update {len(records)} jobs"):
            answers = self._pipelined(self._update, [([self.key(r.id)], [_record_bytes(r)]) for r in records])
        return [KeyError(record.id) if answer == 0 else self._failed(f"update job {record.id!r}", answer)
                for record, answer in zip(records, answers)]

    def finish_many(self, items: list[tuple[JobRecord, np.ndarray | None]]) -> list[Exception | None]:
        """A batch's results and final records in one round trip."""
        if len(items) == 1:
            return super().finish_many(items)
        with self._redis(f"finish {len(items)} jobs"):
            answers = self._pipelined(self._finish, [([self.key(record.id), self._pending, self._finished],
                                                      self._finish_args(record, result)) for record, result in items])
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
            if attempt == 1 and any(isinstance(a, self._errors.NoScriptError) for a in answers):
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
        with self._redis(f"read job {job_id!r}"):
            data = self._client.hget(self.key(job_id), "record")
        if data is None:
            raise KeyError(job_id)
        return self._parse(job_id, data)

    def get_with_result(self, job_id: str) -> tuple[JobRecord, np.ndarray | None]:
        with self._redis(f"read job {job_id!r}"):
            data, result = self._client.hmget(self.key(job_id), ["record", "result"])
        if data is None:
            raise KeyError(job_id)
        record = self._parse(job_id, data)
        if record.status != DONE or result is None:
            return record, None
        return record, self._array(job_id, "result", result)

    def get_input(self, job_id: str) -> np.ndarray | None:
        with self._redis(f"read the input of job {job_id!r}"):
            data = self._client.hget(self.key(job_id), "input")
        return None if data is None else self._array(job_id, "input", data)

    def get_result(self, job_id: str) -> np.ndarray:
        with self._redis(f"read the result of job {job_id!r}"):
            data = self._client.hget(self.key(job_id), "result")
        if data is None:
            raise KeyError(job_id)
        return self._array(job_id, "result", data)

    def delete(self, job_id: str) -> None:
        with self._redis(f"delete job {job_id!r}"):
            pipe = self._client.pipeline(transaction=True)
            pipe.delete(self.key(job_id))
            for index in (self._pending, self._finished, self._expired):
                pipe.zrem(index, job_id)
            pipe.execute()

    def expire(self, now: float, ttl_s: float, forget_after_s: float) -> list[str]:
        self._service_ttls = (float(ttl_s), float(forget_after_s))
        with self._redis("expire old jobs"):
            due = [_str(m) for m in self._client.zrangebyscore(self._finished, "-inf", repr(now - ttl_s))]
            expired = [job_id for part in _chunks(due) for job_id in self._mark_expired(part, now, ttl_s)]
            gone = [_str(m) for m in self._client.zrangebyscore(self._expired, "-inf", repr(now - forget_after_s))]
            for part in _chunks(gone):
                pipe = self._client.pipeline(transaction=False)
                for job_id in part:
                    self._forget(keys=[self.key(job_id), self._expired], args=[job_id], client=pipe)
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
                new = _record_bytes(record)
            self._expire(keys=[self.key(job_id), self._finished, self._expired],
                         args=[job_id, old or b"", new, repr(now), _seconds(_expired_ttl(self._service_ttls)),
                               self._index_ttl()], client=pipe)
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
        with self._redis("list the unfinished jobs"):
            ids = [_str(m) for m in self._client.zrange(self._pending, 0, -1)]
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
                    self._client.zrem(self._pending, *stale)
        return sorted(left, key=lambda r: r.submitted)

    def close(self) -> None:
        self._client.close()

    @property
    def problems(self) -> list[str]:
        return list(self._problems)

    def __repr__(self) -> str:
        return f"RedisStore({self._where!r}, prefix={self.prefix!r})"


def _expired_ttl(service_ttls: tuple[float, float] | None) -> float:
    """How long Redis keeps an expired job: the janitor forgets it first."""
    return (service_ttls[1] if service_ttls else 0.0) + _MARGIN_S


def _seconds(ttl: float) -> int:
    return max(1, int(math.ceil(ttl)))


def _record_bytes(record: JobRecord) -> bytes:
    return json.dumps(record.to_json()).encode()


def _npy(array: np.ndarray) -> bytes:
    return npy_codec.encode(array)


def _str(member: bytes | str) -> str:
    return member.decode() if isinstance(member, bytes) else member


def _chunks(ids: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), _CHUNK):
        yield ids[start:start + _CHUNK]
