"""The queue in Redis (RedisQueue + SharedInferenceService): jobs submitted by one process run
in another, priorities, cancellation across processes, reclaim of a killed worker's jobs
(queued ones rerun, running ones failed with the reason), the heartbeat of a slow live
worker, /metrics, and ``python -m fastloop serve --processes 2``.

Server processes are tests/serve_shared_child.py; the test process itself is a front with
num_workers=0 (it accepts and answers, it runs nothing), so what runs where is decided by the
test, not by timing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from redis_fixtures import prefix, redis, server  # noqa: E402,F401 (fixtures; skips without Redis)

from fastloop.serve import (FileStore, InferenceService, JobCancelled, JobFailed, MemoryStore, RedisQueue,  # noqa: E402
                            RedisStore, SharedInferenceService, create_service)
from fastloop.errors import QueueFull  # noqa: E402
from fastloop.serve.http import App  # noqa: E402
from fastloop.serve.http_inputs import NPY_TYPE, npy_bytes  # noqa: E402
from fastloop.serve.jobs import JobRecord  # noqa: E402
from fastloop.serve.redisqueue import LEVELS  # noqa: E402
from fastloop.serve.spec import Input  # noqa: E402
from fastloop.serve.metrics import render, service_registry  # noqa: E402
from waiting import read_until, wait_for  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = os.path.join(ROOT, "tests", "serve_shared_child.py")
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.fixture
def front(server, prefix):
    """A front-only service in the test process: accepts, answers, cancels; runs nothing."""
    svc = create_service(lambda b: b, num_workers=0, store=RedisStore(server.url, prefix=prefix),
                         queue=RedisQueue(visibility_timeout_s=1.0))
    yield svc
    svc.close(timeout=0)


class Child:
    """A server process (tests/serve_shared_child.py); stopped (or killed) at the end."""

    def __init__(self, server, prefix, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, CHILD, server.url, prefix, *args], env=ENV,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        line = self.proc.stdout.readline().decode()
        assert line.strip() == "ready", line + self.proc.stdout.read().decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def children():
    started: list[Child] = []
    yield started
    for child in started:
        child.stop()


def x(i: float) -> np.ndarray:
    return np.full(4, i, np.float32)


# ---------------------------------------------------------------- across processes


def test_a_job_submitted_here_runs_in_another_process_and_either_answers(front, server, prefix, children):
    ids = [front.submit(x(i)) for i in range(40)]
    assert front.stats()["queue_depth"] == 40
    children.append(Child(server, prefix, "--num-workers", "2", "--max-batch", "8"))
    for i, job in enumerate(ids):
        np.testing.assert_array_equal(front.result(job, timeout=20), x(i) * 2 + 1)
    assert front.status(ids[0]) == "done"
    assert front.stats()["queue_depth"] == 0


def test_workers_take_high_before_normal_before_low(front, server, prefix, children):
    order = ["low"] * 4 + ["normal"] * 4 + ["high"] * 4  # submitted lowest first
    ids = [(front.submit(x(i), priority=p), p) for i, p in enumerate(order)]
    assert front.stats()["queue_depth_by_priority"] == {"high": 4, "normal": 4, "low": 4}
    children.append(Child(server, prefix, "--num-workers", "1", "--max-batch", "1"))
    for job, _ in ids:
        front.result(job, timeout=20)
    started = sorted(ids, key=lambda item: front.record(item[0]).started)
    assert [p for _, p in started] == ["high"] * 4 + ["normal"] * 4 + ["low"] * 4


def test_a_batch_fills_with_the_higher_priority_first(front, server, prefix, children):
    lows = [front.submit(x(i), priority="low") for i in range(3)]
    highs = [front.submit(x(i), priority="high") for i in range(3)]
    children.append(Child(server, prefix, "--num-workers", "1", "--max-batch", "4"))
    for job in lows + highs:
        front.result(job, timeout=20)
    first = min(front.record(j).started for j in lows + highs)
    assert all(front.record(j).started == first for j in highs)  # all three in the first batch


def test_cancel_from_any_process_takes_a_queued_job_off_the_shared_queue(front, server, prefix, children):
    ids = [front.submit(x(i)) for i in range(6)]
    other = create_service(lambda b: b, num_workers=0, store=RedisStore(server.url, prefix=prefix),
                           queue=RedisQueue(visibility_timeout_s=1.0))  # another front: knows nothing of them
    try:
        assert other.cancel(ids[1]) and other.cancel(ids[4])
        assert not other.cancel(ids[1])  # already failed
        with pytest.raises(KeyError):
            other.cancel("no-such-job")
    finally:
        other.close()
    assert front.stats()["queue_depth"] == 4  # the entries left the queue
    children.append(Child(server, prefix, "--num-workers", "1", "--max-batch", "2"))
    for i, job in enumerate(ids):
        if i in (1, 4):
            with pytest.raises(JobCancelled):
                front.result(job, timeout=20)
            assert front.record(job).started is None  # it never ran
        else:
            np.testing.assert_array_equal(front.result(job, timeout=20), x(i) * 2 + 1)
    assert not front.cancel(ids[0])  # done


def test_a_killed_workers_jobs_are_reclaimed_queued_ones_rerun_running_ones_fail(front, server, prefix, children):
    running = [front.submit(x(i)) for i in range(2)]
    child = Child(server, prefix, "--num-workers", "1", "--max-batch", "2", "--model", "block")  # takes both at once
    children.append(child)
    wait_for(lambda: all(front.status(j) == "running" for j in running))
    queued = [front.submit(x(i)) for i in range(2, 5)]
    # a worker that took two entries and died before starting them
    client = redis.Redis.from_url(server.url)
    taken = client.xreadgroup("workers", "dead-worker", {f"{prefix}queue:normal": ">"}, count=2)
    assert len(taken[0][1]) == 2
    child.proc.kill()
    child.proc.wait()
    assert all(front.status(j) == "running" for j in running)
    children.append(Child(server, prefix, "--num-workers", "1", "--max-batch", "4"))
    for job in running:
        with pytest.raises(JobFailed, match="a worker process stopped while the job was running"):
            front.result(job, timeout=20)
    for i, job in enumerate(queued, start=2):
        np.testing.assert_array_equal(front.result(job, timeout=20), x(i) * 2 + 1)
    assert client.xpending(f"{prefix}queue:normal", "workers")["pending"] == 0
    assert sum(client.xlen(f"{prefix}queue:{level}") for level in LEVELS) == 0


def test_the_reclaimer_counts_what_it_reclaimed_in_stats_and_metrics(server, prefix):
    store = RedisStore(server.url, prefix=prefix)
    a = create_service(lambda b: b * 2 + 1, num_workers=0, store=store, queue=RedisQueue(visibility_timeout_s=0.3))
    try:
        jobs = [a.submit(x(i)) for i in range(3)]
        client = redis.Redis.from_url(server.url)
        client.xreadgroup("workers", "dead-worker", {f"{prefix}queue:normal": ">"}, count=3)
        b = create_service(lambda b: b * 2 + 1, num_workers=1, store=RedisStore(server.url, prefix=prefix),
                           queue=RedisQueue(visibility_timeout_s=0.3))
        try:
            for i, job in enumerate(jobs):
                np.testing.assert_array_equal(a.result(job, timeout=20), x(i) * 2 + 1)
            stats = b.stats()
            assert stats["reclaimed"] == {"rerun": 3, "failed": 0, "resumed": 0}
            text = render(service_registry(lambda: stats, dict, b.max_batch))  # what /metrics answers
            assert 'fastloop_serve_reclaimed_total{outcome="rerun"} 3.0' in text
            assert 'fastloop_serve_queue_depth_by_priority{priority="high"} 0.0' in text
            assert stats["wait_s_by_priority"]["normal"]["samples"] == 3
        finally:
            b.close()
    finally:
        a.close()


def test_a_live_worker_slower_than_the_visibility_timeout_keeps_its_job(front, server, prefix, children):
    # the model takes 3x the timeout; the heartbeat keeps the entry, so the second process
    # (idle, reclaiming every half timeout) leaves it alone. A timeout of 2 s: on a loaded
    # 2-core machine (free-threaded build, other suites beside it) a 0.5 s one saw a heartbeat late.
    children.append(Child(server, prefix, "--num-workers", "1", "--model", "slow", "--model-s", "6",
                          "--visibility-timeout-s", "2"))
    job = front.submit(x(3))
    wait_for(lambda: front.status(job) == "running")
    children.append(Child(server, prefix, "--num-workers", "1", "--visibility-timeout-s", "2"))
    np.testing.assert_array_equal(front.result(job, timeout=20), x(3) * 2 + 1)


# ---------------------------------------------------------------- deadlines


def test_the_deadline_is_stored_and_a_job_taken_after_it_fails_there_without_running(server, prefix):
    store = RedisStore(server.url, prefix=prefix)
    queue = RedisQueue()
    queue.bind(store)
    try:
        now = time.time()
        late, fresh = JobRecord.new("late", now - 1, (4,), "<f4"), JobRecord.new("fresh", now, (4,), "<f4")
        late.deadline, fresh.deadline = now - 0.5, now + 60
        for record in (late, fresh):
            assert queue.push(record, x(1), LEVELS.index("normal"), 100) == 1
        assert store.get("fresh").deadline == now + 60
        started, failed = queue.take_start(8, 0)  # what any worker process does
        assert [record.id for _, record, _ in started] == ["fresh"] and [r.id for r in failed] == ["late"]
        record = store.get("late")
        assert record.status == "failed" and record.error.startswith("deadline exceeded: still queued after 1")
        assert store.get_input("late") is None and queue.depth()["normal"] == 0
        assert queue.take_start(8, 0) == ([], [])  # its entry is gone: nobody runs it later
    finally:
        store.close()


def test_a_queued_job_no_worker_takes_fails_at_its_deadline(front):
    job = front.submit(x(1), timeout=0.3)
    record = front.record(job)
    assert record.deadline == pytest.approx(record.submitted + 0.3)
    with pytest.raises(JobFailed, match="deadline exceeded: still queued after"):
        front.result(job, timeout=10)  # failed by a process's keeper (no worker anywhere)
    assert front.stats()["deadline_exceeded"] == 1 and front.stats()["queue_depth"] == 0
    with pytest.raises(ValueError, match="timeout .*must be a number of seconds > 0"):
        front.submit(x(1), timeout=0)


def test_a_job_still_in_the_model_at_its_deadline_fails_and_the_process_keeps_serving(front, server, prefix,
                                                                                      children):
    children.append(Child(server, prefix, "--num-workers", "1", "--model", "slow", "--model-s", "3"))
    late = front.submit(x(1), timeout=0.5)
    wait_for(lambda: front.status(late) == "running")
    with pytest.raises(JobFailed, match="deadline exceeded: the model call was still running"):
        front.result(late, timeout=2.5)  # the model call takes 3 s: its result would be "done"
    after = front.submit(x(2))  # the replacement worker takes it while the stuck one sleeps
    np.testing.assert_array_equal(front.result(after, timeout=20), x(2) * 2 + 1)
    assert front.status(late) == "failed"  # the stuck call's late result was not written over it


def test_a_deadline_outlives_the_process_that_took_the_submit(front, server, prefix, children, tmp_path):
    first = create_service(lambda b: b, num_workers=0, store=RedisStore(server.url, prefix=prefix),
                           queue=RedisQueue(visibility_timeout_s=1.0), timeout=0.5)  # a service default
    late = first.submit(np.full(4, 7, np.float32))
    deadline = first.record(late).deadline
    first.close(timeout=0)  # the process that accepted it is gone
    on_time = front.submit(np.full(4, 8, np.float32), timeout=60)
    wait_for(lambda: time.time() > deadline)
    log = tmp_path / "ran.log"
    children.append(Child(server, prefix, "--num-workers", "1", "--max-batch", "4", "--model", "logged",
                          "--log", str(log)))
    np.testing.assert_array_equal(front.result(on_time, timeout=20), np.full(4, 17, np.float32))
    with pytest.raises(JobFailed, match="deadline exceeded: still queued"):
        front.result(late, timeout=10)
    assert log.read_text().split() == ["8"]  # the late job never reached the model


def test_priority_reaches_the_shared_queue_from_every_input_encoding(server, prefix, tmp_path):
    from test_serve_http import call, serving

    np.save(tmp_path / "x.npy", x(3))
    npy = {"content-type": NPY_TYPE}
    svc = create_service(lambda b: b, num_workers=0, store=RedisStore(server.url, prefix=prefix), queue=RedisQueue())
    named = create_service(lambda a, b: a + b, num_workers=0, store=RedisStore(server.url, prefix=prefix + "named:"),
                           queue=RedisQueue(), inputs={"a": Input("float32", (2,)), "b": Input("float32", (2,))})
    row = np.zeros((), dtype=[("a", "<f4", (2,)), ("b", "<f4", (2,))])
    try:
        with serving(App(svc, input_root=str(tmp_path))) as base:
            assert call(base, "POST", "/v1/jobs", {"inputs": x(1).tolist(), "priority": "high"})[0] == 202
            assert call(base, "POST", "/v1/jobs", {"path": "x.npy", "priority": "high"})[0] == 202
            for query in ("?priority=high", "?priority=low", ""):
                assert call(base, "POST", f"/v1/jobs{query}", raw=npy_bytes(x(2)), headers=npy)[0] == 202
            status, _, body = call(base, "POST", "/v1/jobs?priority=urgent", raw=npy_bytes(x(2)), headers=npy)
            assert status == 400 and "priority must be one of" in body["error"]
        assert svc.stats()["queue_depth_by_priority"] == {"high": 3, "normal": 1, "low": 1}
        with serving(App(named)) as base:
            assert call(base, "POST", "/v1/jobs", {"inputs": {"a": [1, 2], "b": [3, 4]}, "priority": "low"})[0] == 202
            assert call(base, "POST", "/v1/jobs?priority=high", raw=npy_bytes(row), headers=npy)[0] == 202
        assert named.stats()["queue_depth_by_priority"] == {"high": 1, "normal": 0, "low": 1}
    finally:
        svc.close(timeout=0)
        named.close(timeout=0)


# ---------------------------------------------------------------- bad input


def test_a_full_shared_queue_raises_queue_full_and_bad_priorities_are_named(server, prefix):
    svc = create_service(lambda b: b, num_workers=0, max_queue=3, store=RedisStore(server.url, prefix=prefix),
                         queue=RedisQueue())
    try:
        for i in range(3):
            svc.submit(x(i), priority=LEVELS[i])
        with pytest.raises(QueueFull, match="shared queue is full"):
            svc.submit(x(9))
        assert svc.stats()["rejected"] == 1
        with pytest.raises(ValueError, match="priority must be one of 'high', 'normal', 'low'"):
            svc.submit(x(1), priority="urgent")
        assert svc.stats()["queue_depth"] == 3
    finally:
        svc.close()


def test_the_queue_in_redis_needs_a_redis_store_and_priorities_need_it(tmp_path):
    with pytest.raises(TypeError, match="RedisQueue needs the service's store to be a RedisStore, not FileStore"):
        create_service(lambda b: b, store=FileStore(str(tmp_path / "jobs")), queue=RedisQueue())
    with pytest.raises(ValueError, match="visibility_timeout_s must be > 0"):
        RedisQueue(visibility_timeout_s=0)
    with pytest.raises(ValueError, match="num_workers must be an int >= 1"):
        InferenceService(lambda b: b, num_workers=0, store=FileStore(str(tmp_path / "jobs2")))
    with InferenceService(lambda b: b, store=FileStore(str(tmp_path / "jobs3"))) as svc:
        with pytest.raises(ValueError, match="needs a queue with priorities"):
            svc.submit(x(1), priority="high")


def test_inference_service_refuses_a_queue_and_the_factory_picks_the_class(server, prefix):
    """InferenceService(queue=...) used to return a SharedInferenceService in silence: it
    refuses now, naming what to use; create_service() picks the class from the queue."""
    store = RedisStore(server.url, prefix=prefix)
    with pytest.raises(TypeError, match="create_service.*SharedInferenceService"):
        InferenceService(lambda b: b, store=store, queue=RedisQueue())
    with create_service(lambda b: b, store=MemoryStore()) as plain:
        assert type(plain) is InferenceService
    with create_service(lambda b: b + 1, num_workers=1, store=store, queue=RedisQueue()) as shared:
        assert type(shared) is SharedInferenceService
        assert shared.result(shared.submit(x(1)), timeout=30) == pytest.approx(x(1) + 1)


# ---------------------------------------------------------------- python -m fastloop serve --processes


def _children_of(pid: int) -> set[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return {int(p) for p in f.read().split()}


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"),
                    reason="needs Linux's /proc/PID/task/PID/children to find the server processes")
def test_cli_processes_share_one_port_and_a_killed_one_is_replaced(server, tmp_path):
    import socket

    import fastloop as fl
    from fastloop.serve import Client, arch_of

    fl.nn.manual_seed(0)
    mlp = fl.nn.Sequential(fl.nn.Linear(4, 8), fl.nn.ReLU(), fl.nn.Linear(8, 3))
    ckpt = fl.Checkpointer(str(tmp_path / "ckpts"))
    ckpt.save(fl.nn.training_state(mlp, arch=arch_of(mlp), step=1), 1)
    ckpt.wait()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "fastloop", "serve", "--model", str(tmp_path / "ckpts"),
                             "--port", str(port), "--processes", "2", "--store", server.url.rsplit("/", 1)[0] + "/5",
                             "--visibility-timeout-s", "1", "--log-level", "info"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        client = Client(f"http://127.0.0.1:{port}", timeout=5)
        wait_for(lambda: proc.poll() is not None or len(_children_of(proc.pid)) == 2, timeout=30)
        wait_for(lambda: proc.poll() is not None or _healthy(client), timeout=30)
        assert proc.poll() is None, proc.stdout.read().decode()
        first = _children_of(proc.pid)
        jobs = [(client.submit(inputs=x(i), priority=LEVELS[i % 3]), i) for i in range(30)]
        for job, i in jobs:
            np.testing.assert_allclose(client.result(job, timeout=20), mlp(x(i)[None])[0], rtol=1e-6)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            assert 'fastloop_serve_queue_depth_by_priority{priority="high"} 0' in answer.read().decode()
        victim = sorted(first)[0]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: len(_children_of(proc.pid) - first) == 1, timeout=30)  # a new one took its place
        job = client.submit(inputs=x(7))
        np.testing.assert_allclose(client.result(job, timeout=20), mlp(x(7)[None])[0], rtol=1e-6)
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            left = _children_of(proc.pid)
            for pid in left:
                os.kill(pid, signal.SIGUSR1)  # its stacks, for the failure message
            stacks = read_until(proc.stdout, lambda out: out.count(b"Current thread") >= len(left), timeout=10)
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            proc.kill()
            pytest.fail(f"the server did not stop within 60 s; processes left: {left}; "
                        f"{(stacks + proc.stdout.read()).decode()[-12000:]}")
        output = proc.stdout.read().decode()
        assert rc == 0, output
        assert f"server process {victim} died (signal 9); starting another" in output, output
        assert "Traceback" not in output, output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _healthy(client) -> bool:
    try:
        return bool(client.healthz())
    except OSError:
        return False


def test_a_front_hears_the_status_changes_of_jobs_run_in_another_process(front, server, prefix, children):
    import threading

    heard: list[tuple[str, str]] = []
    done = threading.Event()

    def listener(job_id: str, status: str) -> None:
        heard.append((job_id, status))
        if status == "done":
            done.set()

    unsubscribe = front.subscribe(listener)
    try:
        children.append(Child(server, prefix, "--num-workers", "1"))
        job = front.submit(x(1))
        assert done.wait(20), heard
        assert [s for j, s in heard if j == job] == ["queued", "running", "done"]  # queued here, the rest there
    finally:
        unsubscribe()
