"""Serving scaled out on the queue in Redis: server processes and "hosts" sharing one RedisStore.

Everything runs on this machine: a redis-server on loopback, the servers as child processes,
the clients in this process (serve_http's asyncio keep-alive clients: 64 connections, each
POSTs one float32 input as JSON then asks for its result with a long poll, ``GET
.../result?wait_s=10``, answered when the job ends; jobs finishing within ``seconds`` after a
warm-up count). The polling client of bench_serve_http (first poll after 1 ms, the wait
doubling up to 20 ms) is measured once, on the in-memory queue, for comparison: each poll is
a request the front parses and, with the queue in Redis, a Redis round trip, so with polling
clients the fronts' CPU goes to polls (5-7 requests per job) instead of jobs.

1. **Processes** (the front-bound 784-512-512-10 MLP, max_batch 32): ``python -m fastloop
   serve`` with the queue in memory (one process), ``--processes 2`` without Redis (two
   share-nothing processes on one port, each its own queue in memory: peers.py), with
   ``--queue redis`` (one process), and ``--processes 2`` on the queue in Redis. Targets, on
   2 cores, p99 stated: 2 share-nothing processes >= 1.6x one in-memory process; 2 processes
   on Redis >= 1.6x one on Redis (also stated against the best one-process run). The
   server's CPU column counts every server process and redis-server.
2. **Hosts** (the model's cost is device time: each batch of up to 4 waits ``DEVICE_MS`` ms
   with the GIL released, as a GPU call does, then runs the small MLP): one server process
   ("host"), then two on their own ports, the clients spread over both. CPU-bound work cannot
   scale on 2 cores; this measures what a second machine with its own device adds. 24
   clients, long polling: enough to keep both devices' batches full, and the fronts' CPU per
   job small enough that the device, not this machine's 2 cores, is the bound (with polling
   clients one host's server used ~1.4 cores at 142 jobs/s, and a second host on the same
   2 cores added nothing). Target: the second host adds >= 0.8x of one host's jobs/s.

    $ python benchmarks/bench_serve_scale.py [--quick] [--markdown]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .serve import _redis_launcher
from .serve import mlp
from .serve_http import CLIENTS, Conn, Server, Window, checkpoint, closed_loop, job_bodies, model_name, run_job
from .targets import Result
from .timing import tree_cpu_s

HIDDEN = 512
DEVICE_MS = 20.0  # simulated device time per batch in the hosts run: one host tops out near 200 jobs/s
DEVICE_BATCH = 4
HOST_CLIENTS = 24  # the hosts run: enough to fill batches of 4 on two hosts, few enough that polling stays cheap
LONG_POLL_S = 10.0  # the clients' GET .../result?wait_s=
HEADERS = ["run", "variant", "jobs/s", "p50 ms", "p99 ms", "requests/job", "server CPU %", "client CPU %", "jobs"]
COMMAND = "python benchmarks/bench_serve_scale.py"
POLLING = "1 process, queue in memory, polling clients"
SHARE_NOTHING = "2 processes, each its own queue in memory"


class ScaleServer(Server):
    """serve_http's Server with the store (and, unless ``queue`` is "memory", the queue) in
    Redis and ``processes`` server processes; or, with ``device_ms``, a "host" running the
    simulated-device model (this module's __main__)."""

    def __init__(self, ckpt: str, redis: Any, *, processes: int = 1, queue: str = "redis",
                 device_ms: float | None = None, max_batch: int = 32) -> None:
        super().__init__(ckpt, max_batch=max_batch)
        self.redis = redis
        if device_ms is not None:
            self.args = [sys.executable, "-m", "fastloop.bench.serve_scale", "--host-server", ckpt,
                         str(self.port), redis.url, str(device_ms), str(max_batch)]
        else:
            self.args[self.args.index("--store") + 1] = "memory" if queue == "memory" else redis.url
            self.args += ["--processes", str(processes), "--queue", queue]

    def cpu_s(self) -> float:
        return tree_cpu_s([self.proc.pid])  # type: ignore[union-attr]


def _servers_cpu_s(servers: list[ScaleServer]) -> float:
    """The server processes' CPU seconds and redis-server's (once)."""
    return sum(s.cpu_s() for s in servers) + tree_cpu_s([servers[0].redis.process.pid])  # type: ignore[union-attr]


@dataclass
class Run:
    run: str
    variant: str
    jobs: int
    seconds: float
    p50_ms: float
    p99_ms: float
    server_cpu: float
    client_cpu: float
    requests: int = 0  # HTTP requests in the window (POSTs and GETs)

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds

    def row(self) -> list[object]:
        return [self.run, self.variant, round(self.jobs_per_s), round(self.p50_ms, 2), round(self.p99_ms, 2),
                round(self.requests / max(self.jobs, 1), 2), round(100 * self.server_cpu), round(100 * self.client_cpu),
                self.jobs]


async def _closed_loop(servers: list[ScaleServer], bodies: list[bytes], seconds: float, warmup_s: float,
                       long_poll: bool = True) -> tuple[list[float], float, float, float, int]:
    """Client i talks to servers[i % len(servers)]; (latencies, span, server CPU, client CPU,
    requests in the window). ``long_poll``: GET .../result?wait_s=; otherwise polls."""
    conns = [await Conn(servers[i % len(servers)].port).open() for i in range(len(bodies))]
    window = Window()
    requests = [0]

    def count() -> None:  # a request sent in the measured window
        if window.is_open():
            requests[0] += 1

    async def job(conn: Conn, body: bytes) -> tuple[int, str | None]:
        return await run_job(conn, body, wait_s=LONG_POLL_S if long_poll else None, on_request=count)

    async def reading() -> tuple[float, float]:
        return _servers_cpu_s(servers), time.process_time()

    latencies, _, span, (cpu0, mine0), (cpu1, mine1) = await closed_loop(
        conns, bodies, job, seconds, warmup_s, reading, "scale benchmark", window)
    return latencies, span, (cpu1 - cpu0) / span, (mine1 - mine0) / span, requests[0]


def _measure(run: str, variant: str, servers: list[ScaleServer], bodies: list[bytes], seconds: float,
             warmup_s: float, long_poll: bool = True) -> Run:
    latencies, span, server_cpu, client_cpu, requests = asyncio.run(
        _closed_loop(servers, bodies, seconds, warmup_s, long_poll))
    lat = np.array(latencies) * 1e3
    p50, p99 = np.percentile(lat, [50, 99]) if lat.size else (float("nan"),) * 2
    return Run(run, variant, int(lat.size), span, float(p50), float(p99), server_cpu, client_cpu, requests)


def compare(quick: bool = False) -> list[Run]:
    """The processes runs, then the hosts runs, side by side (one Redis, emptied between)."""
    seconds, warmup = (1.5, 0.5) if quick else (5.0, 1.0)
    model = mlp(HIDDEN)
    bodies = job_bodies(model, CLIENTS)
    runs = []
    with tempfile.TemporaryDirectory() as tmp, checkpoint(model) as ckpt:
        launcher = _redis_launcher()
        if launcher is None:
            raise RuntimeError("bench_serve_scale needs a source checkout: it starts redis-server with "
                               "tests/redis_launcher.py")
        redis = launcher.RedisServer(tmp)
        redis.start()
        try:
            plans = [("memory", 1, False, POLLING), ("memory", 1, True, "1 process, queue in memory"),
                     ("memory", 2, True, SHARE_NOTHING),
                     ("redis", 1, True, "1 process, queue in Redis"), ("redis", 2, True, "2 processes, queue in Redis")]
            for queue, processes, long_poll, variant in plans:
                _flush(redis)
                with ScaleServer(ckpt, redis, processes=processes, queue=queue) as server:
                    runs.append(_measure(f"processes ({model_name(model)})", variant, [server], bodies,
                                         seconds, warmup, long_poll))
            for hosts in (1, 2):
                _flush(redis)
                servers = [ScaleServer(ckpt, redis, device_ms=DEVICE_MS, max_batch=DEVICE_BATCH) for _ in range(hosts)]
                for s in servers:
                    s.__enter__()
                try:
                    runs.append(_measure(f"hosts ({DEVICE_MS:g} ms device per batch of <= {DEVICE_BATCH})",
                                         f"{hosts} host{'s' if hosts > 1 else ''}", servers,
                                         bodies[:HOST_CLIENTS], seconds, warmup))
                finally:
                    for s in servers:
                        s.__exit__()
        finally:
            redis.stop()
    return runs


def _flush(redis: Any) -> None:
    import redis as redis_py
    redis_py.Redis.from_url(redis.url).flushdb()


def results(runs: list[Run]) -> list[Result]:
    by = {(r.run.split(" ")[0], r.variant): r for r in runs}
    one, two = by[("processes", "1 process, queue in Redis")], by[("processes", "2 processes, queue in Redis")]
    ratio = two.jobs_per_s / one.jobs_per_s
    best = max((r for r in runs if r.run.startswith("processes") and r.variant.startswith("1 process")),
               key=lambda r: r.jobs_per_s)
    mem1, mem2 = by[("processes", "1 process, queue in memory")], by[("processes", SHARE_NOTHING)]
    local = mem2.jobs_per_s / mem1.jobs_per_s
    vs_best = two.jobs_per_s / best.jobs_per_s
    local_vs_best = mem2.jobs_per_s / best.jobs_per_s
    h1, h2 = by[("hosts", "1 host")], by[("hosts", "2 hosts")]
    added = (h2.jobs_per_s - h1.jobs_per_s) / h1.jobs_per_s
    return [
        Result("serve: 2 processes vs 1 (queue in Redis), small MLP over HTTP", ratio, "x", ">= 1.6x",
               ratio >= 1.6, f"{two.jobs_per_s:.0f} vs {one.jobs_per_s:.0f} jobs/s; p99 {two.p99_ms:.1f} vs "
               f"{one.p99_ms:.1f} ms; {os.cpu_count()} CPUs"),
        Result("serve: 2 share-nothing processes vs 1 (queues in memory), small MLP over HTTP", local, "x",
               ">= 1.6x", local >= 1.6, f"{mem2.jobs_per_s:.0f} vs {mem1.jobs_per_s:.0f} jobs/s; p99 {mem2.p99_ms:.1f} vs "
               f"{mem1.p99_ms:.1f} ms; {local_vs_best:.2f}x the best 1 process run ({best.variant})"),
        Result("serve: 2 processes (queue in Redis) vs the best 1 process run", vs_best, "x", ">= 1.6x",
               vs_best >= 1.6, f"{two.jobs_per_s:.0f} vs {best.jobs_per_s:.0f} jobs/s ({best.variant}); p99 "
               f"{two.p99_ms:.1f} vs {best.p99_ms:.1f} ms"),
        Result("serve: a second host adds (x one host's jobs/s), GIL-free device wait", added, "x", ">= 0.8x",
               added >= 0.8, f"{h2.jobs_per_s:.0f} vs {h1.jobs_per_s:.0f} jobs/s; p99 {h2.p99_ms:.1f} vs "
               f"{h1.p99_ms:.1f} ms"),
    ]


# ------------------------------------------------------------ a "host": the simulated-device server
def _host_server(ckpt: str, port: int, url: str, device_ms: float, max_batch: int) -> int:
    """One server process whose model waits device_ms (GIL released) per batch, then runs
    the checkpoint's MLP; its queue is the shared one in Redis."""
    import uvicorn

    from ..serve import App, RedisQueue, create_service, RedisStore
    from ..nn import set_blas_threads
    from ..serve.checkpoint_model import load_model

    net = load_model(ckpt)
    set_blas_threads(1)  # as `python -m fastloop serve` does (--blas-threads 1): the fronts need the other core

    def model(batch: np.ndarray) -> Any:
        time.sleep(device_ms / 1e3)  # the device's time: a GIL-free wait, as a GPU call is
        return net(batch.astype(np.float32, copy=False))  # JSON inputs arrive as float64 for a plain callable

    service = create_service(model, num_workers=1, max_batch=max_batch, store=RedisStore(url), queue=RedisQueue())
    app = App(service)
    try:
        uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")).run()
    except KeyboardInterrupt:
        pass
    finally:
        service.close(timeout=2)
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["--host-server"]:
    ckpt_, port_, url_, ms_, batch_ = sys.argv[2:7]
    sys.exit(_host_server(ckpt_, int(port_), url_, float(ms_), int(batch_)))
