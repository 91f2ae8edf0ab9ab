"""Loader(mode="threads") over Python code: a map-style dataset, transforms and a collate_fn run
in worker threads of this process (no fork, no serialization), each with its own
get_worker_info() and worker_init_fn; errors name the worker and the sample; sample_rng() draws
the same in every mode; mode="auto" picks threads on a free-threaded interpreter. And a Loader
is safe from many threads: closes from any thread at once, a close racing an iteration, a
Loader freed by the code its own worker runs, and exit with its workers still running."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest

import fastloop
from fastloop.data import loader as loader_module
from synthetic import Samples
from waiting import wait_until

ROUNDS = int(os.environ.get("FASTLOOP_STRESS_ROUNDS", "40"))


class WorkerThreads:
    """A worker_init_fn noting each worker thread's kernel id: the test counts the threads of
    its own Loader, not every loader thread of the process."""

    def __init__(self) -> None:
        self.ids: set[int] = set()
        self.lock = threading.Lock()

    def __call__(self, worker_id: int) -> None:
        with self.lock:
            self.ids.add(threading.get_native_id())

    def alive(self) -> int:
        return sum(os.path.exists(f"/proc/self/task/{tid}") for tid in self.ids)


class Described:
    """Sample i: (float32 [i, i, i], i, "s<i>", the worker id, the fetching thread's ident)."""

    def __init__(self, n: int = 50) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        info = fastloop.get_worker_info()
        return np.full(3, i, np.float32), i, f"s{i}", info.id if info else -1, threading.get_ident()


def collect(loader) -> list:
    try:
        return [batch for batch in loader]
    finally:
        loader.close()


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_a_python_dataset_in_worker_threads_gives_the_batches_of_workers0(workers):
    want = collect(fastloop.Loader(Described(), batch_size=8, shuffle=True, seed=3))
    got = collect(fastloop.Loader(Described(), batch_size=8, shuffle=True, seed=3, num_workers=workers,
                                  mode="threads"))
    assert len(got) == len(want) == 7
    for (x, y, s, _, _), (wx, wy, ws, _, _) in zip(got, want):
        assert x.tolist() == wx.tolist() and y.tolist() == wy.tolist() and s == ws


def test_each_worker_thread_has_its_own_worker_info_and_worker_init_fn():
    started: dict = {}
    lock = threading.Lock()

    def init(worker_id: int) -> None:
        info = fastloop.get_worker_info()
        with lock:
            started[worker_id] = (threading.get_ident(), info)

    loader = fastloop.Loader(Described(40), batch_size=4, num_workers=3, mode="threads", seed=9, worker_init_fn=init)
    batches = collect(loader)
    assert loader.mode == "threads" and loader.worker_pids == []
    assert sorted(started) == [0, 1, 2]
    assert len({ident for ident, _ in started.values()}) == 3 != threading.get_ident()
    for worker_id, (ident, info) in started.items():
        assert (info.id, info.num_workers, info.mode) == (worker_id, 3, "threads")
    for _, _, _, workers, idents in batches:  # each sample fetched on the thread of the worker it names
        assert all(started[int(w)][0] == int(t) for w, t in zip(workers, idents))
    assert fastloop.get_worker_info() is None  # not in the main thread


def test_worker_threads_share_the_process_open_files_and_objects_that_cannot_be_pickled(tmp_path):
    path = tmp_path / "records.bin"
    path.write_bytes(bytes(range(200)))

    class Records:  # an open file, a lock and a lambda: no pickling, no fork needed
        def __init__(self) -> None:
            self.file = open(path, "rb")
            self.lock = threading.Lock()
            self.decode = lambda raw: np.frombuffer(raw, np.uint8).astype(np.int64)

        def __len__(self) -> int:
            return 50

        def __getitem__(self, i: int):
            with self.lock:
                self.file.seek(i * 4)
                return self.decode(self.file.read(4))

    data = Records()
    try:
        out = np.concatenate(collect(fastloop.Loader(data, batch_size=10, num_workers=2, mode="threads")))
    finally:
        data.file.close()
    assert out.reshape(-1).tolist() == list(range(200))


def test_a_collate_fn_runs_in_the_worker_threads():
    threads = []

    def collate(samples):
        threads.append(threading.get_ident())
        return {"sum": sum(int(s[1]) for s in samples), "n": len(samples)}

    out = collect(fastloop.Loader(Described(20), batch_size=5, num_workers=2, mode="threads", collate_fn=collate))
    assert [b["n"] for b in out] == [5] * 4 and [b["sum"] for b in out] == [10, 35, 60, 85]
    assert threading.get_ident() not in threads


def test_a_pipeline_runs_on_the_python_samples_of_worker_threads():
    pipeline = fastloop.ops.Pipeline([fastloop.ops.RandomCrop(4), fastloop.ops.RandomHFlip(),
                                      fastloop.ops.Normalize(0.5, 0.25)], layout="CHW")
    data = Samples(24, lambda i: (np.full((3, 6, 6), i * 10, np.uint8), i))
    want = collect(fastloop.Loader(data, batch_size=8, transform=pipeline, seed=4))
    got = collect(fastloop.Loader(data, batch_size=8, transform=pipeline, seed=4, num_workers=2, mode="threads"))
    for (x, y), (wx, wy) in zip(got, want):
        assert x.shape == (8, 3, 4, 4) and np.array_equal(x, wx) and np.array_equal(y, wy)


class Failing:
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int):
        if i == 17:
            raise KeyError(f"no record {i}")
        return np.zeros(2), i


def test_a_failing_sample_raises_its_type_naming_the_worker_thread_and_the_sample():
    loader = fastloop.Loader(Failing(), batch_size=4, num_workers=2, mode="threads")
    seen = []
    with pytest.raises(KeyError) as caught:
        for _, y in loader:
            seen += y.tolist()
    assert seen == list(range(16))  # the batches before the failing one
    message = str(caught.value)
    assert "in worker thread" in message and "on sample 17" in message and "no record 17" in message
    cause = caught.value.__cause__
    assert isinstance(cause, KeyError) and "__getitem__" in "".join(
        __import__("traceback").format_tb(cause.__traceback__))
    assert caught.value.index == 17
    with pytest.raises(KeyError, match="on sample 17"):  # the next epoch fails there again
        collect(loader)


def test_a_failing_worker_init_fn_raises_at_the_first_batch():
    def init(worker_id: int) -> None:
        if worker_id == 1:
            raise RuntimeError("cannot open the database")

    loader = fastloop.Loader(Described(40), batch_size=4, num_workers=2, mode="threads", worker_init_fn=init)
    with pytest.raises(RuntimeError, match="worker thread 1.*cannot open the database"):
        collect(loader)


class Draws:
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int):
        info = fastloop.get_worker_info()  # None when the Loader probes the first sample here
        return fastloop.sample_rng().integers(1 << 30, size=3), (info.rng if info else fastloop.sample_rng()).random()


@pytest.mark.parametrize("kwargs", [dict(num_workers=1, mode="threads"), dict(num_workers=3, mode="threads"),
                                    dict(num_workers=2, mode="processes")], ids=["threads1", "threads3", "processes2"])
def test_sample_rng_draws_the_same_for_any_worker_count_and_mode(kwargs):
    def draws(**kw) -> list:
        return [(a.tolist(), b.tolist()) for a, b in collect(fastloop.Loader(Draws(), batch_size=5, seed=8,
                                                                             shuffle=True, **kw))]

    # num_workers=0: get_worker_info() is None in this process, as torch's; sample_rng() still draws
    class Main(Draws):
        def __getitem__(self, i):
            return fastloop.sample_rng().integers(1 << 30, size=3), fastloop.sample_rng().random()

    reference = [(a.tolist(), b.tolist()) for a, b in collect(fastloop.Loader(Main(), batch_size=5, seed=8,
                                                                             shuffle=True))]
    assert draws(**kwargs) == reference
    other_epoch = fastloop.Loader(Main(), batch_size=5, seed=8, shuffle=True)
    other_epoch.set_epoch(1)
    assert [(a.tolist(), b.tolist()) for a, b in collect(other_epoch)] != reference


def test_sample_rng_outside_a_fetch_and_a_wrong_kind_are_refused():
    with pytest.raises(ValueError, match="'kind' must be 'numpy' or 'torch'"):
        fastloop.sample_rng("jax")
    result = {}

    def outside() -> None:
        try:
            fastloop.sample_rng()
        except RuntimeError as error:
            result["error"] = str(error)

    t = threading.Thread(target=outside)  # a thread that never fetched
    t.start()
    t.join()
    assert "call it in a dataset's __getitem__" in result["error"]


def test_mode_auto_picks_threads_for_python_code_only_where_threads_run_python_in_parallel(monkeypatch):
    monkeypatch.setattr(loader_module, "free_threaded", lambda: True)
    assert fastloop.Loader(Described(8), batch_size=4, num_workers=2).mode == "threads"
    monkeypatch.setattr(loader_module, "free_threaded", lambda: False)
    assert fastloop.Loader(Described(8), batch_size=4, num_workers=2).mode == "processes"
    assert fastloop.Loader(Described(8), batch_size=4, num_workers=2, mode="threads").mode == "threads"


# ---- many threads on one Loader ----


def python_loader(**kwargs) -> fastloop.Loader:
    return fastloop.Loader(Described(64), batch_size=4, num_workers=2, timeout=60, **kwargs)


@pytest.mark.parametrize("make", [lambda: python_loader(mode="threads"),
                                  lambda: fastloop.Loader(np.arange(256.0), batch_size=4, num_workers=2, timeout=60)],
                         ids=["python", "arrays"])
def test_two_threads_closing_one_loader_while_an_epoch_runs_both_return(make):
    loader = make()
    epoch = iter(loader)
    next(epoch)  # the workers are filling ahead
    barrier = threading.Barrier(2)

    def close() -> None:
        barrier.wait(10)
        loader.close()

    closers = [threading.Thread(target=close) for _ in range(2)]
    for t in closers:
        t.start()
    for t in closers:
        t.join(30)
    assert not any(t.is_alive() for t in closers), "close() hung"
    with pytest.raises(StopIteration):  # the epoch was stopped under it
        next(epoch)
    assert len(collect(loader)) == len(loader)  # and the next one runs whole


def test_a_close_racing_an_iteration_ends_it_and_state_dict_keeps_the_position():
    loader = python_loader(mode="threads")
    got, closing = threading.Event(), threading.Event()
    positions = []

    def iterate() -> None:
        for i, _ in enumerate(loader):
            positions.append(i)
            if i == 2:  # mid-epoch: the next next() races the close
                got.set()
                assert closing.wait(30)

    t = threading.Thread(target=iterate)
    t.start()
    assert got.wait(30)
    closing.set()
    loader.close()
    t.join(30)
    assert not t.is_alive()
    state = loader.state_dict()
    assert state["epoch"] == 0 and state["position"] == len(positions) < len(loader)


class ClosingAfterTaking:
    """A loader's batch source whose next() hands over its `nth` batch only after a close() on
    another thread has run: the close lands between the take and the hand-out, every time."""

    def __init__(self, loader: fastloop.Loader, nth: int) -> None:
        self._core, self._loader, self._left = loader._core, loader, nth

    def next(self, timeout):
        batch = self._core.next(timeout)
        self._left -= 1
        if self._left == 0:
            closer = threading.Thread(target=self._loader.close)
            closer.start()
            closer.join(30)
        return batch

    def __getattr__(self, name):
        return getattr(self._core, name)


def test_a_batch_taken_as_close_runs_is_dropped_and_not_counted():
    loader = python_loader(mode="threads")
    epoch = iter(loader)
    loader._core = ClosingAfterTaking(loader, nth=4)
    got = [next(epoch) for _ in range(3)]
    with pytest.raises(StopIteration):  # the 4th was taken, then the close won: the user gets none
        next(epoch)
    assert len(got) == 3 and loader.state_dict()["position"] == 3
    loader._core = loader._core._core
    loader.load_state_dict(loader.state_dict())
    assert len(collect(loader)) == len(loader) - 3  # the resumed epoch starts at the 4th batch


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_stress_eight_threads_close_one_loader_while_two_iterate(mode):
    """8 threads close one Loader while 2 iterate it, round after round (FASTLOOP_STRESS_ROUNDS;
    the issue's target is 200): no hang, no crash, only whole batches of this source."""
    loader = python_loader(mode=mode)
    closers, iterators = 8, 2
    barrier = threading.Barrier(closers + iterators)
    errors: list = []

    def close() -> None:
        for _ in range(ROUNDS):
            barrier.wait(60)
            loader.close()
            barrier.wait(60)

    def iterate() -> None:
        for _ in range(ROUNDS):
            barrier.wait(60)
            try:
                for x, y, *_ in loader:  # each iteration abandons the other thread's: fine
                    assert x.shape[1:] == (3,) and (x[:, 0] == y).all()
            except BaseException as error:  # noqa: BLE001 - any error fails the test below
                errors.append(error)
            barrier.wait(60)

    threads = [threading.Thread(target=close) for _ in range(closers)]
    threads += [threading.Thread(target=iterate) for _ in range(iterators)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not any(t.is_alive() for t in threads), "a close or an iteration hung"
    assert not errors, errors[0]
    loader.close()
    assert len(collect(loader)) == len(loader)


class Holder:
    """A dataset whose fetch of sample `at` drops the last references to its own Loader: the
    Loader is freed on that worker thread."""

    def __init__(self) -> None:
        self.keep: list = []
        self.dropped = threading.Event()
        self.main_let_go = threading.Event()

    def __len__(self) -> int:
        return 400

    def __getitem__(self, i: int):
        if i == 12:
            assert self.main_let_go.wait(30)
            self.keep.clear()  # the epoch and the Loader go here, on this worker thread
            gc.collect()
            self.dropped.set()
        return np.full(2, i)


def test_a_loader_freed_by_the_code_its_own_worker_runs_ends_cleanly():
    workers = WorkerThreads()
    data = Holder()
    loader = fastloop.Loader(data, batch_size=2, num_workers=3, mode="threads", prefetch_factor=4,
                             worker_init_fn=workers)
    epoch = iter(loader)
    next(epoch)
    gone = weakref.ref(loader)
    data.keep.append(epoch)  # the only references left: in the dataset
    del loader, epoch
    data.main_let_go.set()
    assert data.dropped.wait(30)
    assert wait_until(lambda: gone() is None), "the Loader was not freed"
    assert len(workers.ids) == 3
    assert wait_until(lambda: workers.alive() == 0), "its worker threads did not end"


def test_a_dataset_in_a_cycle_with_its_loader_is_collected_and_its_threads_end():
    workers = WorkerThreads()
    data = Described(64)
    loader = fastloop.Loader(data, batch_size=8, num_workers=2, mode="threads", worker_init_fn=workers)
    data.loader = loader
    assert len(collect(loader)) == 8
    workers.ids.clear()  # close() ended the first epoch's; the next epoch starts its own
    assert sum(1 for _ in loader) == 8
    assert workers.alive() == 2  # persistent workers stay between epochs
    gone = weakref.ref(data)
    del data, loader
    gc.collect()
    assert gone() is None
    assert wait_until(lambda: workers.alive() == 0), "its worker threads did not end"


def test_the_interpreter_exits_while_worker_threads_run_python():
    script = """
import numpy as np, fastloop, threading
class Slow:
    def __len__(self): return 10_000
    def __getitem__(self, i): return np.full(4, i)
loader = fastloop.Loader(Slow(), batch_size=8, num_workers=3, mode="threads", prefetch_factor=8)
epoch = iter(loader)
print(next(epoch)[0].tolist(), flush=True)
# exits here: no close(), the workers busy filling ahead
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0, 0, 0, 0]"


def test_a_worker_that_starts_an_epoch_of_its_own_loader_is_refused_not_hung():
    holder: list = []
    refused: list = []

    class Reentrant:
        def __len__(self) -> int:
            return 16

        def __getitem__(self, i: int):
            if i == 9 and holder and not refused:
                try:
                    next(iter(holder[0]))  # an epoch of the loader this worker fills: it would wait for itself
                except ValueError as error:
                    refused.append(str(error))
            return np.full(2, i)

    loader = fastloop.Loader(Reentrant(), batch_size=4, num_workers=2, mode="threads", timeout=60)
    holder.append(loader)
    collect(loader)  # returns: the worker's iter() abandoned this epoch, then was refused
    assert refused and "cannot start an epoch of that loader" in refused[0]
    assert len(collect(loader)) == 4
