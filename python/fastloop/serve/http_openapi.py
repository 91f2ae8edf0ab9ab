"""GET /openapi.json: the OpenAPI 3.1 document of every HTTP route the front serves, written
from the App's own models (no FastAPI needed): /healthz, /metrics, /v1/models, and for each
model its /v1/models/{name}/ routes (the default model's at /v1/ too): predict, jobs, a job's
status, cancel and result, with request bodies from the model's declared inputs
(http_openapi_inputs.py), and the Open Inference Protocol's /v2 routes (http_openapi_v2.py).
Each operation lists every status code it can answer, and POST .../jobs links to the routes
of the job it made (OpenAPI links, for generated clients and stateful testing).

    >>> schema = openapi_schema(app.fronts, default="mnist", has_input_root=False)
    >>> schema["paths"]["/v1/models/mnist/predict"]["post"]["requestBody"]
"""

from __future__ import annotations

from typing import Any

from .._version import __version__
from .http_model import ModelFront
from .http_openapi_inputs import ID_PATTERN, request_schema
from .http_openapi_v2 import v2_paths
from .http_requests import MAX_WAIT_S

__all__ = ["openapi_schema", "with_root_path"]

_DESCRIPTION = (
    "Models served by fastloop.serve; GET /v1/models lists their inputs. A job's body is JSON as "
    "described, or a .npy array (Content-Type: application/x-npy) with id, timeout_s and priority in "
    "the query (?id=&timeout_s=&priority=), or, for a model with a preprocess, the bytes it reads. "
    "Not described here, since OpenAPI cannot: the WebSocket routes /v1/events, /v1/jobs/{id}/events "
    "and their /v1/models/{name}/ forms (a status event per change; over plain HTTP they answer 405), "
    "and the Open Inference Protocol's binary tensor extension (Inference-Header-Content-Length).")

ERROR = {"type": "object", "required": ["error"], "properties": {
    "error": {"type": "string"}, "id": {"type": "string"}, "status": {"type": "string"},
    "cancelled": {"type": "boolean"}, "errors": {"type": "array", "items": {"type": ["string", "null"]}}}}


def error(description: str, retry_after: bool = False) -> dict[str, Any]:
    """A response whose body is {"error": reason} (with the job's id and status where known)."""
    answer: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": ERROR}}}
    if retry_after:
        answer["headers"] = {"Retry-After": {"description": "seconds to wait before retrying",
                                             "schema": {"type": "string"}}}
    return answer


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_BUSY = error("the queue is full: retry after Retry-After seconds", retry_after=True)
_UNAVAILABLE = error("the store is unreachable, or the server is stopping (draining): retry elsewhere",
                     retry_after=True)
_BAD = error("the body is not what the model takes (the reason in 'error')")
_TOO_LARGE = error("the body (or the .npy file it names) is over the size limit")
_UNKNOWN_JOB = error("no such job (or not a valid id)")
_EXPIRED = error("the job ended longer ago than the service keeps results (result_ttl_s)")
_FAILED = error("the job failed (the model raised, it was cancelled, or its deadline passed)")

_STATUS = {"type": "object", "required": ["id", "status"], "properties": {
    "id": {"type": "string"}, "status": {"enum": ["queued", "running", "done", "failed", "expired"]},
    "submitted": {"type": "number"}, "started": {"type": ["number", "null"]},
    "finished": {"type": ["number", "null"]}, "rows": {"type": "integer"}, "error": {"type": ["string", "null"]},
    "cancelled": {"type": "boolean"}, "errors": {"type": "array", "items": {"type": ["string", "null"]}}}}
_CANCEL = {"type": "object", "required": ["id", "cancelled", "status"], "properties": {
    "id": {"type": "string"}, "cancelled": {"type": "boolean"}, "status": {"type": "string"},
    "error": {"type": "string"}}}
_RESULT = {"type": "object", "required": ["id", "status", "result"], "properties": {
    "id": {"type": "string"}, "status": {"const": "done"},
    "result": {"description": "the output (one row, or the rows; NaN and infinities as null), or what the "
                              "model's postprocess made"},
    "dtype": {}, "shape": {},
    "errors": {"type": "array", "items": {"type": ["string", "null"]}, "description": "per row: why it failed"}}}
_PENDING = {"type": "object", "required": ["id", "status"], "properties": {
    "id": {"type": "string"}, "status": {"enum": ["queued", "running"]}}}
_NPY = {"schema": {"type": "string", "format": "binary"}}
_JOB_ID = {"name": "job_id", "in": "path", "required": True, "description": "a job's id (POST .../jobs answers it)",
           "schema": {"type": "string", "pattern": ID_PATTERN}}


def _result_answer(predict: bool) -> dict[str, Any]:
    return {"description": "the job's result (Accept: application/x-npy: the output as .npy)",
            "content": {"application/json": {"schema": _RESULT}, "application/x-npy": _NPY}}


def _model_paths(prefix: str, front: ModelFront, body: dict[str, Any], tag: str) -> dict[str, Any]:
    """The /v1 routes of one model under `prefix` (/v1 or /v1/models/{name})."""
    name, op = front.name, prefix.replace("/", "_").strip("_")
    hooked = front.service.postprocess is not None
    failed_model = {"500": error("the model's postprocess failed")} if hooked else {}
    job = {"parameters": {"job_id": "$response.body#/id"}}
    return {
        f"{prefix}/predict": {"post": {
            "operationId": f"{op}_predict", "tags": [tag], "summary": f"{name}: run one job, its result in the answer",
            "requestBody": body,
            "responses": {"200": _result_answer(True), "400": _BAD, "410": _EXPIRED, "413": _TOO_LARGE,
                          "422": _FAILED, "429": _BUSY, "503": _UNAVAILABLE,
                          "504": error("the job's deadline passed before it ended"), **failed_model}}},
        f"{prefix}/jobs": {"post": {
            "operationId": f"{op}_submit", "tags": [tag],
            "summary": f"{name}: queue a job; GET {prefix}/jobs/{{job_id}}/result answers it", "requestBody": body,
            "responses": {
                "202": {"description": "queued (or the known job of the id given)",
                        "headers": {"Location": {"description": "the job's URL", "schema": {"type": "string"}}},
                        "content": {"application/json": {"schema": {
                            "type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}}},
                        "links": {"GetJob": {"operationId": f"{op}_job", **job},
                                  "CancelJob": {"operationId": f"{op}_cancel", **job},
                                  "GetResult": {"operationId": f"{op}_result", **job}}},
                "400": _BAD, "413": _TOO_LARGE, "429": _BUSY, "503": _UNAVAILABLE}}},
        f"{prefix}/jobs/{{job_id}}": {
            "parameters": [_JOB_ID],
            "get": {"operationId": f"{op}_job", "tags": [tag], "summary": f"{name}: a job's status",
                    "responses": {"200": _json("the job's status", _STATUS), "404": _UNKNOWN_JOB,
                                  "410": _json("the job expired, or a DELETE cancelled it", _STATUS),
                                  "503": _UNAVAILABLE}},
            "delete": {"operationId": f"{op}_cancel", "tags": [tag],
                       "summary": f"{name}: cancel a queued job (it never runs; GET answers 410 from then on)",
                       "responses": {"200": _json("cancelled", _CANCEL), "404": _UNKNOWN_JOB,
                                     "409": _json("not cancelled: the job is running or has ended", _CANCEL),
                                     "503": _UNAVAILABLE}}},
        f"{prefix}/jobs/{{job_id}}/result": {"get": {
            "operationId": f"{op}_result", "tags": [tag], "summary": f"{name}: a job's result",
            "parameters": [_JOB_ID, {"name": "wait_s", "in": "query", "required": False,
                                     "description": "a long poll: wait up to this many seconds for the job to end",
                                     "schema": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S}}],
            "responses": {"200": _result_answer(False),
                          "202": {"description": "still queued or running: retry after Retry-After",
                                  "headers": {"Retry-After": {"schema": {"type": "string"}}},
                                  "content": {"application/json": {"schema": _PENDING}}},
                          "400": error("wait_s is not a number of seconds from 0 to 60"), "404": _UNKNOWN_JOB,
                          "410": _EXPIRED, "422": _FAILED, "503": _UNAVAILABLE, **failed_model}}},
    }


def _request_body(front: ModelFront, has_input_root: bool) -> dict[str, Any]:
    if front.service.preprocess is not None:  # a body the model reads itself: any bytes
        return {"required": True, "description": "the body the model's preprocess reads",
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}
    return {"required": True, "content": {"application/json": {"schema": request_schema(front, has_input_root)}}}


def openapi_schema(fronts: dict[str, ModelFront], default: str, has_input_root: bool = False) -> dict[str, Any]:
    """The OpenAPI document of the App's routes (`default`: the model the plain /v1/ routes serve)."""
    text = {"schema": {"type": "string"}}
    paths: dict[str, Any] = {
        "/healthz": {op: {"operationId": f"healthz_{op}", "summary": "Health: 200 ok, 503 degraded, closed "
                          "or draining", "responses": {"200": _json("ok", {"type": "object"}),
                                                       "503": _json("not ok", {"type": "object"})}}
                     for op in ("get", "head")},
        "/metrics": {"get": {"operationId": "metrics", "summary": "Prometheus metrics",
                             "responses": {"200": {"description": "the text exposition format",
                                                   "content": {"text/plain": text}}, "503": _UNAVAILABLE}}},
        "/openapi.json": {"get": {"operationId": "openapi", "summary": "This document",
                                  "responses": {"200": _json("the OpenAPI document", {"type": "object"})}}},
        "/v1/models": {"get": {"operationId": "models", "summary": "The models served, with their inputs",
                               "responses": {"200": _json("the models", {
                                   "type": "object", "required": ["models"],
                                   "properties": {"models": {"type": "array", "items": {"type": "object"}}}})}}},
    }
    for name, front in fronts.items():
        body = _request_body(front, has_input_root)
        paths.update(_model_paths(f"/v1/models/{name}", front, body, name))
        if name == default:
            paths.update(_model_paths("/v1", front, body, name))
    paths.update(v2_paths(fronts))
    return {"openapi": "3.1.0", "info": {"title": "fastloop serve", "version": __version__,
                                         "description": _DESCRIPTION}, "paths": paths}


def with_root_path(schema: dict[str, Any], root_path: str) -> dict[str, Any]:
    """`schema` as a request under `root_path` sees it (the front mounted at a prefix, or a
    proxy's root_path): a ``servers`` entry naming the prefix, as FastAPI adds, so a client
    generated from it calls the URLs the server answers. The paths stay as routed."""
    if not root_path:
        return schema
    return {**schema, "servers": [{"url": root_path}]}
