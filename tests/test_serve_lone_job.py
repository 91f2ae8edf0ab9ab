"""The pieces a lone job's path was made cheaper with keep their contracts: job ids, the
job's end latch (threading.Event's interface), one input's batch, a MemoryStore record's
round trip, and result() of a job that ended in this process."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

from fastloop.serve import Input, InferenceService, JobFailed, MemoryStore
from fastloop.serve._job_table import _Finished, copy_record
from fastloop.serve.batching import run_group
from fastloop.serve.jobs import JobRecord, check_job_id, new_job_id


def test_new_job_ids_are_32_hex_digits_valid_and_distinct():
    ids = [new_job_id() for _ in range(1000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) and check_job_id(i) == i for i in ids)
    assert len(set(ids)) == len(ids)


def test_job_ids_from_many_threads_and_a_forked_child_are_all_distinct():
    """The ids are cut from a pool of random bytes: threads never get the same slice, and a
    forked child draws its own (the parent's pool, copied, would repeat the parent's ids)."""
    import os

    new_job_id()  # the pool holds unused bytes at the fork
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.extend(new_job_id() for _ in range(600))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            os.write(write, " ".join(new_job_id() for _ in range(8)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split()
    assert os.waitpid(pid, 0)[1] == 0
    mine = [new_job_id() for _ in range(8)]
    assert len(child) == 8 and len(set(got + mine + child)) == len(got) + 16


def test_finished_latch_times_out_unset_and_wakes_every_waiter_once_set():
    latch = _Finished()
    assert not latch.is_set() and latch.wait(0) is False and latch.wait(0.01) is False
    woke, started = [], threading.Barrier(5)

    def waiter():
        started.wait(timeout=5)
        woke.append(latch.wait(10))

    threads = [threading.Thread(target=waiter) for _ in range(4)]
    for thread in threads:
        thread.start()
    started.wait(timeout=5)
    latch.set()
    latch.set()  # a second set() changes nothing (and does not raise)
    for thread in threads:
        thread.join(timeout=10)
    assert woke == [True] * 4
    assert latch.is_set() and latch.wait(0) is True and latch.wait() is True


def test_one_input_runs_as_a_private_contiguous_batch_of_one():
    x = np.arange(6, dtype=np.float32)[::2]  # not contiguous
    seen = []

    def model(batch):
        seen.append(batch)
        batch[0, 0] = -1.0  # a model that writes to its batch leaves the job's input alone
        return batch * 2

    [(row, error)] = run_group(model, [x])
    assert error is None and seen[0].shape == (1, 3) and seen[0].flags.c_contiguous
    assert x.tolist() == [0.0, 2.0, 4.0] and row.tolist() == [-2.0, 4.0, 8.0]


def test_record_copy_is_equal_and_independent():
    record = JobRecord.new("a-1", 12.5, (3,), "<f4", rows=2)
    record.row_errors = [[1, "bad"]]
    copy = copy_record(record)
    assert copy == record and copy is not record and type(copy) is JobRecord
    copy.status = "running"
    assert record.status == "queued"


def test_memory_store_keeps_every_field_of_a_record():
    store = MemoryStore()
    record = JobRecord.new("b-2", 1.0, (4,), "<f4", rows=3)
    assert store.create(record, None)
    record.status, record.error, record.deadline, record.row_errors = "failed", "boom", 9.0, [[0, "x"]]
    store.update(record)
    assert store.get("b-2") == record


def test_result_of_a_job_ended_here_matches_the_store():
    def model(batch):
        if (batch < 0).any():
            raise ValueError("negative")
        return batch + 1

    with InferenceService(model, num_workers=1, store=MemoryStore(), inputs=Input(np.float32, (2,))) as svc:
        good = svc.submit(np.ones(2, np.float32))
        assert svc.result(good, timeout=10).tolist() == [2.0, 2.0]
        assert svc.record(good) == svc.store.get(good) and svc.status(good) == "done"
        bad = svc.submit(-np.ones(2, np.float32))
        with pytest.raises(JobFailed, match="ValueError: negative"):
            svc.result(bad, timeout=10)
        assert svc.stats()["done"] == 1 and svc.stats()["failed"] == 1
        assert svc.stats()["latency_s"]["samples"] == 1
