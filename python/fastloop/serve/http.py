"""The HTTP front of an InferenceService: a plain ASGI application (no framework), served by
uvicorn (``pip install fastloop[serve]``).

    >>> app = App(service, input_root="inputs")
    >>> uvicorn.run(app, host="127.0.0.1", port=8000)   # or: python -m fastloop serve ...

The front is thin: every call into the service (submit, status, result, cancel: they may
touch the store's disk or network) runs in a small thread pool, never on the event loop, and
never waits for a model call; clients poll or listen on a WebSocket. Status changes reach
WebSockets through ``service.subscribe``: the listener (on a worker thread) hands each event
to the loop with ``call_soon_threadsafe``; each connection keeps the events it has not sent yet,
and a client whose socket pushes back while more than ``ws_buffer`` of them wait is dropped
(closed with 1008) while the others go on. See docs/serve.md for
the endpoints and their status codes.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import re
import threading
import urllib.parse
from typing import Any, Awaitable, Callable

import numpy as np

from ..errors import Closed, QueueFull
from .http_inputs import NPY_TYPE, BadInput, TooLarge, load_npy_under, npy_bytes, parse_body, parse_npy
from .jobs import DONE, EXPIRED, FAILED, QUEUED, RUNNING, JobCancelled, JobExpired, JobFailed, StoreError, check_job_id
from .metrics_text import CONTENT_TYPE, render
from .shared_metrics import render_shared
from .service import InferenceService

__all__ = ["App"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_JOB = re.compile(r"^/v1/jobs/([^/]+)(/result|/events)?$")
_TERMINAL = (DONE, FAILED, EXPIRED)
_ORDER = {QUEUED: 0, RUNNING: 1, DONE: 2, FAILED: 2, EXPIRED: 3}
_UNAVAILABLE = (StoreError, ConnectionError, Closed, OSError)


def _header(scope: Scope, name: bytes) -> str:
    """The first value of a request header (names are lower case in ASGI); "" if absent."""
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return ""


def _query_id(scope: Scope) -> str | None:
    """The ``id`` query parameter (a .npy body's job id), or None."""
    values = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1")).get("id")
    return values[0] if values else None


def _submit_reply(error: Exception, retry_after_s: float) -> Exception:
    """The HTTP answer to an error from submit: 429, 413 or 400; anything else as it is
    (store trouble becomes a 503 in App._call)."""
    if isinstance(error, QueueFull):
        return _Reply(429, {"error": str(error)}, [("retry-after", str(retry_after_s))], rejection="queue_full")
    if isinstance(error, TooLarge):
        return _Reply(413, {"error": str(error)}, rejection="too_large")
    if isinstance(error, (BadInput, TypeError, ValueError)):
        return _Reply(400, {"error": str(error)}, rejection="bad_input")
    return error


class _Reply(Exception):
    """An HTTP answer raised from deep inside a handler: status, JSON body, extra headers."""

    def __init__(self, status: int, body: dict[str, Any], headers: list[tuple[str, str]] | None = None,
                 rejection: str | None = None) -> None:
        super().__init__(status)
        self.status, self.body, self.headers, self.rejection = status, body, headers or [], rejection


class _Watcher:
    """One WebSocket event stream: the (id, status) events the loop has for it, not yet sent.

    A client is too slow when its socket pushes back (a send waits for the client to read)
    while more than ``limit`` events wait; a burst the loop delivers faster than it gets to
    send them does not count, so only the client's own slowness drops it.
    """

    def __init__(self, job_id: str | None, limit: int) -> None:
        self.job_id, self.limit = job_id, limit
        self.events: collections.deque[tuple[str, str]] = collections.deque()
        self.ready = asyncio.Event()
        self.overflow = asyncio.Event()
        self.sending = False  # inside a send() that waits for the client to read

    def put(self, event: tuple[str, str]) -> None:
        self.events.append(event)
        self.ready.set()
        if self.sending and len(self.events) > self.limit:
            self.overflow.set()

    async def get(self) -> tuple[str, str]:
        while not self.events:
            self.ready.clear()
            await self.ready.wait()
        return self.events.popleft()


class App:
    """An ASGI application serving `service` over HTTP and WebSocket.

    ``input_root``: the directory "path" inputs must lie in (None: path inputs refused).
    ``max_body_bytes``: a larger request body (or .npy file) is refused with 413.
    ``ws_buffer``: events a WebSocket client may fall behind by before it is dropped.
    ``retry_after_s``: the Retry-After of a 429. ``threads``: the pool that calls the service.

    >>> app = App(InferenceService(model, store=MemoryStore()), input_root="inputs")
    >>> uvicorn.run(app, port=8000)
    """

    def __init__(self, service: InferenceService, input_root: str | None = None, max_body_bytes: int = 4 << 20,
                 ws_buffer: int = 256, retry_after_s: int = 1, threads: int = 8) -> None:
        if max_body_bytes < 1 or ws_buffer < 1 or threads < 1:
            raise ValueError("max_body_bytes, ws_buffer and threads must be >= 1")
        self.service, self.input_root = service, input_root
        self.max_body_bytes, self.ws_buffer, self.retry_after_s = max_body_bytes, ws_buffer, retry_after_s
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="fastloop-http")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._watchers: dict[str | None, set[_Watcher]] = {}  # job id (None: every job) -> streams
        self._counts_lock = threading.Lock()
        self._responses: dict[int, int] = {}
        self._rejections: dict[str, int] = {}
        self._ws_dropped = 0

    # ------------------------------------------------------------ ASGI entry
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await self._websocket(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._attach()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.detach()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _attach(self) -> None:
        if self._unsubscribe is None:
            self._loop = asyncio.get_running_loop()
            self._unsubscribe = self.service.subscribe(self._on_status)

    def detach(self) -> None:
        """Unsubscribes from the service and stops the thread pool (the server's shutdown
        does it; the service itself is the caller's to close)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._pool.shutdown(wait=False)

    # ------------------------------------------------------------ HTTP
    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._attach()
        method, path = scope["method"], scope["path"]
        try:
            status, body, headers = await self._route(method, path, scope, receive)
        except _Reply as reply:
            status, body, headers = reply.status, reply.body, reply.headers
            if reply.rejection:
                self._count(self._rejections, reply.rejection)
        except Exception as error:  # a bug here: answer it as JSON rather than drop the client
            status, body, headers = 500, {"error": f"{type(error).__name__}: {error}"}, []
        if isinstance(body, str):
            payload, kind = body.encode(), CONTENT_TYPE
        elif isinstance(body, bytes):  # a result asked for as .npy
            payload, kind = body, NPY_TYPE
        else:
            payload, kind = json.dumps(body).encode(), "application/json"
        self._count(self._responses, status)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind.encode()), (b"content-length", str(len(payload)).encode())]
                    + [(k.encode(), v.encode()) for k, v in headers]})
        await send({"type": "http.response.body", "body": payload})

    async def _route(self, method: str, path: str, scope: Scope,
                     receive: Receive) -> tuple[int, Any, list[tuple[str, str]]]:
        if path == "/healthz" and method in ("GET", "HEAD"):
            if self.service.closed:
                return 503, {"status": "closed"}, []
            return 200, {"status": "ok"}, []
        if path == "/metrics" and method == "GET":
            return 200, await self._call(self._metrics), []
        if path == "/v1/jobs":
            if method != "POST":
                raise _Reply(405, {"error": f"{method} {path}: use POST"}, [("allow", "POST")])
            body = await self._read_body(scope, receive)
            npy = _header(scope, b"content-type").split(";")[0].strip().lower() == NPY_TYPE
            given_id = _query_id(scope) if npy else None
            # A full queue is answered here, on the loop, before any parsing: a 429 must be
            # fast when the service is busiest. (A request naming its own id goes the long way,
            # so resubmitting a known job stays idempotent.)
            named = given_id is not None if npy else b'"id"' in body
            if not named and self.service.reject_if_full():
                raise _Reply(429, {"error": f"the service's queue is full ({self.service.max_queue} jobs "
                                            "waiting): retry later"},
                             [("retry-after", str(self.retry_after_s))], rejection="queue_full")
            if npy:
                job_id = await self._call(self._submit_npy, body, given_id)
            else:
                job_id = await self._call(self._submit, body)
            return 202, {"id": job_id}, [("location", f"/v1/jobs/{job_id}")]
        match = _JOB.match(path)
        if match is None:
            raise _Reply(404, {"error": f"no such endpoint: {path}"})
        job_id, tail = match.group(1), match.group(2)
        allowed = {None: ("GET", "DELETE"), "/result": ("GET",), "/events": ()}[tail]
        if method not in allowed:
            raise _Reply(405, {"error": f"{method} {path}: use {' or '.join(allowed) or 'a WebSocket'}"},
                         [("allow", ", ".join(allowed))])
        if tail == "/result":
            return await self._call(self._result, job_id, NPY_TYPE in _header(scope, b"accept").lower())
        if method == "DELETE":
            return await self._call(self._cancel, job_id)
        return await self._call(self._status, job_id)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
                raise _Reply(413, {"error": f"the body has {int(value)} bytes, over the limit of "
                                            f"{self.max_body_bytes}"}, rejection="too_large")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Reply(400, {"error": "the client disconnected"})
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _Reply(413, {"error": f"the body is over the limit of {self.max_body_bytes} bytes"},
                             rejection="too_large")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Runs fn in the pool (it may block on the store); maps store trouble to 503."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, fn, *args)
        except _Reply:
            raise
        except _UNAVAILABLE as error:
            raise _Reply(503, {"error": f"the service is unavailable: {type(error).__name__}: {error}"},
                         [("retry-after", str(self.retry_after_s))], rejection="unavailable") from None
        except RuntimeError as error:  # the pool shut down: the server is stopping
            raise _Reply(503, {"error": f"the server is stopping: {error}"}) from None

    # ------------------------------------------------------------ the handlers (in the pool)
    def _submit(self, body: bytes) -> str:
        try:
            data = parse_body(body)
            if "path" in data:
                inputs: Any = self._as_model_ints(load_npy_under(self.input_root, data["path"], self.max_body_bytes))
            else:
                inputs = data["inputs"]
            return self.service.submit(inputs, job_id=data.get("id"), priority=data.get("priority", "normal"))
        except Exception as error:
            raise _submit_reply(error, self.retry_after_s) from None

    def _submit_npy(self, body: bytes, job_id: str | None) -> str:
        try:
            return self.service.submit(self._as_model_ints(parse_npy(body)), job_id=job_id)
        except Exception as error:
            raise _submit_reply(error, self.retry_after_s) from None

    def _as_model_ints(self, inputs: np.ndarray) -> np.ndarray:
        """Integer arrays (uint8 pixels) convert to the model's dtype, as a JSON list would;
        any other dtype must be the model's (submit says so otherwise)."""
        want = self.service._spec.dtype
        return inputs.astype(want) if want is not None and inputs.dtype.kind in "biu" else inputs

    def _record(self, job_id: str) -> Any:
        try:
            return self.service.record(check_job_id(job_id))
        except (KeyError, TypeError, ValueError):
            raise _Reply(404, {"id": job_id, "error": f"unknown job {job_id!r}"}) from None

    def _status(self, job_id: str) -> tuple[int, Any, list[tuple[str, str]]]:
        record = self._record(job_id)
        body = {"id": record.id, "status": record.status, "submitted": record.submitted,
                "started": record.started, "finished": record.finished}
        if record.status == FAILED:
            body.update(error=record.error, cancelled=record.cancelled)
        return (410 if record.status == EXPIRED else 200), body, []

    def _result(self, job_id: str, as_npy: bool = False) -> tuple[int, Any, list[tuple[str, str]]]:
        record = self._record(job_id)
        if record.status in (QUEUED, RUNNING):
            return 202, {"id": job_id, "status": record.status}, [("retry-after", "1")]
        try:
            row = np.asarray(self.service.result(job_id, timeout=0.0))
        except JobCancelled as error:
            return 422, {"id": job_id, "status": FAILED, "error": error.reason, "cancelled": True}, []
        except JobFailed as error:
            return 422, {"id": job_id, "status": FAILED, "error": error.reason, "cancelled": False}, []
        except JobExpired as error:
            return 410, {"id": job_id, "status": EXPIRED, "error": str(error)}, []
        except KeyError:
            raise _Reply(404, {"id": job_id, "error": f"unknown job {job_id!r}"}) from None
        if as_npy:
            return 200, npy_bytes(row), [("x-job-id", job_id)]
        return 200, {"id": job_id, "status": DONE, "dtype": row.dtype.name, "shape": list(row.shape),
                     "result": row.tolist()}, []

    def _cancel(self, job_id: str) -> tuple[int, Any, list[tuple[str, str]]]:
        self._record(job_id)  # 404 for an unknown id
        try:
            cancelled = self.service.cancel(job_id)
        except KeyError:
            raise _Reply(404, {"id": job_id, "error": f"unknown job {job_id!r}"}) from None
        return 200, {"id": job_id, "cancelled": cancelled, "status": self.service.status(job_id)}, []

    def _metrics(self) -> str:
        with self._counts_lock:
            http = {"responses": dict(self._responses), "rejections": dict(self._rejections),
                    "ws_dropped": self._ws_dropped}
        http["ws_open"] = sum(len(group) for group in list(self._watchers.values()))
        stats = self.service.stats()
        return render(stats, http, self.service.max_batch) + render_shared(stats)

    def _count(self, table: dict[Any, int], key: Any) -> None:
        with self._counts_lock:
            table[key] = table.get(key, 0) + 1

    # ------------------------------------------------------------ WebSocket
    def _on_status(self, job_id: str, status: str) -> None:
        """The service's listener, on the thread that changed the status: hands the event to
        the loop only when a stream watches it."""
        if (job_id in self._watchers or None in self._watchers) and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._deliver, job_id, status)
            except RuntimeError:  # the loop is closed: the server stopped
                pass

    def _deliver(self, job_id: str, status: str) -> None:
        for key in (job_id, None):
            for watcher in list(self._watchers.get(key, ())):
                watcher.put((job_id, status))

    def _watch(self, watcher: _Watcher) -> None:
        self._watchers.setdefault(watcher.job_id, set()).add(watcher)

    def _unwatch(self, watcher: _Watcher) -> None:
        group = self._watchers.get(watcher.job_id)
        if group is not None:
            group.discard(watcher)
            if not group:
                del self._watchers[watcher.job_id]

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._attach()
        path = scope["path"]
        match = _JOB.match(path)
        if path == "/v1/events":
            job_id = None
        elif match is not None and match.group(2) == "/events":
            job_id = match.group(1)
        else:
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008, "reason": "no such endpoint"})
            return
        if (await receive())["type"] != "websocket.connect":
            return
        watcher = _Watcher(job_id, self.ws_buffer)
        self._watch(watcher)  # before reading the status, so no change falls between
        try:
            first: tuple[str, str] | None = None
            if job_id is not None:
                try:
                    first = (job_id, (await self._call(self._record, job_id)).status)
                except _Reply:
                    await send({"type": "websocket.close", "code": 1008, "reason": f"unknown job {job_id}"})
                    return
            await send({"type": "websocket.accept"})
            await self._stream(watcher, first, receive, send)
        finally:
            self._unwatch(watcher)

    async def _stream(self, watcher: _Watcher, first: tuple[str, str] | None, receive: Receive, send: Send) -> None:
        """Sends events until a terminal status (one job), the client leaves, or it falls
        ws_buffer events behind (then it is closed with 1008)."""

        async def pump() -> str:
            last = -1
            event = first
            while True:
                if event is not None:
                    job_id, status = event
                    if watcher.job_id is None or _ORDER[status] > last:  # a job's stream never goes back
                        last = _ORDER[status]
                        watcher.sending = True  # stays True only while the send waits on the client
                        try:
                            await send({"type": "websocket.send", "text": json.dumps({"id": job_id, "status": status})})
                        finally:
                            watcher.sending = False
                        if watcher.job_id is not None and status in _TERMINAL:
                            return "done"
                event = await watcher.get()

        async def listen() -> str:
            while (await receive())["type"] != "websocket.disconnect":
                pass
            return "left"

        tasks = {asyncio.ensure_future(pump()), asyncio.ensure_future(listen()),
                 asyncio.ensure_future(watcher.overflow.wait())}
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        outcomes = {task.result() for task in done if not task.cancelled() and task.exception() is None}
        if "left" in outcomes or not outcomes:  # gone, or a send failed: it is gone
            return
        if True in outcomes:  # the overflow event: the client fell behind
            self._unwatch(watcher)
            with self._counts_lock:
                self._ws_dropped += 1
            code, reason = 1008, f"too slow: more than {self.ws_buffer} events behind"
        else:
            code, reason = 1000, "terminal status"
        try:  # a client that does not read may never let the close through: do not wait on it
            await asyncio.wait_for(send({"type": "websocket.close", "code": code, "reason": reason}), 1.0)
        except (asyncio.TimeoutError, OSError, RuntimeError):
            pass
