"""Jobs of several rows: an input with a leading batch axis is one job whose rows batch with
other jobs' rows and come back in order; the queue's bound counts rows; a row that fails
fails only its own entry."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import fastloop as fl
from fastloop.serve import (FileStore, InferenceService, Input, JobCancelled, JobFailed, MemoryStore, RowsFailed)
from waiting import wait_for

IN, OUT = 16, 4


@pytest.fixture(scope="module")
def mlp():
    fl.nn.manual_seed(0)
    return fl.nn.Sequential(fl.nn.Linear(IN, 32), fl.nn.ReLU(), fl.nn.Linear(32, OUT))


class Gate:
    """Doubles its batch once released; records each call's batch size and first column."""

    def __init__(self, fail_below: float | None = None) -> None:
        self.open = threading.Event()
        self.calls: list[list[float]] = []
        self.fail_below = fail_below

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.calls.append([float(row[0]) for row in batch])
        assert self.open.wait(10), "the test never released the gate"
        if self.fail_below is not None and (batch[:, 0] < self.fail_below).any():
            raise ValueError("a negative row")
        return batch * 2


def rows(first: float, n: int, width: int = 2) -> np.ndarray:
    return np.arange(first, first + n, dtype=np.float64)[:, None].repeat(width, 1)


def test_a_job_of_several_rows_returns_them_in_order_as_the_model_computes_them(mlp):
    x = np.random.default_rng(0).standard_normal((8, IN)).astype(np.float32)
    with InferenceService(mlp, store=MemoryStore()) as svc:
        job = svc.submit(x)
        np.testing.assert_allclose(svc.result(job, timeout=5), mlp(x), rtol=1e-5, atol=1e-6)
        record = svc.record(job)
        assert (record.status, record.rows, record.shape, record.row_errors) == ("done", 8, (8, IN), None)
        one = svc.submit(x[0])  # one row stays one row: no batch axis in its result
        assert svc.result(one, timeout=5).shape == (OUT,) and svc.record(one).rows is None
        listed = svc.result(svc.submit(x[:2].tolist()), timeout=5)  # nested lists too
        np.testing.assert_allclose(listed, mlp(x[:2]), rtol=1e-5, atol=1e-6)


def test_rows_of_several_jobs_batch_together_up_to_max_batch():
    gate = Gate()
    with InferenceService(gate, num_workers=1, max_batch=8, max_delay_s=0, store=MemoryStore(),
                          inputs=Input("float64", (2,))) as svc:
        first = svc.submit([0.0, 0.0])
        wait_for(lambda: gate.calls)  # the worker holds "first": the rest queue
        jobs = [svc.submit(rows(10 * (j + 1), 3)) for j in range(3)]
        gate.open.set()
        for j, job in enumerate(jobs):
            np.testing.assert_array_equal(svc.result(job, timeout=5), 2 * rows(10 * (j + 1), 3))
        svc.result(first, timeout=5)
        # 9 rows of 3 jobs: one batch of 8 (rows of all three), then the last row alone
        assert gate.calls[1:] == [[10, 11, 12, 20, 21, 22, 30, 31], [32]]
        assert svc.stats()["batch_sizes"] == {1: 2, 8: 1}


def test_the_queue_bound_counts_rows():
    gate = Gate()
    with InferenceService(gate, num_workers=1, max_batch=1, max_queue=10, store=MemoryStore(),
                          inputs=Input("float64", (2,))) as svc:
        busy = svc.submit([0.0, 0.0])
        wait_for(lambda: gate.calls)
        big = svc.submit(rows(1, 8))
        assert svc.stats()["queue_depth"] == 8
        with pytest.raises(fl.QueueFull):
            svc.submit(rows(1, 3))
        small = svc.submit(rows(1, 2))  # exactly fills it
        with pytest.raises(fl.QueueFull):
            svc.submit([1.0, 1.0])
        with pytest.raises(ValueError, match="11 rows, more than the queue holds .max_queue=10."):
            svc.submit(rows(1, 11))
        assert svc.stats()["rejected"] == 2
        gate.open.set()
        for job in (busy, big, small):
            svc.result(job, timeout=5)
        assert svc.stats()["queue_depth"] == 0


def test_a_row_that_fails_fails_its_own_entry_and_the_others_are_answered():
    gate = Gate(fail_below=0)
    gate.open.set()
    with InferenceService(gate, max_batch=4, store=MemoryStore(), inputs=Input("float64", (2,))) as svc:
        x = rows(0, 6)
        x[2] = -1.0
        x[5] = -5.0
        job = svc.submit(x)
        with pytest.raises(RowsFailed, match=r"2 of 6 rows failed \(row 2: ValueError: a negative row\)") as failed:
            svc.result(job, timeout=5)
        assert failed.value.errors == {2: "ValueError: a negative row", 5: "ValueError: a negative row"}
        expected = 2 * x
        expected[[2, 5]] = 0
        np.testing.assert_array_equal(failed.value.result, expected)
        assert svc.status(job) == "done"
        assert svc.record(job).row_errors == [[2, "ValueError: a negative row"], [5, "ValueError: a negative row"]]

        every = svc.submit(-rows(1, 3))
        with pytest.raises(JobFailed, match="every one of the 3 rows failed") as all_failed:
            svc.result(every, timeout=5)
        assert not isinstance(all_failed.value, RowsFailed) and svc.status(every) == "failed"


def test_named_inputs_take_several_rows_along_each_inputs_leading_axis():
    def model(a, b):
        return {"sum": a.sum(axis=1) + b, "b": b}

    with InferenceService(model, store=MemoryStore(),
                          inputs={"a": Input("float32", (2,)), "b": Input("int64", ())}) as svc:
        out = svc.result(svc.submit({"a": [[1, 2], [3, 4], [5, 6]], "b": [10, 20, 30]}), timeout=5)
        assert out["sum"].tolist() == [13.0, 27.0, 41.0] and out["b"].tolist() == [10, 20, 30]
        with pytest.raises(ValueError, match="the same number of rows"):
            svc.submit({"a": [[1, 2], [3, 4]], "b": [10, 20, 30]})
        with pytest.raises(ValueError, match="the same number of rows"):
            svc.submit({"a": [[1, 2], [3, 4]], "b": 10})
        structured = np.zeros(2, dtype=[("a", np.float32, (2,)), ("b", np.int64)])
        structured["a"], structured["b"] = [[1, 1], [2, 2]], [1, 2]
        assert svc.result(svc.submit(structured), timeout=5)["sum"].tolist() == [3.0, 6.0]


def test_a_queued_job_of_several_rows_is_cancelled_whole_and_none_of_its_rows_run():
    gate = Gate()
    with InferenceService(gate, num_workers=1, max_batch=2, store=MemoryStore(), inputs=Input("float64", (2,))) as svc:
        busy = svc.submit([0.0, 0.0])
        wait_for(lambda: gate.calls)
        job = svc.submit(rows(1, 5))
        assert svc.cancel(job)
        after = svc.submit([9.0, 9.0])
        gate.open.set()
        with pytest.raises(JobCancelled):
            svc.result(job, timeout=5)
        svc.result(after, timeout=5)
        svc.result(busy, timeout=5)
        assert gate.calls == [[0.0], [9.0]] and svc.stats()["queue_depth"] == 0


def test_a_deadline_fails_a_job_of_several_rows_whose_rows_are_still_queued():
    gate = Gate()
    with InferenceService(gate, num_workers=1, max_batch=2, store=MemoryStore(), inputs=Input("float64", (2,))) as svc:
        busy = svc.submit([0.0, 0.0])
        wait_for(lambda: gate.calls)
        job = svc.submit(rows(1, 4), timeout=0.05)
        with pytest.raises(JobFailed, match="deadline exceeded"):
            svc.result(job, timeout=10)
        gate.open.set()
        svc.result(busy, timeout=5)
        wait_for(lambda: svc.stats()["queue_depth"] == 0)
        assert gate.calls == [[0.0]]


def test_a_job_of_several_rows_left_queued_runs_after_a_restart(tmp_path):
    gate = Gate()
    store = FileStore(tmp_path, durable=False)
    svc = InferenceService(gate, num_workers=1, store=store, inputs=Input("float64", (2,)))
    busy = svc.submit([0.0, 0.0])
    wait_for(lambda: gate.calls)
    job = svc.submit(rows(1, 3), job_id="several")
    svc._queue.close(immediate=True)  # as a killed process: nothing more is taken
    store.close()
    with InferenceService(lambda b: b + 1, store=FileStore(tmp_path), inputs=Input("float64", (2,))) as again:
        np.testing.assert_array_equal(again.result(job, timeout=5), rows(1, 3) + 1)
        assert again.stats()["requeued_at_start"] == 1
        assert again.status(busy) == "failed"  # it was running: not rerun
    gate.open.set()  # only now may the first service's model call end
    svc.close(timeout=0)


def test_many_jobs_of_several_rows_from_many_threads_each_get_their_own_rows(mlp):
    def square(batch):
        return batch * batch

    with InferenceService(square, num_workers=3, max_batch=7, max_delay_s=0.001, store=MemoryStore(),
                          inputs=Input("float64", (2,))) as svc:
        errors: list[str] = []

        def client(c: int) -> None:
            for k in range(30):
                n = 1 + (c + k) % 9
                x = rows(1000 * c + 10 * k, n)
                got = svc.result(svc.submit(x), timeout=30)
                if not np.array_equal(got, x * x):
                    errors.append(f"client {c} job {k}")

        threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors and not any(t.is_alive() for t in threads)
        assert svc.stats()["queue_depth"] == 0 and svc.stats()["running"] == 0
