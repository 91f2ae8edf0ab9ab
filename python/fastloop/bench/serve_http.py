"""The serving targets over HTTP on loopback: dynamic batching against max_batch=1, and overload.

The server runs in its own process (``python -m fastloop serve`` on a free port, a checkpoint
written to a temporary directory, ``--store memory``, 2 workers, uvicorn); the clients run in
this process on asyncio with raw keep-alive streams (one connection each, a hand-written
HTTP/1.1 request and response: far less client CPU per request than http.client in threads).

1. **Batching** (closed loop): 64 clients, each POSTs one float32 input as JSON, then polls
   ``GET /v1/jobs/{id}/result`` until 200 (first poll after 1 ms, the wait doubling up to
   20 ms, so polling does not swamp the server), and repeats; jobs finishing within
   ``seconds`` after a warm-up count. For 784-512-512-10 and 784-2048-2048-10 MLPs, with
   ``--max-batch 32 --max-delay-s 0.002`` and ``--max-batch 1``: jobs/s, client latency p50/p99
   (submit to result), polls per job, mean batch (from /metrics), and the CPU the server and
   the clients used (% of one core), so a client-bound run shows. Target: ratio >= 3x for the
   784-2048-2048-10 MLP (the 784-512-512-10 one is front-bound: its ratio is reported only).
2. **Overload** (open loop): ``--max-queue 256``, submissions paced at twice the batched
   capacity measured in 1. (a pacing loop that never waits for results) for ``seconds``;
   reported: /metrics queue depth every 100 ms (target: levels at max_queue), the latency of
   the 429 answers (target p99 < 5 ms), the server's RSS at start, peak and end (VmRSS of its
   process; bounded), and /healthz latency every 10 ms from a separate client **process**
   (target p99 < 10 ms: proof that inference does not hold the server's GIL; a thread of this
   process would measure this process's own GIL hand-offs instead). Each overload runs twice:
   the workers at normal priority, and under SCHED_IDLE (``--worker-priority idle``), where a
   woken front thread (or client) preempts a computing worker at once instead of waiting for
   its time slice to end.

    $ python benchmarks/bench_serve_http.py [--quick] [--markdown]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterator

import numpy as np

import fastloop as fl

from ..serve.http_inputs import NPY_TYPE, npy_bytes
from .serve import ClosedLoopRun, mlp
from .targets import Result
from .timing import best_times, cpu_s

CLIENTS = 64
WORKERS = 2
HIDDEN = (512, 2048)  # 784-h-h-10
OVERLOAD_QUEUE = 256
OPEN_LOOP_CONNECTIONS = 256  # enough that the pacing never waits for a free connection
HEADERS = ["model", "variant", "jobs/s", "p50 ms", "p99 ms", "polls/job", "mean batch", "server CPU %",
           "client CPU %", "jobs"]
COMMAND = "python benchmarks/bench_serve_http.py"
NPY_MAGIC = b"\x93NUMPY"
NPY_VARIANT = ", .npy bodies"


# ------------------------------------------------------------ the server process
class Server:
    """``python -m fastloop serve`` in a child process on a free loopback port.

    >>> with Server(checkpoint, max_batch=32) as server: print(server.port, server.rss_mib())
    """

    def __init__(self, checkpoint: str, *, max_batch: int, max_delay_s: float = 0.002, max_queue: int = 1024,
                 workers: int = WORKERS, worker_priority: str = "normal") -> None:
        self.port = _free_port()
        self.args = [sys.executable, "-m", "fastloop", "serve", "--model", checkpoint, "--port", str(self.port),
                     "--num-workers", str(workers), "--max-batch", str(max_batch), "--max-delay-s", str(max_delay_s),
                     "--max-queue", str(max_queue), "--store", "memory", "--log-level", "warning",
                     "--worker-priority", worker_priority]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> "Server":
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}: "
                                   f"{self.proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
                    if s.recv(64).startswith(b"HTTP/1.1 200"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.__exit__()
        raise RuntimeError("the server did not answer /healthz within 30 s")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(2)  # SIGINT: uvicorn stops, the service drains (nothing waits long)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()

    def rss_mib(self) -> float:
        """The server process's resident set (VmRSS), MiB."""
        with open(f"/proc/{self.proc.pid}/status") as f:  # type: ignore[union-attr]
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the server process has used, all its threads."""
        return cpu_s(self.proc.pid)  # type: ignore[union-attr]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def checkpoint(model: fl.nn.Sequential) -> Iterator[str]:
    """The model as a .npz checkpoint (parameters and arch) in a temporary directory."""
    from fastloop.serve import arch_of
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.npz")
        np.savez(path, **fl.nn.training_state(model, arch=arch_of(model)))
        yield path


# ------------------------------------------------------------ a minimal keep-alive HTTP/1.1 client
class Conn:
    """One keep-alive connection on asyncio streams; request() sends one request and reads
    the whole response (the server always sends Content-Length), and reconnects when the
    answer says ``connection: close`` (server processes rebalancing their connections)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> "Conn":
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return self

    async def request(self, method: str, path: str, body: bytes = b"", accept: str = "",
                      headers: str = "") -> tuple[int, bytes]:
        """(status, body); a body starting with .npy's magic goes as application/x-npy.
        `headers`: more header lines, each ending in CRLF (a content-type there replaces ours)."""
        head = f"{method} {path} HTTP/1.1\r\nhost: b\r\ncontent-length: {len(body)}\r\n{headers}"
        if body and "content-type:" not in headers.lower():
            kind = NPY_TYPE if body.startswith(NPY_MAGIC) else "application/json"
            head += f"content-type: {kind}\r\n"
        if accept:
            head += f"accept: {accept}\r\n"
        self.writer.write(head.encode() + b"\r\n" + body)  # type: ignore[union-attr]
        await self.writer.drain()  # type: ignore[union-attr]
        header = await self.reader.readuntil(b"\r\n\r\n")  # type: ignore[union-attr]
        status = int(header[9:12])
        at = header.lower().find(b"content-length:")
        length = int(header[at + 15:header.index(b"\r\n", at)]) if at >= 0 else 0
        body = await self.reader.readexactly(length)  # type: ignore[union-attr]
        if b"\r\nconnection: close\r\n" in header.lower():  # the server moves this client: reconnect
            self.close()
            await self.open()
        return status, body

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return float("nan")


def _batch_totals(text: str) -> tuple[float, float]:
    return _metric(text, "fastloop_serve_batch_size_sum"), _metric(text, "fastloop_serve_batch_size_count")


# ------------------------------------------------------------ 1. closed loop
@dataclass
class Run(ClosedLoopRun):
    """A run of the HTTP server, its clients polling for results."""

    polls_per_job: float
    mean_batch: float
    server_cpu: float  # share of one core over the window
    client_cpu: float

    def row(self) -> list[object]:
        return self.first_cells() + [round(self.polls_per_job, 1), round(self.mean_batch, 1),
                                     round(100 * self.server_cpu), round(100 * self.client_cpu), self.jobs]


def model_name(model: fl.nn.Sequential) -> str:
    return "-".join(str(n) for n in [model.in_features] + [layer.out_features for layer in model
                                                              if isinstance(layer, fl.nn.Linear)])


def job_bodies(model: fl.nn.Sequential, count: int, body_format: str = "json") -> list[bytes]:
    """Request bodies, one float32 input each (4 decimals, as a client would send pixels):
    JSON, or .npy (``body_format="npy"``: sent as application/x-npy)."""
    x = np.round(np.random.default_rng(1).standard_normal((count, model.in_features)), 4).astype(np.float32)
    if body_format == "npy":
        return [npy_bytes(row) for row in x]
    return [json.dumps({"inputs": row.tolist()}).encode() for row in x]


async def run_job(conn: Conn, body: bytes, accept: str = "", wait_s: float | None = None,
                  on_request: Callable[[], None] | None = None) -> tuple[int, str | None]:
    """One job as a client runs it: POST the body to /v1/jobs, then GET its result until it
    is there — polling (the first GET after 1 ms, the wait doubling up to 20 ms), or with
    ``wait_s`` long-polling (GET .../result?wait_s=, no wait between). ``on_request`` is
    called before each request. Returns the number of GETs and None, or a failure naming
    the request that got an unexpected answer."""
    count = on_request or (lambda: None)
    count()
    status, reply = await conn.request("POST", "/v1/jobs", body)
    if status != 202:
        return 0, f"POST /v1/jobs answered {status}: {reply[:200]!r}"
    path = f"/v1/jobs/{json.loads(reply)['id']}/result"
    if wait_s is not None:
        path += f"?wait_s={wait_s:g}"
    wait, gets = 0.001, 0
    while True:
        if wait_s is None:
            await asyncio.sleep(wait)
        count()
        status, reply = await conn.request("GET", path, accept=accept)
        gets += 1
        if status == 200:
            return gets, None
        if status != 202:
            return gets, f"GET {path} answered {status}: {reply[:200]!r}"
        wait = min(2 * wait, 0.02)


class Window:
    """The measured stretch of a closed-loop run, between warm-up and the end."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.end: float | None = None

    def is_open(self, at: float | None = None) -> bool:
        """Whether the window is open now (and `at`, when given, falls inside it)."""
        return self.start is not None and self.end is None and (at is None or at >= self.start)


async def closed_loop(conns: list[Conn], bodies: list[bytes],
                      job: Callable[[Conn, bytes], Awaitable[tuple[int, str | None]]], seconds: float,
                      warmup_s: float, reading: Callable[[], Awaitable[Any]], what: str,
                      window: Window | None = None) -> tuple[list[float], int, float, Any, Any]:
    """One client per (conn, body), each running job() after job() (a closed loop) for warmup_s,
    then `seconds` measured, then until its last job ends; the conns are closed after. Returns
    the latencies of the jobs that ended in the window, the sum of the counts job() returned
    for them, the window's span, and reading() at its start and at its end (CPU, metrics).
    Raises RuntimeError naming `what` when a job fails."""
    window = window or Window()
    latencies: list[float] = []
    counted = [0]
    failures: list[str] = []

    async def client(conn: Conn, body: bytes) -> None:
        while window.end is None:
            start = time.perf_counter()
            n, failure = await job(conn, body)
            if failure:
                failures.append(failure)
                return
            end = time.perf_counter()
            if window.is_open(end):
                latencies.append(end - start)
                counted[0] += n

    tasks = [asyncio.ensure_future(client(c, b)) for c, b in zip(conns, bodies)]
    await asyncio.sleep(warmup_s)
    window.start = time.perf_counter()
    before = await reading()
    await asyncio.sleep(seconds)
    window.end = time.perf_counter()
    after = await reading()
    await asyncio.gather(*tasks)
    for c in conns:
        c.close()
    if failures:
        raise RuntimeError(f"{what}: a client failed: {failures[0]}")
    return latencies, counted[0], window.end - window.start, before, after


async def _closed_loop(port: int, bodies: list[bytes], seconds: float, warmup_s: float,
                       server: Server) -> tuple[list[float], int, float, float, float, tuple[float, float]]:
    conns = [await Conn(port).open() for _ in bodies]

    async def job(conn: Conn, body: bytes) -> tuple[int, str | None]:
        accept = NPY_TYPE if body.startswith(NPY_MAGIC) else ""  # results come back as the inputs went
        return await run_job(conn, body, accept)

    async def reading() -> tuple[float, float, tuple[float, float]]:
        return server.cpu_s(), time.process_time(), _batch_totals(await _scrape(port))

    latencies, polls, span, (cpu0, mine0, metrics0), (cpu1, mine1, metrics1) = await closed_loop(
        conns, bodies, job, seconds, warmup_s, reading, "HTTP serve benchmark")
    batched = (metrics1[0] - metrics0[0], metrics1[1] - metrics0[1])
    return latencies, polls, span, (cpu1 - cpu0) / span, (mine1 - mine0) / span, batched


async def _scrape(port: int) -> str:
    conn = await Conn(port).open()
    try:
        return (await conn.request("GET", "/metrics"))[1].decode()
    finally:
        conn.close()


def measure(ckpt: str, model: fl.nn.Sequential, variant: str, max_batch: int, *, seconds: float,
            warmup_s: float, clients: int = CLIENTS, body_format: str = "json") -> Run:
    """Closed loop over HTTP: `clients` connections submit and poll, for warmup_s + seconds."""
    bodies = job_bodies(model, clients, body_format)
    with Server(ckpt, max_batch=max_batch) as server:
        latencies, polls, span, server_cpu, client_cpu, (jobs_in_batches, batches) = asyncio.run(
            _closed_loop(server.port, bodies, seconds, warmup_s, server))
    lat = np.array(latencies) * 1e3
    p50, p99 = np.percentile(lat, [50, 99]) if lat.size else (float("nan"),) * 2
    return Run(model_name(model), variant, int(lat.size), span, float(p50), float(p99),
               polls / max(1, lat.size), jobs_in_batches / max(1.0, batches), server_cpu, client_cpu)


def model_costs(model: fl.nn.Sequential, batch: int = 32) -> tuple[float, float]:
    """Seconds per row of `model` in this process: one row alone, and inside a batch of `batch`."""
    x = np.random.default_rng(2).standard_normal((batch, model.in_features)).astype(np.float32)
    times = best_times({"one": lambda: model(x[:1]), "batch": lambda: model(x)}, rounds=5)
    return times["one"], times["batch"] / batch


# ------------------------------------------------------------ 2. overload
@dataclass
class Overload:
    model: str
    variant: str
    capacity: float  # jobs/s, from the closed loop
    offered: float  # submissions/s actually sent
    seconds: float
    max_queue: int
    accepted: int
    rejected: int
    reject_p50_ms: float
    reject_p99_ms: float
    accept_p50_ms: float
    accept_p99_ms: float
    depth: list[tuple[float, float]]  # (seconds since the start, queue depth)
    rss_start: float
    rss_peak: float
    rss_end: float
    health_p50_ms: float
    health_p99_ms: float
    health_max_ms: float
    health_probes: int
    wake_p99_ms: float  # the probe process's own sleep() wake-up delay, p99: the machine's share
    server_cpu: float
    client_cpu: float
    other: dict[str, int] = field(default_factory=dict)  # answers other than 202/429 (and healthz 200)
    load: float = float("nan")  # the machine's 1-minute load average at the end

    def plateau(self) -> float:
        """Median queue depth over the second half of the overload."""
        late = [d for t, d in self.depth if self.seconds / 2 <= t <= self.seconds]
        return float(np.median(late)) if late else float("nan")

    def depth_line(self, every_s: float = 0.5) -> str:
        points, next_t = [], 0.0
        for t, d in self.depth:
            if t >= next_t:
                points.append(f"{t:.1f}s:{d:.0f}")
                next_t += every_s
        return " ".join(points)


_PROBE = r"""
import http.client, json, sys, time
port, seconds, every = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
conn.request("GET", "/healthz"); conn.getresponse().read()
print("ready", flush=True)
sys.stdin.readline()
out, late, end = [], [], time.perf_counter() + seconds
while time.perf_counter() < end:
    start = time.perf_counter()
    conn.request("GET", "/healthz")
    r = conn.getresponse(); r.read()
    out.append([time.perf_counter() - start, r.status])
    nap = max(0.0, every - (time.perf_counter() - start))
    woke = time.perf_counter() + nap
    time.sleep(nap)
    late.append(time.perf_counter() - woke)  # the machine's wake-up delay, no server involved
print(json.dumps([out, late]), flush=True)
"""


async def _open_loop(server: Server, body: bytes, rate: float, seconds: float,
                     connections: int) -> dict[str, Any]:
    port = server.port
    conns = [await Conn(port).open() for _ in range(connections)]
    scraper = await Conn(port).open()
    results: list[tuple[int, float]] = []
    depth: list[tuple[float, float]] = []
    rss: list[float] = [server.rss_mib()]
    ticket = [0]
    t0 = time.perf_counter() + 0.05
    stop_at = t0 + seconds

    async def submitter(conn: Conn) -> None:
        while True:
            k = ticket[0]
            ticket[0] += 1
            due = t0 + k / rate
            if due >= stop_at:
                return
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            start = time.perf_counter()
            status, _ = await conn.request("POST", "/v1/jobs", body)
            results.append((status, time.perf_counter() - start))

    async def scrape() -> None:
        while time.perf_counter() < stop_at + 1.0:
            text = (await scraper.request("GET", "/metrics"))[1].decode()
            depth.append((time.perf_counter() - t0, _metric(text, "fastloop_serve_queue_depth")))
            rss.append(server.rss_mib())
            await asyncio.sleep(0.1)

    cpu0, mine0 = server.cpu_s(), time.process_time()
    scraping = asyncio.ensure_future(scrape())
    await asyncio.gather(*(submitter(c) for c in conns))
    sent_by = time.perf_counter()
    cpu1, mine1 = server.cpu_s(), time.process_time()
    await scraping
    for _ in range(100):  # the end RSS: once what was accepted has run
        text = (await scraper.request("GET", "/metrics"))[1].decode()
        if _metric(text, "fastloop_serve_queue_depth") == 0 and _metric(text, "fastloop_serve_running") == 0:
            break
        await asyncio.sleep(0.1)
    rss_end = server.rss_mib()
    for c in conns + [scraper]:
        c.close()
    span = sent_by - t0
    return {"results": results, "depth": depth, "rss": rss, "rss_end": rss_end, "span": span,
            "server_cpu": (cpu1 - cpu0) / span, "client_cpu": (mine1 - mine0) / span}


def overload(ckpt: str, model: fl.nn.Sequential, capacity: float, *, max_batch: int, seconds: float,
             max_queue: int = OVERLOAD_QUEUE, factor: float = 2.0, connections: int = OPEN_LOOP_CONNECTIONS,
             worker_priority: str = "normal", body_format: str = "json") -> Overload:
    """Open loop at factor x capacity (jobs/s of the same server in the closed loop) for
    `seconds` against a server with a small queue, its workers at `worker_priority`."""
    body = job_bodies(model, 1, body_format)[0]
    with Server(ckpt, max_batch=max_batch, max_queue=max_queue, worker_priority=worker_priority) as server:
        probe = subprocess.Popen([sys.executable, "-c", _PROBE, str(server.port), str(seconds), "0.01"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            if probe.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
                raise RuntimeError("the /healthz probe did not start")
            probe.stdin.write("go\n")  # type: ignore[union-attr]
            probe.stdin.flush()  # type: ignore[union-attr]
            out = asyncio.run(_open_loop(server, body, factor * capacity, seconds, connections))
            health, wake_late = json.loads(probe.stdout.readline())  # type: ignore[union-attr]
        finally:
            probe.kill()
            probe.wait()
    statuses = [s for s, _ in out["results"]]
    reject = np.array([lat for s, lat in out["results"] if s == 429]) * 1e3
    accept = np.array([lat for s, lat in out["results"] if s == 202]) * 1e3
    hl = np.array([lat for lat, status in health if status == 200]) * 1e3

    def pct(a: np.ndarray, q: float) -> float:
        return float(np.percentile(a, q)) if a.size else float("nan")

    other: dict[str, int] = {}
    for s in statuses:
        if s not in (202, 429):
            other[f"POST {s}"] = other.get(f"POST {s}", 0) + 1
    for _, s in health:
        if s != 200:
            other[f"healthz {s}"] = other.get(f"healthz {s}", 0) + 1
    variant = f"max_batch={max_batch}, {worker_priority} workers{NPY_VARIANT if body_format == 'npy' else ''}"
    return Overload(model_name(model), variant, capacity, len(statuses) / out["span"], out["span"], max_queue,
                    statuses.count(202), statuses.count(429), pct(reject, 50), pct(reject, 99), pct(accept, 50),
                    pct(accept, 99), out["depth"], out["rss"][0], max(out["rss"]), out["rss_end"], pct(hl, 50),
                    pct(hl, 99), float(hl.max()) if hl.size else float("nan"), int(hl.size),
                    pct(np.array(wake_late) * 1e3, 99), out["server_cpu"], out["client_cpu"], other,
                    os.getloadavg()[0])


# ------------------------------------------------------------ the suite
@dataclass
class Suite:
    runs: list[Run]
    overloads: list[Overload]
    costs: dict[str, tuple[float, float]]  # model -> (s per row alone, s per row in a batch of 32)
    floor: tuple[float, float]  # /healthz closed loop: requests/s, server CPU ms per request


async def _healthz_loop(server: Server, clients: int, seconds: float) -> tuple[float, float]:
    conns = [await Conn(server.port).open() for _ in range(clients)]
    count, stop = [0], [False]

    async def client(conn: Conn) -> None:
        while not stop[0]:
            await conn.request("GET", "/healthz")
            count[0] += 1

    tasks = [asyncio.ensure_future(client(c)) for c in conns]
    await asyncio.sleep(0.3)
    n0, cpu0, t0 = count[0], server.cpu_s(), time.perf_counter()
    await asyncio.sleep(seconds)
    n1, cpu1, t1 = count[0], server.cpu_s(), time.perf_counter()
    stop[0] = True
    await asyncio.gather(*tasks)
    for c in conns:
        c.close()
    return (n1 - n0) / (t1 - t0), (cpu1 - cpu0) * 1e3 / max(1, n1 - n0)


def front_floor(ckpt: str, seconds: float) -> tuple[float, float]:
    """The HTTP front's own cost: 64 clients GET /healthz (touches neither model nor store)
    in a closed loop; requests/s and the server's CPU ms per request."""
    with Server(ckpt, max_batch=32) as server:
        return asyncio.run(_healthz_loop(server, CLIENTS, seconds))


def compare(quick: bool = False) -> Suite:
    """Per model: batched and max_batch=1 over HTTP with JSON bodies, and for the small MLP the same with .npy bodies; the
    front's per-request floor; then the overload on the large MLP at twice the closed-loop
    capacity of the same server (quick: 2 s with a queue of 64, so that it fills), with
    max_batch=1 (the workers are the bottleneck) and, unless quick, max_batch=32 (the front
    is), each with the workers at normal priority and under SCHED_IDLE (``--worker-priority
    idle``), side by side, and max_batch=32 with idle workers and .npy bodies."""
    seconds, warmup, overload_s = (1.5, 0.5, 2.0) if quick else (5.0, 1.0, 5.0)
    runs, costs = [], {}
    for hidden in HIDDEN:
        model = mlp(hidden)
        costs[model_name(model)] = model_costs(model)
        with checkpoint(model) as ckpt:
            runs.append(measure(ckpt, model, "max_batch=32", 32, seconds=seconds, warmup_s=warmup))
            runs.append(measure(ckpt, model, "max_batch=1", 1, seconds=seconds, warmup_s=warmup))
            if hidden == HIDDEN[0]:  # the front-bound model: the same with .npy bodies (no JSON numbers)
                for max_batch in (32,) if quick else (32, 1):
                    runs.append(measure(ckpt, model, f"max_batch={max_batch}{NPY_VARIANT}", max_batch,
                                        seconds=seconds, warmup_s=warmup, body_format="npy"))
    model = mlp(HIDDEN[-1])
    loads = []
    with checkpoint(model) as ckpt:
        floor = front_floor(ckpt, 1.0 if quick else 2.0)
        for max_batch in (1,) if quick else (1, 32):
            capacity = next(r for r in runs if r.model == model_name(model)
                            and r.variant == f"max_batch={max_batch}").jobs_per_s
            priorities = ("normal", "idle") if hasattr(os, "SCHED_IDLE") else ("normal",)
            plans = [(p, "json") for p in priorities] + ([("idle", "npy")] if max_batch > 1 and len(priorities) > 1 else [])
            for priority, body_format in plans:
                loads.append(overload(ckpt, model, capacity, max_batch=max_batch, seconds=overload_s,
                                      max_queue=OVERLOAD_QUEUE // 4 if quick else OVERLOAD_QUEUE,
                                      worker_priority=priority, body_format=body_format))
    return Suite(runs, loads, costs, floor)


def results(suite: Suite) -> list[Result]:
    rows = []
    for model, bodies in [(m, b) for m in dict.fromkeys(r.model for r in suite.runs) for b in ("", NPY_VARIANT)]:
        variants = {r.variant: r for r in suite.runs if r.model == model}
        if f"max_batch=32{bodies}" not in variants or f"max_batch=1{bodies}" not in variants:
            continue
        batched, single = variants[f"max_batch=32{bodies}"], variants[f"max_batch=1{bodies}"]
        ratio = batched.jobs_per_s / single.jobs_per_s
        one, in_batch = suite.costs[model]
        # The target is the model-bound MLP's: a row of the small one costs less than the front's
        # ~0.5-1 ms of CPU per job, so the front, not batching, sets its rate (reported only).
        front_bound = model.startswith(f"784-{HIDDEN[0]}-")
        rows.append(Result(f"HTTP {model}{bodies}: dynamic batching / max_batch=1 throughput", ratio, "x",
                           "(front-bound)" if front_bound else ">= 3", None if front_bound else ratio >= 3,
                           f"{batched.jobs_per_s:.0f} vs {single.jobs_per_s:.0f} jobs/s; model "
                           f"{one * 1e6:.0f} us/row alone, {in_batch * 1e6:.0f} us/row in 32; server CPU "
                           f"{batched.server_cpu * 1e3 / batched.jobs_per_s:.2f} vs "
                           f"{single.server_cpu * 1e3 / single.jobs_per_s:.2f} ms/job"))
    rate, cpu_ms = suite.floor
    rows.append(Result("HTTP front floor: GET /healthz, 64 clients", rate, "req/s", "", None,
                       f"server CPU {cpu_ms:.2f} ms/request (uvicorn + ASGI, no model, no store)"))
    for o in suite.overloads:
        name = f"HTTP overload {o.model} {o.variant}"
        plateau = o.plateau()
        rows.append(Result(f"{name}: queue depth (median, 2nd half)", plateau, "jobs", f"~ {o.max_queue}",
                           o.max_queue * 0.9 <= plateau <= o.max_queue,
                           f"offered {o.offered:.0f}/s = {o.offered / o.capacity:.1f}x capacity {o.capacity:.0f}/s;"
                           f" {o.accepted} accepted, {o.rejected} rejected"
                           + "".join(f", {k}: {v}" for k, v in o.other.items())))
        rows.append(Result(f"{name}: 429 latency p99", o.reject_p99_ms, "ms", "< 5", o.reject_p99_ms < 5,
                           f"p50 {o.reject_p50_ms:.2f} ms; 202 p50 {o.accept_p50_ms:.2f}, p99 {o.accept_p99_ms:.2f} ms"))
        rows.append(Result(f"{name}: server RSS peak - start", o.rss_peak - o.rss_start, "MiB", "< 64 (bounded)",
                           o.rss_peak - o.rss_start < 64,
                           f"start {o.rss_start:.0f}, peak {o.rss_peak:.0f}, end {o.rss_end:.0f} MiB"))
        rows.append(Result(f"{name}: /healthz p99", o.health_p99_ms, "ms", "< 10", o.health_p99_ms < 10,
                           f"p50 {o.health_p50_ms:.2f}, max {o.health_max_ms:.1f} ms, {o.health_probes} probes; "
                           f"server CPU {100 * o.server_cpu:.0f}%, client CPU {100 * o.client_cpu:.0f}%; "
                           f"the probe's own sleep() woke p99 {o.wake_p99_ms:.2f} ms late (the machine, "
                           f"load {o.load:.1f})"))
    return rows
