"""GET /metrics: an InferenceService's stats() and the HTTP front's own counters as
Prometheus metrics, rendered by prometheus_client (its text format escapes label values,
newlines included). Each App has its own registry, so several services in one process do
not collide, and nothing is added to prometheus_client's global one.

    >>> registry = service_registry(service.stats, front_counts, max_batch=32)
    >>> text = prometheus_client.generate_latest(registry)
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Metric, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from .shared_metrics import shared_families

__all__ = ["CONTENT_TYPE", "service_registry", "render"]

# generate_latest writes the 0.0.4 text format (every name here is a classic one), which
# every Prometheus version reads; newer clients label it 1.0.0, older scrapers know 0.0.4
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_OUTCOMES = ("submitted", "done", "failed", "cancelled", "rejected", "expired", "requeued_at_start",
             "failed_at_start", "deadline_exceeded", "in_doubt_removed")
_REJECTIONS = ("queue_full", "too_large", "bad_input", "unavailable")


def _buckets(max_batch: int) -> list[int]:
    edges, edge = [], 1
    while edge < max_batch:
        edges.append(edge)
        edge *= 2
    return edges + [max_batch]


class _Collector:
    """Reads the service's and the front's counters at each scrape."""

    def __init__(self, stats: Callable[[], dict[str, Any]], http: Callable[[], dict[str, Any]], max_batch: int) -> None:
        self.stats, self.http, self.max_batch = stats, http, max_batch

    def collect(self) -> Iterator[Metric]:
        stats, http = self.stats(), self.http()
        for name, key, help_text in (("queue_depth", "queue_depth", "Jobs waiting in the queue."),
                                     ("running", "running", "Jobs inside a model call now."),
                                     ("workers", "workers", "Worker threads serving (stuck ones not counted)."),
                                     ("stuck_workers", "stuck_workers",
                                      "Workers replaced while stuck in a model call past a job's deadline.")):
            yield GaugeMetricFamily(f"fastloop_serve_{name}", help_text, value=stats.get(key, 0))
        jobs = CounterMetricFamily("fastloop_serve_jobs", "Jobs by outcome since the service started.",
                                   labels=["outcome"])
        for outcome in _OUTCOMES:
            jobs.add_metric([outcome], stats.get(outcome, 0))
        yield jobs
        errors = CounterMetricFamily("fastloop_serve_errors", "Store errors and listener errors.", labels=["kind"])
        errors.add_metric(["store"], stats.get("store_errors", 0))
        errors.add_metric(["listener"], stats.get("listener_errors", 0))
        yield errors

        sizes: dict[int, int] = stats.get("batch_sizes", {})
        edges = _buckets(max(self.max_batch, max(sizes, default=1)))
        buckets = [(str(edge), sum(n for s, n in sizes.items() if s <= edge)) for edge in edges]
        buckets.append(("+Inf", sum(sizes.values())))
        yield HistogramMetricFamily("fastloop_serve_batch_size", "Jobs per model call.", buckets=buckets,
                                    sum_value=sum(s * n for s, n in sizes.items()))

        latency = stats.get("latency_ms", {})
        summary = Metric("fastloop_serve_latency_seconds",
                         "Submit-to-done latency; quantiles over the last 10^4 done jobs.", "summary")
        for quantile, key in (("0.5", "p50"), ("0.9", "p90"), ("0.99", "p99")):
            summary.add_sample("fastloop_serve_latency_seconds", {"quantile": quantile}, latency.get(key, 0.0) / 1e3)
        summary.add_sample("fastloop_serve_latency_seconds_count", {}, stats.get("done", 0))
        yield summary
        yield GaugeMetricFamily("fastloop_serve_latency_max_seconds", "The longest latency in the window.",
                                value=latency.get("max", 0.0) / 1e3)

        responses = CounterMetricFamily("fastloop_http_responses", "HTTP responses by status code.", labels=["code"])
        for code, n in sorted(http.get("responses", {}).items()):
            responses.add_metric([str(code)], n)
        yield responses
        rejections = CounterMetricFamily(
            "fastloop_http_rejections",
            "Submissions refused: queue_full (429), too_large (413), bad_input (400), unavailable (503).",
            labels=["reason"])
        for reason in _REJECTIONS:
            rejections.add_metric([reason], http.get("rejections", {}).get(reason, 0))
        yield rejections
        yield GaugeMetricFamily("fastloop_ws_connections", "Open WebSocket event streams.", value=http.get("ws_open", 0))
        yield CounterMetricFamily("fastloop_ws_dropped", "WebSocket clients dropped for falling behind.",
                                  value=http.get("ws_dropped", 0))
        yield from shared_families(stats)  # the queue in Redis: depth and waits per priority, reclaims


def service_registry(stats: Callable[[], dict[str, Any]], http: Callable[[], dict[str, Any]],
                     max_batch: int) -> CollectorRegistry:
    """A registry whose one collector reads `stats()` and `http()` at each scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(stats, http, max_batch))
    return registry


def render(registry: CollectorRegistry) -> str:
    """The text exposition of `registry` (format 0.0.4)."""
    return generate_latest(registry).decode()
