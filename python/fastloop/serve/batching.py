"""Dynamic batching: collecting jobs from the queue, grouping them by input shape, running
the model once per group and splitting its output into one row per job.

A worker takes what is queued (up to ``max_batch``) as soon as one job is there, then waits
at most ``max_delay_s`` for the batch to fill (no longer once it is full). Jobs whose inputs
differ in shape or dtype from the others run as their own group. When the model raises on a group of several jobs,
each job is run again alone, so only the inputs that fail are marked failed.

    >>> items = collect(queue, max_batch=32, max_delay_s=0.002)
    >>> outcomes = run_group(model, [job.inputs for job in items])   # [(row, None) | (None, error)]
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from .._core import Queue
from ..errors import Closed

__all__ = ["collect", "group_by_input", "run_group"]

T = TypeVar("T")


def collect(queue: Queue, max_batch: int, max_delay_s: float, timeout: float | None = None,
            more_coming: Callable[[int], bool] | None = None) -> list[Any]:
    """Up to max_batch items: waits (up to `timeout`) for the first, then at most
    max_delay_s for the batch to fill. Raises fastloop.Closed once the queue is closed and
    empty. ``more_coming(held)`` (held: the items this batch holds so far): False when no item
    is on its way, so the batch runs with what it holds instead of waiting out max_delay_s.

    While it waits for more it sleeps in a few slices and looks at qsize() (not one
    get_many() per arriving item), so a filling batch costs the worker a handful of wake-ups,
    each a trip through the GIL, instead of one per job.
    """
    items = queue.get_many(max_batch, timeout=timeout)
    if not items or len(items) >= max_batch or max_delay_s <= 0:
        return items
    deadline = time.monotonic() + max_delay_s
    nap = max(max_delay_s / 4, 2e-4)
    while len(items) < max_batch:
        need = max_batch - len(items)
        remaining = deadline - time.monotonic()
        if queue.qsize() < need and remaining > 0 and (more_coming is None or more_coming(len(items))):
            time.sleep(min(nap, remaining))
            continue
        try:
            if queue.qsize():  # a lone job (none more queued) runs without a second get
                items += queue.get_many(need, timeout=0)
        except Closed:  # closed meanwhile: run what we hold; the next collect() says Closed
            pass
        break
    return items


def group_by_input(jobs: Sequence[T], key: Callable[[T], Any]) -> list[list[T]]:
    """Jobs split into groups of equal key (input shape and dtype), in first-seen order."""
    groups: dict[Any, list[T]] = {}
    for job in jobs:
        groups.setdefault(key(job), []).append(job)
    return list(groups.values())


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _call(model: Callable[[np.ndarray], Any], batch: np.ndarray) -> np.ndarray:
    out = model(batch)
    if hasattr(out, "to_numpy"):  # a fastloop.cuda.DeviceArray from a model on a GPU
        out = out.to_numpy()
    out = np.asarray(out)
    if out.ndim == 0 or out.shape[0] != batch.shape[0]:
        raise ValueError(f"the model returned shape {out.shape} for a batch of {batch.shape[0]}: "
                         "expected one row per input")
    return out


def run_group(model: Callable[[np.ndarray], Any], inputs: Sequence[np.ndarray]) -> list[tuple[np.ndarray | None, str | None]]:
    """Runs the model once on the stacked inputs; returns (row, None) or (None, error) per
    input. If the batch fails and holds several inputs, each runs again alone."""
    try:
        # one input (a lone job): its copy with a batch axis, what np.stack gives, at a tenth of the cost
        out = _call(model, inputs[0][np.newaxis].copy() if len(inputs) == 1 else np.stack(inputs))
        return [(np.array(out[i]), None) for i in range(len(inputs))]  # copies: rows outlive the batch
    except BaseException as error:  # SystemExit too: one bad input must not fail its neighbours
        if len(inputs) == 1:
            return [(None, _describe(error))]
    outcomes: list[tuple[np.ndarray | None, str | None]] = []
    for x in inputs:
        try:
            outcomes.append((np.array(_call(model, x[np.newaxis])[0]), None))
        except BaseException as error:
            outcomes.append((None, _describe(error)))
    return outcomes
