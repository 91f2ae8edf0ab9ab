"""The /metrics families of the queue in Redis (a SharedInferenceService's stats()): queue
depth per priority across all processes, queue waits per priority of the jobs this process
started, and the entries this process reclaimed from stopped workers. None for the
in-memory queue. serve/metrics.py's collector yields them beside the service's own.
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import Metric
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["shared_families"]


def shared_families(sources: list[tuple[dict[str, str], dict[str, Any]]]) -> Iterator[Metric]:
    """The families of the services' stats, (labels, stats) each: the labels (model=name)
    go on every sample of that service."""
    sources = [(labels, stats) for labels, stats in sources if "queue_depth_by_priority" in stats]
    if not sources:
        return
    names = list(sources[0][0])
    depth = GaugeMetricFamily("fastloop_serve_queue_depth_by_priority",
                              "Jobs waiting in the shared queue, all processes, by priority.",
                              labels=names + ["priority"])
    # prometheus_client's SummaryMetricFamily has no quantiles: one gauge per quantile instead
    wait = GaugeMetricFamily("fastloop_serve_queue_wait_seconds",
                             "Submit-to-start wait of the jobs this process started, by priority; "
                             "quantiles over the last 10^4.", labels=names + ["priority", "quantile"])
    count = CounterMetricFamily("fastloop_serve_queue_waits", "Queue waits measured, by priority.",
                                labels=names + ["priority"])
    reclaimed = CounterMetricFamily("fastloop_serve_reclaimed",
                                    "Jobs of stopped workers this process reclaimed: rerun (still queued) or "
                                    "failed (were running); resumed: its own jobs whose run Redis lost "
                                    "(a lost answer, a restart from an older snapshot), run again.",
                                    labels=names + ["outcome"])
    for labels, stats in sources:
        values = list(labels.values())
        for level, n in stats["queue_depth_by_priority"].items():
            depth.add_metric(values + [level], n)
        for level, measured in stats["wait_s_by_priority"].items():
            for quantile, key in (("0.5", "p50"), ("0.99", "p99")):
                wait.add_metric(values + [level, quantile], measured[key])
            count.add_metric(values + [level], measured["samples"])
        for outcome, n in stats["reclaimed"].items():
            reclaimed.add_metric(values + [outcome], n)
    yield from (depth, wait, count, reclaimed)
