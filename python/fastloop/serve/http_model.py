"""One model behind the HTTP front (App, http.py): its service and what the front runs for it
in its thread pool, never on the event loop: reading a request's input (JSON, .npy, a path, or
the model's own ``preprocess``), submitting, and the answers about its jobs (status, result,
cancel), with the model's ``postprocess`` applied to a JSON result. Also ``Reply``, the HTTP
answer a handler raises, and the answer to a submit's error.

    >>> front = ModelFront("mnist", service, input_root=None, max_body_bytes=4 << 20, retry_after_s=1)
    >>> job_id, watched = front.submit(body, admission, on_end=None, timeout_s=None)
    >>> status, body, headers = front.result(job_id, as_npy=False)
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import QueueFull
from .http_inputs import BadInput, TooLarge, load_npy_under, npy_bytes, parse_body, parse_npy
from .jobs import DEADLINE_EXCEEDED, DONE, EXPIRED, FAILED, QUEUED, RUNNING, JobRecord, check_job_id
from .outputs import as_json, unpack
from .rows import row_errors_of
from .service import Admission, InferenceService
from .shared import SharedInferenceService
from .stores import MemoryStore

__all__ = ["ModelFront", "Reply", "submit_reply", "describe_inputs", "INLINE_MAX_BYTES"]

Answer = tuple[int, Any, list[tuple[str, str]]]  # status, JSON body (or .npy bytes), extra headers
OnEnd = Callable[[JobRecord, Any], None]
INLINE_MAX_BYTES = 64 << 10  # a smaller body is parsed (C, the GIL held) and submitted on the loop


class Reply(Exception):
    """An HTTP answer raised from deep inside a handler: status, JSON body, extra headers."""

    def __init__(self, status: int, body: dict[str, Any], headers: list[tuple[str, str]] | None = None,
                 rejection: str | None = None) -> None:
        super().__init__(status)
        self.status, self.body, self.headers, self.rejection = status, body, headers or [], rejection


def submit_reply(error: Exception, retry_after_s: float) -> Exception:
    """The HTTP answer to an error from submit: 429, 413 or 400; anything else as it is
    (store trouble becomes a 503 in App._call)."""
    if isinstance(error, QueueFull):
        return Reply(429, {"error": str(error)}, [("retry-after", str(retry_after_s))], rejection="queue_full")
    if isinstance(error, (TooLarge, MemoryError)):  # MemoryError: an input no check above caught
        return Reply(413, {"error": str(error) or "the input is too large to hold in memory"}, rejection="too_large")
    if isinstance(error, (BadInput, TypeError, ValueError, OverflowError)):
        return Reply(400, {"error": str(error)}, rejection="bad_input")
    return error


def row_errors(record: JobRecord) -> list[str | None]:
    """A job of several rows' errors, one entry per row (null for a row that ran)."""
    errors = row_errors_of(record)
    return [errors.get(i) for i in range(record.rows or 0)]


def describe_inputs(service: InferenceService) -> list[dict[str, Any]]:
    """What one row of the model takes: [{"name", "dtype", "shape"}] (a null size: any; a
    null dtype or shape: not declared)."""
    spec = service._spec
    if hasattr(spec, "names"):  # declared Inputs
        return [{"name": name, "dtype": i.dtype.name, "shape": list(i.shape)} for name, i in zip(spec.names, spec.inputs)]
    dtype = None if spec.dtype is None else np.dtype(spec.dtype).name
    shape = None if spec.features is None else [spec.features]
    return [{"name": "input", "dtype": dtype, "shape": shape}]


class ModelFront:
    """The handlers of one model (`name`, `service`) that App calls in its thread pool."""

    def __init__(self, name: str, service: InferenceService, input_root: str | None, max_body_bytes: int,
                 retry_after_s: float) -> None:
        self.name, self.service = name, service
        self.input_root, self.max_body_bytes, self.retry_after_s = input_root, max_body_bytes, retry_after_s
        # The memory store (not a subclass: it may block) never waits on a disk or a network,
        # so a submit of a parsed input may run on the event loop; a durable store's may not.
        self.submits_on_loop = type(service.store) is MemoryStore

    def inline(self, body: bytes) -> bool:
        """Whether a request with this (JSON or v2) body is read and submitted on the event
        loop: a body under INLINE_MAX_BYTES parses in tens of us, the memory store never
        blocks, and a trip through the pool (a thread switch there and back) costs more than
        that. A larger body, or a store that may block, goes through the pool; so does a
        request that reads a file (a "path" input: the caller looks once it has parsed)."""
        return self.submits_on_loop and len(body) < INLINE_MAX_BYTES

    @property
    def hooked(self) -> bool:
        """Whether the model reads its own bodies (preprocess) or shapes its answers (postprocess)."""
        return self.service.preprocess is not None or self.service.postprocess is not None

    def looks_full(self) -> bool:
        """Whether admit() would find the queue full: a look without its lock that counts no
        rejection, so the front searches a body for an "id" only when it may need to."""
        service = self.service
        if isinstance(service, SharedInferenceService):
            return sum(service._depth.values()) >= service.max_queue
        return service._queued + service._admitted >= service.max_queue

    def describe(self) -> dict[str, Any]:
        """The model as GET /v1/models lists it."""
        service = self.service
        return {"name": self.name, "inputs": describe_inputs(service), "max_batch": service.max_batch,
                "max_queue": service.max_queue, "workers": service.num_workers,
                "preprocess": service.preprocess is not None, "postprocess": service.postprocess is not None}

    # ------------------------------------------------------------ submitting
    def submit(self, body: bytes, admission: Admission | None = None, on_end: OnEnd | None = None,
               timeout_s: float | None = None, query: dict[str, Any] | None = None) -> tuple[str, bool]:
        """A JSON body's job: its id, and whether `on_end` will be called (service.watch).
        ``query``: the options the request's query gives (id, timeout_s, priority); one the
        body gives too is refused (400), not silently chosen between."""
        return self.submit_parsed(self.parse(body, query), admission, on_end, timeout_s)

    def parse(self, body: bytes, query: dict[str, Any] | None = None) -> dict[str, Any]:
        """A JSON body read, with the query's options added (400 for one given in both):
        reads no file and touches no store (submit_parsed does), so a small body may be
        parsed on the event loop."""
        try:
            data = parse_body(body, self.service._spec.dtype)
            for name, value in (query or {}).items():
                if name in data:
                    raise BadInput(f"{name!r} is given both in the body and in the query (?{name}=): give it once")
                data[name] = value
        except Exception as error:
            raise submit_reply(error, self.retry_after_s) from None
        return data

    def submit_parsed(self, data: dict[str, Any], admission: Admission | None = None, on_end: OnEnd | None = None,
                      timeout_s: float | None = None) -> tuple[str, bool]:
        """parse()'s job submitted. A "path" input reads its file here: call it in the pool
        then, and whenever the store may block (submits_on_loop False)."""
        try:
            if "path" in data:
                inputs: Any = self.as_model_ints(load_npy_under(self.input_root, data["path"], self.max_body_bytes))
            else:
                inputs = data["inputs"]
            job_id = self.service.submit(inputs, job_id=data.get("id"), timeout=data.get("timeout_s", timeout_s),
                                         priority=data.get("priority", "normal"), admission=admission)
        except Exception as error:
            raise submit_reply(error, self.retry_after_s) from None
        return job_id, on_end is not None and self.service.watch(job_id, on_end)

    def submit_raw(self, body: bytes, job_id: str | None, timeout_s: float | None, priority: str,
                   admission: Admission | None = None, on_end: OnEnd | None = None) -> tuple[str, bool]:
        """A .npy body's job, or any body the model's preprocess(body) reads (its options in
        the query): its id, and whether `on_end` will be called."""
        try:
            if self.service.preprocess is not None:
                inputs = self.service.preprocess(body)
            else:
                inputs = self.as_model_ints(parse_npy(body))
            job_id = self.service.submit(inputs, job_id=job_id, timeout=timeout_s, priority=priority,
                                         admission=admission)
        except Exception as error:
            raise submit_reply(error, self.retry_after_s) from None
        return job_id, on_end is not None and self.service.watch(job_id, on_end)

    def as_model_ints(self, inputs: np.ndarray) -> np.ndarray:
        """Integer arrays (uint8 pixels) convert to the model's dtype, as a JSON list would;
        any other dtype must be the model's (submit says so otherwise)."""
        want = self.service._spec.dtype
        return inputs.astype(want) if want is not None and inputs.dtype.kind in "biu" else inputs

    # ------------------------------------------------------------ the answers about a job
    def record(self, job_id: str) -> JobRecord:
        try:
            return self.service.record(check_job_id(job_id))
        except (KeyError, TypeError, ValueError):
            raise Reply(404, {"id": job_id, "error": f"unknown job {job_id!r}"}) from None

    def status(self, job_id: str) -> Answer:
        record = self.record(job_id)
        body = {"id": record.id, "status": record.status, "submitted": record.submitted,
                "started": record.started, "finished": record.finished}
        if record.rows is not None:
            body["rows"] = record.rows
        if record.status == FAILED:
            body.update(error=record.error, cancelled=record.cancelled)
        if record.row_errors:
            body["errors"] = row_errors(record)
        gone = record.status == EXPIRED or record.cancelled  # a DELETE took it: 410 from then on
        return (410 if gone else 200), body, []

    def result(self, job_id: str, as_npy: bool = False, predict: bool = False) -> Answer:
        """The answer to GET .../result: one store read (record and result together)."""
        try:
            record, row = self.service._outcome(check_job_id(job_id))
        except (KeyError, TypeError, ValueError):
            raise Reply(404, {"id": job_id, "error": f"unknown job {job_id!r}"}) from None
        return self.outcome_reply(job_id, record, row, as_npy, predict)

    def outcome_reply(self, job_id: str, record: JobRecord, row: Any, as_npy: bool, predict: bool = False) -> Answer:
        """The answer for a job's state: 202 while it runs; 200 with the result (JSON, shaped
        by the model's postprocess if it has one, or .npy); 422 failed (a predict whose job
        missed its deadline: 504); 410 expired. Runs postprocess: call it in the pool."""
        if record.status in (QUEUED, RUNNING):
            return 202, {"id": job_id, "status": record.status}, [("retry-after", "1")]
        if record.status == FAILED:
            reason = record.error or ("cancelled" if record.cancelled else "unknown error")
            body = {"id": job_id, "status": FAILED, "error": reason, "cancelled": record.cancelled}
            if record.row_errors:
                body["errors"] = row_errors(record)
            late = predict and reason.startswith(DEADLINE_EXCEEDED)
            return (504 if late else 422), body, []
        if row is None:  # expired, or done and its result dropped since
            return 410, {"id": job_id, "status": EXPIRED, "error": f"job {job_id!r} expired: its result was kept "
                                                                   f"{self.service.result_ttl_s:g} s"}, []
        failed = sorted(row_errors_of(record))
        if as_npy:  # failed rows are zero-filled; which they are rides in a header, the reasons in the status
            extra = [("x-failed-rows", ",".join(map(str, failed)))] if failed else []
            return 200, npy_bytes(row), [("x-job-id", job_id)] + extra
        if self.service.postprocess is not None:
            try:
                shaped = self.service.postprocess(unpack(row))
            except Exception as error:  # the model's own code: its failure is the answer
                return 500, {"id": job_id, "status": DONE, "error": f"postprocess failed: "
                                                                    f"{type(error).__name__}: {error}"}, []
            body = {"id": job_id, "status": DONE, "result": shaped}
        else:
            body = {"id": job_id, "status": DONE, **as_json(row, failed)}
        if failed:
            body["errors"] = row_errors(record)
        return 200, body, []

    def cancel(self, job_id: str) -> Answer:
        self.record(job_id)  # 404 for an unknown id
        try:
            cancelled = self.service.cancel(job_id)
        except KeyError:
            raise Reply(404, {"id": job_id, "error": f"unknown job {job_id!r}"}) from None
        status = self.service.status(job_id)
        if not cancelled:  # running or ended: nothing was deleted, so the DELETE did not happen
            return 409, {"id": job_id, "cancelled": False, "status": status,
                         "error": f"job {job_id!r} is {status}: only a queued job can be cancelled"}, []
        return 200, {"id": job_id, "cancelled": True, "status": status}, []
