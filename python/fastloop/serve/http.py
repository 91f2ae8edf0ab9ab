"""The HTTP front of one InferenceService or several (models by name): an ASGI application
routed by Starlette, served by uvicorn (``pip install fastloop[serve]``) or mounted in a
FastAPI/Starlette app.

    >>> app = App(service, input_root="inputs")
    >>> app = App({"mnist": mnist_service, "resnet": resnet_service})   # several models
    >>> uvicorn.run(app, host="127.0.0.1", port=8000)   # or: python -m fastloop serve ...

The front is thin: every call into a service that may touch the store's disk or network
(submit, status, result, cancel) runs in a small thread pool (http_model.py), never on the
event loop, and never waits for a model call. A JSON body under 64 KB for a service on the
memory store, which never blocks, is parsed and submitted on the loop instead. ``POST /v1/predict`` answers with the result: the
request waits on the loop (a future the service settles when the job ends, ``service.watch``),
holding no thread; ``POST /v1/jobs`` answers the job's id, and clients poll, long-poll or
listen on a WebSocket. ``drain()`` (a server's SIGTERM) makes new submits answer 503 while
what was accepted finishes. Status changes reach WebSockets and long polls through
``service.subscribe``: the listener (on a worker thread) hands each event to the loop with
``call_soon_threadsafe`` (http_events.py). Each model has its routes under
``/v1/models/{name}/``; the first model (the only one, usually) also answers at ``/v1/``.
See docs/serve.md for the endpoints and their status codes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
from typing import Any, Awaitable, Callable, Mapping

from ..errors import Closed
from .http_events import Watcher, ended
from .http_inputs import NPY_TYPE
from .http_model import ModelFront, Reply
from .http_requests import (Answer, Receive, Scope, Send, _header, _jobs_path, _query_wait, _route_path, _settle,
                            _submit_query, _timed_out)
from .http_v2 import V2Routes
from .http_websocket import _EventRoutes
from .jobs import JobRecord, StoreError, check_job_id
from .service import InferenceService

__all__ = ["App"]

_UNAVAILABLE = (StoreError, ConnectionError, Closed, OSError)
_PREDICT_MARGIN_S = 1.0  # a predict waits this long past its job's deadline for the janitor's verdict
_RECHECK_S = 1.0  # a long poll re-reads the job this often, whatever the events say
_JSON = json.JSONEncoder(allow_nan=False)  # json.dumps(allow_nan=False) builds one per call
MAX_WEBSOCKETS = 1024  # App(max_websockets=)'s default: open event streams at once
DEFAULT_NAME = "default"  # the name of a model given alone


class _Endpoint:
    """A Starlette route's endpoint as a plain ASGI app: Starlette routes (path parameters in
    scope["path_params"], 404/405), the handler answers without Request/Response objects:
    52-61 us of server CPU per /healthz or 429 instead of 92-99 (the hand-written app: 48)."""

    def __init__(self, app: "App", handler: Callable[[Scope, Receive], Awaitable[Any]]) -> None:
        self.app, self.handler = app, handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app._answer(scope, receive, send, self.handler)


def _models_of(models: InferenceService | Mapping[str, InferenceService]) -> dict[str, InferenceService]:
    if isinstance(models, InferenceService):
        return {DEFAULT_NAME: models}
    if not isinstance(models, Mapping) or not models:
        raise TypeError(f"App takes an InferenceService or a dict name -> InferenceService, not {models!r}")
    for name, service in models.items():
        check_job_id(name)  # a model's name goes in paths and metric labels, as an id does
        if not isinstance(service, InferenceService):
            raise TypeError(f"App: model {name!r} must be an InferenceService, not {type(service).__name__}")
    return dict(models)


class App(_EventRoutes):
    """An ASGI application serving `models` over HTTP and WebSocket: one InferenceService, or
    a dict name -> InferenceService (each with its own queue, workers, batch size and metrics,
    labelled by model). The first model also answers at the plain /v1/ routes.

    ``input_root``: the directory "path" inputs must lie in (None: path inputs refused).
    ``max_body_bytes``: a larger request body (or .npy file) is refused with 413.
    ``ws_buffer``: events a WebSocket client may fall behind by before it is dropped.
    ``retry_after_s``: the Retry-After of a 429 or of a 503 while draining. ``num_workers``: the
    threads of the pool that calls the services. ``predict_timeout_s``: the deadline of a POST .../predict
    that names none (and the service has no default ``timeout``): its job fails then and the
    request answers 504. ``max_websockets``: event streams open at once; one more is closed
    at once with 1013 ("try again later"), its reason naming the limit.

    >>> app = App(InferenceService(model, store=MemoryStore()), input_root="inputs")
    >>> uvicorn.run(app, port=8000)
    """

    def __init__(self, models: InferenceService | Mapping[str, InferenceService], input_root: str | None = None,
                 max_body_bytes: int = 4 << 20, ws_buffer: int = 256, retry_after_s: int = 1, num_workers: int = 8,
                 predict_timeout_s: float = 30.0, max_websockets: int = MAX_WEBSOCKETS) -> None:
        if max_body_bytes < 1 or ws_buffer < 1 or num_workers < 1 or max_websockets < 1:
            raise ValueError("max_body_bytes, ws_buffer, num_workers and max_websockets must be >= 1")
        if not predict_timeout_s > 0:
            raise ValueError(f"predict_timeout_s must be > 0, not {predict_timeout_s!r}")
        self.fronts = {name: ModelFront(name, service, input_root, max_body_bytes, retry_after_s)
                       for name, service in _models_of(models).items()}
        self.default = next(iter(self.fronts.values()))
        self.service = self.default.service  # the first model's (the only one's, usually)
        self.input_root, self.predict_timeout_s = input_root, float(predict_timeout_s)
        self.max_body_bytes, self.ws_buffer, self.retry_after_s = max_body_bytes, ws_buffer, retry_after_s
        self._draining = False
        self._in_flight = 0  # HTTP requests being answered (a predict or a long poll: until its result)
        self._pool = concurrent.futures.ThreadPoolExecutor(num_workers, thread_name_prefix="fastloop-http")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unsubscribe: list[Callable[[], None]] | None = None
        self._watchers: dict[tuple[str, str | None], set[Watcher]] = {}  # (model, job id or None) -> streams
        self._counts_lock = threading.Lock()
        self._responses: dict[int, int] = {}
        self._rejections: dict[str, int] = {}
        self._ws_dropped = 0
        self._ws_refused = 0  # WebSockets closed at once: max_websockets were open
        self.max_websockets, self._ws_open = max_websockets, 0
        self._result_reads: dict[tuple[str, str], asyncio.Future[dict[str, Any]]] = {}  # ?result=1: one read per job
        self._openapi: dict[str, Any] | None = None
        self.v2 = V2Routes(self)  # the Open Inference Protocol's /v2 routes (http_v2.py)
        from .metrics import CONTENT_TYPE, models_registry  # prometheus_client: the serve extra

        self._metrics_type = CONTENT_TYPE
        self._registry = models_registry({name: front.service for name, front in self.fronts.items()},
                                         self._http_counts)
        self._router = self._build_router()
        # The hot routes, answered without Starlette's middleware and route matching (about a
        # tenth of the event loop's time per predict); everything else, and every error, through it.
        self._fast = {("POST", "/v1/predict"): self._ep_predict, ("POST", "/v1/jobs"): self._ep_submit,
                      ("GET", "/healthz"): self._ep_healthz, **self.v2.fast()}

    @property
    def models(self) -> dict[str, InferenceService]:
        """The services by model name."""
        return {name: front.service for name, front in self.fronts.items()}

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

        def raw(handler: Callable[[Scope, Receive], Awaitable[Answer]]) -> Any:
            return _Endpoint(self, handler)

        routes = [
            Route("/healthz", raw(self._ep_healthz), methods=["GET", "HEAD"]),
            Route("/metrics", raw(self._ep_metrics), methods=["GET"]),
            Route("/openapi.json", raw(self._ep_openapi), methods=["GET"]),
            Route("/v1/models", raw(self._ep_models), methods=["GET"]),
        ]
        for prefix in ("/v1", "/v1/models/{model}"):
            routes += [
                Route(f"{prefix}/jobs", raw(self._ep_submit), methods=["POST"]),
                Route(f"{prefix}/predict", raw(self._ep_predict), methods=["POST"]),
                Route(f"{prefix}/jobs/{{job_id}}", raw(self._ep_job), methods=["GET", "DELETE"]),
                Route(f"{prefix}/jobs/{{job_id}}/result", raw(self._ep_result), methods=["GET"]),
                Route(f"{prefix}/jobs/{{job_id}}/events", raw(self._ep_events_http), methods=["GET"]),
                WebSocketRoute(f"{prefix}/events", self._ep_websocket),
                WebSocketRoute(f"{prefix}/jobs/{{job_id}}/events", self._ep_websocket),
            ]
        routes += self.v2.routes(raw)
        routes.append(WebSocketRoute("/{path:path}", self._ep_no_websocket))  # refused as before: 1008, not 1000
        return Starlette(routes=routes, exception_handlers={HTTPException: not_routed}, lifespan=self._lifespan)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self._attach()  # mounted in another app, no lifespan reaches this one
            handler = self._fast.get((scope["method"], _route_path(scope)))
            if handler is not None:
                scope.setdefault("path_params", {})
                return await self._answer(scope, receive, send, handler)
        elif scope["type"] == "websocket":
            self._attach()
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
            self._unsubscribe = [front.service.subscribe(self._listener(name)) for name, front in self.fronts.items()]

    def drain(self) -> None:
        """Stops accepting jobs: from now on POST .../jobs and .../predict answer 503 with
        Retry-After and /healthz 503 "draining" (a load balancer stops sending), while
        status, results and the predicts in progress are still answered. What a server's
        SIGTERM does first; an app that mounts this one calls it from its own shutdown."""
        self._draining = True

    @property
    def draining(self) -> bool:
        return self._draining

    def _refuse_if_draining(self) -> None:
        if self._draining:
            raise Reply(503, {"error": "the server is stopping: it takes no new jobs; retry on another"},
                        [("retry-after", str(self.retry_after_s))], rejection="unavailable")

    def detach(self) -> None:
        """Unsubscribes from the services and stops the thread pool (the server's shutdown
        does it; an app that mounts this one calls it from its own shutdown; the services
        themselves are the caller's to close)."""
        for unsubscribe in self._unsubscribe or ():
            unsubscribe()
        self._unsubscribe = None
        self._pool.shutdown(wait=False)

    def _front(self, scope: Scope) -> ModelFront:
        """The model a request names (its /v1/models/{model}/ path), or the first one."""
        name = scope.get("path_params", {}).get("model")
        if name is None:
            return self.default
        front = self.fronts.get(name)
        if front is None:
            raise Reply(404, {"error": f"no model named {name!r} (GET /v1/models lists them: "
                                       f"{', '.join(map(repr, self.fronts))})"})
        return front

    # ------------------------------------------------------------ HTTP
    def _encode(self, status: int, body: Any) -> tuple[bytes, str]:
        self._count(self._responses, status)
        if isinstance(body, str):
            return body.encode(), self._metrics_type
        if isinstance(body, bytes):  # a result asked for as .npy, or a v2 body (a Payload: its own type)
            return body, getattr(body, "content_type", NPY_TYPE)
        return _JSON.encode(body).encode(), "application/json"

    def _respond(self, status: int, body: Any, headers: list[tuple[str, str]] | None = None) -> Any:
        """A Starlette Response (for the 404/405 handler)."""
        from starlette.responses import Response

        payload, kind = self._encode(status, body)
        return Response(payload, status, headers=dict(headers or []), media_type=kind)

    async def _answer(self, scope: Scope, receive: Receive, send: Send,
                      handler: Callable[[Scope, Receive], Awaitable[Answer]]) -> None:
        self._in_flight += 1
        try:
            status, body, headers = await handler(scope, receive)
        except Reply as reply:
            status, body, headers = reply.status, reply.body, reply.headers
            if reply.rejection:
                self._count(self._rejections, reply.rejection)
        except Exception as error:  # a bug here: answer it as JSON rather than drop the client
            status, body, headers = 500, {"error": f"{type(error).__name__}: {error}"}, []
        finally:
            self._in_flight -= 1
        try:
            payload, kind = self._encode(status, body)
        except (TypeError, ValueError) as error:  # a postprocess that returned what JSON cannot hold
            status, body, headers = 500, {"error": f"the answer is not JSON: {error}"}, []
            payload, kind = self._encode(status, body)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind.encode()), (b"content-length", str(len(payload)).encode())]
                    + [(k.encode(), v.encode()) for k, v in headers]})
        await send({"type": "http.response.body", "body": payload})

    async def _ep_healthz(self, scope: Scope, receive: Receive) -> Answer:
        healths = {name: front.service.health() for name, front in self.fronts.items()}
        health = dict(healths[next(iter(healths))])
        if len(healths) > 1:  # the worst of them; each model's own beside
            order = ("closed", "degraded", "ok")
            health["status"] = min((h["status"] for h in healths.values()), key=order.index)
            health["models"] = healths
        if self._draining and health["status"] == "ok":
            health["status"] = "draining"
        return (200 if health["status"] == "ok" else 503), health, []

    async def _ep_metrics(self, scope: Scope, receive: Receive) -> Answer:
        return 200, await self._call(self._metrics), []

    async def _ep_models(self, scope: Scope, receive: Receive) -> Answer:
        return 200, {"models": [dict(front.describe(), default=front is self.default)
                                for front in self.fronts.values()]}, []

    async def _ep_openapi(self, scope: Scope, receive: Receive) -> Answer:
        from .http_openapi import openapi_schema, with_root_path

        if self._openapi is None:
            self._openapi = await self._call(openapi_schema, self.fronts, self.default.name, self.input_root is not None)

        return 200, with_root_path(self._openapi, scope.get("root_path", "")), []

    async def _ep_submit(self, scope: Scope, receive: Receive) -> Answer:
        job_id, _ = await self._accept(scope, receive)
        return 202, {"id": job_id}, [("location", f"{scope.get('root_path', '')}{_jobs_path(scope)}/{job_id}")]

    async def _accept(self, scope: Scope, receive: Receive, on_end: Callable[[JobRecord, Any], None] | None = None,
                      timeout_s: float | None = None, query: dict[str, Any] | None = None) -> tuple[str, bool]:
        """Reads, admits and submits a request's job (POST .../jobs, .../predict): its id,
        and whether `on_end` will be called when it ends (service.watch; False: the job ended
        already, or another process holds it). `timeout_s`: the deadline when the request
        names none. `query`: the request's _submit_query (read here when not given)."""
        front = self._front(scope)
        if query is None:
            query = _submit_query(scope)  # id, timeout_s, priority: for every kind of body
        body = await self._read_body(scope, receive)
        self._refuse_if_draining()
        raw = front.service.preprocess is not None or \
            _header(scope, b"content-type").split(";")[0].strip().lower() == NPY_TYPE
        # A full queue is answered here, on the loop, before any parsing: a 429 must be
        # fast when the service is busiest. (A request naming its own id goes the long way,
        # so resubmitting a known job stays idempotent. The body is searched for one only
        # when the queue looks full: 8 us for a 16 KB row.) An admitted request holds a queue
        # slot until its submit uses it, so it is never refused later (a 429 that waited
        # behind parsing).
        named = "id" in query or (not raw and front.looks_full() and b'"id"' in body)
        admission = None if named else front.service.admit()
        if admission is None and not named and (raw or b'"id"' not in body):  # (filled since the look)
            raise Reply(429, {"error": f"the service's queue is full ({front.service.max_queue} jobs "
                                       "waiting): retry later"},
                        [("retry-after", str(self.retry_after_s))], rejection="queue_full")
        try:
            if raw:
                return await self._call(front.submit_raw, body, query.get("id"), query.get("timeout_s", timeout_s),
                                        query.get("priority", "normal"), admission, on_end)
            if front.inline(body):  # a small body on the memory store: on the loop, but a "path" input's file read
                data = self._inline(front.parse, body, query)
                if "path" not in data:
                    return self._inline(front.submit_parsed, data, admission, on_end, timeout_s)
                return await self._call(front.submit_parsed, data, admission, on_end, timeout_s)
            return await self._call(front.submit, body, admission, on_end, timeout_s, query)
        finally:
            if admission is not None:
                admission.release()  # unused: the submit failed before it, or never ran

    async def _ep_predict(self, scope: Scope, receive: Receive) -> Answer:
        """POST .../predict: submits the job as POST .../jobs does and answers its result
        (as GET .../result), 422 for a failed one, 504 when its deadline passes first."""
        front = self._front(scope)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[JobRecord, Any] | None] = loop.create_future()  # None: wait_s passed

        def on_end(record: JobRecord, row: Any) -> None:  # on the worker that ended the job
            loop.call_soon_threadsafe(_settle, done, (record, row))

        timeout_s = front.service.timeout or self.predict_timeout_s
        query = _submit_query(scope)
        job_id, watching = await self._accept(scope, receive, on_end, timeout_s, query)
        as_npy = NPY_TYPE in _header(scope, b"accept").lower()
        wait_s = query.get("timeout_s", timeout_s) + _PREDICT_MARGIN_S  # the deadline the job has
        if not watching:  # ended already, or held by another process
            answer = await self._wait_result(front, job_id, as_npy, wait_s, predict=True)
            return _timed_out(job_id, wait_s) if answer[0] == 202 else answer
        timer = loop.call_later(wait_s, _settle, done, None)  # cheaper than asyncio.wait_for
        try:
            outcome = await done
        finally:
            timer.cancel()
        if outcome is None:
            return _timed_out(job_id, wait_s)
        record, row = outcome
        if front.hooked and not as_npy:  # the model's postprocess: its code, in the pool
            return await self._call(front.outcome_reply, job_id, record, row, as_npy, True)
        return front.outcome_reply(job_id, record, row, as_npy, predict=True)

    async def _ep_job(self, scope: Scope, receive: Receive) -> Answer:
        front = self._front(scope)
        handler = front.cancel if scope["method"] == "DELETE" else front.status
        return await self._call(handler, scope["path_params"]["job_id"])

    async def _ep_result(self, scope: Scope, receive: Receive) -> Answer:
        front = self._front(scope)
        as_npy = NPY_TYPE in _header(scope, b"accept").lower()
        job_id = scope["path_params"]["job_id"]
        wait_s = _query_wait(scope)
        if not wait_s:
            return await self._call(front.result, job_id, as_npy)
        return await self._wait_result(front, job_id, as_npy, wait_s)

    async def _wait_result(self, front: ModelFront, job_id: str, as_npy: bool, wait_s: float,
                           predict: bool = False) -> Answer:
        """A long poll: the result answer once the job ends (its status event), or 202 after
        wait_s. The watcher is in place before the first read, so no ending falls between."""
        loop = asyncio.get_running_loop()
        watcher = Watcher((front.name, job_id), self.ws_buffer)
        self._watch(watcher)
        try:
            until = loop.time() + wait_s
            while True:
                answer = await self._call(front.result, job_id, as_npy, predict)
                left = until - loop.time()
                if answer[0] != 202 or left <= 0:
                    return answer
                with contextlib.suppress(asyncio.TimeoutError):  # re-read at least every second:
                    await asyncio.wait_for(ended(watcher), min(left, _RECHECK_S))  # an event may be lost
        finally:
            self._unwatch(watcher)

    async def _ep_events_http(self, scope: Scope, receive: Receive) -> Answer:
        return 405, {"error": f"{scope['method']} {scope['path']}: use a WebSocket"}, [("allow", "")]

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
                raise Reply(413, {"error": f"the body has {int(value)} bytes, over the limit of "
                                           f"{self.max_body_bytes}"}, rejection="too_large")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise Reply(400, {"error": "the client disconnected"})
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise Reply(413, {"error": f"the body is over the limit of {self.max_body_bytes} bytes"},
                            rejection="too_large")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _inline(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn on the loop, its errors answered as _call answers them."""
        try:
            return fn(*args)
        except Reply:
            raise
        except _UNAVAILABLE as error:
            raise Reply(503, {"error": f"the service is unavailable: {type(error).__name__}: {error}"},
                        [("retry-after", str(self.retry_after_s))], rejection="unavailable") from None

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Runs fn in the pool (it may block on the store); maps store trouble to 503."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, fn, *args)
        except Reply:
            raise
        except _UNAVAILABLE as error:
            raise Reply(503, {"error": f"the service is unavailable: {type(error).__name__}: {error}"},
                        [("retry-after", str(self.retry_after_s))], rejection="unavailable") from None
        except RuntimeError as error:  # the pool shut down: the server is stopping
            raise Reply(503, {"error": f"the server is stopping: {error}"}) from None

    def _http_counts(self) -> dict[str, Any]:
        with self._counts_lock:
            http = {"responses": dict(self._responses), "rejections": dict(self._rejections),
                    "ws_dropped": self._ws_dropped, "ws_refused": self._ws_refused}
        http["ws_open"] = sum(len(group) for group in list(self._watchers.values()))
        return http

    def _metrics(self) -> str:
        from .metrics import render

        return render(self._registry)

    def _count(self, table: dict[Any, int], key: Any) -> None:
        with self._counts_lock:
            table[key] = table.get(key, 0) + 1
