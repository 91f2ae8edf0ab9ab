"""The Open Inference Protocol's /v2 routes in the OpenAPI document (http_openapi.py): health,
server and model metadata, readiness, and each model's JSON infer request exactly as
v2_tensors.read_request and V2Routes._inputs check it (the declared inputs' names, datatypes,
shapes with the batch size, and data of that many elements of the datatype's range).

The binary tensor extension (Inference-Header-Content-Length, binary_data_size) is not
described: a body of JSON then raw bytes has no OpenAPI schema. Neither are requested
``outputs``: their names are the model's answer's (output0, ...), known once it has run.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .http_model import ModelFront, describe_inputs
from .http_openapi_inputs import has_priorities, number_schema
from .v2_tensors import DATATYPES, MAX_WHOLE, datatype_of

__all__ = ["v2_paths", "MAX_LISTED_BATCH"]

MAX_LISTED_BATCH = 16  # an infer request's batch sizes are listed one by one up to this

_ERROR = {"description": "{\"error\": reason}", "content": {"application/json": {"schema": {
    "type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}}}}


def _ok(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_OUTPUT = {"type": "object", "required": ["name", "datatype", "shape"], "properties": {
    "name": {"type": "string"}, "datatype": {"type": "string"},
    "shape": {"type": "array", "items": {"type": "integer"}}, "parameters": {"type": "object"},
    "data": {"type": "array"}}}
_RESPONSE = {"type": "object", "required": ["model_name", "outputs"], "properties": {
    "model_name": {"type": "string"}, "model_version": {"type": "string"}, "id": {"type": "string"},
    "outputs": {"type": "array", "items": _OUTPUT}}}
_METADATA = {"type": "object", "required": ["name", "versions", "platform", "inputs", "outputs"], "properties": {
    "name": {"type": "string"}, "versions": {"type": "array", "items": {"type": "string"}},
    "platform": {"type": "string"}, "inputs": {"type": "array", "items": _OUTPUT},
    "outputs": {"type": "array", "items": _OUTPUT}}}
_READY = {"type": "object", "required": ["ready"], "properties": {"ready": {"type": "boolean"},
                                                                   "name": {"type": "string"},
                                                                   "error": {"type": "string"}}}


def _tensor(name: str, dtype: np.dtype | None, shape: list[int | None] | None, batch: int | None) -> dict[str, Any]:
    """One input tensor of a request of `batch` rows (None: any, for a shape not fully declared)."""
    datatype = None if dtype is None else datatype_of(dtype)
    item = {"type": "boolean"} if datatype == "BOOL" else number_schema(dtype)
    if batch is not None and shape is not None and None not in shape:
        full = [batch, *shape]
        count = math.prod(full)
        flat = {"type": "array", "items": item, "minItems": count, "maxItems": count}
        nested: dict[str, Any] = item
        for size in reversed(full):
            nested = {"type": "array", "items": nested, "minItems": size, "maxItems": size}
        shape_schema: dict[str, Any] = {"const": full}
        data: dict[str, Any] = {"anyOf": ([flat, nested] if len(full) > 1 else [flat]) + ([item] if count == 1 else [])}
    else:  # the sizes are not all known: the element count must still match the shape
        shape_schema = {"type": "array", "items": {"type": "integer", "minimum": 0}}
        data = {"type": "array", "description": "row-major, as many elements as the shape holds"}
    return {"type": "object", "required": ["name", "datatype", "shape", "data"], "additionalProperties": False,
            "properties": {"name": {"const": name},
                           "datatype": {"enum": list(DATATYPES)} if datatype is None else {"const": datatype},
                           "shape": shape_schema, "data": data,
                           "parameters": {"type": "object", "additionalProperties": False, "properties": {}}}}


def infer_request(front: ModelFront) -> dict[str, Any]:
    """The JSON body of POST /v2/models/{name}/infer for `front`'s model."""
    service = front.service
    inputs = describe_inputs(service)
    declared = hasattr(service._spec, "names")
    dtypes = [None if i["dtype"] is None else np.dtype(i["dtype"]) for i in inputs]
    exact = declared and service.max_queue <= MAX_LISTED_BATCH and all(None not in i["shape"] for i in inputs)
    batches = range(1, service.max_queue + 1) if exact else [None]
    variants = [{"type": "array", "minItems": len(inputs), "maxItems": len(inputs),
                 "prefixItems": [_tensor(i["name"], d, i["shape"], batch) for i, d in zip(inputs, dtypes)]}
                for batch in batches]
    priorities = {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_WHOLE} if has_priorities(service) \
        else {"enum": [0, 2, None]}
    return {"type": "object", "required": ["inputs"], "additionalProperties": False, "properties": {
        "id": {"type": ["string", "null"], "description": "echoed in the answer"},
        "model_name": {"enum": [front.name, None]}, "model_version": {"enum": ["", "1", None]},
        "parameters": {"type": "object", "additionalProperties": False, "properties": {
            "binary_data_output": {"type": "boolean", "description": "answer the outputs as binary tensors"},
            "timeout": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_WHOLE,
                        "description": "the deadline in microseconds (0: the model's)"},
            "priority": {**priorities, "description": "Triton's: 1 highest; 0 and 2 normal"
                         + ("" if has_priorities(service) else " (this model's queue has no priorities)")}}},
        "inputs": variants[0] if len(variants) == 1 else {"anyOf": variants, "description":
                                                           "every input with the same batch size first"}}}


def v2_paths(fronts: dict[str, ModelFront]) -> dict[str, Any]:
    """The /v2 routes of the App's models as OpenAPI path items."""
    paths: dict[str, Any] = {
        "/v2": {"get": {"operationId": "v2_server", "summary": "Server metadata (Open Inference Protocol)",
                        "responses": {"200": _ok({"type": "object", "required": ["name", "version", "extensions"],
                                                  "properties": {"name": {"type": "string"},
                                                                 "version": {"type": "string"},
                                                                 "extensions": {"type": "array"}}})}}},
        "/v2/health/live": {"get": {"operationId": "v2_live", "summary": "Liveness",
                                    "responses": {"200": _ok({"type": "object", "required": ["live"]})}}},
        "/v2/health/ready": {"get": {"operationId": "v2_ready", "summary": "Readiness of every model",
                                     "responses": {"200": _ok(_READY), "503": _ok(_READY, "not ready")}}},
    }
    for name, front in fronts.items():
        body = {"required": True, "content": {"application/json": {"schema": infer_request(front)}}}
        for base in (f"/v2/models/{name}", f"/v2/models/{name}/versions/1"):
            op = base.replace("/", "_").strip("_")
            paths[base] = {"get": {"operationId": f"{op}_metadata", "summary": f"{name}: metadata", "tags": [name],
                                   "responses": {"200": _ok(_METADATA)}}}
            paths[f"{base}/ready"] = {"get": {"operationId": f"{op}_ready", "summary": f"{name}: readiness",
                                              "tags": [name],
                                              "responses": {"200": _ok(_READY), "503": _ok(_READY, "not ready")}}}
            paths[f"{base}/infer"] = {"post": {
                "operationId": f"{op}_infer", "tags": [name],
                "summary": f"{name}: infer (Open Inference Protocol)", "requestBody": body,
                "responses": {"200": {"description": "the outputs (binary_data_output: binary tensors after the "
                                                     "JSON, its length in Inference-Header-Content-Length)",
                                      "content": {"application/json": {"schema": _RESPONSE},
                                                  "application/octet-stream": {
                                                      "schema": {"type": "string", "format": "binary"}}}},
                              "400": _ERROR, "413": _ERROR, "500": _ERROR,
                              "503": {**_ERROR, "description": "the queue is full, the deadline passed, or the "
                                                               "server is stopping"}}}}
    return paths
