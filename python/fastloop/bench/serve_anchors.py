"""fastloop serve against the serving libraries a user would pick instead (issue 36): the same
torch MLP (784-1024-1024-10, float32, one intra-op thread everywhere), the same closed-loop
client (serve_http.Conn: raw keep-alive HTTP/1.1 on asyncio, one JSON row of 784 numbers per
request), side by side in one run:

- LitServe, batching on (max_batch_size 32, batch_timeout 2 ms, fast_queue), 1 and 2 workers
  (its best is the one compared);
- MLServer, a custom runtime around the model, adaptive batching (32, 2 ms), over the Open
  Inference Protocol's JSON;
- fastloop ``/v1/predict``, and ``/v2/models/default/infer`` with JSON and with binary tensors
  (2 workers, max_batch 32, 2 ms, as serve_predict).

Each anchor runs from its own Python (a venv with it and torch: ``--litserve-python``,
``--mlserver-python``, or $FASTLOOP_BENCH_LITSERVE_PYTHON / $FASTLOOP_BENCH_MLSERVER_PYTHON);
fastloop's server runs from ``--torch-python`` ($FASTLOOP_BENCH_TORCH_PYTHON; default this
Python when it has torch) with this fastloop on its PYTHONPATH. A row whose server cannot start
is skipped, with the reason. Rounds alternate the servers (all up for the whole run, so each sees
the same disturbances of a shared machine); each keeps its best round at 64 clients, and its
lowest p50 at one client. Server CPU counts the server's process and its children.

    $ python benchmarks/bench_serve_http.py --anchors [--quick] [--litserve-python PY] [--mlserver-python PY]
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .serve_http import CLIENTS, Conn
from .serve_predict import ONE_THREAD, Process, Run, _free_port
from .targets import Result

HIDDEN = 1024
HEADERS = ["server", "route", "clients", "jobs/s", "p50 ms", "p99 ms", "server CPU ms/job", "jobs"]
COMMAND = "python benchmarks/bench_serve_http.py --anchors"
V2_PATH = "/v2/models/default/infer"

# bench_model.py: mlp() for every server, build() for fastloop (the model and its declared Input).
ANCHOR_MODEL_FILE = '''
import torch


def mlp():
    """The benchmark's torch MLP, 784-{h}-{h}-10, in eval mode."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(784, {h}), torch.nn.ReLU(), torch.nn.Linear({h}, {h}),
                               torch.nn.ReLU(), torch.nn.Linear({h}, 10)).eval()


def build():
    from fastloop.serve import Input

    return mlp(), Input(torch.float32, (784,))
'''.replace("{h}", str(HIDDEN))

LITSERVE_FILE = '''
"""LitServe around the benchmark's MLP: batching on (32 rows, 2 ms), fast_queue."""
import sys

import litserve as ls
import torch

from bench_model import mlp


class MLP(ls.LitAPI):
    def setup(self, device):
        torch.set_num_threads(1)
        self.model = mlp()

    def decode_request(self, request):
        return request["inputs"]

    def batch(self, inputs):
        return torch.tensor(inputs, dtype=torch.float32)

    def predict(self, x):
        with torch.inference_mode():
            return self.model(x)

    def unbatch(self, output):
        return list(output)

    def encode_response(self, output):
        return {"result": output.tolist()}


if __name__ == "__main__":
    api = MLP(max_batch_size=32, batch_timeout=0.002)
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=int(sys.argv[2]), fast_queue=True)
    server.run(port=int(sys.argv[1]), log_level="warning", generate_client_file=False)
'''

MLSERVER_FILE = '''
"""An MLServer custom runtime around the benchmark's MLP (its adaptive batching stacks the rows)."""
import numpy as np
import torch
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse

from bench_model import mlp


class TorchMLP(MLModel):
    async def load(self) -> bool:
        torch.set_num_threads(1)
        self.model = mlp()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32, copy=False)
        with torch.inference_mode():
            y = self.model(torch.from_numpy(x)).numpy()
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output("output0", y)])
'''


def _python(option: str | None, env: str, module: str) -> tuple[str | None, str]:
    """(a Python that imports `module`, or None) and why not."""
    python = option or os.environ.get(env)
    if python is None:
        python = sys.executable
    probe = subprocess.run([python, "-c", f"import {module}, torch"], capture_output=True, text=True)
    if probe.returncode:
        return None, (f"{module} and torch do not import in {python} (give --{module}-python or ${env}): "
                      f"{probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else probe.returncode}")
    return python, ""


def _version(python: str, module: str) -> str:
    probe = subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version({module!r}))"],
                           capture_output=True, text=True)
    return probe.stdout.strip() or "?"


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of process pid and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total, stack = 0.0, [pid]
    while stack:
        p = stack.pop()
        total += times.get(p, 0.0)
        stack.extend(children.get(p, []))
    return total


@dataclass
class Target:
    """A server and how to ask it: the route, one request's body and extra header lines."""
    server: str
    route: str
    process: Process
    body: Any  # (row: np.ndarray) -> (bytes, header lines)


def _v1(row: np.ndarray) -> tuple[bytes, str]:
    return json.dumps({"inputs": row.tolist()}).encode(), ""


def _v2_json(row: np.ndarray) -> tuple[bytes, str]:
    return json.dumps({"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32",
                                   "data": row.tolist()}]}).encode(), ""


def _v2_binary(row: np.ndarray) -> tuple[bytes, str]:
    """Triton's binary tensor extension, as tritonclient's set_data_from_numpy sends it (the
    output asked for binary too)."""
    raw = row.astype("<f4").tobytes()
    head = json.dumps({"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32",
                                   "parameters": {"binary_data_size": len(raw)}}],
                       "outputs": [{"name": "output0", "parameters": {"binary_data": True}}]}).encode()
    return head + raw, (f"inference-header-content-length: {len(head)}\r\n"
                        "content-type: application/octet-stream\r\n")


async def _closed_loop(target: Target, clients: int, seconds: float, warmup_s: float) -> Run:
    rows = np.round(np.random.default_rng(1).standard_normal((clients, 784)), 4).astype(np.float32)
    conns = [await Conn(target.process.port).open() for _ in range(clients)]
    window: dict[str, float] = {}
    latencies: list[float] = []
    failures: list[str] = []

    async def client(conn: Conn, body: bytes, headers: str) -> None:
        while "end" not in window:
            start = time.perf_counter()
            status, reply = await conn.request("POST", target.route, body, headers=headers)
            if status != 200:
                failures.append(f"{target.server} {target.route} answered {status}: {reply[:200]!r}")
                return
            end = time.perf_counter()
            if "start" in window and "end" not in window:
                latencies.append(end - start)

    tasks = [asyncio.ensure_future(client(c, *target.body(r))) for c, r in zip(conns, rows)]
    await asyncio.sleep(warmup_s)
    window["start"], cpu0 = time.perf_counter(), tree_cpu_s(target.process.proc.pid)
    await asyncio.sleep(seconds)
    window["end"], cpu1 = time.perf_counter(), tree_cpu_s(target.process.proc.pid)
    await asyncio.gather(*tasks)
    for c in conns:
        c.close()
    if failures:
        raise RuntimeError(failures[0])
    lat = np.array(latencies) * 1e3
    p50, p99 = np.percentile(lat, [50, 99]) if lat.size else (float("nan"),) * 2
    return Run(target.server, target.route, clients, int(lat.size), window["end"] - window["start"], float(p50),
               float(p99), (cpu1 - cpu0) * 1e3 / max(1, lat.size))


def measure(target: Target, clients: int, seconds: float, warmup_s: float) -> Run:
    return asyncio.run(_closed_loop(target, clients, seconds, warmup_s))


def _start(make: Any, skipped: dict[str, str], name: str) -> Process | None:
    try:
        return make()
    except (RuntimeError, OSError) as error:
        skipped[name] = f"did not start: {str(error)[-600:]}"
        return None


def _mlserver_dir(tmp: str, workers: int) -> tuple[str, int]:
    folder = os.path.join(tmp, f"mlserver{workers}")
    os.makedirs(os.path.join(folder, "mlp"))
    port = _free_port()
    with open(os.path.join(folder, "settings.json"), "w") as f:
        json.dump({"http_port": port, "grpc_port": _free_port(), "metrics_port": _free_port(),
                   "parallel_workers": workers, "debug": False, "metrics_endpoint": None}, f)
    with open(os.path.join(folder, "mlp", "model-settings.json"), "w") as f:
        json.dump({"name": "mlp", "implementation": "bench_mlserver.TorchMLP", "max_batch_size": 32,
                   "max_batch_time": 0.002}, f)
    return folder, port


@dataclass
class Suite:
    runs: list[Run]
    skipped: dict[str, str]
    versions: dict[str, str]
    load: tuple[float, float]  # load average (1 min) at the start and at the end
    idle_cpu: dict[str, float] = field(default_factory=dict)  # each server's CPU share while idle


def compare(quick: bool = False, litserve_python: str | None = None, mlserver_python: str | None = None,
            torch_python: str | None = None, litserve_workers: tuple[int, ...] = (1, 2),
            mlserver_workers: tuple[int, ...] = (1,)) -> Suite:
    """Every server up at once, then rounds alternating them at 64 clients, then one client each."""
    seconds, warmup, rounds = (1.5, 0.5, 1) if quick else (5.0, 1.5, 3)
    skipped: dict[str, str] = {}
    versions: dict[str, str] = {}
    load0 = os.getloadavg()[0]
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # fastloop's python/
    ours_py, why = _python(torch_python, "FASTLOOP_BENCH_TORCH_PYTHON", "torch")
    ls_py, ls_why = _python(litserve_python, "FASTLOOP_BENCH_LITSERVE_PYTHON", "litserve")
    ml_py, ml_why = _python(mlserver_python, "FASTLOOP_BENCH_MLSERVER_PYTHON", "mlserver")
    targets: list[Target] = []
    procs: list[Process] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in (("bench_model.py", ANCHOR_MODEL_FILE), ("bench_litserve.py", LITSERVE_FILE),
                           ("bench_mlserver.py", MLSERVER_FILE)):
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
        try:
            if ours_py is None:
                skipped["fastloop"] = why
            else:
                versions["torch"] = _version(ours_py, "torch")
                port = _free_port()
                args = [ours_py, "-m", "fastloop", "serve", "--model", "bench_model:build", "--port", str(port),
                        "--torch-threads", "1", "--num-workers", "2", "--max-batch", "32", "--max-delay-s",
                        "0.002", "--log-level", "warning", "--store", "memory"]
                ours = _start(lambda: Process(args, tmp, port, pythonpath=here), skipped, "fastloop")
                if ours is not None:
                    procs.append(ours)
                    targets += [Target("fastloop", "/v1/predict", ours, _v1),
                                Target("fastloop", f"{V2_PATH} (JSON)", ours, _v2_json),
                                Target("fastloop", f"{V2_PATH} (binary)", ours, _v2_binary)]
            for workers in litserve_workers:
                name = f"LitServe ({workers} worker{'s' if workers > 1 else ''})"
                if ls_py is None:
                    skipped[name] = ls_why
                    continue
                versions["litserve"] = _version(ls_py, "litserve")
                port = _free_port()
                proc = _start(lambda: Process([ls_py, "bench_litserve.py", str(port), str(workers)], tmp, port,
                                              health="/health", start_s=120, env=ONE_THREAD), skipped, name)
                if proc is not None:
                    procs.append(proc)
                    targets.append(Target(name, "/predict", proc, _v1))
            for workers in mlserver_workers:
                name = f"MLServer ({workers} worker{'s' if workers > 1 else ''})"
                if ml_py is None:
                    skipped[name] = ml_why
                    continue
                versions["mlserver"] = _version(ml_py, "mlserver")
                folder, port = _mlserver_dir(tmp, workers)
                cli = os.path.join(os.path.dirname(ml_py), "mlserver")
                cli = cli if os.path.exists(cli) else shutil.which("mlserver") or cli
                proc = _start(lambda: Process([cli, "start", folder], tmp, port, health="/v2/models/mlp/ready",
                                              start_s=180, env=ONE_THREAD), skipped, name)
                if proc is not None:
                    procs.append(proc)
                    targets.append(Target(name, "/v2/models/mlp/infer (JSON)", proc, _v2_json))
            idle = {}
            for proc in procs:  # what each costs while nobody asks it (they share the machine)
                idle[proc] = tree_cpu_s(proc.proc.pid)
            time.sleep(1.0)
            idle_cpu = {t.server: tree_cpu_s(t.process.proc.pid) - idle[t.process] for t in targets}
            runs = _rounds(targets, rounds, seconds, warmup)
        finally:
            for proc in procs:
                proc.stop()
    return Suite(runs, skipped, versions, (load0, os.getloadavg()[0]), idle_cpu)


def _route(target: Target) -> Target:
    return Target(target.server, target.route.split(" ")[0], target.process, target.body)


def _rounds(targets: list[Target], rounds: int, seconds: float, warmup: float) -> list[Run]:
    best: dict[tuple[str, str, int], Run] = {}

    def keep(run: Run, lower_is_better: bool = False) -> None:
        key = (run.server, run.route, run.clients)
        old = best.get(key)
        if old is None or (run.p50_ms < old.p50_ms if lower_is_better else run.jobs_per_s > old.jobs_per_s):
            best[key] = run

    for target in targets:  # warm each once (first requests: lazy imports, allocator growth)
        measure(_route(target), 4, 0.3, 0.3)
    for _ in range(rounds):
        for target in targets:
            run = measure(_route(target), CLIENTS, seconds, warmup)
            run.route = target.route
            keep(run)
    for _ in range(rounds + 1):
        for target in targets:
            run = measure(_route(target), 1, seconds / 2, warmup / 2)
            run.route = target.route
            keep(run, lower_is_better=True)
    return sorted(best.values(), key=lambda r: (r.clients != CLIENTS, [t.server for t in targets].index(r.server),
                                                r.route))


def results(suite: Suite) -> list[Result]:
    """The issue's targets: v2 binary >= 1.0x and v2 JSON >= 0.9x /v1/predict; fastloop
    (/v1/predict) >= 1.5x LitServe's best and MLServer's best, p99 no worse, at 64 clients."""
    many = [r for r in suite.runs if r.clients == CLIENTS]
    ours = {r.route: r for r in many if r.server == "fastloop"}
    rows: list[Result] = []
    v1 = ours.get("/v1/predict")
    if v1 is None:
        return rows
    for route, floor in ((f"{V2_PATH} (binary)", 1.0), (f"{V2_PATH} (JSON)", 0.9)):
        if route in ours:
            ratio = ours[route].jobs_per_s / v1.jobs_per_s
            rows.append(Result(f"HTTP {route} / /v1/predict, {CLIENTS} clients", ratio, "x", f">= {floor}",
                               ratio >= floor, f"{ours[route].jobs_per_s:.0f} vs {v1.jobs_per_s:.0f} jobs/s; p99 "
                                               f"{ours[route].p99_ms:.1f} vs {v1.p99_ms:.1f} ms"))
    for anchor in ("LitServe", "MLServer"):
        theirs = [r for r in many if r.server.startswith(anchor)]
        if not theirs:
            continue
        best = max(theirs, key=lambda r: r.jobs_per_s)
        ratio = v1.jobs_per_s / best.jobs_per_s
        rows.append(Result(f"HTTP fastloop /v1/predict / {best.server}, {CLIENTS} clients", ratio, "x", ">= 1.5",
                           ratio >= 1.5, f"{v1.jobs_per_s:.0f} vs {best.jobs_per_s:.0f} jobs/s"))
        rows.append(Result(f"HTTP p99, fastloop /v1/predict vs {best.server}, {CLIENTS} clients",
                           v1.p99_ms / best.p99_ms, "x", "<= 1", v1.p99_ms <= best.p99_ms,
                           f"{v1.p99_ms:.1f} vs {best.p99_ms:.1f} ms"))
    return rows
