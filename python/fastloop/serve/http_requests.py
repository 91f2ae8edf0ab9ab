"""What the HTTP front reads from a request besides its body: headers, the query string (a
submit's id, timeout_s and priority; a long poll's wait_s; flags), and the paths the routes
see under a mount. Pure functions of the ASGI scope, so each is tested without a server.
"""

from __future__ import annotations

import asyncio
import math
import urllib.parse
from typing import Any, Awaitable, Callable

from .http_model import Reply

__all__ = ["Scope", "Receive", "Send", "Answer", "SUBMIT_QUERY"]


Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Answer = tuple[int, Any, list[tuple[str, str]]]

MAX_WAIT_S = 60.0  # the longest long poll (GET .../result?wait_s=)


def _header(scope: Scope, name: bytes) -> str:
    """The first value of a request header (names are lower case in ASGI); "" if absent."""
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return ""


def _query(scope: Scope, name: str) -> str | None:
    """A query parameter (a result's ``wait_s``), or None."""
    values = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1")).get(name)
    return values[0] if values else None


SUBMIT_QUERY = ("id", "timeout_s", "priority")  # what POST .../jobs and .../predict take in the query


def _bad_query(message: str) -> Reply:
    return Reply(400, {"error": message}, rejection="bad_input")


def _submit_query(scope: Scope) -> dict[str, Any]:
    """The job options a POST .../jobs or .../predict gives in its query, whatever its body:
    ``id``, ``timeout_s`` (a float here) and ``priority``; 400 naming a parameter that is
    unknown, given twice, or (timeout_s) not a finite number of seconds. Never ignored."""
    text = scope.get("query_string", b"")
    if not text:
        return {}
    options: dict[str, Any] = {}
    for name, value in urllib.parse.parse_qsl(text.decode("latin-1"), keep_blank_values=True):
        if name not in SUBMIT_QUERY:
            raise _bad_query(f"unknown query parameter {name!r:.60}: a job takes ?id=, ?timeout_s= and ?priority=")
        if name in options:
            raise _bad_query(f"query parameter {name!r} is given more than once")
        options[name] = value
    if "timeout_s" in options:
        text = options["timeout_s"]
        try:
            options["timeout_s"] = float(text)
        except ValueError:
            options["timeout_s"] = math.nan
        if not math.isfinite(options["timeout_s"]):
            raise _bad_query(f"query parameter 'timeout_s' must be a finite number of seconds, not {text!r:.40}")
    return options


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
        raise Reply(400, {"error": f"wait_s must be a number of seconds from 0 to {MAX_WAIT_S:g}, not {text!r}"},
                    rejection="bad_input")
    return wait


def _query_flag(scope: Scope, name: str) -> bool:
    """A yes/no query parameter (``?result=1``, ``true`` or ``yes``)."""
    values = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1")).get(name)
    return bool(values) and values[0].lower() in ("1", "true", "yes")


def _settle(future: "asyncio.Future[Any]", value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _timed_out(job_id: str, wait_s: float) -> Answer:
    return 504, {"id": job_id, "error": f"no result within {wait_s:g} s: the job is still running or queued "
                                        f"(GET .../jobs/{job_id}/result answers it later)"}, []


def _route_path(scope: Scope) -> str:
    """The path the routes see: without the prefix a mount (or a proxy's root_path) added,
    as Starlette's router takes it."""
    path, root = scope["path"], scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root):len(root) + 1] == "/":
        return path[len(root):]
    return path


def _jobs_path(scope: Scope) -> str:
    """/v1/jobs, or /v1/models/{model}/jobs: where a submitted job's Location points."""
    model = scope.get("path_params", {}).get("model")
    return "/v1/jobs" if model is None else f"/v1/models/{model}/jobs"
