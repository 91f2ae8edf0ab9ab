"""GET /metrics: an InferenceService's stats() and the HTTP front's own counters as
Prometheus metrics, rendered by prometheus_client (its text format escapes label values,
newlines included). Each App has its own registry, so several services in one process do
not collide, and nothing is added to prometheus_client's global one. An App of several
models labels each service's metrics with ``model``; one of one model adds no label.

    >>> registry = service_registry(service.stats, front_counts, max_batch=32)
    >>> registry = models_registry({"mnist": a, "resnet": b}, front_counts)
    >>> text = prometheus_client.generate_latest(registry)
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Metric, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from .shared_metrics import shared_families

__all__ = ["CONTENT_TYPE", "service_registry", "models_registry", "render"]

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
    """Reads the services' and the front's counters at each scrape. `sources`: (model name or
    None, stats(), max_batch) per service; with a name, each sample is labelled model=name."""

    def __init__(self, sources: list[tuple[str | None, Callable[[], dict[str, Any]], int]],
                 http: Callable[[], dict[str, Any]]) -> None:
        self.sources, self.http = sources, http

    def collect(self) -> Iterator[Metric]:
        http = self.http()
        named = self.sources[0][0] is not None
        extra = ["model"] if named else []
        snaps = [([] if name is None else [name], stats(), max_batch) for name, stats, max_batch in self.sources]
        for name, key, help_text in (("queue_depth", "queue_depth", "Jobs waiting in the queue."),
                                     ("running", "running", "Jobs inside a model call now."),
                                     ("workers", "workers", "Worker threads serving (stuck ones not counted)."),
                                     ("stuck_workers", "stuck_workers",
                                      "Workers replaced while stuck in a model call past a job's deadline.")):
            gauge = GaugeMetricFamily(f"fastloop_serve_{name}", help_text, labels=extra)
            for label, stats, _ in snaps:
                gauge.add_metric(label, stats.get(key, 0))
            yield gauge
        jobs = CounterMetricFamily("fastloop_serve_jobs", "Jobs by outcome since the service started.",
                                   labels=extra + ["outcome"])
        errors = CounterMetricFamily("fastloop_serve_errors", "Store errors and listener errors.",
                                     labels=extra + ["kind"])
        for label, stats, _ in snaps:
            for outcome in _OUTCOMES:
                jobs.add_metric(label + [outcome], stats.get(outcome, 0))
            errors.add_metric(label + ["store"], stats.get("store_errors", 0))
            errors.add_metric(label + ["listener"], stats.get("listener_errors", 0))
        yield jobs
        yield errors

        histogram = HistogramMetricFamily("fastloop_serve_batch_size", "Jobs per model call.", labels=extra)
        summary = Metric("fastloop_serve_latency_seconds",
                         "Submit-to-done latency; quantiles over the last 10^4 done jobs.", "summary")
        longest = GaugeMetricFamily("fastloop_serve_latency_max_seconds", "The longest latency in the window.",
                                    labels=extra)
        for label, stats, max_batch in snaps:
            sizes: dict[int, int] = stats.get("batch_sizes", {})
            edges = _buckets(max(max_batch, max(sizes, default=1)))
            buckets = [(str(edge), sum(n for s, n in sizes.items() if s <= edge)) for edge in edges]
            buckets.append(("+Inf", sum(sizes.values())))
            histogram.add_metric(label, buckets, sum_value=sum(s * n for s, n in sizes.items()))
            latency = stats.get("latency_s", {})
            labels = dict(zip(extra, label))
            for quantile, key in (("0.5", "p50"), ("0.9", "p90"), ("0.99", "p99")):
                summary.add_sample("fastloop_serve_latency_seconds", {**labels, "quantile": quantile},
                                   latency.get(key, 0.0))
            summary.add_sample("fastloop_serve_latency_seconds_count", labels, stats.get("done", 0))
            longest.add_metric(label, latency.get("max", 0.0))
        yield histogram
        yield summary
        yield longest

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
        yield CounterMetricFamily("fastloop_ws_refused", "WebSocket clients refused (1013): max_websockets were open.",
                                  value=http.get("ws_refused", 0))
        # the queue in Redis: depth and waits per priority, reclaims
        yield from shared_families([(dict(zip(extra, label)), stats) for label, stats, _ in snaps])


def service_registry(stats: Callable[[], dict[str, Any]], http: Callable[[], dict[str, Any]],
                     max_batch: int) -> CollectorRegistry:
    """A registry whose one collector reads `stats()` and `http()` at each scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector([(None, stats, max_batch)], http))
    return registry


def models_registry(services: dict[str, Any], http: Callable[[], dict[str, Any]]) -> CollectorRegistry:
    """A registry of one App's services by model name (labelled when there are several)."""
    named = len(services) > 1
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector([(name if named else None, service.stats, service.max_batch)
                                  for name, service in services.items()], http))
    return registry


def render(registry: CollectorRegistry) -> str:
    """The text exposition of `registry` (format 0.0.4)."""
    return generate_latest(registry).decode()
