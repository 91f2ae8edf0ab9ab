"""The queue in Redis across a Redis that comes back older than it was (killed, restarted from
its last snapshot) or whose answer to a take was lost: the jobs whose outcome Redis lost are
run again by the process that held them, never failed as "a worker process stopped while the
job was running" while that process lives (issue 26: 3 such jobs in 1 of 5 runs of "kill -9
Redis mid-load, restart it" with --processes 2)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from redis_fixtures import redis  # noqa: F401 (skips without Redis)
from redis_launcher import RedisServer  # noqa: E402

from fastloop.serve import JobFailed, RedisQueue, RedisStore, StoreUnavailable, create_service  # noqa: E402
from test_serve import Gate  # noqa: E402
from waiting import wait_for  # noqa: E402


@pytest.fixture
def own_server(tmp_path):
    server = RedisServer(str(tmp_path))
    server.start()
    yield server
    if server.process.poll() is None:
        server.process.kill()
        server.process.wait()


def final(svc, job: str) -> str:
    try:
        svc.result(job, timeout=30)
        return "done"
    except JobFailed as error:
        return f"failed: {error.reason}"


@pytest.mark.filterwarnings("ignore:InferenceService:RuntimeWarning")
def test_jobs_that_a_redis_restarted_from_an_older_snapshot_shows_running_are_run_again_not_failed(own_server):
    gate = Gate(wait_s=20)
    store = RedisStore(own_server.url, socket_timeout_s=0.5)
    with create_service(gate, num_workers=1, max_batch=4, max_delay_s=0.02, store=store,
                        queue=RedisQueue(visibility_timeout_s=3)) as svc:
        jobs = [svc.submit(np.full(2, float(i)), job_id=f"j{i}") for i in range(3)]
        wait_for(lambda: len(gate.seen) == 3)  # one batch of 3, running in Redis too
        own_server.client().save()  # the snapshot Redis comes back with: those jobs running
        gate.open.set()
        assert [final(svc, job) for job in jobs] == ["done"] * 3
        own_server.stop()  # kill -9: what came after the snapshot is lost
        own_server.start()
        wait_for(lambda: len(gate.seen) == 6, timeout=30)  # the owner ran them again
        assert [final(svc, job) for job in jobs] == ["done"] * 3
        np.testing.assert_array_equal(svc.result("j2", timeout=5), [4.0, 4.0])
        assert svc.stats()["reclaimed"]["failed"] == 0 and svc.stats()["reclaimed"]["resumed"] == 3
    store.close()


@pytest.mark.filterwarnings("ignore:InferenceService:RuntimeWarning")
def test_jobs_started_by_a_take_whose_answer_was_lost_are_run_not_failed(own_server, monkeypatch):
    gate = Gate(wait_s=20)
    gate.open.set()
    store = RedisStore(own_server.url, socket_timeout_s=0.5)
    queue = RedisQueue(visibility_timeout_s=3)
    real = RedisQueue._call_take_start
    lost = threading.Event()

    def answer_lost(self, count, taken):
        flat = real(self, count, taken)
        if flat and not lost.is_set():  # the script ran (jobs running in Redis); its answer never came
            lost.set()
            raise StoreUnavailable("connection lost before the reply to the take")
        return flat

    monkeypatch.setattr(RedisQueue, "_call_take_start", answer_lost)
    with create_service(gate, num_workers=1, max_batch=4, store=store, queue=queue) as svc:
        jobs = [svc.submit(np.full(2, float(i)), job_id=f"k{i}") for i in range(3)]
        assert [final(svc, job) for job in jobs] == ["done"] * 3
        assert lost.is_set() and svc.stats()["reclaimed"]["failed"] == 0
    store.close()
