"""fastloop.serve: the InferenceService core (dynamic batching, bounds, cancel, TTL, close,
restart recovery) and its stores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import fastloop as fl
from fastloop.serve import (FileStore, InferenceService, JobCancelled, JobExpired, JobFailed, JobRecord,
                            MemoryStore, StoreError, StoreUnavailable)
from waiting import wait_for

IN, OUT = 16, 4


@pytest.fixture(scope="module")
def mlp():
    fl.nn.manual_seed(0)
    return fl.nn.Sequential(fl.nn.Linear(IN, 32), fl.nn.ReLU(), fl.nn.Linear(32, OUT))


def sample(i: int) -> np.ndarray:
    return np.random.default_rng(i).standard_normal(IN).astype(np.float32)


class Gate:
    """A model that blocks until released, recording the first value of every row it sees."""

    def __init__(self, wait_s: float = 10) -> None:
        self.open = threading.Event()
        self.seen: list[float] = []
        self.wait_s = wait_s

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.seen += [float(row[0]) for row in batch]
        assert self.open.wait(self.wait_s), "the test never released the gate"
        return batch * 2


# ---------------------------------------------------------------- end to end


@pytest.mark.parametrize("store", ["memory", "file"])
def test_submit_poll_result_with_an_nn_mlp(mlp, store, tmp_path):
    made = MemoryStore() if store == "memory" else FileStore(tmp_path)
    with InferenceService(mlp, store=made) as svc:
        ids = [svc.submit(sample(i)) for i in range(5)]
        for i, job in enumerate(ids):
            np.testing.assert_allclose(svc.result(job, timeout=5), mlp(sample(i)), rtol=1e-5, atol=1e-6)
            assert svc.status(job) == "done"
        assert svc.stats()["done"] == 5


def test_a_plain_callable_is_a_model():
    with InferenceService(lambda batch: batch.sum(axis=(1, 2)), store=MemoryStore()) as svc:
        job = svc.submit([[1, 2], [3, 4]])
        assert svc.result(job, timeout=5) == 10


def test_default_store_is_a_file_store_in_a_temporary_directory(mlp):
    svc = InferenceService(mlp)
    directory = svc.store.directory
    assert isinstance(svc.store, FileStore) and os.path.isdir(directory)
    svc.result(svc.submit(sample(0)), timeout=5)
    svc.close()
    assert not os.path.exists(directory)


def test_a_temporary_file_store_skips_fsyncs_and_is_removed_off_the_callers_time(tmp_path):
    store = FileStore()
    assert store.durable is False and FileStore(tmp_path).durable is True
    for i in range(200):
        store.create(JobRecord.new(f"j{i}", time.time()), np.zeros(4, np.float32))
    directory = store.directory
    parent, name = os.path.split(directory)
    store.close()  # renamed aside at once; a thread removes it
    assert not os.path.exists(directory)
    wait_for(lambda: not [n for n in os.listdir(parent) if n.startswith(name)])


def test_concurrent_submitters_are_batched_and_each_job_gets_its_own_row(mlp):
    def slow_model(batch):  # slow enough that jobs pile up while a batch runs
        time.sleep(0.004)
        return mlp(batch)

    results: dict[int, np.ndarray] = {}
    with InferenceService(slow_model, num_workers=2, max_batch=16, max_delay_s=0.005, store=MemoryStore()) as svc:
        def client(c: int) -> None:
            for k in range(15):
                i = c * 100 + k
                results[i] = svc.result(svc.submit(sample(i)), timeout=10)

        threads = [threading.Thread(target=client, args=(c,)) for c in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = svc.stats()
    assert len(results) == 16 * 15
    assert max(stats["batch_sizes"]) > 1 and stats["mean_batch_size"] > 2, stats["batch_sizes"]
    assert sum(k * v for k, v in stats["batch_sizes"].items()) == 16 * 15
    xs = np.stack([sample(i) for i in results])
    np.testing.assert_allclose(np.stack(list(results.values())), mlp(xs), rtol=1e-5, atol=1e-6)


def test_inputs_of_another_shape_run_in_their_own_batch():
    gate = Gate()
    with InferenceService(gate, num_workers=1, max_batch=8, store=MemoryStore()) as svc:
        first = svc.submit(np.zeros(3))
        wait_for(lambda: svc.status(first) == "running")
        jobs = [svc.submit(np.full(3, 1.0)), svc.submit(np.full(4, 2.0)), svc.submit(np.full(3, 3.0))]
        gate.open.set()
        outs = [svc.result(j, timeout=5) for j in jobs]
        assert [o.tolist() for o in outs] == [[2.0] * 3, [4.0] * 4, [6.0] * 3]
        assert svc.stats()["batch_sizes"] == {1: 2, 2: 1}


# ---------------------------------------------------------------- bounds, ids, cancel


def test_queue_full_raises_at_once_at_the_bound():
    gate = Gate()
    with InferenceService(gate, num_workers=1, max_queue=3, max_batch=1, store=MemoryStore()) as svc:
        running = svc.submit(np.zeros(2))
        wait_for(lambda: svc.status(running) == "running")
        queued = [svc.submit(np.ones(2)) for _ in range(3)]
        with pytest.raises(fl.QueueFull, match="full"):  # at once: no slot can free while the gate holds the worker
            svc.submit(np.ones(2))
        assert svc.status(running) == "running" and not gate.open.is_set()
        stats = svc.stats()
        assert stats["rejected"] == 1 and stats["queue_depth"] == 3
        gate.open.set()
        for job in [running] + queued:
            svc.result(job, timeout=5)


def test_an_admitted_submit_keeps_its_slot_while_others_fill_the_queue():
    gate = Gate()
    with InferenceService(gate, num_workers=1, max_queue=2, max_batch=1, store=MemoryStore()) as svc:
        running = svc.submit(np.zeros(2))
        wait_for(lambda: svc.status(running) == "running")
        admitted = svc.admit()  # what the HTTP front does before parsing a body
        assert admitted is not None and admitted.held
        queued = svc.submit(np.ones(2))  # takes the one slot left
        assert svc.admit() is None and svc.reject_if_full()
        with pytest.raises(fl.QueueFull, match="full"):
            svc.submit(np.ones(2))
        late = svc.submit(np.full(2, 3.0), admission=admitted)  # never refused: the slot was its own
        stats = svc.stats()
        assert not admitted.held and stats["queue_depth"] == 2 and stats["rejected"] == 3
        gate.open.set()
        assert [float(svc.result(job, timeout=5)[0]) for job in (running, queued, late)] == [0.0, 2.0, 6.0]


def test_an_admission_comes_back_when_its_submit_fails_or_never_happens(mlp):
    with InferenceService(mlp, num_workers=1, max_queue=1, store=MemoryStore()) as svc:
        refused = svc.admit()
        with pytest.raises(ValueError, match="shape"):
            svc.submit(np.zeros(IN + 1, np.float32), admission=refused)
        assert not refused.held
        unused = svc.admit()
        assert unused is not None and svc.admit() is None  # it holds the only slot
        unused.release()
        unused.release()  # a second release changes nothing
        assert svc.result(svc.submit(sample(0), admission=svc.admit()), timeout=5).shape == (OUT,)


def test_a_caller_given_id_is_idempotent():
    calls = []
    with InferenceService(lambda b: calls.append(len(b)) or b, store=MemoryStore()) as svc:
        assert svc.submit(np.ones(2), job_id="req-1") == "req-1"
        assert svc.submit(np.ones(2), job_id="req-1") == "req-1"
        svc.result("req-1", timeout=5)
        assert svc.submit(np.zeros(2), job_id="req-1") == "req-1"
        assert svc.result("req-1", timeout=5).tolist() == [1.0, 1.0]
        assert svc.stats()["submitted"] == 1 and sum(calls) == 1


def test_an_unknown_id_raises_key_error_everywhere():
    with InferenceService(lambda b: b, store=MemoryStore()) as svc:
        for call in (svc.status, svc.result, svc.cancel, svc.record):
            with pytest.raises(KeyError):
                call("never-submitted")


def test_cancel_takes_a_queued_job_off_the_queue_and_it_never_runs():
    gate = Gate()
    with InferenceService(gate, num_workers=1, max_batch=1, store=MemoryStore()) as svc:
        running = svc.submit(np.array([1.0]))
        wait_for(lambda: svc.status(running) == "running")
        queued = svc.submit(np.array([2.0]))
        assert svc.cancel(queued) is True
        assert svc.cancel(running) is False
        assert svc.cancel(queued) is False
        gate.open.set()
        assert svc.result(running, timeout=5).tolist() == [2.0]
        with pytest.raises(JobCancelled, match="cancelled"):
            svc.result(queued, timeout=5)
        assert svc.status(queued) == "failed" and svc.record(queued).cancelled
        svc.result(svc.submit(np.array([3.0])), timeout=5)
    assert gate.seen == [1.0, 3.0]
    assert svc.stats()["cancelled"] == 1 and svc.stats()["failed"] == 0


# ---------------------------------------------------------------- failures


def test_a_model_raising_on_some_inputs_fails_those_jobs_and_keeps_serving():
    def picky(batch):
        if (batch[:, 0] < 0).any():
            raise ValueError("negative input")
        time.sleep(0.002)
        return batch + 1

    with InferenceService(picky, num_workers=2, max_batch=8, max_delay_s=0.005, store=MemoryStore()) as svc:
        values = [(-1.0 if i % 5 == 0 else float(i)) for i in range(60)]
        ids = [None] * len(values)

        def client(c):
            for i in range(c, len(values), 6):
                ids[i] = svc.submit(np.array([values[i], 0.0]))

        threads = [threading.Thread(target=client, args=(c,)) for c in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for value, job in zip(values, ids):
            if value < 0:
                with pytest.raises(JobFailed, match="ValueError: negative input"):
                    svc.result(job, timeout=5)
            else:
                assert svc.result(job, timeout=5)[0] == value + 1
        stats = svc.stats()
        assert stats["failed"] == 12 and stats["done"] == 48 and stats["workers"] == 2
        assert svc.result(svc.submit(np.array([5.0, 0.0])), timeout=5)[0] == 6.0


def test_a_model_returning_the_wrong_number_of_rows_fails_the_job():
    with InferenceService(lambda b: b[:0], store=MemoryStore()) as svc:
        with pytest.raises(JobFailed, match="one row per input"):
            svc.result(svc.submit(np.ones(2)), timeout=5)


@pytest.mark.parametrize("bad, error, words", [
    (np.ones(IN + 1, np.float32), ValueError, "shape"),
    (np.ones((2, IN + 1), np.float32), ValueError, "shape"),
    (np.ones((0, IN), np.float32), ValueError, "no rows"),
    (np.ones(IN, np.float64), TypeError, "astype"),
    (np.ones(IN, np.int32), TypeError, "float32"),
    (["a"] * IN, TypeError, "float32"),
    (np.array([object()] * IN), TypeError, "dtype"),
])
def test_bad_inputs_raise_at_submit_naming_the_cause(mlp, bad, error, words):
    with InferenceService(mlp, store=MemoryStore()) as svc:
        with pytest.raises(error, match=words):
            svc.submit(bad)
        assert svc.stats()["submitted"] == 0
        assert svc.result(svc.submit(list(map(float, range(IN)))), timeout=5).shape == (OUT,)


@pytest.mark.parametrize("job_id", ["", ".hidden", "../x", "a/b", "x" * 129, 7])
def test_bad_job_ids_are_refused(job_id):
    with InferenceService(lambda b: b, store=MemoryStore()) as svc:
        with pytest.raises((ValueError, TypeError)):
            svc.submit(np.ones(1), job_id=job_id)


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_idle_worker_priority_puts_the_worker_threads_only_under_sched_idle():
    def model(batch):  # runs on a worker thread: reports that thread's policy in every row
        return np.full((len(batch), 1), os.sched_getscheduler(0), dtype=np.int64)

    with InferenceService(model, num_workers=2, worker_priority="idle", store=MemoryStore()) as svc:
        assert "worker_priority='idle'" in repr(svc)
        assert svc.result(svc.submit(np.ones(3)), timeout=5)[0] == os.SCHED_IDLE
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller's thread is untouched
    with InferenceService(model, store=MemoryStore()) as svc:
        assert svc.result(svc.submit(np.ones(3)), timeout=5)[0] == os.SCHED_OTHER


@pytest.mark.parametrize("priority", ["low", "IDLE", None, 19])
def test_an_unknown_worker_priority_is_refused_naming_it(priority):
    with pytest.raises(ValueError, match=f"worker_priority must be one of .*not {priority!r}"):
        InferenceService(lambda b: b, worker_priority=priority, store=MemoryStore())


class BatchStore(MemoryStore):
    """A MemoryStore that writes batches (as RedisStore does), logs the calls the service
    makes, and can refuse chosen jobs' final writes or be down for update_many."""

    writes_batches = True

    def __init__(self, refuse_finish=(), updates_down=False, cut_batches=0) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []
        self.refuse_finish, self.updates_down = set(refuse_finish), updates_down
        self.cut_batches = cut_batches  # finish_many calls that raise, as a pipeline an outage cuts

    def update_many(self, records):
        self.calls.append(("update_many", len(records)))
        if self.updates_down:
            raise StoreError("BatchStore: down")
        return [None if MemoryStore.update(self, r) is None else None for r in records]

    def finish_many(self, items):
        self.calls.append(("finish_many", len(items)))
        if self.cut_batches > 0 and len(items) > 1:
            self.cut_batches -= 1
            raise StoreError("BatchStore: connection lost")
        outcomes = []
        for record, result in items:
            if record.id in self.refuse_finish and result is not None:
                outcomes.append(StoreError(f"no room for the result of {record.id}"))
            else:
                MemoryStore.finish(self, record, result)
                outcomes.append(None)
        return outcomes

    def finish(self, record, result):
        self.calls.append(("finish", 1))
        if record.id in self.refuse_finish and result is not None:
            raise StoreError(f"no room for the result of {record.id}")
        super().finish(record, result)


def _batch_of_eight(store, **kwargs):
    """Job "first" runs alone while eight more queue; then the eight run as one batch."""
    gate = Gate()
    svc = InferenceService(gate, num_workers=1, max_batch=8, max_delay_s=0, store=store, **kwargs)
    first = svc.submit(np.zeros(2), job_id="first")
    wait_for(lambda: gate.seen)
    jobs = [svc.submit(np.full(2, i + 1.0), job_id=f"job{i}") for i in range(8)]
    gate.open.set()
    return svc, first, jobs


def test_a_store_that_writes_batches_gets_one_call_per_batch_and_each_job_its_row():
    store = BatchStore()
    svc, first, jobs = _batch_of_eight(store)
    with svc:
        for i, job in enumerate(jobs):
            np.testing.assert_array_equal(svc.result(job, timeout=5), np.full(2, 2 * (i + 1.0)))
        assert svc.result(first, timeout=5).tolist() == [0.0, 0.0]
        assert store.calls == [("update_many", 1), ("finish_many", 1), ("update_many", 8), ("finish_many", 8)]
        assert svc.stats()["batch_sizes"] == {1: 1, 8: 1} and svc.stats()["store_errors"] == 0


def test_a_job_whose_batched_result_is_refused_fails_alone_and_the_batch_is_stored():
    store = BatchStore(refuse_finish={"job3"})
    svc, first, jobs = _batch_of_eight(store)
    with svc:
        with pytest.raises(JobFailed, match="could not store the result: no room for the result of job3"):
            svc.result("job3", timeout=5)
        assert [svc.status(job) for job in jobs] == ["done"] * 3 + ["failed"] + ["done"] * 4
        # only job3 written again: its result (refused again), then its failed record
        assert store.calls[-3:] == [("finish_many", 8), ("finish", 1), ("finish", 1)]
        assert svc.stats()["store_errors"] == 1


def test_a_batch_write_the_store_drops_is_written_job_by_job():
    store = BatchStore(cut_batches=1)
    svc, first, jobs = _batch_of_eight(store)
    with svc:
        assert [svc.result(job, timeout=5)[0] for job in jobs] == [2.0 * (i + 1) for i in range(8)]
        assert store.calls[-9:] == [("finish_many", 8)] + [("finish", 1)] * 8
        assert [store.get(job).status for job in jobs] == ["done"] * 8


@pytest.mark.filterwarnings(r"ignore:InferenceService. could not record 1 job\(s\):RuntimeWarning")
def test_jobs_run_when_the_store_cannot_record_them_running():
    store = BatchStore(updates_down=True)
    with pytest.warns(RuntimeWarning, match=r"could not record 8 job\(s\) as running"):
        svc, first, jobs = _batch_of_eight(store)
        with svc:
            assert [svc.result(job, timeout=5)[0] for job in jobs] == [2.0 * (i + 1) for i in range(8)]
            assert svc.stats()["store_errors"] == 9


class UnreachableOnceStore(MemoryStore):
    """A MemoryStore that cannot be reached for the first final write of each id in
    `unreachable` (a Redis restarting: connection refused), then takes every write."""

    def __init__(self, unreachable=()) -> None:
        super().__init__()
        self.unreachable = set(unreachable)

    def finish(self, record, result):
        if record.id in self.unreachable:
            self.unreachable.discard(record.id)
            raise StoreUnavailable(f"cannot finish job {record.id!r}: Connection refused")
        super().finish(record, result)


def test_a_result_the_store_could_not_reach_is_written_later_and_never_turned_into_a_failure():
    # The flake of test_ten_thousand_jobs_with_one_percent_failures_and_a_redis_restart: a
    # done job whose final write met a Redis restarting was stored failed, "could not store
    # the result: ... Connection refused", as soon as Redis took the next write.
    store = UnreachableOnceStore(unreachable={"a"})
    with InferenceService(lambda b: b * 2, store=store) as svc:
        assert svc.result(svc.submit(np.ones(2), job_id="a"), timeout=5).tolist() == [2.0, 2.0]
        wait_for(lambda: svc.stats()["unsaved"] == 0)  # the janitor wrote it once the store answered
        assert store.get("a").status == "done" and store.get_result("a").tolist() == [2.0, 2.0]
        assert svc.status("a") == "done" and svc.stats()["failed"] == 0


class LostReplyStore(MemoryStore):
    """A MemoryStore whose first create() of each id in `lose` writes the job and then
    raises, as a Redis that goes down before its reply comes back does."""

    def __init__(self, lose=()) -> None:
        super().__init__()
        self.lose = set(lose)

    def create(self, record, inputs):
        created = super().create(record, inputs)
        if record.id in self.lose:
            self.lose.discard(record.id)
            raise StoreError(f"connection lost before the reply to creating {record.id}")
        return created


def test_a_retried_submit_queues_a_job_whose_first_try_was_stored_but_unanswered():
    store = LostReplyStore(lose={"a"})
    with InferenceService(lambda b: b * 2, store=store) as svc:
        with pytest.raises(StoreError, match="connection lost before the reply"):
            svc.submit(np.ones(2), job_id="a")
        assert store.get("a").status == "queued"  # stored, yet no worker holds it
        assert svc.submit(np.ones(2), job_id="a") == "a"
        assert svc.result("a", timeout=5).tolist() == [2.0, 2.0]
        assert svc.submit(np.ones(2), job_id="a") == "a"  # done now: queues nothing
        stats = svc.stats()
        assert (stats["submits_adopted"], stats["submitted"], stats["done"]) == (1, 1, 1)


def test_a_file_store_job_whose_folder_sync_failed_exists_and_a_retry_runs_it(tmp_path, monkeypatch):
    store = FileStore(tmp_path)
    real_sync = store._sync_dir

    def sync_fails_once(path):  # only the store's own folder, after the job's rename
        if path != store.directory:
            return real_sync(path)
        monkeypatch.setattr(store, "_sync_dir", real_sync)
        raise OSError(5, "Input/output error")

    with InferenceService(lambda b: b + 1, store=store) as svc:
        monkeypatch.setattr(store, "_sync_dir", sync_fails_once)
        with pytest.raises(StoreError, match=f"cannot sync {tmp_path} after creating job 'f'.*Input/output"):
            svc.submit(np.zeros(2), job_id="f")
        assert store.get("f").status == "queued" and (tmp_path / "f").is_dir()
        assert svc.submit(np.zeros(2), job_id="f") == "f"
        assert svc.result("f", timeout=5).tolist() == [1.0, 1.0]
        assert svc.stats()["submits_adopted"] == 1


# ---------------------------------------------------------------- waiting


def test_result_times_out():
    gate = Gate()
    with InferenceService(gate, num_workers=1, store=MemoryStore()) as svc:
        job = svc.submit(np.ones(1))
        with pytest.raises(TimeoutError, match="did not finish"):  # the timeout ended the wait, not the job
            svc.result(job, timeout=0.2)
        assert svc.status(job) in ("queued", "running")
        gate.open.set()


def test_result_is_interrupted_by_ctrl_c():
    # A Ctrl-C whose KeyboardInterrupt is raised inside a finalizer that the collector runs
    # during the wait is swallowed by CPython (one stress run waited out the Gate here), so
    # Ctrl-C is pressed every 0.2 s until result() raises, and ignored from then on.
    gate, caught = Gate(), threading.Event()
    main, sent = threading.main_thread().ident, []

    def on_sigint(signum, frame):
        if not caught.is_set():
            raise KeyboardInterrupt

    def press_until_caught():
        while not caught.wait(0.2):
            sent.append(time.monotonic())
            signal.pthread_kill(main, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, on_sigint)
    presser = threading.Thread(target=press_until_caught)
    try:
        with InferenceService(gate, num_workers=1, store=MemoryStore()) as svc:
            job = svc.submit(np.ones(1))
            with pytest.raises(KeyboardInterrupt):
                presser.start()
                svc.result(job)
            caught.set()
            assert len(sent) <= 10, f"result() let {len(sent)} Ctrl-C presses pass"  # 2 s; it waits in 0.1 s slices
            gate.open.set()
    finally:
        caught.set()
        if presser.is_alive():
            presser.join()
        signal.signal(signal.SIGINT, previous)


def test_listeners_see_every_status_change():
    events = []
    heard_done = threading.Event()

    def listener(job: str, status: str) -> None:
        events.append((job, status))
        if status == "done":
            heard_done.set()

    with InferenceService(lambda b: b, store=MemoryStore()) as svc:
        unsubscribe = svc.subscribe(listener)
        job = svc.submit(np.ones(1))
        svc.result(job, timeout=5)
        # result() wakes before the listeners hear "done" (as concurrent.futures wakes its
        # waiters before its done callbacks run)
        assert heard_done.wait(5), events
        unsubscribe()
        svc.result(svc.submit(np.ones(1)), timeout=5)
    assert events == [(job, "queued"), (job, "running"), (job, "done")]


# ---------------------------------------------------------------- expiry


@pytest.mark.parametrize("store", ["memory", "file"])
def test_results_expire_after_the_ttl_and_are_forgotten_later(store, tmp_path):
    made = MemoryStore() if store == "memory" else FileStore(tmp_path)
    expired = []
    # expired_ttl_s leaves the expired state 2 s to be seen in, however slow the machine is
    with InferenceService(lambda b: b, store=made, result_ttl_s=0.2, expired_ttl_s=2.0) as svc:
        svc.subscribe(lambda job, status: status == "expired" and expired.append(job))
        job = svc.submit(np.ones(1))
        assert svc.result(job, timeout=5).tolist() == [1.0]
        wait_for(lambda: svc.status(job) == "expired")
        with pytest.raises(JobExpired, match="expired"):
            svc.result(job)
        wait_for(lambda: expired == [job])
        if store == "file":
            assert sorted(os.listdir(tmp_path / job)) == ["record.json"]
        wait_for(lambda: _unknown(svc, job))
        assert svc.stats()["expired"] == 1


def _unknown(svc, job) -> bool:
    try:
        svc.status(job)
        return False
    except KeyError:
        return True


# ---------------------------------------------------------------- close


def test_close_runs_what_is_queued_within_drain():
    def slow(batch):
        time.sleep(0.01)
        return batch

    svc = InferenceService(slow, num_workers=1, max_batch=2, store=MemoryStore())
    jobs = [svc.submit(np.full(1, i)) for i in range(10)]
    svc.close(timeout=10)
    assert [svc.status(j) for j in jobs] == ["done"] * 10
    with pytest.raises(fl.Closed):
        svc.submit(np.ones(1))


def test_close_with_a_short_drain_fails_the_rest_and_leaves_none_running(tmp_path):
    gate = Gate()
    svc = InferenceService(gate, num_workers=1, max_batch=1, store=FileStore(tmp_path))
    jobs = [svc.submit(np.full(1, i)) for i in range(5)]
    wait_for(lambda: svc.status(jobs[0]) == "running")
    threading.Timer(0.3, gate.open.set).start()
    start = time.monotonic()
    svc.close(timeout=0.1)
    assert time.monotonic() - start < 3
    assert svc.status(jobs[0]) in ("done", "failed")
    assert [svc.status(j) for j in jobs[1:]] == ["failed"] * 4
    with pytest.raises(JobFailed, match="service closed before the job ran"):
        svc.result(jobs[1])
    reopened = FileStore(tmp_path)
    assert reopened.recover() == []
    reopened.close()


def test_a_service_left_open_is_drained_at_exit(tmp_path):
    script = textwrap.dedent(f"""
        import time, numpy as np
        from fastloop.serve import InferenceService, FileStore
        def slow(b):
            time.sleep(0.01)
            return b
        svc = InferenceService(slow, num_workers=1, max_batch=1, store=FileStore({str(tmp_path)!r}))
        for i in range(5):
            svc.submit(np.full(1, float(i)), job_id=f"j{{i}}")
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=30)
    store = FileStore(tmp_path)
    assert [store.get(f"j{i}").status for i in range(5)] == ["done"] * 5
    store.close()


# ---------------------------------------------------------------- stores and restart


def kill_a_child_serving_from(store_source: str) -> None:
    """Runs a child that serves from the store `store_source` builds (Python source) with a
    model that hangs, and kills it (SIGKILL) once job0 runs and job1..job3 wait."""
    script = textwrap.dedent(f"""
        import os, time, numpy as np
        from fastloop.serve import InferenceService, FileStore, RedisStore
        def hang(batch):
            os.write(1, b"running\\n")  # one write: print() from two threads can interleave the lines
            time.sleep(60)
        svc = InferenceService(hang, num_workers=1, max_batch=1, store={store_source})
        for i in range(4):
            svc.submit(np.random.default_rng(i).standard_normal({IN}).astype(np.float32), job_id=f"job{{i}}")
        os.write(1, b"submitted\\n")
        time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:  # one job in the model, the three others stored: either line may come first
        assert {child.stdout.readline().strip() for _ in range(2)} == {"running", "submitted"}
    finally:
        child.kill()
        child.wait()


def assert_restart_policy_applied(svc: InferenceService, mlp, timeout: float) -> None:
    """After kill_a_child_serving_from() on svc's store: the running job0 failed ("server
    restarted"), the queued job1..job3 ran, and svc counted both. The timeout bounds a hang."""
    with pytest.raises(JobFailed, match="server restarted while the job was running"):
        svc.result("job0", timeout=timeout)
    for i in range(1, 4):
        np.testing.assert_allclose(svc.result(f"job{i}", timeout=timeout), mlp(sample(i)), rtol=1e-5, atol=1e-6)
    stats = svc.stats()
    assert stats["requeued_at_start"] == 3 and stats["failed_at_start"] == 1


def test_restart_requeues_queued_jobs_and_fails_running_ones(mlp, tmp_path):
    """A child serving from tmp_path is killed while one job runs and three wait. A new service
    on the same directory fails the running one ("server restarted") and runs the queued ones."""
    kill_a_child_serving_from(f"FileStore({str(tmp_path)!r})")
    with InferenceService(mlp, store=FileStore(tmp_path)) as svc:
        assert_restart_policy_applied(svc, mlp, timeout=5)


def test_a_deadline_holds_across_a_restart(tmp_path):
    """Queued jobs a dead process left, with their deadlines stored: the one past it fails
    without running, the one before it runs."""
    from fastloop.serve.jobs import JobRecord

    store = FileStore(tmp_path)
    now = time.time()
    for job_id, deadline in (("late", now - 1), ("on-time", now + 60)):
        record = JobRecord.new(job_id, now - 2, (2,), "<f4")
        record.deadline = deadline
        store.create(record, np.full(2, 3, np.float32))
    store.close()
    ran = []
    with InferenceService(lambda b: ran.append(len(b)) or b * 2, store=FileStore(tmp_path)) as svc:
        with pytest.raises(JobFailed, match="deadline exceeded: still queued after"):
            svc.result("late", timeout=5)
        np.testing.assert_array_equal(svc.result("on-time", timeout=5), np.full(2, 6, np.float32))
        assert svc.record("on-time").deadline == now + 60 and svc.stats()["deadline_exceeded"] == 1
    assert ran == [1]


def test_restart_with_records_a_dead_process_left(tmp_path):
    """Records written as a dead process leaves them: queued with and without input,
    running, done, and leftover temporary files."""
    from fastloop.serve.jobs import JobRecord

    store = FileStore(tmp_path)
    for job_id in ("q-input", "q-bare", "r", "d"):
        store.create(JobRecord.new(job_id, time.time(), (2,), "<f8"), np.ones(2) if job_id != "q-bare" else None)
    for job_id, status in (("r", "running"), ("d", "done")):
        record = store.get(job_id)
        record.status = status
        if status == "done":
            record.finished = time.time()
            store.finish(record, np.full(2, 7.0))
        else:
            store.update(record)
    store.close()
    (tmp_path / ".tmp-deadbeef").write_bytes(b"half a file")
    (tmp_path / ".new-deadbeef").mkdir()
    with InferenceService(lambda b: b * 3, store=FileStore(tmp_path)) as svc:
        assert svc.result("q-input", timeout=5).tolist() == [3.0, 3.0]
        with pytest.raises(JobFailed, match="kept no input"):
            svc.result("q-bare", timeout=5)
        with pytest.raises(JobFailed, match="server restarted while the job was running"):
            svc.result("r", timeout=5)
        assert svc.result("d", timeout=5).tolist() == [7.0, 7.0]
    assert not any(name.startswith((".tmp-", ".new-")) for name in os.listdir(tmp_path))


def test_a_memory_store_keeps_finished_jobs_out_of_the_garbage_collectors_scans():
    # A full collection scans every tracked object: 10^5s of finished jobs kept for the
    # result TTL would stall the whole server (the HTTP front included) on each one.
    import gc

    store = MemoryStore()
    gc.collect()
    before = len(gc.get_objects())
    for i in range(5000):
        record = JobRecord.new(f"job-{i}", 1000.0 + i, (IN,), "<f4")
        store.create(record, None)
        record.status, record.finished = "done", 2000.0 + i
        store.finish(record, np.full(OUT, i, np.float32))
    # A record's tuple holds its shape tuple, (IN,) built at run time: a collection untracks a
    # tuple of untracked items, and the free-threaded one visits in heap order, so an outer
    # tuple seen before its shape stays tracked until the next collection (3.13t: ~half).
    gc.collect()
    gc.collect()
    assert len(gc.get_objects()) - before < 1000  # not one (or two) per job, as JobRecord objects were
    record = store.get("job-42")
    assert (record.status, record.submitted, record.finished, record.shape, record.dtype) == \
        ("done", 1042.0, 2042.0, (IN,), "<f4")
    assert store.get_result("job-42")[0] == 42
    assert store.expire(now=2100.0, ttl_s=90.0, forget_after_s=1e9) == [f"job-{i}" for i in range(11)]
    assert store.get("job-3").status == "expired" and store.get("job-3").expired_at == 2100.0
    with pytest.raises(KeyError):
        store.get_result("job-3")


def test_file_store_files_are_json_and_npy_without_pickle(tmp_path):
    with InferenceService(lambda b: b.astype(np.float32), store=FileStore(tmp_path)) as svc:
        job = svc.result(svc.submit(np.arange(3.0), job_id="abc"), timeout=5)
    record = json.loads((tmp_path / "abc" / "record.json").read_text())
    assert record["status"] == "done" and record["shape"] == [3] and record["dtype"] == "<f8"
    assert np.load(tmp_path / "abc" / "result.npy", allow_pickle=False).tolist() == [0.0, 1.0, 2.0]
    assert not (tmp_path / "abc" / "input.npy").exists()
    assert sorted(os.listdir(tmp_path)) == [".lock", "abc"]
    assert job.dtype == np.float32


def test_an_unparsable_record_is_reported_not_skipped(tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "record.json").write_text("{not json")
    with pytest.warns(RuntimeWarning, match="broken/record.json"):
        store = FileStore(tmp_path)
    assert "broken/record.json" in store.problems[0]
    with InferenceService(lambda b: b, store=store) as svc:
        with pytest.raises(StoreError, match="broken/record.json"):
            svc.status("broken")
        with pytest.raises(StoreError, match="broken/record.json"):
            svc.submit(np.ones(1), job_id="broken")
        assert svc.stats()["submitted"] == 0
    assert (tmp_path / "broken" / "record.json").read_text() == "{not json"  # never overwritten


def test_one_open_file_store_per_directory(tmp_path):
    first = FileStore(tmp_path)
    with pytest.raises(StoreError, match="in use"):
        FileStore(tmp_path)
    first.close()
    FileStore(tmp_path).close()


def test_result_with_no_wait_returns_a_job_whose_status_reads_done():
    """A client polling status() and then result(timeout=0) never gets a TimeoutError for a
    job that already reads "done" (the status turns before the job is stored)."""
    import fastloop.serve as serve

    with serve.InferenceService(lambda x: x * 2, num_workers=2, store=serve.MemoryStore()) as svc:
        for i in range(300):
            job = svc.submit(np.full(4, float(i), np.float32))
            wait_for(lambda: svc.status(job) == "done", interval=0)  # polls as a client would, bounded
            np.testing.assert_array_equal(svc.result(job, timeout=0), np.full(4, 2.0 * i, np.float32))


def test_the_npy_codec_writes_np_saves_bytes_and_reads_every_layout_np_load_reads():
    import io

    from fastloop.serve import npy_codec

    arrays = [np.arange(6, dtype=np.int64).reshape(2, 3), np.ones((), np.float32), np.ones((0, 3)),
              np.zeros((), dtype=[("a", "<f4", (2,)), ("b", "<i2")]), np.array(["ab", "c"]),
              np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.arange(5)[::2], np.arange(4, dtype=">i4")]
    for array in arrays:
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        for _ in range(2):  # the first call learns the header, the second takes the fast path
            assert npy_codec.encode(array) == buffer.getvalue()
            back = npy_codec.decode(buffer.getvalue())
            assert back.dtype == array.dtype and back.shape == array.shape and back.flags.writeable
            np.testing.assert_array_equal(back, array)
    data = npy_codec.encode(np.ones(4, np.float32))
    with pytest.raises(ValueError):  # a body shorter than its known header promises: NumPy's own error
        npy_codec.decode(data[:-4])
    with pytest.raises(ValueError):
        npy_codec.decode(np.array([{"a": 1}], dtype=object).dumps())


def test_a_lone_submit_runs_at_once_without_waiting_max_delay():
    """The HTTP front's rule, in process: a worker that takes a job while no other is queued,
    held by another worker or admitted runs it at once. With a 60 s max_delay, a wait would
    time the result() out."""
    sizes: list[int] = []

    def model(batch: np.ndarray) -> np.ndarray:
        sizes.append(len(batch))
        return batch * 2

    with InferenceService(model, num_workers=1, max_batch=8, max_delay_s=60.0, store=MemoryStore()) as svc:
        for i in range(3):
            np.testing.assert_array_equal(svc.result(svc.submit(sample(i)), timeout=30), sample(i) * 2)
    assert sizes == [1, 1, 1]


def test_a_batch_still_fills_while_other_jobs_are_in_progress():
    """One worker is in a model call (another job in progress): the second worker's batch waits
    for more (max_delay 60 s) and runs once max_batch jobs are in it."""
    entered, release = threading.Event(), threading.Event()
    sizes: list[int] = []

    def model(batch: np.ndarray) -> np.ndarray:
        sizes.append(len(batch))
        if batch[0, 0] == 100:  # the first job holds its worker until released
            entered.set()
            assert release.wait(30)
        return batch

    with InferenceService(model, num_workers=2, max_batch=2, max_delay_s=60.0, store=MemoryStore()) as svc:
        first = svc.submit(np.full(IN, 100, np.float32))
        assert entered.wait(30)
        pair = [svc.submit(np.full(IN, i, np.float32)) for i in (1, 2)]
        for job in pair:
            assert svc.result(job, timeout=30)[0] in (1, 2)
        release.set()
        assert svc.result(first, timeout=30)[0] == 100
    assert sizes == [1, 2]
