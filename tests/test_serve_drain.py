"""SIGTERM (what Docker and Kubernetes send) and Ctrl-C drain `python -m fastloop serve`: new
jobs get 503 with Retry-After and /healthz "draining", the jobs already accepted run and the
requests waiting on them are answered, the store is closed and the process exits 0; with one
process and with --processes. Tested with a real kill -TERM on the CLI."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

pytest.importorskip("uvicorn")

from fastloop.serve import FileStore  # noqa: E402
from waiting import wait_for, wait_until  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))

MODEL = '''
import os
import time

from fastloop.serve import Input


def build():
    """Doubles rows of 4 float32; with $FASTLOOP_TEST_GATE set, each call waits until that
    file exists; with $FASTLOOP_TEST_LOADED set, the factory writes it + ".loading" and
    waits for it first (a model still loading)."""
    gate = os.environ.get("FASTLOOP_TEST_GATE")
    loaded = os.environ.get("FASTLOOP_TEST_LOADED")
    if loaded:
        open(loaded + ".loading", "w").close()
    while loaded and not os.path.exists(loaded):  # polls the test's condition (another process)
        time.sleep(0.005)

    def model(batch):
        while gate and not os.path.exists(gate):
            time.sleep(0.005)
        time.sleep(0.001)  # paces the model: a call takes time, so a drain finds jobs in flight
        return batch * 2
    return model, Input("float32", (4,))
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, path: str, x: list[float], conn: http.client.HTTPConnection | None = None,
         job_id: str | None = None):
    """(status, headers, JSON body) of a POST with {"inputs": x} (and "id": job_id)."""
    own = conn is None
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = {"inputs": x} if job_id is None else {"inputs": x, "id": job_id}
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json"})
        response = conn.getresponse()
        return response.status, response, json.loads(response.read() or b"{}")
    finally:
        if own:
            conn.close()


def get(port: int, path: str):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


class Server:
    """The CLI serving MODEL (from `directory`) on a free port, its jobs in file:`directory`/jobs."""

    def __init__(self, directory, *args: str, env: dict[str, str] | None = None) -> None:
        (directory / "drain_model.py").write_text(MODEL)
        self.port, self.jobs = free_port(), directory / "jobs"
        self.proc = subprocess.Popen([sys.executable, "-m", "fastloop", "serve", "--model", "drain_model:build",
                                      "--port", str(self.port), "--store", f"file:{self.jobs}",
                                      "--log-level", "warning", *args],
                                     cwd=str(directory), env=dict(ENV, **(env or {})),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def wait_serving(self) -> None:
        def up() -> bool:
            with contextlib.suppress(OSError):
                return get(self.port, "/healthz")[0] == 200
            return False
        wait_for(lambda: self.proc.poll() is not None or up(), timeout=60)
        assert self.proc.poll() is None, self.proc.stdout.read().decode()

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def exit_code(self) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"the server did not stop within 60 s: {self.proc.stdout.read().decode()[-4000:]}")
        return rc, self.proc.stdout.read().decode()

    def stored(self) -> dict[str, tuple[str, np.ndarray | None]]:
        """Every job the stopped server left: id -> (status, result)."""
        folders = [self.jobs] if (self.jobs / ".lock").exists() else sorted(self.jobs.glob("process-*"))
        out = {}
        for folder in folders:
            store = FileStore(folder)
            for job_id in [name for name in os.listdir(folder) if not name.startswith(".")]:
                record = store.get(job_id)
                out[job_id] = (record.status, store.get_result(job_id) if record.status == "done" else None)
            store.close()
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.parametrize("processes", [1, 2])
def test_sigterm_refuses_new_jobs_runs_the_accepted_ones_answers_their_predicts_and_exits_0(tmp_path, processes):
    gate = tmp_path / "gate"
    server = Server(tmp_path, "--num-workers", "1", "--max-batch", "1", "--processes", str(processes),
                    env={"FASTLOOP_TEST_GATE": str(gate)})
    try:
        server.wait_serving()
        accepted = {post(server.port, "/v1/jobs", [float(i), 0, 0, 0])[2]["id"]: i for i in range(4)}
        answers: list[tuple[int, dict]] = []

        def predict(i: int) -> None:
            status, _, body = post(server.port, "/v1/predict", [float(i), 1, 1, 1], job_id=f"predict-{i}")
            answers.append((status, body))

        waiting = [threading.Thread(target=predict, args=(10 + i,)) for i in range(2)]
        for t in waiting:
            t.start()
        in_flight = [*accepted, "predict-10", "predict-11"]  # the predicts' requests wait on their jobs
        wait_for(lambda: sum(get(server.port, f"/v1/jobs/{job}")[1].get("status") in ("queued", "running")
                             for job in in_flight) == 6)
        server.terminate()

        def refused() -> bool:  # the signal is handled by now: new jobs are refused
            with contextlib.suppress(OSError):
                status, _, body = post(server.port, "/v1/jobs", [99.0, 0, 0, 0])
                if status == 202:  # sent before the signal was handled: accepted, so it must run
                    accepted[body["id"]] = 99
                return status == 503
            return False
        assert wait_until(refused, timeout=30), server.proc.poll()
        status, response, body = post(server.port, "/v1/predict", [98.0, 0, 0, 0])
        assert status == 503 and response.getheader("retry-after") == "1" and "stopping" in body["error"]
        assert get(server.port, "/healthz") == (503, {"status": "draining", "workers": 1, "stuck_workers": 0})
        job = next(iter(accepted))
        assert get(server.port, f"/v1/jobs/{job}")[1]["status"] in ("queued", "running")  # still answered
        assert server.proc.poll() is None  # held by the jobs it accepted
        gate.touch()
        for t in waiting:
            t.join(timeout=60)
        rc, output = server.exit_code()
        assert rc == 0 and "Traceback" not in output, output
        assert sorted(status for status, _ in answers) == [200, 200], answers
        assert sorted(body["result"][0] for _, body in answers) == [20.0, 22.0]
        stored = server.stored()
        for job_id, i in accepted.items():
            status, result = stored[job_id]
            assert status == "done" and result.tolist() == [2.0 * i, 0, 0, 0]
        assert all(status == "done" for status, _ in stored.values()) and len(stored) == len(accepted) + 2
    finally:
        gate.touch()
        server.kill()


@pytest.mark.parametrize("processes", [1, 2])
def test_under_load_sigterm_loses_no_accepted_job(tmp_path, processes):
    server = Server(tmp_path, "--num-workers", "2", "--max-batch", "8", "--processes", str(processes),
                    "--drain-s", "30")
    accepted: dict[str, float] = {}
    predicted: list[tuple[float, list[float]]] = []
    failures: list[str] = []
    stop = threading.Event()
    lock = threading.Lock()

    def client(c: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        k = 0
        while not stop.is_set():
            k += 1
            value = float(1000 * c + k)
            route = "/v1/predict" if k % 2 else "/v1/jobs"
            try:
                status, _, body = post(server.port, route, [value, 0, 0, 0], conn)
            except (OSError, http.client.HTTPException):
                return  # the server closed the connection or stopped listening: it is stopping
            if status == 503:
                return  # draining: this job was not accepted
            with lock:
                if route == "/v1/jobs" and status == 202:
                    accepted[body["id"]] = value
                elif route == "/v1/predict" and status == 200:
                    predicted.append((value, body["result"]))
                else:
                    failures.append(f"{route}: {status} {body}")

    try:
        server.wait_serving()
        clients = [threading.Thread(target=client, args=(c,)) for c in range(8)]
        for t in clients:
            t.start()
        wait_for(lambda: len(accepted) + len(predicted) >= 200, timeout=60)
        server.terminate()
        rc, output = server.exit_code()
        stop.set()
        for t in clients:
            t.join(timeout=60)
        assert rc == 0 and "Traceback" not in output, output
        assert not failures, failures[:5]
        assert all(result == [2 * value, 0, 0, 0] for value, result in predicted)
        stored = server.stored()
        lost = [job for job in accepted if stored.get(job, ("missing",))[0] != "done"]
        assert not lost, [(job, stored.get(job)) for job in lost[:5]]
        for job_id, value in accepted.items():
            assert stored[job_id][1].tolist() == [2 * value, 0, 0, 0]
        assert {status for status, _ in stored.values()} == {"done"}
    finally:
        stop.set()
        server.kill()


def test_drain_timeout_bounds_the_drain_and_what_is_left_fails_with_the_reason(tmp_path):
    gate = tmp_path / "never"  # the model never returns
    server = Server(tmp_path, "--num-workers", "1", "--max-batch", "1", "--drain-s", "1",
                    env={"FASTLOOP_TEST_GATE": str(gate)})
    try:
        server.wait_serving()
        jobs = [post(server.port, "/v1/jobs", [float(i), 0, 0, 0])[2]["id"] for i in range(3)]
        wait_for(lambda: get(server.port, f"/v1/jobs/{jobs[0]}")[1]["status"] == "running")
        server.terminate()
        rc, output = server.exit_code()
        assert rc == 0, output
        stored = server.stored()
        assert [stored[job][0] for job in jobs] == ["failed"] * 3
    finally:
        server.kill()


def test_a_sigterm_while_the_model_loads_stops_the_server_once_it_serves(tmp_path):
    loaded = tmp_path / "loaded"
    server = Server(tmp_path, env={"FASTLOOP_TEST_LOADED": str(loaded)})
    try:
        wait_for(lambda: (tmp_path / "loaded.loading").exists() or server.proc.poll() is not None, timeout=60)
        server.terminate()
        loaded.touch()
        rc, output = server.exit_code()
        assert rc == 0 and "Traceback" not in output, output
    finally:
        server.kill()
