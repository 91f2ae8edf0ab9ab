"""The Prometheus text exposition (format 0.0.4) of an InferenceService's stats() and the
HTTP front's own counters, for GET /metrics.

    >>> print(render(svc.stats(), {"responses": {"202": 3}, "rejections": {}}, max_batch=32))
    # HELP fastloop_serve_queue_depth Jobs waiting in the queue.
    ...
"""

from __future__ import annotations

from typing import Any

__all__ = ["CONTENT_TYPE", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_OUTCOMES = ("submitted", "done", "failed", "cancelled", "rejected", "expired", "requeued_at_start",
             "failed_at_start")


def _num(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    escaped = (f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
               for k, v in labels.items())
    return "{" + ",".join(escaped) + "}"


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, value: float, **labels: str) -> None:
        self.lines.append(f"{name}{_labels(labels)} {_num(value)}")


def _buckets(max_batch: int) -> list[int]:
    edges, edge = [], 1
    while edge < max_batch:
        edges.append(edge)
        edge *= 2
    return edges + [max_batch]


def render(stats: dict[str, Any], http: dict[str, Any], max_batch: int) -> str:
    """The exposition text: service gauges and counters, the batch-size histogram, the
    latency summary (quantiles over the service's window of recent jobs), and the HTTP
    front's responses by status code, rejections by reason and WebSocket figures."""
    out = _Out()
    for name, key, help_text in (("queue_depth", "queue_depth", "Jobs waiting in the queue."),
                                 ("running", "running", "Jobs inside a model call now."),
                                 ("workers", "workers", "Worker threads alive.")):
        out.family(f"fastloop_serve_{name}", "gauge", help_text)
        out.sample(f"fastloop_serve_{name}", stats[key])
    out.family("fastloop_serve_jobs_total", "counter", "Jobs by outcome since the service started.")
    for outcome in _OUTCOMES:
        out.sample("fastloop_serve_jobs_total", stats.get(outcome, 0), outcome=outcome)
    out.family("fastloop_serve_errors_total", "counter", "Store errors and listener errors.")
    out.sample("fastloop_serve_errors_total", stats.get("store_errors", 0), kind="store")
    out.sample("fastloop_serve_errors_total", stats.get("listener_errors", 0), kind="listener")

    sizes: dict[int, int] = stats.get("batch_sizes", {})
    out.family("fastloop_serve_batch_size", "histogram", "Jobs per model call.")
    for edge in _buckets(max(max_batch, max(sizes, default=1))):
        out.sample("fastloop_serve_batch_size_bucket", sum(n for s, n in sizes.items() if s <= edge), le=str(edge))
    out.sample("fastloop_serve_batch_size_bucket", sum(sizes.values()), le="+Inf")
    out.sample("fastloop_serve_batch_size_sum", sum(s * n for s, n in sizes.items()))
    out.sample("fastloop_serve_batch_size_count", sum(sizes.values()))

    latency = stats.get("latency_ms", {})
    out.family("fastloop_serve_latency_seconds", "summary",
               "Submit-to-done latency; quantiles over the last 10^4 done jobs.")
    for quantile, key in (("0.5", "p50"), ("0.9", "p90"), ("0.99", "p99")):
        out.sample("fastloop_serve_latency_seconds", latency.get(key, 0.0) / 1e3, quantile=quantile)
    out.sample("fastloop_serve_latency_seconds_count", stats.get("done", 0))
    out.family("fastloop_serve_latency_max_seconds", "gauge", "The longest latency in the window.")
    out.sample("fastloop_serve_latency_max_seconds", latency.get("max", 0.0) / 1e3)

    out.family("fastloop_http_responses_total", "counter", "HTTP responses by status code.")
    for code, n in sorted(http.get("responses", {}).items()):
        out.sample("fastloop_http_responses_total", n, code=str(code))
    out.family("fastloop_http_rejections_total", "counter",
               "Submissions refused: queue_full (429), too_large (413), bad_input (400), unavailable (503).")
    for reason in ("queue_full", "too_large", "bad_input", "unavailable"):
        out.sample("fastloop_http_rejections_total", http.get("rejections", {}).get(reason, 0), reason=reason)
    out.family("fastloop_ws_connections", "gauge", "Open WebSocket event streams.")
    out.sample("fastloop_ws_connections", http.get("ws_open", 0))
    out.family("fastloop_ws_dropped_total", "counter", "WebSocket clients dropped for falling behind.")
    out.sample("fastloop_ws_dropped_total", http.get("ws_dropped", 0))
    return "\n".join(out.lines) + "\n"
