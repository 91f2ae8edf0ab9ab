"""The Open Inference Protocol's REST routes (KServe v2, as Triton implements them) on the HTTP
front (App, http.py), so that ``tritonclient.http`` and KServe's REST client work unchanged:

    GET  /v2/health/live, /v2/health/ready       {"live": true} / {"ready": true}; 503 not ready
    GET  /v2                                     {"name", "version", "extensions"}
    GET  /v2/models/{name}[/versions/1]          {"name", "versions", "platform", "inputs", "outputs"}
    GET  /v2/models/{name}[/versions/1]/ready    200, or 503 (draining, closed, degraded)
    POST /v2/models/{name}[/versions/1]/infer    tensors in, tensors out (JSON or binary)

An infer request is one job of the model's service, as POST /v1/predict submits it: the same
admission (a full queue answers at once), dynamic batching with other requests, deadline
(Triton's ``parameters.timeout``, microseconds; else the service's or the App's), metrics and
drain. Each input tensor carries the batch axis first (the metadata's -1); a model's outputs
are named as the service returns them: ``output0`` for an array, ``output0``, ``output1``, ...
for a tuple, the keys of a dict. Errors are ``{"error": ...}`` with Triton's status codes: 400
a bad request, 404 an unknown model or version, 503 a full queue, a missed deadline, a draining
or stopped server; 500 a model that failed. The tensor bodies themselves: v2_tensors.py.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any, Callable

import numpy as np

from .._version import __version__
from .http_inputs import BadInput
from .http_model import ModelFront, Reply, describe_inputs, submit_reply
from .http_requests import Answer, Receive, Scope, _settle
from .jobs import DEADLINE_EXCEEDED, FAILED, JobRecord
from .rows import row_errors_of
from .v2_tensors import Request, datatype_of, read_request, write_response

__all__ = ["V2Routes", "Payload", "VERSION", "output_tensors"]

VERSION = "1"  # a service has one version of its model
EXTENSIONS = ["binary_tensor_data"]
_MARGIN_S = 1.0  # an infer waits this long past its job's deadline for the janitor's verdict
_PRIORITIES = {0: "normal", 1: "high", 2: "normal", 3: "low"}  # Triton's levels (1: highest) -> fastloop's


class Payload(bytes):
    """A response body already encoded, with its content type (App._encode sends it as is)."""

    content_type = "application/json"

    def __new__(cls, data: bytes, content_type: str) -> "Payload":
        payload = super().__new__(cls, data)
        payload.content_type = content_type
        return payload


def _bad(message: str) -> Reply:
    return Reply(400, {"error": message}, rejection="bad_input")


def input_metadata(front: ModelFront) -> list[dict[str, Any]]:
    """The model's inputs as the protocol lists them: name, datatype ("" for a model that
    takes any numbers) and shape with -1 first (the batch axis) and for any size."""
    tensors = []
    for item in describe_inputs(front.service):
        datatype = "" if item["dtype"] is None else datatype_of(np.dtype(item["dtype"]))
        shape = [-1] + [-1 if size is None else size for size in (item["shape"] or [])]
        tensors.append({"name": item["name"], "datatype": datatype, "shape": shape})
    return tensors


def output_tensors(row: np.ndarray, rows: int | None) -> list[tuple[str, np.ndarray]]:
    """A job's result as named tensors with the batch axis first: ``output0`` for an array,
    ``output0``, ``output1``, ... for a tuple, the keys of a dict."""
    if rows is None:  # a job of one row (no batch axis at submit): give it one
        row = row[np.newaxis]
    names = row.dtype.names
    if names is None:
        return [("output0", row)]
    tuple_like = names == tuple(str(i) for i in range(len(names)))
    return [(f"output{name}" if tuple_like else name, np.ascontiguousarray(row[name])) for name in names]


def _headers(scope: Scope) -> tuple[str, str]:
    """The request's Inference-Header-Content-Length and Content-Encoding (lower case): "" if absent."""
    length = encoding = None
    for key, value in scope.get("headers", []):
        if key == b"inference-header-content-length" and length is None:
            length = value.decode("latin-1")
        elif key == b"content-encoding" and encoding is None:
            encoding = value.decode("latin-1").strip().lower()
    return length or "", encoding or ""


def _fits(declared: list[int], shape: Any) -> bool:
    """Whether `shape` has the declared sizes (-1: any), both of one rank."""
    for want, got in zip(declared, shape):
        if want != -1 and want != got:
            return False
    return True


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """A Content-Encoding: gzip or deflate (zlib) body, at most `limit` bytes once inflated."""
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise Reply(400, {"error": f"Content-Encoding {encoding!r:.40} is not supported: use gzip, deflate or none"})
    inflater = zlib.decompressobj(zlib.MAX_WBITS | (16 if encoding == "gzip" else 0))
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as error:
        raise _bad(f"the {encoding} body cannot be inflated: {error}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise Reply(413, {"error": f"the inflated body is over the limit of {limit} bytes"}, rejection="too_large")
    if not inflater.eof:
        raise _bad(f"the {encoding} body is truncated")
    return out


class V2Routes:
    """The v2 handlers of an App (its models, pool, drain state and counters)."""

    def __init__(self, app: Any) -> None:  # an App (http.py imports this module)
        self.app = app
        self.outputs: dict[str, list[dict[str, Any]]] = {}  # model -> its outputs, once it has answered
        self.declared: dict[str, list[dict[str, Any]]] = {}  # model -> input_metadata (fixed): read once

    def routes(self, raw: Callable[[Any], Any]) -> list[Any]:
        from starlette.routing import Route

        routes = [Route("/v2", raw(self.server_metadata), methods=["GET"]),
                  Route("/v2/health/live", raw(self.live), methods=["GET"]),
                  Route("/v2/health/ready", raw(self.ready), methods=["GET"])]
        for model in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            routes += [Route(model, raw(self.model_metadata), methods=["GET"]),
                       Route(f"{model}/ready", raw(self.model_ready), methods=["GET"]),
                       Route(f"{model}/infer", raw(self.infer), methods=["POST"])]
        return routes

    def fast(self) -> dict[tuple[str, str], Callable[[Scope, Receive], Any]]:
        """POST /v2/models/{name}/infer for each model, for App's table of routes answered
        without Starlette's matching (App.__call__)."""
        def infer_of(name: str) -> Callable[[Scope, Receive], Any]:
            async def infer(scope: Scope, receive: Receive) -> Answer:
                scope["path_params"] = {"model": name}
                return await self.infer(scope, receive)
            return infer
        return {("POST", f"/v2/models/{name}/infer"): infer_of(name) for name in self.app.fronts}

    # ------------------------------------------------------------ health and metadata
    def _front(self, scope: Scope) -> ModelFront:
        params = scope.get("path_params", {})
        name = params.get("model")
        front = self.app.fronts.get(name)
        if front is None:
            raise Reply(404, {"error": f"unknown model {name!r}: this server has "
                                       f"{', '.join(map(repr, self.app.fronts))}"})
        version = params.get("version", VERSION)
        if version != VERSION:
            raise Reply(404, {"error": f"model {name!r} has no version {version!r}: it has version {VERSION!r}"})
        return front

    def _not_ready(self, front: ModelFront) -> str | None:
        """Why the model takes no requests now, or None."""
        if self.app.draining:
            return "the server is stopping: it takes no new requests"
        status = front.service.health()["status"]
        return None if status == "ok" else f"model {front.name!r} is {status}"

    async def live(self, scope: Scope, receive: Receive) -> Answer:
        return 200, {"live": True}, []

    async def ready(self, scope: Scope, receive: Receive) -> Answer:
        reasons = [r for r in map(self._not_ready, self.app.fronts.values()) if r]
        if reasons:
            return 503, {"ready": False, "error": "; ".join(reasons)}, []
        return 200, {"ready": True}, []

    async def server_metadata(self, scope: Scope, receive: Receive) -> Answer:
        return 200, {"name": "fastloop", "version": __version__, "extensions": EXTENSIONS}, []

    async def model_metadata(self, scope: Scope, receive: Receive) -> Answer:
        front = self._front(scope)
        return 200, {"name": front.name, "versions": [VERSION], "platform": "fastloop",
                     "inputs": input_metadata(front), "outputs": self.outputs.get(front.name, [])}, []

    async def model_ready(self, scope: Scope, receive: Receive) -> Answer:
        front = self._front(scope)
        reason = self._not_ready(front)
        if reason:
            return 503, {"name": front.name, "ready": False, "error": reason}, []
        return 200, {"name": front.name, "ready": True}, []

    # ------------------------------------------------------------ infer
    async def infer(self, scope: Scope, receive: Receive) -> Answer:
        app = self.app
        front = self._front(scope)
        body = await app._read_body(scope, receive)
        app._refuse_if_draining()
        text, encoding = _headers(scope)
        if text and not text.strip().isdigit():
            raise _bad(f"Inference-Header-Content-Length must be a number of bytes, not {text!r:.40}")
        header_length = int(text) if text else None
        admission = front.service.admit()  # a full queue is answered before any parsing
        if admission is None:
            raise Reply(503, {"error": f"the model's queue is full ({front.service.max_queue} requests "
                                       "waiting): retry later"},
                        [("retry-after", str(app.retry_after_s))], rejection="queue_full")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[JobRecord, Any] | None] = loop.create_future()  # None: wait_s passed

        def on_end(record: JobRecord, row: Any) -> None:  # on the worker that ended the job
            loop.call_soon_threadsafe(_settle, done, (record, row))

        timeout_s = front.service.timeout or app.predict_timeout_s
        args = (front, body, header_length, encoding, admission, on_end, timeout_s)
        # /v1/predict's rule (ModelFront.inline): a small body on the memory store is read and
        # submitted on the loop; a large or compressed one, or a store that may block, in the pool.
        inline = encoding in ("", "identity") and front.inline(body)
        try:
            request, job_id, timeout_s, watching = app._inline(self.submit, *args) if inline else \
                await app._call(self.submit, *args)
        finally:
            admission.release()  # unused: the submit failed before it
        wait_s = timeout_s + _MARGIN_S
        if watching:
            timer = loop.call_later(wait_s, _settle, done, None)  # cheaper than asyncio.wait_for
            try:
                outcome = await done
            finally:
                timer.cancel()
        else:  # ended already: read it
            outcome = await app._call(front.service._outcome, job_id)
        if outcome is None:
            raise Reply(503, {"error": f"{DEADLINE_EXCEEDED}: no result within {wait_s:g} s"})
        record, row = outcome
        # on the loop, as /v1/predict's answer: a few outputs to encode, cheaper than a trip through the pool
        return self.answer(front, request, record, row)

    def submit(self, front: ModelFront, body: bytes, header_length: int | None, encoding: str, admission: Any,
               on_end: Callable[[JobRecord, Any], None], timeout: float) -> tuple[Request, str, float, bool]:
        """Reads the request and submits its job (in the pool): the request, the job's id, its
        deadline (seconds from now: the request's, else `timeout`) and whether on_end will be called."""
        service = front.service
        try:
            body = _decompress(body, encoding, self.app.max_body_bytes)
            request = read_request(body, header_length)
            name, version = request.model
            if name not in (None, front.name) or version not in (None, "", VERSION):
                raise BadInput(f"the body names model {name!r} version {version!r}; the path names {front.name!r}")
            inputs = self._inputs(front, request)
            if request.timeout_us:  # Triton's timeout: microseconds (0: none given)
                timeout = request.timeout_us / 1e6
            priority = _PRIORITIES.get(request.priority, "low")
            job_id = service.submit(inputs, timeout=timeout, priority=priority, admission=admission)
        except Reply:
            raise
        except Exception as error:
            reply = submit_reply(error, self.app.retry_after_s)
            if isinstance(reply, Reply) and reply.status == 429:
                reply.status = 503  # Triton answers a full queue 503 (UNAVAILABLE)
            raise reply from None
        return request, job_id, timeout, service.watch(job_id, on_end)

    def _inputs(self, front: ModelFront, request: Request) -> Any:
        """The request's tensors as the service's submit takes them, checked against the
        model's declared inputs: names, datatypes and shapes (batch axis first)."""
        declared = self.declared.get(front.name)
        if declared is None:
            declared = self.declared[front.name] = input_metadata(front)
        spec = front.service._spec
        typed = hasattr(spec, "names")  # declared Inputs (else fastloop.nn's or a callable's: the service checks)
        if typed and spec.single and len(request.inputs) == 1:  # the usual request: one row of the one input
            want, tensor = declared[0], request.inputs[0]
            shape = tensor.array.shape
            if tensor.name == want["name"] and tensor.datatype == want["datatype"] and shape[:1] == (1,) \
                    and len(shape) == len(want["shape"]) and _fits(want["shape"], shape):
                return tensor.array[0]  # a job of one row, as /v1/predict's (answer() gives back the axis)
        by_name = {t.name: t for t in request.inputs}
        names = [d["name"] for d in declared]
        if by_name.keys() != set(names):
            raise _bad(f"model {front.name!r} takes inputs {names}, the request gives {sorted(by_name)}")
        arrays = {}
        for want in declared:
            tensor = by_name[want["name"]]
            label = f"input {tensor.name!r}"
            if want["datatype"] and tensor.datatype != want["datatype"]:
                raise _bad(f"{label}: datatype {tensor.datatype}, the model takes {want['datatype']}")
            shape, rank = list(tensor.array.shape), len(want["shape"])
            if typed and (len(shape) != rank or not _fits(want["shape"], shape)):
                raise _bad(f"{label}: shape {shape}, the model takes {want['shape']} (-1: any size)")
            if not shape or shape[0] == 0:
                raise _bad(f"{label}: shape {shape} holds no rows (the batch axis comes first)")
            arrays[tensor.name] = tensor.array
        if typed and spec.single and arrays[names[0]].shape[0] == 1:
            return arrays[names[0]][0]  # one row: a job of one row, as /v1/predict's (answer() gives back the axis)
        if typed:  # a batch along the first axis
            return arrays[names[0]] if spec.single else arrays
        array = arrays[names[0]]
        if spec.features is None:  # a plain callable: any array is one row
            if array.shape[0] != 1:
                raise _bad(f"input {names[0]!r}: model {front.name!r} declares no input shape, so it takes one "
                           f"row per request (shape [1, ...]), not {array.shape[0]}")
            return array[0]
        return array

    def answer(self, front: ModelFront, request: Request, record: JobRecord, row: Any) -> Answer:
        """The infer response for the job's outcome: its outputs, or the error."""
        if record.status == FAILED:
            reason = record.error or ("cancelled" if record.cancelled else "unknown error")
            status = 503 if reason.startswith(DEADLINE_EXCEEDED) else 500
            return status, {"error": reason}, []
        if row is None:
            return 500, {"error": f"the result of the request is gone (kept {front.service.result_ttl_s:g} s)"}, []
        failed = row_errors_of(record)
        if failed:
            reasons = "; ".join(f"{i}: {e}" for i, e in sorted(failed.items()))
            return 500, {"error": f"the model failed on rows {reasons}"}, []
        tensors = output_tensors(row, record.rows)
        try:
            self.outputs[front.name] = [{"name": n, "datatype": datatype_of(a.dtype), "shape": [-1, *a.shape[1:]]}
                                        for n, a in tensors]
        except BadInput as error:  # an output no datatype holds (complex numbers)
            return 500, {"error": str(error)}, []
        chosen = [(name, array, request.binary_output) for name, array in tensors]
        if request.outputs is not None:
            have = dict(tensors)
            unknown = [r.name for r in request.outputs if r.name not in have]
            if unknown:
                return 400, {"error": f"unknown outputs {unknown}: model {front.name!r} has {list(have)}"}, []
            chosen = [(r.name, have[r.name], request.binary_output if r.binary is None else r.binary)
                      for r in request.outputs]
        try:
            body, header_length = write_response(front.name, VERSION, request.id, chosen)
        except BadInput as error:
            return 500, {"error": str(error)}, []
        if header_length is None:
            return 200, Payload(body, "application/json"), []
        return 200, Payload(body, "application/octet-stream"), [("inference-header-content-length", str(header_length))]

