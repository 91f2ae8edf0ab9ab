"""The JSON Schemas of what a model takes over HTTP, for the OpenAPI document
(http_openapi.py): a number of each dtype with the range the server accepts, one row of a
declared Input as nested arrays of its sizes, and a job request's body (``inputs`` or
``path``, ``id``, ``timeout_s``, ``priority``) exactly as ModelFront.submit and the service
check it, so a schema-valid body is accepted and an invalid one answered 400.

    >>> number_schema(np.dtype("uint8"))      # {"type": "integer", "minimum": 0, "maximum": 255}
    >>> request_schema(front, has_input_root=False)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .http_model import ModelFront, describe_inputs

__all__ = ["number_schema", "row_schema", "request_schema", "ID_PATTERN", "has_priorities"]

# jobs.check_job_id's rule, anchored for JSON Schema (a pattern is searched, not matched);
# (?!\n) because "$" also matches before a final newline, which the server refuses
ID_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$(?!\n)"

# The smallest magnitude each float dtype rounds to infinity (its max plus half an ulp): the
# server refuses a number that overflows the model's dtype, and takes any below it
_FLOAT_LIMITS = {np.dtype("float16"): 65520.0, np.dtype("float32"): float(2 ** 128 - 2 ** 103)}


def number_schema(dtype: np.dtype | None) -> dict[str, Any]:
    """One JSON number of `dtype` as the server reads it from a list: an int dtype takes
    integers in its range (1.0 included, as JSON Schema's integer does), bool takes 0 or 1
    (JSON's true/false are refused: check_numbers), a float any finite number that does not
    overflow it (JSON has no NaN or infinity; the server refuses the NaN literal too)."""
    if dtype is None:
        return {"type": "number"}
    if dtype.kind == "b":
        return {"enum": [0, 1], "description": "bool: 0 or 1"}
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return {"type": "integer", "minimum": int(info.min), "maximum": int(info.max)}
    limit = _FLOAT_LIMITS.get(dtype)
    if limit is None:  # float64 (and wider): any finite JSON number
        return {"type": "number"}
    return {"type": "number", "exclusiveMinimum": -limit, "exclusiveMaximum": limit}


def _nested(item: dict[str, Any], shape: list[int | None]) -> dict[str, Any]:
    """Nested arrays of `item`, one level per axis, each of its size when it has one."""
    for size in reversed(shape):
        array: dict[str, Any] = {"type": "array", "items": item}
        if size is not None:
            array.update(minItems=size, maxItems=size)
        item = array
    return item


def row_schema(dtype: np.dtype | None, shape: list[int | None] | None, max_rows: int) -> dict[str, Any]:
    """One row of an input, or 1..max_rows rows along a leading axis (the service refuses a
    job of more rows than its queue holds). An undeclared shape: a number or nested arrays."""
    number = number_schema(dtype)
    if shape is None:
        return {"anyOf": [number, {"type": "array", "items": {}}],
                "description": "numbers of any shape (the model does not declare one)"}
    row = _nested(number, shape)
    rows = {"type": "array", "minItems": 1, "maxItems": max_rows, "items": row}
    return {"anyOf": [row, rows], "description": f"one row of shape {shape}, or up to {max_rows} rows"
                                                  " along a leading axis (null size: any, the same in every row)"}


MAX_LISTED_ROWS = 16  # the row counts of a model of several inputs are listed one by one up to this


def _row_counts(max_queue: int) -> list[int | None]:
    """None (one row each), then each number of rows a job may have (listed: every input must
    have the same; past MAX_LISTED_ROWS the schema cannot say so and lists "any")."""
    return [None, *range(1, max_queue + 1)] if max_queue <= MAX_LISTED_ROWS else [None, 0]


def _several(inputs: list[dict[str, Any]], rows: int | None, max_queue: int) -> list[dict[str, Any]]:
    """The object and the list forms of the inputs of a model of several, each with `rows`
    rows (None: one row without the leading axis; 0: any number up to max_queue)."""
    members = {}
    for item in inputs:
        row = _nested(number_schema(_dtype(item["dtype"])), item["shape"] or [])
        if rows is not None:
            row = {"type": "array", "items": row, "minItems": rows or 1, "maxItems": rows or max_queue}
        members[item["name"]] = row
    return [{"type": "object", "properties": members, "required": list(members), "additionalProperties": False},
            {"type": "array", "prefixItems": list(members.values()), "minItems": len(members),
             "maxItems": len(members)}]


def has_priorities(service: Any) -> bool:
    """Whether the service's queue has priorities (a SharedInferenceService: the queue in Redis)."""
    from .shared import SharedInferenceService

    return isinstance(service, SharedInferenceService)


def request_schema(front: ModelFront, has_input_root: bool) -> dict[str, Any]:
    """The JSON body of POST .../jobs and .../predict to `front`'s model."""
    service = front.service
    inputs = describe_inputs(service)
    if getattr(service._spec, "single", True):  # one input: "inputs" is its rows
        inputs_schema = row_schema(_dtype(inputs[0]["dtype"]), inputs[0]["shape"], service.max_queue)
    else:  # several: an object with a member per input (or a list in their order)
        inputs_schema = {"description": "a member per input: each one row, or each the same number of rows",
                         "anyOf": [variant for rows in _row_counts(service.max_queue)
                                   for variant in _several(inputs, rows, service.max_queue)]}
    levels = ["high", "normal", "low"] if has_priorities(service) else ["normal"]
    properties: dict[str, Any] = {
        "inputs": inputs_schema,
        "id": {"type": "string", "pattern": ID_PATTERN, "description": "the job's id: 1-128 letters, digits, "
               "'_', '-' or '.', not starting with '.' (a known id: nothing is queued, the known job answers)"},
        "timeout_s": {"type": "number", "exclusiveMinimum": 0,
                      "description": "the job's deadline, seconds from submit (finite)"},
        "priority": {"enum": levels, "description": "the job's place in the queue" if len(levels) > 1 else
                     "this model's queue has no priorities: only 'normal' (a Redis queue has high and low)"},
    }
    required: list[str] = ["inputs"]
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if has_input_root:
        properties["path"] = {"type": "string", "pattern": r"\.npy$(?!\n)", "maxLength": 1024,
                              "description": "a .npy file under the server's input root (an absent, "
                                             "unreadable or outside file: 400)"}
        schema["oneOf"] = [{"required": ["inputs"]}, {"required": ["path"]}]
    else:
        schema["required"] = required
    return schema


def _dtype(name: str | None) -> np.dtype | None:
    return None if name is None else np.dtype(name)
