"""The serving target: dynamic batching against one job per model call, side by side.

An in-process InferenceService (2 worker threads, a float32 fastloop.nn MLP: 784-512-512-10,
and 784-2048-2048-10 where one row costs more than the service's own per-job work) serves
64 client threads; each client submits one input, waits for its result, and repeats
(a closed loop). Measured for ``max_batch=32`` (``max_delay_s=0.002``) and ``max_batch=1``, both
on a MemoryStore so that the comparison is about batching alone, and once more with
``max_batch=32`` on a durable FileStore (the default store: every record fsynced), and both
on a RedisStore against a throwaway local redis-server when one is installed. Reported:
throughput (jobs/s), client-side latency p50/p99 (submit to result), mean batch size, and
the throughput ratio per model (target >= 3x). ``--quick`` measures the small MLP only.

    $ python benchmarks/bench_serve.py [--quick]
"""

from __future__ import annotations

import pathlib
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import fastloop as fl
from fastloop.serve import FileStore, InferenceService, MemoryStore, Store

from .targets import Result

CLIENTS = 64
HIDDEN = (512, 2048)  # 784-h-h-10
HEADERS = ["model", "variant", "jobs/s", "p50 ms", "p99 ms", "mean batch", "jobs"]


@dataclass
class ClosedLoopRun:
    """One closed-loop measurement of a served model: the jobs that finished within the
    measured `seconds`, and their client-side latency (submit to result)."""

    model: str
    variant: str
    jobs: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds

    def first_cells(self) -> list[object]:
        """The row's first cells, as every serving table starts: model, variant, jobs/s, p50 ms, p99 ms."""
        return [self.model, self.variant, round(self.jobs_per_s), round(self.p50_ms, 2), round(self.p99_ms, 2)]


@dataclass
class Run(ClosedLoopRun):
    """A run of the in-process InferenceService."""

    mean_batch: float
    cpu_s: float = float("nan")  # this process's CPU time (all threads) over the measured seconds

    @property
    def jobs_per_cpu_s(self) -> float:
        """Jobs per CPU-second: what a busy shared machine distorts least (wall time counts
        the time other processes held the cores)."""
        return self.jobs / self.cpu_s

    def row(self) -> list[object]:
        return self.first_cells() + [round(self.mean_batch, 1), self.jobs]


def mlp(hidden: int = 512, seed: int = 0) -> fl.nn.Sequential:
    """784-hidden-hidden-10 with ReLUs."""
    fl.nn.manual_seed(seed)
    return fl.nn.Sequential(fl.nn.Linear(784, hidden), fl.nn.ReLU(), fl.nn.Linear(hidden, hidden), fl.nn.ReLU(),
                            fl.nn.Linear(hidden, 10))


def measure(model: fl.nn.Sequential, variant: str, max_batch: int, store: Store, *, seconds: float,
            warmup_s: float, clients: int = CLIENTS, workers: int = 2, max_delay_s: float = 0.002,
            rows: np.ndarray | None = None, name: str | None = None, **options: object) -> Run:
    """Closed loop: `clients` threads submit and wait, for warmup_s + seconds; jobs that
    finish within the last `seconds` count. `rows`: one input per client (default: normal
    float32 rows of the fastloop.nn model's in_features); `options` go to InferenceService."""
    inputs = rows
    if inputs is None:
        inputs = np.random.default_rng(1).standard_normal((clients, model.in_features)).astype(np.float32)
    stop = threading.Event()
    finished: list[list[tuple[float, float]]] = [[] for _ in range(clients)]  # (end time, latency)
    errors: list[BaseException] = []
    with InferenceService(model, num_workers=workers, max_batch=max_batch, max_delay_s=max_delay_s,
                          max_queue=4 * clients, store=store, **options) as svc:  # type: ignore[arg-type]
        def client(c: int) -> None:
            x, mine = inputs[c], finished[c]
            try:
                while not stop.is_set():
                    start = time.perf_counter()
                    svc.result(svc.submit(x), timeout=60)
                    end = time.perf_counter()
                    mine.append((end, end - start))
            except BaseException as error:  # reported below, not lost in a thread
                errors.append(error)

        threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
        for t in threads:
            t.start()
        time.sleep(warmup_s)
        t0, c0 = time.perf_counter(), time.process_time()
        time.sleep(seconds)
        t1, c1 = time.perf_counter(), time.process_time()
        stop.set()
        for t in threads:
            t.join()
        stats = svc.stats()
    if errors:
        raise RuntimeError(f"serve benchmark {variant}: a client failed: {errors[0]!r}") from errors[0]
    latencies = np.array([lat for mine in finished for end, lat in mine if t0 <= end < t1]) * 1e3
    p50, p99 = np.percentile(latencies, [50, 99]) if latencies.size else (float("nan"),) * 2
    if name is None:
        name = "-".join(str(n) for n in [model.in_features] + [layer.out_features for layer in model
                                                                  if isinstance(layer, fl.nn.Linear)])
    return Run(name, variant, int(latencies.size), t1 - t0, float(p50), float(p99), stats["mean_batch_size"], c1 - c0)


def compare(quick: bool = False) -> list[Run]:
    """Per model: batched and max_batch=1 on a MemoryStore; for the small MLP also batched
    on a durable FileStore, and both on a RedisStore when redis-server and redis-py are
    installed. Each measured the same way in one process."""
    seconds, warmup = (0.5, 0.2) if quick else (3.0, 0.5)
    runs = []
    for hidden in HIDDEN[:1] if quick else HIDDEN:
        model = mlp(hidden)
        runs.append(measure(model, "max_batch=32, MemoryStore", 32, MemoryStore(), seconds=seconds, warmup_s=warmup))
        runs.append(measure(model, "max_batch=1, MemoryStore", 1, MemoryStore(), seconds=seconds, warmup_s=warmup))
        if hidden == HIDDEN[0]:
            with tempfile.TemporaryDirectory() as tmp:
                runs.append(measure(model, "max_batch=32, FileStore (fsync)", 32, FileStore(tmp),
                                    seconds=seconds, warmup_s=warmup))
            launcher = _redis_launcher()
            if launcher is not None and launcher.available():
                runs += _on_redis(launcher, model, seconds, warmup)
    return runs


def _redis_launcher() -> Any:
    """The throwaway redis-server launcher of a source checkout (tests/redis_launcher.py: a
    test fixture, not shipped), or None outside one: then the Redis rows are left out."""
    tests = pathlib.Path(__file__).resolve().parents[3] / "tests"
    if not (tests / "redis_launcher.py").is_file():
        return None
    if str(tests) not in sys.path:
        sys.path.insert(0, str(tests))
    import redis_launcher

    return redis_launcher


def _on_redis(redis_launcher: Any, model: fl.nn.Sequential, seconds: float, warmup: float) -> list[Run]:
    """Batched and max_batch=1 on a RedisStore against a throwaway local redis-server."""
    from fastloop.serve import RedisStore

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        server = redis_launcher.RedisServer(tmp)
        server.start()
        try:
            for max_batch in (32, 1):
                runs.append(measure(model, f"max_batch={max_batch}, RedisStore", max_batch,
                                    RedisStore(server.url, prefix=f"bench{max_batch}:"), seconds=seconds,
                                    warmup_s=warmup))
        finally:
            server.stop()
    return runs


def results(runs: list[Run]) -> list[Result]:
    rows = [Result(f"serve {r.model} {r.variant}: throughput", r.jobs_per_s, "jobs/s", "", None,
                   f"p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms, mean batch {r.mean_batch:.1f}") for r in runs]
    for model in dict.fromkeys(r.model for r in runs):
        batched, single = (next(r for r in runs if r.model == model and r.variant.startswith(v))
                           for v in ("max_batch=32, Memory", "max_batch=1, Memory"))
        ratio = batched.jobs_per_s / single.jobs_per_s
        rows.append(Result(f"serve {model}: dynamic batching / max_batch=1 throughput", ratio, "x", ">= 3",
                           ratio >= 3, f"{CLIENTS} client threads, 2 workers, max_delay_s=0.002"))
    return rows


def run(quick: bool = False, log: Callable[[str], object] = lambda s: None) -> list[Result]:
    runs = compare(quick)
    for r in runs:
        log(f"serve {r.model} {r.variant}: {r.jobs_per_s:.0f} jobs/s, p50 {r.p50_ms:.2f} ms, p99 {r.p99_ms:.2f} ms")
    return results(runs)
