"""The HTTP front of an InferenceService: an ASGI application routed by Starlette, served by
uvicorn (``pip install fastloop[serve]``) or mounted in a FastAPI/Starlette app.

    >>> app = App(service, input_root="inputs")
    >>> uvicorn.run(app, host="127.0.0.1", port=8000)   # or: python -m fastloop serve ...

The front is thin: every call into the service (submit, status, result, cancel: they may
touch the store's disk or network) runs in a small thread pool, never on the event loop, and
never waits for a model call. ``POST /v1/predict`` answers with the result: the request waits
on the loop (a future the service settles when the job ends, ``service.watch``), holding no
thread; ``POST /v1/jobs`` answers the job's id, and clients poll, long-poll or listen on a
WebSocket. ``drain()`` (a server's SIGTERM) makes new submits answer 503 while what was
accepted finishes. Status changes reach
WebSockets through ``service.subscribe``: the listener (on a worker thread) hands each event
to the loop with ``call_soon_threadsafe``; each connection keeps the events it has not sent yet,
and a client whose socket pushes back while more than ``ws_buffer`` of them wait is dropped
(closed with 1008) while the others go on. See docs/serve.md for
the endpoints and their status codes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import concurrent.futures
import json
import math
import threading
import urllib.parse
from typing import Any, Awaitable, Callable

import numpy as np

from ..errors import Closed, QueueFull
from .http_inputs import NPY_TYPE, BadInput, TooLarge, load_npy_under, npy_bytes, parse_body, parse_npy
from .jobs import DEADLINE_EXCEEDED, DONE, EXPIRED, FAILED, QUEUED, RUNNING, JobRecord, StoreError, check_job_id
from .outputs import as_json
from .rows import row_errors_of
from .service import Admission, InferenceService

__all__ = ["App"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_TERMINAL = (DONE, FAILED, EXPIRED)
_ORDER = {QUEUED: 0, RUNNING: 1, DONE: 2, FAILED: 2, EXPIRED: 3}
_UNAVAILABLE = (StoreError, ConnectionError, Closed, OSError)
MAX_WAIT_S = 60.0  # the longest long poll (GET .../result?wait_s=)
_PREDICT_MARGIN_S = 1.0  # a predict waits this long past its job's deadline for the janitor's verdict
_RECHECK_S = 1.0  # a long poll re-reads the job this often, whatever the events say


def _header(scope: Scope, name: bytes) -> str:
    """The first value of a request header (names are lower case in ASGI); "" if absent."""
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return ""


def _query(scope: Scope, name: str) -> str | None:
    """A query parameter (a .npy body's ``id`` or ``timeout_s``), or None."""
    values = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1")).get(name)
    return values[0] if values else None


def _query_timeout(scope: Scope) -> float | None:
    text = _query(scope, "timeout_s")
    try:
        return None if text is None else float(text)
    except ValueError:
        raise _Reply(400, {"error": f"timeout_s must be a number of seconds, not {text!r}"},
                     rejection="bad_input") from None


def _query_wait(scope: Scope) -> float:
    """A result request's ``?wait_s=`` (0: answer at once); 400 unless 0 <= wait_s <= MAX_WAIT_S."""
    text = _query(scope, "wait_s")
    if text is None:
        return 0.0
    try:
        wait = float(text)
    except ValueError:
        wait = math.nan
    if not 0 <= wait <= MAX_WAIT_S:
        raise _Reply(400, {"error": f"wait_s must be a number of seconds from 0 to {MAX_WAIT_S:g}, not {text!r}"},
                     rejection="bad_input")
    return wait


async def _ended(watcher: "_Watcher") -> None:
    """Returns once the watched job's stream brings a terminal status."""
    while (await watcher.get())[1] not in _TERMINAL:
        pass


def _query_flag(scope: Scope, name: str) -> bool:
    """A yes/no query parameter (``?result=1``, ``true`` or ``yes``)."""
    values = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1")).get(name)
    return bool(values) and values[0].lower() in ("1", "true", "yes")


def _submit_reply(error: Exception, retry_after_s: float) -> Exception:
    """The HTTP answer to an error from submit: 429, 413 or 400; anything else as it is
    (store trouble becomes a 503 in App._call)."""
    if isinstance(error, QueueFull):
        return _Reply(429, {"error": str(error)}, [("retry-after", str(retry_after_s))], rejection="queue_full")
    if isinstance(error, (TooLarge, MemoryError)):  # MemoryError: an input no check above caught
        return _Reply(413, {"error": str(error) or "the input is too large to hold in memory"}, rejection="too_large")
    if isinstance(error, (BadInput, TypeError, ValueError, OverflowError)):
        return _Reply(400, {"error": str(error)}, rejection="bad_input")
    return error


def _settle(future: "asyncio.Future[Any]", value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _timed_out(job_id: str, wait_s: float) -> tuple[int, Any, list[tuple[str, str]]]:
    return 504, {"id": job_id, "error": f"no result within {wait_s:g} s: the job is still running or queued "
                                        f"(GET /v1/jobs/{job_id}/result answers it later)"}, []


def _row_errors(record: JobRecord) -> list[str | None]:
    """A job of several rows' errors, one entry per row (null for a row that ran)."""
    errors = row_errors_of(record)
    return [errors.get(i) for i in range(record.rows or 0)]


class _Reply(Exception):
    """An HTTP answer raised from deep inside a handler: status, JSON body, extra headers."""

    def __init__(self, status: int, body: dict[str, Any], headers: list[tuple[str, str]] | None = None,
                 rejection: str | None = None) -> None:
        super().__init__(status)
        self.status, self.body, self.headers, self.rejection = status, body, headers or [], rejection


class _Endpoint:
    """A Starlette route's endpoint as a plain ASGI app: Starlette routes (path parameters in
    scope["path_params"], 404/405), the handler answers without Request/Response objects:
    52-61 us of server CPU per /healthz or 429 instead of 92-99 (the hand-written app: 48)."""

    def __init__(self, app: "App", handler: Callable[[Scope, Receive], Awaitable[Any]]) -> None:
        self.app, self.handler = app, handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app._answer(scope, receive, send, self.handler)


class _Watcher:
    """One WebSocket event stream: the (id, status) events the loop has for it, not yet sent.

    A client is too slow when its socket pushes back (a send waits for the client to read)
    while more than ``limit`` events wait; a burst the loop delivers faster than it gets to
    send them does not count, so only the client's own slowness drops it.
    """

    def __init__(self, job_id: str | None, limit: int, with_result: bool = False) -> None:
        self.job_id, self.limit, self.with_result = job_id, limit, with_result
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
    ``retry_after_s``: the Retry-After of a 429 or of a 503 while draining. ``threads``: the
    pool that calls the service. ``predict_timeout_s``: the deadline of a POST /v1/predict
    that names none (and the service has no default ``timeout_s``): its job fails then and the
    request answers 504.

    >>> app = App(InferenceService(model, store=MemoryStore()), input_root="inputs")
    >>> uvicorn.run(app, port=8000)
    """

    def __init__(self, service: InferenceService, input_root: str | None = None, max_body_bytes: int = 4 << 20,
                 ws_buffer: int = 256, retry_after_s: int = 1, threads: int = 8,
                 predict_timeout_s: float = 30.0) -> None:
        if max_body_bytes < 1 or ws_buffer < 1 or threads < 1:
            raise ValueError("max_body_bytes, ws_buffer and threads must be >= 1")
        if not predict_timeout_s > 0:
            raise ValueError(f"predict_timeout_s must be > 0, not {predict_timeout_s!r}")
        self.predict_timeout_s = float(predict_timeout_s)
        self._draining = False
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
        from .metrics import CONTENT_TYPE, service_registry  # prometheus_client: the serve extra

        self._metrics_type = CONTENT_TYPE
        self._registry = service_registry(self.service.stats, self._http_counts, self.service.max_batch)
        self._router = self._build_router()

    # ------------------------------------------------------------ ASGI entry
    def _build_router(self) -> Any:
        """The Starlette app that routes requests to the handlers below."""
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.routing import Route, WebSocketRoute

        async def not_routed(request: Any, error: HTTPException) -> Any:  # 404/405 as JSON, like the rest
            path = request.url.path
            if error.status_code == 405:
                allow = (error.headers or {}).get("Allow", "")
                use = " or ".join(m for m in allow.split(", ") if m != "HEAD") or "a WebSocket"
                return self._respond(405, {"error": f"{request.method} {path}: use {use}"}, [("allow", allow)])
            return self._respond(error.status_code, {"error": f"no such endpoint: {path}"})

        def raw(handler: Callable[[Scope, Receive], Awaitable[tuple[int, Any, list[tuple[str, str]]]]]) -> Any:
            return _Endpoint(self, handler)

        routes = [
            Route("/healthz", raw(self._ep_healthz), methods=["GET", "HEAD"]),
            Route("/metrics", raw(self._ep_metrics), methods=["GET"]),
            Route("/v1/jobs", raw(self._submit_request), methods=["POST"]),
            Route("/v1/predict", raw(self._ep_predict), methods=["POST"]),
            Route("/v1/jobs/{job_id}", raw(self._ep_job), methods=["GET", "DELETE"]),
            Route("/v1/jobs/{job_id}/result", raw(self._ep_result), methods=["GET"]),
            Route("/v1/jobs/{job_id}/events", raw(self._ep_events_http), methods=["GET"]),
            WebSocketRoute("/v1/events", self._ep_websocket),
            WebSocketRoute("/v1/jobs/{job_id}/events", self._ep_websocket),
            WebSocketRoute("/{path:path}", self._ep_no_websocket),  # refused as before: 1008, not 1000
        ]
        return Starlette(routes=routes, exception_handlers={HTTPException: not_routed}, lifespan=self._lifespan)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            self._attach()  # mounted in another app, no lifespan reaches this one
        await self._router(scope, receive, send)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Any) -> Any:
        self._attach()
        try:
            yield
        finally:
            self.detach()

    def _attach(self) -> None:
        if self._unsubscribe is None:
            self._loop = asyncio.get_running_loop()
            self._unsubscribe = self.service.subscribe(self._on_status)

    def drain(self) -> None:
        """Stops accepting jobs: from now on POST /v1/jobs and /v1/predict answer 503 with
        Retry-After and /healthz 503 "draining" (a load balancer stops sending), while
        status, results and the predicts in progress are still answered. What a server's
        SIGTERM does first; an app that mounts this one calls it from its own shutdown."""
        self._draining = True

    @property
    def draining(self) -> bool:
        return self._draining

    def _refuse_if_draining(self) -> None:
        if self._draining:
            raise _Reply(503, {"error": "the server is stopping: it takes no new jobs; retry on another"},
                         [("retry-after", str(self.retry_after_s))], rejection="unavailable")

    def detach(self) -> None:
        """Unsubscribes from the service and stops the thread pool (the server's shutdown
        does it; an app that mounts this one calls it from its own shutdown; the service
        itself is the caller's to close)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._pool.shutdown(wait=False)

    # ------------------------------------------------------------ HTTP
    def _encode(self, status: int, body: Any) -> tuple[bytes, str]:
        self._count(self._responses, status)
        if isinstance(body, str):
            return body.encode(), self._metrics_type
        if isinstance(body, bytes):  # a result asked for as .npy
            return body, NPY_TYPE
        return json.dumps(body, allow_nan=False).encode(), "application/json"

    def _respond(self, status: int, body: Any, headers: list[tuple[str, str]] | None = None) -> Any:
        """A Starlette Response (for the 404/405 handler)."""
        from starlette.responses import Response

        payload, kind = self._encode(status, body)
        return Response(payload, status, headers=dict(headers or []), media_type=kind)

    async def _answer(self, scope: Scope, receive: Receive, send: Send,
                      handler: Callable[[Scope, Receive], Awaitable[tuple[int, Any, list[tuple[str, str]]]]]) -> None:
        try:
            status, body, headers = await handler(scope, receive)
        except _Reply as reply:
            status, body, headers = reply.status, reply.body, reply.headers
            if reply.rejection:
                self._count(self._rejections, reply.rejection)
        except Exception as error:  # a bug here: answer it as JSON rather than drop the client
            status, body, headers = 500, {"error": f"{type(error).__name__}: {error}"}, []
        payload, kind = self._encode(status, body)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind.encode()), (b"content-length", str(len(payload)).encode())]
                    + [(k.encode(), v.encode()) for k, v in headers]})
        await send({"type": "http.response.body", "body": payload})

    async def _ep_healthz(self, scope: Scope, receive: Receive) -> tuple[int, Any, list[tuple[str, str]]]:
        health = self.service.health()
        if self._draining and health["status"] == "ok":
            health["status"] = "draining"
        return (200 if health["status"] == "ok" else 503), health, []

    async def _ep_metrics(self, scope: Scope, receive: Receive) -> tuple[int, Any, list[tuple[str, str]]]:
        return 200, await self._call(self._metrics), []

    async def _submit_request(self, scope: Scope, receive: Receive) -> tuple[int, Any, list[tuple[str, str]]]:
        job_id, _ = await self._accept(scope, receive)
        return 202, {"id": job_id}, [("location", f"{scope.get('root_path', '')}/v1/jobs/{job_id}")]

    async def _accept(self, scope: Scope, receive: Receive, on_end: Callable[[JobRecord, Any], None] | None = None,
                      timeout_s: float | None = None) -> tuple[str, bool]:
        """Reads, admits and submits a request's job (POST /v1/jobs, /v1/predict): its id,
        and whether `on_end` will be called when it ends (service.watch; False: the job ended
        already, or another process holds it). `timeout_s`: the deadline when the request
        names none."""
        body = await self._read_body(scope, receive)
        self._refuse_if_draining()
        npy = _header(scope, b"content-type").split(";")[0].strip().lower() == NPY_TYPE
        given_id = _query(scope, "id") if npy else None
        # A full queue is answered here, on the loop, before any parsing: a 429 must be
        # fast when the service is busiest. (A request naming its own id goes the long way,
        # so resubmitting a known job stays idempotent.)
        # An admitted request holds a queue slot until its submit in the pool uses it, so it
        # is never refused later (a 429 that waited behind the pool's parsing).
        named = given_id is not None if npy else b'"id"' in body
        admission = None if named else self.service.admit()
        if admission is None and not named:
            raise _Reply(429, {"error": f"the service's queue is full ({self.service.max_queue} jobs "
                                        "waiting): retry later"},
                         [("retry-after", str(self.retry_after_s))], rejection="queue_full")
        try:
            if npy:
                return await self._call(self._submit_npy, body, given_id, _query_timeout(scope) or timeout_s,
                                        _query(scope, "priority") or "normal", admission, on_end)
            return await self._call(self._submit, body, admission, on_end, timeout_s)
        finally:
            if admission is not None:
                admission.release()  # unused: the submit failed before it, or never ran

    async def _ep_predict(self, scope: Scope, receive: Receive) -> tuple[int, Any, list[tuple[str, str]]]:
        """POST /v1/predict: submits the job as POST /v1/jobs does and answers its result
        (as GET .../result), 422 for a failed one, 504 when its deadline passes first."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[tuple[JobRecord, Any]] = loop.create_future()

        def on_end(record: JobRecord, row: Any) -> None:  # on the worker that ended the job
            loop.call_soon_threadsafe(_settle, ended, (record, row))

        timeout_s = self.service.timeout_s or self.predict_timeout_s
        job_id, watching = await self._accept(scope, receive, on_end, timeout_s)
        as_npy = NPY_TYPE in _header(scope, b"accept").lower()
        wait_s = timeout_s + _PREDICT_MARGIN_S
        if watching:
            try:
                record, row = await asyncio.wait_for(ended, wait_s)
            except asyncio.TimeoutError:
                return _timed_out(job_id, wait_s)
            return self._outcome_reply(job_id, record, row, as_npy, predict=True)
        answer = await self._wait_result(job_id, as_npy, wait_s, predict=True)  # held elsewhere, or ended
        return _timed_out(job_id, wait_s) if answer[0] == 202 else answer

    async def _ep_job(self, scope: Scope, receive: Receive) -> tuple[int, Any, list[tuple[str, str]]]:
        handler = self._cancel if scope["method"] == "DELETE" else self._status
        return await self._call(handler, scope["path_params"]["job_id"])

    async def _ep_result(self, scope: Scope, receive: Receive) -> tuple[int, Any, list[tuple[str, str]]]:
        as_npy = NPY_TYPE in _header(scope, b"accept").lower()
        job_id = scope["path_params"]["job_id"]
        wait_s = _query_wait(scope)
        if not wait_s:
            return await self._call(self._result, job_id, as_npy)
        return await self._wait_result(job_id, as_npy, wait_s)

    async def _wait_result(self, job_id: str, as_npy: bool, wait_s: float,
                           predict: bool = False) -> tuple[int, Any, list[tuple[str, str]]]:
        """A long poll: the result answer once the job ends (its status event), or 202 after
        wait_s. The watcher is in place before the first read, so no ending falls between."""
        loop = asyncio.get_running_loop()
        watcher = _Watcher(job_id, self.ws_buffer)
        self._watch(watcher)
        try:
            until = loop.time() + wait_s
            while True:
                answer = await self._call(self._result, job_id, as_npy, predict)
                left = until - loop.time()
                if answer[0] != 202 or left <= 0:
                    return answer
                with contextlib.suppress(asyncio.TimeoutError):  # re-read at least every second:
                    await asyncio.wait_for(_ended(watcher), min(left, _RECHECK_S))  # an event may be lost
        finally:
            self._unwatch(watcher)

    async def _ep_events_http(self, scope: Scope, receive: Receive) -> tuple[int, Any, list[tuple[str, str]]]:
        return 405, {"error": f"{scope['method']} {scope['path']}: use a WebSocket"}, [("allow", "")]

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
    def _submit(self, body: bytes, admission: Admission | None = None,
                 on_end: Callable[[JobRecord, Any], None] | None = None, timeout_s: float | None = None) -> tuple[str, bool]:
        try:
            data = parse_body(body, self.service._spec.dtype)
            if "path" in data:
                inputs: Any = self._as_model_ints(load_npy_under(self.input_root, data["path"], self.max_body_bytes))
            else:
                inputs = data["inputs"]
            job_id = self.service.submit(inputs, job_id=data.get("id"), timeout_s=data.get("timeout_s", timeout_s),
                                         priority=data.get("priority", "normal"), admission=admission)
        except Exception as error:
            raise _submit_reply(error, self.retry_after_s) from None
        return job_id, on_end is not None and self.service.watch(job_id, on_end)

    def _submit_npy(self, body: bytes, job_id: str | None, timeout_s: float | None, priority: str,
                    admission: Admission | None = None,
                    on_end: Callable[[JobRecord, Any], None] | None = None) -> tuple[str, bool]:
        try:
            job_id = self.service.submit(self._as_model_ints(parse_npy(body)), job_id=job_id, timeout_s=timeout_s,
                                         priority=priority, admission=admission)
        except Exception as error:
            raise _submit_reply(error, self.retry_after_s) from None
        return job_id, on_end is not None and self.service.watch(job_id, on_end)

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
        if record.rows is not None:
            body["rows"] = record.rows
        if record.status == FAILED:
            body.update(error=record.error, cancelled=record.cancelled)
        if record.row_errors:
            body["errors"] = _row_errors(record)
        return (410 if record.status == EXPIRED else 200), body, []

    def _result(self, job_id: str, as_npy: bool = False, predict: bool = False) -> tuple[int, Any, list[tuple[str, str]]]:
        """The answer to GET .../result: one store read (record and result together)."""
        try:
            record, row = self.service._outcome(check_job_id(job_id))
        except (KeyError, TypeError, ValueError):
            raise _Reply(404, {"id": job_id, "error": f"unknown job {job_id!r}"}) from None
        return self._outcome_reply(job_id, record, row, as_npy, predict)

    def _outcome_reply(self, job_id: str, record: JobRecord, row: Any, as_npy: bool,
                       predict: bool = False) -> tuple[int, Any, list[tuple[str, str]]]:
        """The answer for a job's state: 202 while it runs; 200 with the result (JSON, or
        .npy); 422 failed (a predict whose job missed its deadline: 504); 410 expired."""
        if record.status in (QUEUED, RUNNING):
            return 202, {"id": job_id, "status": record.status}, [("retry-after", "1")]
        if record.status == FAILED:
            reason = record.error or ("cancelled" if record.cancelled else "unknown error")
            body = {"id": job_id, "status": FAILED, "error": reason, "cancelled": record.cancelled}
            if record.row_errors:
                body["errors"] = _row_errors(record)
            late = predict and reason.startswith(DEADLINE_EXCEEDED)
            return (504 if late else 422), body, []
        if row is None:  # expired, or done and its result dropped since
            return 410, {"id": job_id, "status": EXPIRED, "error": f"job {job_id!r} expired: its result was kept "
                                                                   f"{self.service.result_ttl_s:g} s"}, []
        failed = sorted(row_errors_of(record))
        if as_npy:  # failed rows are zero-filled; which they are rides in a header, the reasons in the status
            extra = [("x-failed-rows", ",".join(map(str, failed)))] if failed else []
            return 200, npy_bytes(row), [("x-job-id", job_id)] + extra
        body = {"id": job_id, "status": DONE, **as_json(row, failed)}
        if failed:
            body["errors"] = _row_errors(record)
        return 200, body, []

    def _cancel(self, job_id: str) -> tuple[int, Any, list[tuple[str, str]]]:
        self._record(job_id)  # 404 for an unknown id
        try:
            cancelled = self.service.cancel(job_id)
        except KeyError:
            raise _Reply(404, {"id": job_id, "error": f"unknown job {job_id!r}"}) from None
        return 200, {"id": job_id, "cancelled": cancelled, "status": self.service.status(job_id)}, []

    def _http_counts(self) -> dict[str, Any]:
        with self._counts_lock:
            http = {"responses": dict(self._responses), "rejections": dict(self._rejections),
                    "ws_dropped": self._ws_dropped}
        http["ws_open"] = sum(len(group) for group in list(self._watchers.values()))
        return http

    def _metrics(self) -> str:
        from .metrics import render

        return render(self._registry)

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

    async def _ep_no_websocket(self, websocket: Any) -> None:
        await websocket.receive()  # websocket.connect
        await websocket.send({"type": "websocket.close", "code": 1008, "reason": "no such endpoint"})

    async def _ep_websocket(self, websocket: Any) -> None:
        job_id = websocket.path_params.get("job_id")  # None: /v1/events, every job
        receive, send = websocket.receive, websocket.send
        if (await receive())["type"] != "websocket.connect":
            return
        watcher = _Watcher(job_id, self.ws_buffer, _query_flag(websocket.scope, "result"))
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

    async def _result_message(self, job_id: str) -> dict[str, Any]:
        """A done job's dtype/shape/result for its event (as GET .../result answers them),
        or the error that kept the result out of it."""
        try:
            status, body, _ = await self._call(self._result, job_id)
        except _Reply as reply:
            return {"error": reply.body.get("error", f"HTTP {reply.status}")}
        return {k: body[k] for k in ("dtype", "shape", "result") if k in body} if status == 200 \
            else {"error": body.get("error", f"HTTP {status}")}

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
                        message = {"id": job_id, "status": status}
                        if watcher.with_result and status == DONE:  # ?result=1: the result rides along
                            message.update(await self._result_message(job_id))
                        watcher.sending = True  # stays True only while the send waits on the client
                        try:
                            await send({"type": "websocket.send", "text": json.dumps(message)})
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
