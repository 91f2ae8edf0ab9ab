"""fastloop.Loader: every sample once per epoch (1e6 indices; threads, processes, shards),
reproducible shuffles and augmentations, sources (arrays, .npy maps, folders, datasets),
zero-copy batches, and faults: dead workers, exceptions, Ctrl-C, break, gc, bad files."""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import fastloop
from fastloop.ops import Normalize, Pipeline, RandomCrop, RandomHFlip
from synthetic import IndexDataset
from waiting import alive

RNG = np.random.default_rng(0)
IMAGES = RNG.integers(0, 256, (600, 3, 20, 20), dtype=np.uint8)
LABELS = np.arange(600, dtype=np.int64)
AUG = Pipeline([RandomCrop(16), RandomHFlip(), Normalize([0.5, 0.4, 0.3], [0.2, 0.2, 0.2])], layout="CHW")


class ImageDataset:
    """A map-style dataset of (image, label), as a torch Dataset would be."""

    def __len__(self) -> int:
        return len(LABELS)

    def __getitem__(self, i: int):
        return IMAGES[i], LABELS[i]


# ---- every sample exactly once ----


@pytest.mark.parametrize("mode, workers", [("threads", 0), ("threads", 2), ("processes", 2)])
def test_1e6_indices_each_exactly_once_per_shuffled_epoch_and_across_shards(mode, workers):
    n = 999_999  # divisible by the 3 ranks (else shards are trimmed or padded: the next test)
    source = np.arange(n, dtype=np.int64) if mode == "threads" else IndexDataset(n)
    seen_all = np.zeros(n, np.int64)
    for rank in range(3):
        loader = fastloop.Loader(source, batch_size=4096, shuffle=True, seed=5, num_workers=workers, mode=mode,
                                 rank=rank, world_size=3)
        got = np.concatenate(list(loader))
        assert len(got) == len(range(rank, n, 3))
        assert len(np.unique(got)) == len(got)  # nothing twice within the shard
        seen_all[got] += 1
        if rank == 0:  # the next epoch: a new shuffle (so another subset for this shard)
            again = np.concatenate(list(loader))
            assert len(np.unique(again)) == len(again) == len(got) and not np.array_equal(again, got)
        loader.close()
    assert (seen_all == 1).all()  # shards disjoint, together everything


@pytest.mark.parametrize("drop_last", [True, False])
def test_uneven_shards_are_equal_in_length_as_torch_distributed_sampler(drop_last):
    n, world = 1003, 4  # 1003 = 4 * 250 + 3
    shards = [np.concatenate(list(fastloop.Loader(np.arange(n), batch_size=50, shuffle=True, seed=1, rank=r,
                                                  world_size=world, drop_last=drop_last)))
              for r in range(world)]
    lengths = {len(shard) for shard in shards}
    if drop_last:  # trimmed to 250 per rank (5 full batches), disjoint
        assert lengths == {250}
        every = np.concatenate(shards)
        assert len(np.unique(every)) == len(every) == 1000
    else:  # padded to 251 per rank by wrapping around: everything once, 1 sample twice
        assert lengths == {251}
        counts = np.bincount(np.concatenate(shards), minlength=n)
        assert counts.min() == 1 and counts.sum() == 1004 and (counts == 2).sum() == 1
    assert len({len(fastloop.Loader(np.arange(n), batch_size=64, rank=r, world_size=world, drop_last=drop_last))
                for r in range(world)}) == 1  # every rank runs the same number of steps


def test_shuffle_is_reproducible_and_in_order_without_it():
    a = [b.copy() for b in fastloop.Loader(LABELS, batch_size=64, shuffle=True, seed=3, num_workers=2)]
    b = [b.copy() for b in fastloop.Loader(LABELS, batch_size=64, shuffle=True, seed=3, num_workers=0)]
    c = [b.copy() for b in fastloop.Loader(LABELS, batch_size=64, shuffle=True, seed=4, num_workers=2)]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    plain = np.concatenate(list(fastloop.Loader(LABELS, batch_size=64, num_workers=3)))
    assert np.array_equal(plain, LABELS)


def test_len_drop_last_and_the_last_partial_batch():
    loader = fastloop.Loader(LABELS, batch_size=64)
    batches = list(loader)
    assert len(loader) == len(batches) == 10 and len(batches[-1]) == 600 - 9 * 64
    loader = fastloop.Loader(LABELS, batch_size=64, drop_last=True)
    assert len(loader) == 9 and all(len(b) == 64 for b in loader)


def test_rank_and_world_size_default_to_torchrun_variables(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    loader = fastloop.Loader(LABELS, batch_size=1000)
    assert (loader.rank, loader.world_size) == (1, 4)
    assert np.array_equal(next(iter(loader)), LABELS[1::4])


# ---- C pipelines ----


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_pipeline_batches_equal_the_pipeline_run_on_those_samples(workers):
    loader = fastloop.Loader((IMAGES, LABELS), batch_size=50, shuffle=True, seed=9, num_workers=workers, transform=AUG)
    loader.set_epoch(2)
    for x, y in loader:
        assert x.shape == (len(y), 3, 16, 16) and x.dtype == np.float32
        want = AUG(IMAGES[y], seed=fastloop._core._epoch_seed(9, 2), ids=y)
        np.testing.assert_array_equal(x, want)


def test_augmentations_do_not_depend_on_worker_count_or_mode():
    def epoch(**kwargs):
        loader = fastloop.Loader((IMAGES, LABELS), batch_size=32, shuffle=True, seed=1, transform=AUG, **kwargs)
        return [(x.copy(), y.copy()) for x, y in loader]

    threads1, threads3 = epoch(num_workers=1), epoch(num_workers=3)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(threads1, threads3))
    dataset = [(x.copy(), y.copy()) for x, y in fastloop.Loader(ImageDataset(), batch_size=32, shuffle=True, seed=1,
                                                                  transform=AUG, num_workers=2)]
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(threads1, dataset))


# ---- sources ----


def test_npy_memory_maps_and_folders_of_files(tmp_path):
    np.save(tmp_path / "images.npy", IMAGES)
    mapped = fastloop.load_npy(tmp_path / "images.npy")
    assert not mapped.flags.writeable and np.array_equal(mapped, IMAGES)
    folder = tmp_path / "samples"
    folder.mkdir()
    for i in range(40):
        np.save(folder / f"{i:03d}.npy", IMAGES[i])
        IMAGES[i].tofile(folder / f"{i:03d}.raw")
    for source in (fastloop.Folder(folder, "*.npy"), fastloop.Folder(folder, "*.raw", dtype="uint8", shape=(3, 20, 20))):
        loader = fastloop.Loader((source, LABELS[:40]), batch_size=16, num_workers=2, transform=AUG)
        for x, y in loader:
            np.testing.assert_array_equal(x, AUG(IMAGES[y], seed=fastloop._core._epoch_seed(0, 0), ids=y))
    loader = fastloop.Loader((mapped, LABELS), batch_size=100, num_workers=2)
    assert all(np.array_equal(x, IMAGES[y]) for x, y in loader)


def test_bad_npy_files_name_the_file(tmp_path):
    (tmp_path / "bad.npy").write_bytes(b"not a numpy file at all")
    with pytest.raises(ValueError, match=r"bad\.npy.*magic") as bad:
        fastloop.load_npy(tmp_path / "bad.npy")
    assert str(bad.value).count("bad.npy") == 1
    np.save(tmp_path / "short.npy", np.zeros(100))
    with open(tmp_path / "short.npy", "r+b") as f:
        f.truncate(300)
    with pytest.raises(ValueError, match=r"short\.npy.*truncated"):
        fastloop.load_npy(tmp_path / "short.npy")
    with pytest.raises(FileNotFoundError, match="missing.npy") as missing:
        fastloop.load_npy(tmp_path / "missing.npy")
    assert str(missing.value).count("missing.npy") == 1


def test_a_missing_or_mismatched_file_names_the_file_and_index(tmp_path):
    for i in range(10):
        np.save(tmp_path / f"{i}.npy", np.full((4,), i, np.float32))
    folder = fastloop.Folder(tmp_path)
    os.remove(tmp_path / "7.npy")
    loader = fastloop.Loader(folder, batch_size=4, num_workers=2)
    batches = iter(loader)
    assert list(next(batches)[:, 0]) == [0, 1, 2, 3]
    with pytest.raises(FileNotFoundError, match=r"sample 7.*7\.npy"):
        next(batches)
    np.save(tmp_path / "7.npy", np.zeros((5,), np.float32))  # wrong shape now
    with pytest.raises(ValueError, match=r"sample 7.*7\.npy"):
        list(loader)
    with pytest.raises(FileNotFoundError):
        fastloop.Folder(tmp_path / "nowhere")


# ---- processes and Python code ----


def test_python_transform_runs_in_worker_processes_with_distinct_seeds():
    def transform(image):  # the input only, as torchvision's datasets apply it
        return image[:, :8, :8].astype(np.float32)

    def target_transform(label):
        info = fastloop.get_worker_info()  # None once: the layout probe in the main process
        worker = info.id if info is not None else -1
        return np.array([label, worker, np.random.randint(1 << 30)])

    init_calls = []
    loader = fastloop.Loader((IMAGES, LABELS), batch_size=40, num_workers=2, mode="processes", transform=transform,
                             target_transform=target_transform, worker_init_fn=init_calls.append)
    assert loader.mode == "processes"
    rows = np.concatenate([meta for _, meta in loader])
    assert sorted(rows[:, 0]) == list(range(600))
    assert set(rows[:, 1]) == {0, 1}
    draws = {w: set(rows[rows[:, 1] == w, 2]) for w in (0, 1)}
    assert not draws[0] & draws[1]  # not the identical-random-numbers-in-every-worker bug
    assert fastloop.get_worker_info() is None and init_calls == []  # those ran in the workers


class FreezeCount(IndexDataset):
    def __getitem__(self, i: int):
        return np.int64(gc.get_freeze_count())


def test_workers_inherit_the_parents_objects_frozen_and_the_parent_stays_unfrozen():
    # gc.freeze() before the fork keeps collections in workers from copying the parent's heap
    if gc.get_freeze_count() != 0:  # CPython 3.12.1 starts with 375 objects frozen
        # the loader reads that as a program freezing objects itself and leaves gc alone (a
        # known gap there: its workers then copy the heap pages a collection touches)
        frozen = gc.get_freeze_count()
        assert len(np.concatenate(list(fastloop.Loader(FreezeCount(16), batch_size=8, num_workers=1,
                                                        mode="processes")))) == 16
        assert gc.get_freeze_count() == frozen
        return
    loader = fastloop.Loader(FreezeCount(64), batch_size=8, num_workers=2, mode="processes")
    counts = np.concatenate(list(loader))
    assert (counts > 1000).all()  # in the workers: everything the parent had
    assert gc.get_freeze_count() == 0
    loader.close()
    gc.freeze()  # a program that freezes objects itself keeps its regime
    try:
        frozen = gc.get_freeze_count()
        assert len(np.concatenate(list(fastloop.Loader(FreezeCount(16), batch_size=8, num_workers=1,
                                                        mode="processes")))) == 16
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


class Broken(ImageDataset):
    def __getitem__(self, i):
        if i == 123:
            raise KeyError(f"no label for sample {i}")
        return super().__getitem__(i)


def test_an_exception_in_a_worker_is_reraised_with_its_type_index_and_traceback():
    loader = fastloop.Loader(Broken(), batch_size=50, num_workers=2, mode="processes")
    got = []
    with pytest.raises(KeyError) as raised:
        for x, y in loader:
            got.extend(y)
    assert got == list(range(100))  # the batches before the failing one arrive first
    text = str(raised.value)
    assert "sample 123" in text and "no label for sample 123" in text and "Worker traceback" in text
    assert "__getitem__" in text and raised.value.index == 123
    with pytest.raises(KeyError):  # a new epoch starts afresh, and fails again at 123
        list(loader)


def ours_in_dev_shm(pids) -> set[str]:
    """The /dev/shm entries naming one of `pids` (this test's processes), not the machine's:
    other programs come and go there. (The slots are an anonymous shared mapping, so none is
    expected; a named one that outlived its process would show here.)"""
    named = re.compile("|".join(rf"(?<!\d){pid}(?!\d)" for pid in pids))
    return {name for name in os.listdir("/dev/shm") if named.search(name)}


def test_a_worker_killed_mid_epoch_raises_worker_error_naming_it_and_nothing_leaks():
    shm_before = ours_in_dev_shm([os.getpid()])

    class Slow(ImageDataset):
        def __getitem__(self, i):
            time.sleep(0.002)
            return super().__getitem__(i)

    loader = fastloop.Loader(Slow(), batch_size=20, num_workers=2, mode="processes")
    batches = iter(loader)
    next(batches)
    victim, other = loader.worker_pids
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(fastloop.WorkerError) as raised:  # no timeout set: only noticing the death ends the wait
        for _ in batches:
            pass
    assert raised.value.pid == victim and raised.value.signal == signal.SIGKILL
    assert f"pid {victim}" in str(raised.value) and "signal 9" in str(raised.value)
    assert not alive(victim) and not alive(other) and loader.worker_pids == []
    assert len([x for x, _ in loader]) == 30  # a new epoch works, with new workers
    loader.close()
    assert ours_in_dev_shm([os.getpid(), victim, other]) == shm_before


@pytest.mark.parametrize("how", ["break", "close", "gc"])
def test_leaving_an_epoch_early_ends_the_workers_within_a_second(how):
    loader = fastloop.Loader(ImageDataset(), batch_size=10, num_workers=2)
    for x, y in loader:
        pids = loader.worker_pids
        break
    start = time.monotonic()
    if how == "close":
        loader.close()
    elif how == "gc":
        del loader, x, y
        gc.collect()
    deadline = time.monotonic() + 5.0  # well under 1 s when idle; margin for a loaded machine
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(alive(p) for p in pids), f"workers still alive {time.monotonic() - start:.2f}s after {how}"
    if how != "gc":
        assert sum(len(y) for _, y in loader) == 600  # and the next epoch works


BATCH_FREED_AT_FORK = """
import os, sys
sys.path.insert(0, sys.argv[1])
import fastloop
from test_loader import ImageDataset

loader = fastloop.Loader(ImageDataset(), batch_size=10, num_workers=2)
kept = []
for batch in loader:
    kept.append(batch)  # still lent when the epoch is left
    break
os.register_at_fork(before=kept.clear)  # frees it while the next epoch forks its workers
print(sum(len(y) for _, y in loader))
"""


def test_a_batch_freed_by_code_run_at_fork_does_not_deadlock_the_next_epoch():
    # Python code run around fork (at-fork callbacks, the garbage collector) may free a batch,
    # whose slot goes back to the pool from the thread that is forking
    tests = os.path.dirname(os.path.abspath(__file__))
    run = subprocess.run([sys.executable, "-c", BATCH_FREED_AT_FORK, tests], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["600"]


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="needs the main thread")
def test_ctrl_c_while_waiting_stops_the_workers(sigint_raises):
    # The first sample is fetched in this process to learn the shapes: the dataset is
    # stuck only in the workers. Worker 0 presses Ctrl-C for the parent on its first sample: a
    # worker has work only once every worker is forked, so the parent is waiting by then. (A
    # SIGINT while the workers fork can be lost: CPython reports an exception raised in its
    # at-fork callbacks as unraisable; and a thread, as a threading.Timer, starting or ending
    # as the loader forks can leave a worker waiting on a lock it held under ASan.)
    class StuckInWorkers(ImageDataset):
        def __getitem__(self, i):
            worker = fastloop.get_worker_info()
            if worker is not None:
                if worker.id == 0:
                    os.kill(os.getppid(), signal.SIGINT)
                time.sleep(60)
            return super().__getitem__(i)

    loader = fastloop.Loader(StuckInWorkers(), batch_size=2, num_workers=2, mode="processes")
    with pytest.raises(KeyboardInterrupt):
        for _ in loader:
            pass
    deadline = time.monotonic() + 5.0
    while loader.worker_pids and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loader.worker_pids == []


def test_timeout_raises_when_workers_are_too_slow():
    class Slow(ImageDataset):
        def __getitem__(self, i):
            if fastloop.get_worker_info() is not None:
                time.sleep(2)
            return super().__getitem__(i)

    loader = fastloop.Loader(Slow(), batch_size=2, num_workers=1, timeout=0.2)
    with pytest.raises(TimeoutError, match="0.2"):
        next(iter(loader))
    loader.close()


def test_persistent_workers_keep_their_pids_across_epochs():
    loader = fastloop.Loader(ImageDataset(), batch_size=100, num_workers=2)
    list(loader)
    pids = loader.worker_pids
    list(loader)
    assert loader.worker_pids == pids
    short_lived = fastloop.Loader(ImageDataset(), batch_size=100, num_workers=2, persistent_workers=False)
    list(short_lived)
    assert short_lived.worker_pids == []


# ---- zero-copy batches ----


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_batches_are_views_recycled_when_dropped_and_copies_when_hoarded(mode):
    source = (IMAGES, LABELS) if mode == "threads" else ImageDataset()
    loader = fastloop.Loader(source, batch_size=10, num_workers=2, mode=mode)
    kept = []
    for x, y in loader:
        kept.append((x, y))
    views = [x for x, _ in kept if isinstance(x.base, fastloop._core._SlotLease)]
    assert 1 <= len(views) < len(kept)  # a few stay lent; the rest were copied, not starved
    assert all(np.array_equal(x, IMAGES[y]) for x, y in kept)
    del kept, views, x, y
    loader2 = iter(loader)
    x, _ = next(loader2)
    assert isinstance(x.base, fastloop._core._SlotLease)  # dropping them made slots free again


def test_torch_takes_batches_without_a_copy():
    torch = pytest.importorskip("torch")
    x, y = next(iter(fastloop.Loader((IMAGES, LABELS), batch_size=8, num_workers=1, transform=AUG)))
    t = torch.from_numpy(x)
    assert t.data_ptr() == x.ctypes.data and t.shape == (8, 3, 16, 16)
    d = torch.from_dlpack(x)
    assert d.data_ptr() == x.ctypes.data


# ---- bad arguments ----


def test_bad_arguments_are_refused_clearly():
    with pytest.raises(ValueError, match="mode='processes' needs num_workers >= 1"):
        fastloop.Loader(ImageDataset(), num_workers=0, mode="processes")
    with pytest.raises(TypeError, match="map-style dataset"):
        fastloop.Loader(42)
    with pytest.raises(ValueError, match="batch_size"):
        fastloop.Loader(LABELS, batch_size=0)
    with pytest.raises(ValueError, match="mode"):
        fastloop.Loader(LABELS, mode="fibers")
    with pytest.raises(ValueError, match="samples"):
        fastloop.Loader((IMAGES, LABELS[:10]))
    with pytest.raises(ValueError, match="rank"):
        fastloop.Loader(LABELS, rank=3, world_size=3)
    with pytest.raises(ValueError, match="crop"):
        fastloop.Loader(IMAGES, transform=Pipeline([RandomCrop(64)], layout="CHW"))
    if not fastloop.cuda.is_available():
        with pytest.raises(fastloop.CudaUnavailable):
            fastloop.Loader(LABELS, device="cuda")


def test_a_monitor_attached_to_a_loader_logs_its_samples_per_second(tmp_path):
    import json

    loader = fastloop.Loader((IMAGES, LABELS), batch_size=50, num_workers=1, transform=AUG)
    with fastloop.Monitor(interval_s=0.02, sinks=[fastloop.JSONLSink(tmp_path / "m.jsonl")]) as mon:
        mon.attach(loader)
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            for _ in loader:
                time.sleep(0.001)
    tags = {json.loads(line)["name"] for line in open(tmp_path / "m.jsonl")}
    assert {"loader/samples/per_s", "loader/batches/per_s"} <= tags
    assert loader.stats()["samples"] > 0 and loader.stats()["batches"] > 0


class Squares:
    """A map-style dataset: what the Python-fed backends read."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> np.ndarray:
        return np.array([i * i], np.int64)


@pytest.mark.parametrize("make", [lambda: fastloop.Loader(np.arange(10), batch_size=4, num_workers=2),
                                  lambda: fastloop.Loader(Squares(), batch_size=4, num_workers=0),
                                  lambda: fastloop.Loader(Squares(), batch_size=4, num_workers=2, mode="threads"),
                                  lambda: fastloop.Loader(Squares(), batch_size=4, num_workers=2, mode="processes")],
                         ids=["C threads", "inline", "Python threads", "processes"])
def test_stats_is_a_fresh_snapshot_of_the_counters_in_every_backend(make):
    with make() as loader:
        before = loader.stats()
        assert before == {"samples": 0, "batches": 0, "skipped": 0}
        assert len(np.concatenate(list(loader))) == 10
        assert loader.stats() == {"samples": 10, "batches": 3, "skipped": 0}
        assert before["samples"] == 0  # a snapshot: it does not move with the loader
        list(loader)
        assert loader.stats()["samples"] == 20  # every epoch counts
        assert not hasattr(loader, "metrics") and not hasattr(loader, "workers")
        assert loader.num_workers in (0, 2)


def test_worker_counts_are_named_as_torch_names_them():
    with pytest.raises(ValueError, match="'num_workers'"):
        fastloop.Loader(LABELS, num_workers=-1)
    with pytest.raises(ValueError, match="'num_workers'"):
        fastloop.Loader(LABELS, num_workers=2000)
    with pytest.raises(ValueError, match="'prefetch_factor'"):
        fastloop.Loader(LABELS, num_workers=1, prefetch_factor=0)
    with pytest.raises(ValueError, match=r"'num_workers' x 'prefetch_factor' is too large"):
        fastloop.Loader(LABELS, num_workers=1000, prefetch_factor=2**31 - 1)
    for old in ({"workers": 2}, {"prefetch": 2}):
        with pytest.raises(TypeError, match=f"'{next(iter(old))}'"):  # one name each, no alias
            fastloop.Loader(LABELS, **old)
