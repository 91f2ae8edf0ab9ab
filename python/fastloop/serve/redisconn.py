"""What RedisStore and RedisQueue share: one connection to Redis (the client, its retry
policy and outage handling), the names of the keys under a prefix, and how a job's hash
encodes its record and arrays.

    >>> conn = RedisConnection("redis://127.0.0.1:6379/0", socket_timeout=1.0)
    >>> with conn.call("read job 'a'"):
    ...     conn.client.hget(RedisKeys("fastloop:").job("a"), "record")
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from typing import Any, Iterator

import numpy as np

from .npy_codec import decode as _decode_npy
from .npy_codec import encode as npy_bytes  # np.save's bytes, each header built once
from .jobs import JobRecord, StoreError

__all__ = ["StoreUnavailable", "RedisConnection", "RedisKeys", "record_bytes", "read_record", "npy_bytes",
           "read_array", "seconds", "as_str"]

_COOLDOWN_S = 0.1  # after a failed connection, fail at once for this long


class StoreUnavailable(StoreError):
    """The store cannot be reached (Redis down, restarting or not answering within its
    socket timeout). A front answers 503; retrying later may succeed.

    >>> svc.submit(x)  # raises StoreUnavailable while Redis is down
    """


def import_redis() -> Any:
    try:
        import redis
    except ImportError:
        raise ImportError("fastloop.serve.RedisStore needs redis-py: pip install redis") from None
    return redis


class RedisConnection:
    """A redis-py client for ``url`` whose commands (and connects) time out after
    ``socket_timeout`` seconds, and ``call()``, which names what failed when they do."""

    def __init__(self, url: str, socket_timeout: float) -> None:
        redis = import_redis()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.errors = redis.exceptions
        # One retry, and only on a connection error: it replaces a pooled connection that a
        # Redis restart closed. A timeout is not retried (the command may have run).
        retry = Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,))
        self.client = redis.Redis.from_url(url, socket_timeout=socket_timeout,
                                           socket_connect_timeout=socket_timeout, retry=retry)
        kwargs = self.client.connection_pool.connection_kwargs
        self.where = kwargs.get("path") or f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
        self._down_until = 0.0
        self._down_reason = ""

    @contextlib.contextmanager
    def call(self, what: str) -> Iterator[None]:
        """Turns redis-py's errors into StoreUnavailable / StoreError naming what failed; for
        0.1 s after a failed connection, fails at once without trying."""
        if time.monotonic() < self._down_until:
            raise StoreUnavailable(f"RedisStore: cannot {what}: Redis at {self.where} is unreachable "
                                   f"({self._down_reason})")
        try:
            yield
        except (self.errors.ConnectionError, self.errors.TimeoutError) as error:
            self._down_reason = str(error) or type(error).__name__
            self._down_until = time.monotonic() + _COOLDOWN_S
            raise StoreUnavailable(f"RedisStore: cannot {what}: Redis at {self.where} is unreachable "
                                   f"({self._down_reason})") from error
        except self.errors.RedisError as error:
            raise StoreError(f"RedisStore: cannot {what}: {type(error).__name__}: {error}") from error

    def close(self) -> None:
        self.client.close()


class RedisKeys:
    """The keys of one service's jobs and queue, all starting with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.pending = prefix + "pending"  # sorted set: queued/running job ids by submit time
        self.finished = prefix + "finished"  # sorted set: done/failed job ids by finish time
        self.expired = prefix + "expired"  # sorted set: expired job ids by expiry time
        self.events = prefix + "events"  # pub/sub channel of status changes
        self.deadlines = prefix + "deadlines"  # sorted set: ids of jobs with a deadline, by it

    def job(self, job_id: str) -> str:
        """The hash that holds the job."""
        return f"{self.prefix}job:{job_id}"

    def queue(self, level: str) -> str:
        """The stream of one priority level's queue entries."""
        return f"{self.prefix}queue:{level}"


def record_bytes(record: JobRecord) -> bytes:
    return json.dumps(record.to_json()).encode()


def read_record(key: str, job_id: str, data: bytes) -> JobRecord:
    """The record stored in the hash `key`; StoreError naming the key when it is not one."""
    try:
        record = JobRecord.from_json(json.loads(data))
        if record.id != job_id:
            raise ValueError(f"it holds the record of job {record.id!r}")
    except (ValueError, TypeError) as error:  # json's errors are ValueErrors
        raise StoreError(f"RedisStore: cannot read {key!r} field 'record': {error}") from None
    return record


def read_array(key: str, field: str, data: bytes) -> np.ndarray:
    """The .npy bytes of a hash's field, never unpickled; StoreError naming key and field."""
    try:
        return _decode_npy(data)
    except (OSError, ValueError, EOFError) as error:
        raise StoreError(f"RedisStore: cannot read {key!r} field {field!r}: {error}") from None


def seconds(ttl: float) -> int:
    """A TTL as Redis takes it: whole seconds, at least 1."""
    return max(1, int(math.ceil(ttl)))


def as_str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
