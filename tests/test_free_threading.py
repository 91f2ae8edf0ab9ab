"""Many threads at once on ONE shared object of each kind the binding declares safe without
the GIL (Py_MOD_GIL_NOT_USED): Queue, Loader (several epochs on one source), Monitor,
Checkpointer, fastloop.nn models and optimizers, InferenceService. Each test starts its
threads behind a barrier so they really overlap, and checks that nothing is lost, doubled or
torn. With the GIL they check the C side's locks; on a free-threaded build (3.13t) they are
the tests the audit in docs/development.md relies on.

FASTLOOP_TEST_THREADS sets the thread count (default 8; `make test-threads` uses 32 and
also runs the thread-heavy test files under pytest-run-parallel).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections import Counter
from typing import Callable

import numpy as np
import pytest

import fastloop as fl

THREADS = int(os.environ.get("FASTLOOP_TEST_THREADS", "8"))


def run_at_once(body: Callable[[int], object], threads: int = THREADS, timeout: float = 60.0) -> list:
    """Runs body(i) for i in range(threads) on that many threads started together; returns
    their results in order, or raises the first exception one of them raised."""
    barrier = threading.Barrier(threads)
    results: list = [None] * threads
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout)
            results[i] = body(i)
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)
            barrier.abort()

    workers = [threading.Thread(target=run, args=(i,), name=f"ft-{i}") for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout)
    assert not any(t.is_alive() for t in workers), f"a thread was still running after {timeout} s"
    if errors:
        raise errors[0]
    return results


def test_one_queue_many_producers_and_consumers_lose_and_double_nothing():
    q = fl.Queue(maxsize=64)
    producers = THREADS // 2
    consumers = THREADS - producers
    per_producer = 500 * consumers  # so each consumer takes the same count: 500 * producers

    def body(i: int) -> list:
        if i < producers:
            for k in range(per_producer):
                q.put((i, k), timeout=30.0)
            return []
        return [q.get(timeout=30.0) for _ in range(500 * producers)]

    results = run_at_once(body)
    items = [item for got in results for item in got]
    assert sorted(items) == [(i, k) for i in range(producers) for k in range(per_producer)], "lost or doubled"
    assert q.qsize() == 0
    for got in results:  # FIFO: a consumer sees each producer's items in the order put
        for i in range(producers):
            mine = [k for p, k in got if p == i]
            assert mine == sorted(mine)


def test_one_queue_get_many_and_put_from_many_threads_with_close_during_traffic():
    q = fl.Queue(maxsize=32)
    taken = Counter()
    lock = threading.Lock()

    def body(i: int) -> int:
        if i == 0:  # closes once enough has gone through
            while True:
                with lock:  # the consumers update the Counter under it: read it under it too
                    if sum(taken.values()) >= 5000:  # (unlocked, 3.13t raised "changed size")
                        break
                q.put(-1, timeout=30.0)
            q.close()
            return 0
        n = 0
        try:
            while True:
                if i % 2:
                    q.put(i, timeout=30.0)
                else:
                    got = q.get_many(16, timeout=30.0)
                    with lock:
                        taken.update(got)
                n += 1
        except fl.Closed:
            return n

    run_at_once(body)
    assert sum(taken.values()) >= 5000


def test_one_monitor_takes_scalars_from_many_threads_and_writes_every_one(tmp_path):
    path = tmp_path / "m.csv"
    per_thread = 500
    with fl.Monitor(interval_s=0, sinks=[fl.CSVSink(str(path))], record_wait_s=5.0) as mon:
        run_at_once(lambda i: [mon.scalar(f"t{i}", float(k), k) for k in range(per_thread)])
    rows = path.read_text().splitlines()[1:]
    counts = Counter(row.split(",")[2] for row in rows)
    assert counts == {f"t{i}": per_thread for i in range(THREADS)}
    for i in range(THREADS):  # each thread's records stay in its own order
        steps = [int(row.split(",")[1]) for row in rows if row.split(",")[2] == f"t{i}"]
        assert steps == list(range(per_thread))


def test_one_checkpointer_saved_from_many_threads_keeps_each_state_intact(tmp_path):
    states = {i: {"w": np.full((64, 64), i, np.float32), "step": i} for i in range(THREADS)}
    with fl.Checkpointer(str(tmp_path), keep=THREADS) as ckpt:
        run_at_once(lambda i: ckpt.save(states[i], i + 1, timeout=60.0))
        assert ckpt.wait(timeout=60.0)  # the last save's write may still be in flight
        assert [c.step for c in ckpt.checkpoints()] == list(range(1, THREADS + 1))
        for i in range(THREADS):
            back = ckpt.load(i + 1)
            np.testing.assert_array_equal(back["w"], states[i]["w"])
            assert back["step"] == i


def test_many_loaders_over_one_source_each_yield_every_sample_once():
    x = np.arange(4096 * 4, dtype=np.float32).reshape(4096, 4)
    y = np.arange(4096)

    def body(i: int) -> list[int]:
        seen = []
        with fl.Loader((x, y), batch_size=128, shuffle=True, seed=i, num_workers=2) as loader:
            for xb, yb in loader:
                np.testing.assert_array_equal(xb[:, 0], yb * 4)
                seen.extend(yb.tolist())
        return seen

    for seen in run_at_once(body):
        assert sorted(seen) == list(range(4096))


def test_one_nn_model_forward_from_many_threads_while_its_lr_changes():
    fl.nn.manual_seed(3)
    model = fl.nn.Sequential(fl.nn.Linear(32, 64), fl.nn.ReLU(), fl.nn.Linear(64, 8))
    opt = fl.nn.SGD(model, lr=0.1)
    x = np.random.default_rng(4).standard_normal((256, 32)).astype(np.float32)
    expected = model(x)

    def body(i: int) -> None:
        for k in range(50):
            if i == 0:
                opt.lr = 0.01 * (k % 7)  # set_hyper with a dict, read under the model's lock
            else:
                np.testing.assert_array_equal(model(x), expected)

    run_at_once(body)
    assert opt.lr == pytest.approx(0.01 * (49 % 7))


def test_one_nn_model_trained_from_many_threads_counts_every_step():
    fl.nn.manual_seed(5)
    model = fl.nn.Sequential(fl.nn.Linear(16, 32), fl.nn.ReLU(), fl.nn.Linear(32, 4))
    opt = fl.nn.Adam(model, lr=1e-3)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((64, 16)).astype(np.float32)
    y = rng.standard_normal((64, 4)).astype(np.float32)
    losses = run_at_once(lambda i: [model.train_step(x, y, opt=opt) for _ in range(20)])
    assert opt.steps == 20 * THREADS
    assert all(np.isfinite(loss) for per in losses for loss in per)
    assert model.train_step(x, y, opt=opt) < losses[0][0]


def test_one_inference_service_takes_jobs_from_many_submitters(tmp_path):
    from fastloop.serve import FileStore, InferenceService

    fl.nn.manual_seed(7)
    model = fl.nn.Sequential(fl.nn.Linear(8, 16), fl.nn.ReLU(), fl.nn.Linear(16, 2))
    rows = np.random.default_rng(8).standard_normal((THREADS, 20, 8)).astype(np.float32)
    with InferenceService(model, num_workers=4, max_batch=16, store=FileStore(str(tmp_path))) as svc:
        def body(i: int) -> np.ndarray:
            ids = [svc.submit(row) for row in rows[i]]
            return np.stack([svc.result(job, timeout=30.0) for job in ids])

        results = run_at_once(body)
    for i in range(THREADS):
        np.testing.assert_allclose(results[i], model(rows[i]), rtol=1e-5, atol=1e-6)


GIL_CHECK = """
import importlib, pkgutil, sys, warnings
import fastloop
turned_on = []
for module in pkgutil.walk_packages(fastloop.__path__, "fastloop."):
    if module.name == "fastloop.__main__":  # runs the CLI
        continue
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            importlib.import_module(module.name)
        except ImportError:  # an optional dependency this interpreter lacks (torch)
            continue
    turned_on += [f"{module.name}: {w.message}" for w in caught if "(GIL) has been enabled" in str(w.message)]
print("\\n".join(turned_on) or ("ok" if not sys._is_gil_enabled() else "the GIL is on, no module said why"))
"""


@pytest.mark.skipif(getattr(sys, "_is_gil_enabled", lambda: True)(),
                    reason="needs a free-threaded interpreter with the GIL off (make test-ft)")
def test_importing_any_fastloop_module_keeps_the_gil_off():
    """Every module of the package, its C extensions (_core, _cuda) and what they import: none
    may turn the GIL back on (an extension without Py_MOD_GIL_NOT_USED does, with a warning)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}  # no override: the modules decide
    done = subprocess.run([sys.executable, "-c", GIL_CHECK], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok", done.stdout
