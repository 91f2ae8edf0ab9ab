"""fastloop.serve.Client: the HTTP front's client, standard library only.

    >>> client = Client("http://127.0.0.1:8000", timeout=10)
    >>> y = client.predict(x)                                   # one request, one answer
    >>> y = client.result(client.submit(inputs=x), timeout=5.0)   # or a job, and its result later

HTTP errors become the exceptions InferenceService itself raises: 429 -> fastloop.QueueFull
(``.retry_after`` in seconds), 404 -> KeyError, 410 -> JobExpired, a failed job -> JobFailed
(JobCancelled; RowsFailed when some rows of several failed), 400/413 -> ValueError
(BadRequest), 503 or no connection -> ConnectionError (ServiceUnavailable), 504 (a predict
past its deadline) -> TimeoutError.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import numpy as np

from ..errors import Error, QueueFull
from .http_inputs import NPY_TYPE, npy_bytes, parse_npy
from .jobs import JobCancelled, JobExpired, JobFailed, RowsFailed
from .outputs import from_json, unpack

__all__ = ["Client", "BadRequest", "ServiceUnavailable"]


_LONG_POLL_S = 30.0  # the longest wait_s a result request asks for
_PREDICT_DEFAULT_S = 30.0  # App(predict_timeout_s=...)'s default: a predict's deadline when it names none


class BadRequest(Error, ValueError):
    """The server refused the request (400, 413, 405): ``status`` and the server's ``reason``.

    >>> client.submit(inputs=[1, 2])  # raises BadRequest: 400: inputs have shape (2,), ...
    """

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status, self.reason = status, reason


class ServiceUnavailable(Error, ConnectionError):
    """The server answered 503 (its store is down, or it is stopping) or could not be reached.

    >>> client.submit(inputs=x)  # raises ServiceUnavailable while Redis is down
    """


class Client:
    """Submits jobs to a fastloop serve front over HTTP and fetches their results.

    ``timeout``: seconds one HTTP request may take (result() has its own).

    >>> client = Client("http://127.0.0.1:8000")
    >>> client.status(client.submit(inputs=[0.0] * 784))
    'queued'
    """

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url, self.timeout = base_url.rstrip("/"), timeout

    def predict(self, inputs: Any = None, path: str | None = None, timeout: float | None = None,
                job_id: str | None = None, priority: str | None = None) -> Any:
        """Runs one input (or several rows along a leading axis) through the model in one
        request (POST /v1/predict) and returns its output, as result() would. ``timeout``:
        the job's deadline in seconds (default: the server's), after which it fails and this
        raises TimeoutError; the HTTP wait allows it. QueueFull, JobFailed, RowsFailed
        (some rows failed: ``.errors``, ``.result``), BadRequest, ServiceUnavailable."""
        path_, body = self._job_request("/v1/predict", inputs, path, job_id, priority, timeout)
        # the server answers by the job's deadline (its default: 30 s) and a margin
        wait = max(self.timeout, (_PREDICT_DEFAULT_S if timeout is None else timeout) + 5.0)
        status, answer, headers = self._exchange("POST", path_, body, ok=(200,), timeout=wait)
        if headers.get("x-failed-rows"):  # the reasons are in the job's status
            job = headers.get("x-job-id", "")
            _, record = self._request("GET", f"/v1/jobs/{job}", ok=(200,))
            errors = {i: e for i, e in enumerate(record.get("errors", ())) if e is not None}
            raise RowsFailed(job, errors, unpack(answer), record.get("rows"))
        return _output(answer)

    def _job_request(self, route: str, inputs: Any, path: str | None, job_id: str | None, priority: str | None,
                     timeout_s: float | None = None) -> tuple[str, Any]:
        """The path (with its query) and body of a POST /v1/jobs or /v1/predict."""
        if (inputs is None) == (path is None):
            raise ValueError("give exactly one of inputs or path")
        if isinstance(inputs, dict) and inputs and all(isinstance(v, np.ndarray) for v in inputs.values()):
            inputs = _row_of(inputs)  # several named inputs travel as one structured .npy row
        if isinstance(inputs, np.ndarray):
            params = {name: value for name, value in (("id", job_id), ("priority", priority),
                                                      ("timeout_s", timeout_s)) if value is not None}
            query = "?" + urllib.parse.urlencode(params) if params else ""
            return route + query, npy_bytes(inputs)
        body: dict[str, Any] = {"path": path} if path is not None else {"inputs": _as_lists(inputs)}
        for key, value in (("id", job_id), ("priority", priority), ("timeout_s", timeout_s)):
            if value is not None:
                body[key] = value
        return route, body

    def submit(self, inputs: Any = None, path: str | None = None, job_id: str | None = None,
               priority: str | None = None) -> str:
        """Queues one input or a .npy file under the server's input root; returns the job id.
        A NumPy array travels as a .npy body, with its dtype (which must be the model's, or
        integers); a nested list as JSON, converted to the model's dtype by the server. For
        a model of several inputs, a dict name -> value (arrays: one structured .npy row).
        QueueFull (``.retry_after``) when the queue is full. ``priority`` ("high", "normal",
        "low"; a server whose queue is in Redis) travels in the JSON body, or in the query of
        a .npy body."""
        path_, body = self._job_request("/v1/jobs", inputs, path, job_id, priority)
        return self._request("POST", path_, body)[1]["id"]

    def status(self, job_id: str) -> str:
        """"queued", "running", "done", "failed" or "expired"; KeyError for an unknown id."""
        status, body = self._request("GET", f"/v1/jobs/{job_id}", ok=(200, 410))
        return body["status"]

    def result(self, job_id: str, timeout: float | None = 30.0, poll_s: float = 0.01) -> Any:
        """Waits until the job finishes and returns its output row (a dict or tuple of arrays
        for a model that returns one): long polls (``?wait_s=``, each at most half the
        connection timeout), so the server answers when the job ends; a server that answers
        at once instead is polled (waits growing from poll_s to 0.5 s). TimeoutError after
        `timeout` s; JobFailed, JobCancelled, JobExpired, KeyError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = poll_s
        while True:
            left = _LONG_POLL_S if deadline is None else max(0.0, deadline - time.monotonic())
            wait_s = min(left, self.timeout / 2, _LONG_POLL_S)
            asked = time.monotonic()
            status, body, headers = self._exchange("GET", f"/v1/jobs/{job_id}/result?wait_s={wait_s:.3f}",
                                                   ok=(200, 202))
            if status == 200 and headers.get("x-failed-rows"):
                _, record = self._request("GET", f"/v1/jobs/{job_id}", ok=(200,))
                errors = {i: e for i, e in enumerate(record.get("errors", ())) if e is not None}
                raise RowsFailed(job_id, errors, unpack(body), record.get("rows"))
            if status == 200:
                return _output(body)
            if deadline is not None and time.monotonic() + (0 if wait_s else wait) >= deadline:
                raise TimeoutError(f"job {job_id!r} did not finish within {timeout} s (status: {body['status']})")
            if time.monotonic() - asked < wait_s / 2:  # the server did not hold the request
                time.sleep(wait)
                wait = min(wait * 1.5, 0.5)

    def cancel(self, job_id: str) -> bool:
        """Takes a queued job off the queue; False when it is already running or finished."""
        return bool(self._request("DELETE", f"/v1/jobs/{job_id}", ok=(200, 409))[1]["cancelled"])

    def healthz(self) -> bool:
        """True when the server answers /healthz with 200."""
        try:
            return self._request("GET", "/healthz")[0] == 200
        except ConnectionError:
            return False

    def _request(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 202)) -> tuple[int, Any]:
        """(status, answer): a .npy answer as an array, a JSON one as it reads. `body`: bytes
        (sent as .npy), or anything JSON takes."""
        status, answer, _ = self._exchange(method, path, body, ok)
        return status, answer

    def _exchange(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 202),
                  timeout: float | None = None) -> tuple[int, Any, Any]:
        """_request(), with the answer's headers."""
        headers = {"accept": f"{NPY_TYPE}, application/json"}
        if isinstance(body, bytes):
            data, headers["content-type"] = body, NPY_TYPE
        elif body is not None:
            data, headers["content-type"] = json.dumps(body).encode(), "application/json"
        else:
            data = None
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        try:
            try:
                with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                    status, raw, headers = response.status, response.read(), response.headers
            except urllib.error.HTTPError as error:
                status, raw, headers = error.code, error.read(), error.headers
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise ServiceUnavailable(f"{method} {self.base_url}{path}: {reason}") from None
        except http.client.HTTPException as error:  # e.g. IncompleteRead: the server died mid-answer
            raise ServiceUnavailable(f"{method} {self.base_url}{path}: the connection broke off the answer "
                                     f"({type(error).__name__}: {error})") from None
        try:
            if status == 200 and headers.get("content-type", "").startswith(NPY_TYPE):
                return status, parse_npy(raw), headers
            answer = json.loads(raw) if raw else {}
        except ValueError:
            answer = {"error": raw[:200].decode(errors="replace")}
        if status in ok:
            return status, answer, headers
        raise _error(status, answer, headers, path)


def _output(answer: Any) -> Any:
    """A 200 result answer as the model's output: a .npy body unpacked, a JSON one read."""
    return unpack(answer) if isinstance(answer, np.ndarray) else from_json(answer)


def _row_of(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """Named arrays as one structured row, a field per name (each keeps its dtype)."""
    row = np.zeros((), dtype=[(str(k), v.dtype, v.shape) for k, v in arrays.items()])
    for key, value in arrays.items():
        row[str(key)] = value
    return row


def _as_lists(inputs: Any) -> Any:
    """Inputs as JSON takes them: nested lists, or an object of them per named input."""
    if isinstance(inputs, dict):
        return {str(k): np.asarray(v).tolist() for k, v in inputs.items()}
    if isinstance(inputs, tuple):  # several inputs in the model's order
        return [np.asarray(v).tolist() for v in inputs]
    return np.asarray(inputs).tolist()


def _error(status: int, body: dict[str, Any], headers: Any, path: str) -> Exception:
    reason = body.get("error") or f"HTTP {status}"
    job_id = body.get("id", path.split("/")[3] if path.count("/") >= 3 else "")
    if status == 429:
        error = QueueFull(reason)
        try:
            error.retry_after = float(headers.get("retry-after", "1"))  # type: ignore[attr-defined]
        except ValueError:
            error.retry_after = 1.0  # type: ignore[attr-defined]
        return error
    if status == 404:
        return KeyError(reason)
    if status == 410:
        return JobExpired(job_id, reason)
    if status == 422:
        return (JobCancelled if body.get("cancelled") else JobFailed)(job_id, reason)
    if status == 503:
        return ServiceUnavailable(reason)
    if status == 504:
        return TimeoutError(reason)
    return BadRequest(status, reason)
