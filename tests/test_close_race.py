"""Closing a Monitor or a Checkpointer from many threads at once, while other threads log or
save, and from a __del__ run on whichever thread the garbage collector picks: every
close() returns only once the writer has finished, close(timeout=0) returns at once,
the loggers and savers either succeed or get fastloop.Closed, and nothing crashes or hangs.

FASTLOOP_STRESS_ROUNDS sets the number of rounds of each race (default 40, about 10 s here;
make stress runs 200)."""

from __future__ import annotations

import gc
import os
import threading
import weakref
from typing import Any, Callable

import numpy as np
import pytest

import fastloop

ROUNDS = int(os.environ.get("FASTLOOP_STRESS_ROUNDS", "40"))
CLOSERS, WORKERS = 8, 2
JOIN_TIMEOUT_S = 60.0  # far past a healthy round (milliseconds): a thread still alive hung


@pytest.fixture(autouse=True)
def no_gpu_notice(monkeypatch):
    from fastloop import monitor as monitor_module

    monkeypatch.setattr(monitor_module, "_gpu_notice_given", True)


def run_threads(targets: list[Callable[[], None]]) -> list[str]:
    """Runs each target on a thread of its own, all released at once by one barrier (each target
    takes it as its argument); returns what went wrong: exceptions and threads that never ended."""
    start, problems = threading.Barrier(len(targets)), []

    def guarded(target):
        try:
            start.wait()
            target()
        except BaseException as error:  # noqa: BLE001 -- reported below, with its thread
            problems.append(f"{threading.current_thread().name}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=guarded, args=(t,), name=f"race-{i}") for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT_S)
    problems += [f"{t.name} still running after {JOIN_TIMEOUT_S:g} s: a hang" for t in threads if t.is_alive()]
    return problems


def until_closed(work: Callable[[], None], busy: threading.Event) -> Callable[[], None]:
    """A worker that repeats `work` until the object says it is closed, setting `busy` once
    it has done it a few times (the closers wait for that: they race work in progress)."""

    def worker():
        try:
            for done in range(1, 2**62):
                work()
                if done == 5:
                    busy.set()
        except fastloop.Closed:
            busy.set()  # closed before it got going (a collector thread's close, say)

    return worker


def once_busy(close: Callable[[], None], busy: threading.Event) -> Callable[[], None]:
    """A closer that closes once the workers are at it."""

    def closer():
        assert busy.wait(JOIN_TIMEOUT_S), "the workers never got going"
        close()

    return closer


# ---- Monitor ----


def new_monitor(tmp_path) -> fastloop.Monitor:
    return fastloop.Monitor(interval_s=0.001, flush_interval_s=0.01, gpu=False, sinks=[
        fastloop.CSVSink(tmp_path / "m.csv"), fastloop.CallbackSink(lambda event: None, maxsize=64)])


def monitor_finished(mon: fastloop.Monitor) -> bool:
    """The writer is done (sinks written and closed) and the callbacks delivered everything."""
    return mon._core.wait_closed(0) and not any(c.thread.is_alive() for c in mon._callbacks)


def monitor_loggers(mon: fastloop.Monitor, busy: threading.Event) -> list[Callable[[], None]]:
    def scalars():
        mon.scalar("loss", 0.5)
        mon.event("tick")

    def summaries():
        mon.histogram("h", np.arange(10.0))
        mon.text("t", "hello")
        mon.flush(timeout=5)  # True once closed: everything queued was written

    return [until_closed(scalars, busy), until_closed(summaries, busy)]


def test_8_threads_close_a_monitor_while_2_log(tmp_path):
    for round in range(ROUNDS):
        mon, returned_early, busy = new_monitor(tmp_path), [], threading.Event()

        def closer(wait):
            def close():
                mon.close(timeout=None if wait else 0)
                if wait and not monitor_finished(mon):
                    returned_early.append(round)
            return once_busy(close, busy)

        closers = [closer((i + round) % 2 == 0) for i in range(CLOSERS)]
        problems = run_threads(closers + monitor_loggers(mon, busy))
        assert not problems, f"round {round}: {problems}"
        assert not returned_early, "close() returned before the writer finished"
        assert monitor_finished(mon)


# ---- Checkpointer ----


def new_checkpointer(tmp_path) -> fastloop.Checkpointer:
    ckpt = fastloop.Checkpointer(tmp_path / "ckpts", keep=2, every_steps=1, max_pending=2)
    ckpt.due(0)  # the loop asks from the start (a close before any maybe_save() warns otherwise)
    return ckpt


def checkpointer_savers(ckpt: fastloop.Checkpointer, saved: list[int], busy: threading.Event) -> list[Callable[[], None]]:
    """Two savers, one through save() and one through maybe_save(); `saved` counts the saves
    that returned (each one must be written by the time a waiting close() returns)."""
    steps = iter(range(1, 10**9))  # next() on one iterator from two threads: a lock inside
    lock = threading.Lock()

    def next_step():
        with lock:
            return next(steps)

    def save():
        ckpt.save({"w": np.ones(1000, np.float32)}, next_step())
        saved.append(1)

    def maybe_save():
        ckpt.maybe_save(lambda: {"w": np.zeros(1000, np.float32), "note": "maybe"}, next_step())
        saved.append(1)

    return [until_closed(save, busy), until_closed(maybe_save, busy)]


def test_8_threads_close_a_checkpointer_while_2_save(tmp_path):
    for round in range(ROUNDS):
        ckpt, saved, seen_at_return, busy = new_checkpointer(tmp_path), [], [], threading.Event()
        ckpt.save({"big": np.ones(1 << 20)}, 0)  # 8 MB: the writer is busy as the race starts

        def closer(wait):
            def close():
                ckpt.close(timeout=None if wait else 0)
                if wait:  # what a waiting close left: every save that will ever return is written
                    seen_at_return.append((ckpt._core.wait_closed(0), ckpt.stats()["written"]))
            return once_busy(close, busy)

        closers = [closer((i + round) % 2 == 0) for i in range(CLOSERS)]
        problems = run_threads(closers + checkpointer_savers(ckpt, saved, busy))
        assert not problems, f"round {round}: {problems}"
        written = 1 + len(saved)
        assert ckpt.stats()["written"] == written
        assert seen_at_return == [(True, written)] * len(seen_at_return), \
            f"round {round}: close() returned before the writer finished ({written} saves)"


# ---- close() from __del__, on the thread the garbage collector picks ----


class Owner:
    """Holds a Monitor or a Checkpointer in a reference cycle and closes it from __del__, as a
    user's trainer class might: only the cyclic collector frees it, on whatever thread runs it."""

    closed_on: list[str] = []  # the threads their __del__ ran on

    def __init__(self, closable: Any) -> None:
        self.closable = closable
        self.me = self

    def __del__(self) -> None:
        Owner.closed_on.append(threading.current_thread().name)
        self.closable.close()


@pytest.mark.parametrize("kind", ["monitor", "checkpointer"])
def test_close_from_del_on_the_collecting_thread_races_the_others(tmp_path, kind):
    for round in range(ROUNDS):
        busy = threading.Event()
        if kind == "monitor":
            closable = new_monitor(tmp_path)
            workers = monitor_loggers(closable, busy)
        else:
            closable = new_checkpointer(tmp_path)
            workers = checkpointer_savers(closable, [], busy)
        owner = weakref.ref(Owner(closable))  # garbage at once: a cycle only a collection frees
        closers = [once_busy(lambda: closable.close(), busy) for _ in range(CLOSERS - 2)]
        collectors = [once_busy(gc.collect, busy) for _ in range(2)]
        problems = run_threads(closers + workers + collectors)
        assert not problems, f"round {round}: {problems}"
        gc.collect()  # the owner is gone, whichever thread collected it
        assert owner() is None
        closable.close()  # one more: returns at once
    assert [name for name in Owner.closed_on if name.startswith("race-")], "never closed by a racing thread"


def test_a_callback_that_closes_its_monitor_returns(tmp_path):
    closed = threading.Event()
    mon_box: list[fastloop.Monitor] = []

    def close_on_first(event):
        if not closed.is_set():
            mon_box[0].close()  # on the callback's own thread: it must not wait for itself
            closed.set()

    mon = fastloop.Monitor(interval_s=0, gpu=False, sinks=[fastloop.CallbackSink(close_on_first)])
    mon_box.append(mon)
    mon.scalar("x", 1.0, 1)
    assert closed.wait(30), "the callback's close() never returned"
    mon.close()  # no SinkError: the callback raised nothing
    assert monitor_finished(mon)


# ---- InferenceService ----


def test_8_threads_close_an_inference_service_while_2_submit(tmp_path):
    """Every close() returns only once the service is closed: no job of it is still queued or
    running (the first close drains or fails them; the others wait for it)."""
    from fastloop.serve import FileStore, InferenceService

    fastloop.nn.manual_seed(3)
    model = fastloop.nn.Sequential(fastloop.nn.Linear(8, 4))
    rows = np.ones((1, 8), np.float32)
    for round_ in range(max(1, ROUNDS // 4)):  # a service starts threads and a store: heavier rounds
        svc = InferenceService(model, num_workers=2, max_batch=8, store=FileStore(str(tmp_path / f"r{round_}")))
        busy, submitted, lock = threading.Event(), [], threading.Lock()
        unfinished: list[str] = []

        def submit():
            job = svc.submit(rows)
            with lock:
                submitted.append(job)

        def close():
            svc.close(timeout=0.05)
            left = [j for j in list(submitted) if svc.status(j) in ("queued", "running")]
            unfinished.extend(left)

        submitters = [until_closed(submit, busy) for _ in range(WORKERS)]
        problems = run_threads(submitters + [once_busy(close, busy) for _ in range(CLOSERS)])
        assert not problems, problems
        assert svc.closed and not unfinished, f"round {round_}: close() returned with jobs {unfinished[:3]} unfinished"
