"""fastloop.Metrics: exact under contention, statistics right, bad input refused."""

from __future__ import annotations

import threading
from typing import Callable

import pytest

import fastloop


def test_8_threads_x_1e5_updates_give_the_exact_total():
    metrics = fastloop.Metrics()
    barrier = threading.Barrier(8)

    def work():
        barrier.wait()
        add = metrics.add
        for _ in range(100_000):
            add("samples", 1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = metrics.get("samples")
    assert stats.count == 800_000 and stats.sum == 800_000.0


def test_statistics_of_a_metric():
    metrics = fastloop.Metrics()
    for value in (3.0, -1.0, 4.0):
        metrics.add("loss", value)
    stats = metrics["loss"]
    assert (stats.count, stats.sum, stats.mean, stats.min, stats.max, stats.last) == (3, 6.0, 2.0, -1.0, 4.0, 4.0)
    metrics.add("events")  # default value 1: a counter
    assert metrics.snapshot()["events"].sum == 1.0
    assert len(metrics) == 2 and "loss" in metrics and "nope" not in metrics
    assert isinstance(stats, fastloop.MetricStats)
    metrics.reset()
    assert len(metrics) == 0 and metrics.snapshot() == {}


def assert_checks_name_and_value(record: Callable[[object, object], object]) -> None:
    """record(name, value), as Metrics.add and Monitor.scalar take them, refuses a name outside
    1 to 47 bytes (ValueError) and a value that is not a number (TypeError)."""
    with pytest.raises(ValueError, match="1 to 47 bytes"):
        record("x" * 48, 1.0)
    with pytest.raises(ValueError):
        record("", 1.0)
    with pytest.raises(TypeError):
        record("x", "one")


def test_bad_input():
    metrics = fastloop.Metrics()
    with pytest.raises(KeyError):
        metrics.get("missing")
    assert_checks_name_and_value(metrics.add)
    with pytest.raises(TypeError):
        metrics.add(5, 1.0)
    with pytest.raises(TypeError):
        fastloop.Metrics(3)
