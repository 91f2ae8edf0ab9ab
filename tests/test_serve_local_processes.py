"""``python -m fastloop serve --processes N`` without Redis: N share-nothing server processes
on one port, each with its own queue, workers and store; a job belongs to the process
``owner_of(id, N)`` names, and a request for it that reaches another process is forwarded to
the owner (fastloop.serve.peers).

Tested as a user meets it: the CLI in a subprocess, real HTTP and WebSockets over loopback.
The kernel spreads connections over the processes, so a test that needs a particular one
opens connections until one answers from it (``x-fastloop-process``), then sends its request
on that kept-alive connection."""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
import pytest

uvicorn = pytest.importorskip("uvicorn")
ws_client = pytest.importorskip("websockets.sync.client")

import fastloop as fl  # noqa: E402
from fastloop.serve import Client, JobCancelled  # noqa: E402
from fastloop.serve import arch_of  # noqa: E402
from fastloop.serve.http_inputs import NPY_TYPE  # noqa: E402
from fastloop.serve.peers import owner_of  # noqa: E402
from test_serve_http import IN, ROOT, free_port, mlp, npy, sample, ws_url  # noqa: E402,F401 (mlp: a fixture)
from waiting import read_until, wait_for, wait_until  # noqa: E402
from websockets.exceptions import InvalidStatus  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
PROCESS = "x-fastloop-process"
REACH_S = 30.0  # how long connecting may take to reach a given process (it may be restarting)

pytestmark = pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"),
                                reason="needs Linux's /proc to find the server processes")


# ---------------------------------------------------------------- the server and reaching its processes


def children_of(pid: int) -> set[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return {int(p) for p in f.read().split()}


def request(conn: http.client.HTTPConnection, method: str, path: str, body=None, raw: bytes | None = None,
            headers: dict | None = None):
    """(status, response, JSON | array | text) of one request on `conn` (kept open)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    conn.request(method, path, body=data, headers=headers or {})
    response = conn.getresponse()
    payload = response.read()
    kind = response.getheader("content-type", "")
    if kind.startswith("application/json"):
        return response.status, response, json.loads(payload)
    if kind.startswith(NPY_TYPE):
        return response.status, response, np.load(io.BytesIO(payload), allow_pickle=False)
    return response.status, response, payload.decode(errors="replace")


def served_by(response) -> int:
    value = response.getheader(PROCESS)
    assert value is not None, f"no {PROCESS} header in {response.getheaders()}"
    return int(value)


class Fleet:
    """`python -m fastloop serve --processes 2 ...` on a free port; stop() ends it with Ctrl-C."""

    def __init__(self, args: list[str], cwd: str | None = None, env: dict | None = None, n: int = 2) -> None:
        self.n, self.port = n, free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "fastloop", "serve", "--port", str(self.port),
                                      "--processes", str(n), "--log-level", "warning", "--drain-s", "2", *args],
                                     env=env or ENV, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.output = ""
        wait_for(lambda: self.proc.poll() is not None or len(children_of(self.proc.pid)) == n, timeout=30)
        assert self.proc.poll() is None, self.proc.stdout.read().decode()
        for i in range(n):  # every process serves before a test starts
            self.connect(i).close()

    def connect(self, i: int, timeout: float = REACH_S) -> http.client.HTTPConnection:
        """A kept-alive connection that process i accepted (its /healthz said so)."""
        deadline = time.monotonic() + timeout
        seen: list[str] = []
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the server exited: {self.proc.stdout.read().decode()[-4000:]}"
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            try:
                status, response, _ = request(conn, "GET", "/healthz")
            except OSError as error:  # a process going away under the connection
                seen.append(repr(error))
                conn.close()
                continue
            seen.append(f"{status} from {response.getheader(PROCESS)}")
            # an answer with "connection: close" (the process moving a client off: over its
            # share of connections) leaves no connection to reuse
            if status == 200 and response.getheader(PROCESS) == str(i) and not response.will_close:
                return conn
            conn.close()
        raise AssertionError(f"no connection reached process {i} in {timeout:g} s; {len(seen)} tries answered "
                             f"{sorted(set(seen))}")

    def on(self, i: int, method: str, path: str, body=None, raw: bytes | None = None, headers=None):
        """(status, response, body) of one request sent to process i."""
        conn = self.connect(i)
        try:
            return request(conn, method, path, body, raw, headers)
        finally:
            conn.close()

    def websocket(self, i: int, path: str):
        """A WebSocket opened on a connection that process i accepted."""
        conn = self.connect(i)
        sock, conn.sock = conn.sock, None  # the kept-alive socket, now the WebSocket's
        return ws_client.connect(ws_url(self.base, path), sock=sock, open_timeout=10)

    def pid_of(self, i: int) -> int:
        """The pid of process i: the child holding the server end of a connection i accepted."""
        conn = self.connect(i)
        try:
            client_port = conn.sock.getsockname()[1]
            wanted = f"0100007F:{self.port:04X} 0100007F:{client_port:04X}"
            with open("/proc/net/tcp") as f:
                inodes = [line.split()[9] for line in f if " ".join(line.split()[1:3]) == wanted]
            assert len(inodes) == 1, (wanted, inodes)
            link = f"socket:[{inodes[0]}]"
            for pid in children_of(self.proc.pid):
                with contextlib.suppress(OSError):
                    if any(os.readlink(f"/proc/{pid}/fd/{fd}") == link for fd in os.listdir(f"/proc/{pid}/fd")):
                        return pid
            raise AssertionError(f"no server process holds {link}")
        finally:
            conn.close()

    def stop(self) -> str:
        """Ctrl-C; waits for the supervisor and returns its output (stacks on a hang)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            left = children_of(self.proc.pid)
            for pid in left:
                os.kill(pid, signal.SIGUSR1)  # its stacks, for the failure message
            stacks = read_until(self.proc.stdout, lambda out: out.count(b"Current thread") >= len(left), timeout=10)
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            self.proc.kill()
            pytest.fail(f"the server did not stop within 60 s; processes left: {left}; "
                        f"{(stacks + self.proc.stdout.read()).decode()[-12000:]}")
        self.output = self.proc.stdout.read().decode()
        assert rc == 0, self.output
        assert "Traceback" not in self.output, self.output
        return self.output

    def kill(self) -> None:
        if self.proc.poll() is None:
            for pid in children_of(self.proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def fleet(*args: str, **kwargs):
    server = Fleet(list(args), **kwargs)
    try:
        yield server
        server.stop()
    finally:
        server.kill()


@pytest.fixture(scope="module")
def checkpoint(mlp, tmp_path_factory):
    path = tmp_path_factory.mktemp("local-processes") / "ckpts"
    ckpt = fl.Checkpointer(str(path))
    ckpt.save(fl.nn.training_state(mlp, arch=arch_of(mlp), step=1), 1)
    ckpt.wait()
    return str(path)


GATED_MODEL = '''
import os
import time


def build():
    """A model that holds every call until the file $FASTLOOP_TEST_GATE exists, then doubles."""
    gate = os.environ["FASTLOOP_TEST_GATE"]

    def model(batch):
        while not os.path.exists(gate):
            time.sleep(0.005)
        return batch * 2
    return model
'''


@contextlib.contextmanager
def gated_fleet(tmp_path, *args: str):
    """Two processes serving the gated model, one worker each, one job per model call: a job
    runs only once the test opens the gate (yields (fleet, open_gate))."""
    (tmp_path / "gated_model.py").write_text(GATED_MODEL)
    gate = tmp_path / "gate-open"
    env = dict(ENV, FASTLOOP_TEST_GATE=str(gate))
    with contextlib.ExitStack() as undo:
        server = undo.enter_context(fleet("--model", "gated_model:build", "--num-workers", "1", "--max-batch", "1",
                                          "--max-delay-s", "0", *args, cwd=str(tmp_path), env=env))
        undo.callback(gate.touch)  # before the stop: a held job would hold the drain
        yield server, gate.touch


def id_owned_by(i: int, stem: str, n: int = 2) -> str:
    return next(f"{stem}-{k}" for k in range(1000) if owner_of(f"{stem}-{k}", n) == i)


def submitted_count(server: Fleet, i: int) -> float:
    """Process i's fastloop_serve_jobs_total{outcome="submitted"} (its /metrics)."""
    status, response, text = server.on(i, "GET", "/metrics")
    assert status == 200 and served_by(response) == i
    match = re.search(r'^fastloop_serve_jobs_total\{outcome="submitted"\} (\S+)$', text, re.M)
    assert match, text[:2000]
    return float(match.group(1))


def test_owner_of_is_crc32_of_the_id_modulo_n():
    for job_id in ("a", "job-1", "0" * 32, "x.y_z-9"):
        for n in (1, 2, 3, 7):
            assert owner_of(job_id, n) == zlib.crc32(job_id.encode()) % n


# ---------------------------------------------------------------- results, status, long poll across processes


def test_every_job_is_answered_by_its_owner_from_either_process(checkpoint, mlp):
    with fleet("--model", checkpoint, "--store", "memory", "--num-workers", "1") as server:
        jobs: dict[str, tuple[np.ndarray, int]] = {}
        for i in range(16):  # over connections to each process in turn, then wherever they land
            x = sample(100 + i)
            if i < 8:
                status, response, body = server.on(i % 2, "POST", "/v1/jobs", {"inputs": x.tolist()})
                assert served_by(response) == i % 2
            else:
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
                status, response, body = request(conn, "POST", "/v1/jobs", {"inputs": x.tolist()})
                conn.close()
            assert status == 202, body
            job = body["id"]
            assert re.fullmatch(r"[0-9a-f]{32}", job), job
            assert owner_of(job, 2) == served_by(response), "a fresh id is the accepting process's own"
            assert response.getheader("location") == f"/v1/jobs/{job}"
            jobs[job] = (x, served_by(response))
        assert {owner for _, owner in jobs.values()} == {0, 1}
        for job, (x, owner) in jobs.items():
            other = 1 - owner
            status, response, body = server.on(other, "GET", f"/v1/jobs/{job}/result?wait_s=20")
            assert status == 200 and served_by(response) == owner, (status, body)
            assert body["id"] == job and body["status"] == "done" and body["dtype"] == "float32"
            np.testing.assert_allclose(np.array(body["result"], np.float32), mlp(x[None])[0], rtol=1e-6)
            status, response, body = server.on(other, "GET", f"/v1/jobs/{job}")
            assert status == 200 and served_by(response) == owner and body["status"] == "done", body
            assert body["submitted"] <= body["started"] <= body["finished"]
            status, response, row = server.on(other, "GET", f"/v1/jobs/{job}/result", headers={"accept": NPY_TYPE})
            assert status == 200 and served_by(response) == owner and response.getheader("x-job-id") == job
            assert row.dtype == np.float32 and np.array_equal(row, mlp(x[None])[0])
        client = Client(server.base, timeout=10)  # the user's client, over whatever connections it gets
        for job, (x, _) in jobs.items():
            np.testing.assert_allclose(client.result(job, timeout=20), mlp(x[None])[0], rtol=1e-6)
        for i in (0, 1):  # /healthz and /metrics answer for the process the connection reached
            status, response, body = server.on(i, "GET", "/healthz")
            assert status == 200 and served_by(response) == i and body["status"] == "ok"
            assert submitted_count(server, i) == sum(1 for _, owner in jobs.values() if owner == i)


def test_a_long_poll_and_status_of_a_running_job_are_answered_across_processes(tmp_path):
    with gated_fleet(tmp_path) as (server, open_gate):
        status, response, body = server.on(0, "POST", "/v1/jobs", {"inputs": [1.5]})
        job = body["id"]
        assert status == 202 and served_by(response) == 0 == owner_of(job, 2)
        wait_for(lambda: server.on(1, "GET", f"/v1/jobs/{job}")[2]["status"] == "running")
        status, response, body = server.on(1, "GET", f"/v1/jobs/{job}")
        assert status == 200 and served_by(response) == 0 and body["started"] is not None
        started = time.monotonic()
        status, response, body = server.on(1, "GET", f"/v1/jobs/{job}/result?wait_s=0.3")
        assert (status, body) == (202, {"id": job, "status": "running"}) and served_by(response) == 0
        assert time.monotonic() - started >= 0.3
        answer: dict = {}
        conn = server.connect(1)
        poller = threading.Thread(target=lambda: answer.update(
            got=request(conn, "GET", f"/v1/jobs/{job}/result?wait_s=20")))
        poller.start()
        open_gate()
        poller.join(25)
        conn.close()
        status, response, body = answer["got"]
        assert status == 200 and served_by(response) == 0 and body["result"] == [3.0], body
        for bad in ("-1", "nan", "61", "soon"):  # refused as one process refuses them
            status, response, body = server.on(1, "GET", f"/v1/jobs/{job}/result?wait_s={bad}")
            assert status == 400 and "wait_s" in body["error"], (bad, body)
        assert server.on(1, "GET", f"/v1/jobs/{id_owned_by(0, 'nosuch')}/result?wait_s=1")[0] == 404


# ---------------------------------------------------------------- user-given ids


def test_a_user_given_id_belongs_to_its_owner_wherever_it_is_posted_and_stays_idempotent(checkpoint, mlp):
    with fleet("--model", checkpoint, "--store", "memory") as server:
        for owner, stem in ((0, "user-json"), (1, "user-json")):
            job = id_owned_by(owner, stem)
            x, y = sample(1), sample(2)
            status, response, body = server.on(1 - owner, "POST", "/v1/jobs", {"inputs": x.tolist(), "id": job})
            assert status == 202 and body == {"id": job} and served_by(response) == owner, (status, body)
            assert response.getheader("location") == f"/v1/jobs/{job}"
            status, response, body = server.on(owner, "GET", f"/v1/jobs/{job}/result?wait_s=20")
            assert status == 200 and served_by(response) == owner
            np.testing.assert_allclose(np.array(body["result"], np.float32), mlp(x[None])[0], rtol=1e-6)
            first = server.on(owner, "GET", f"/v1/jobs/{job}")[2]
            for where in (owner, 1 - owner):  # again, with other inputs, on either process: the same job
                status, response, body = server.on(where, "POST", "/v1/jobs", {"inputs": y.tolist(), "id": job})
                assert status == 202 and body == {"id": job} and served_by(response) == owner, (where, body)
            status, response, body = server.on(1 - owner, "GET", f"/v1/jobs/{job}")
            assert status == 200 and body == first, (body, first)
            body = server.on(1 - owner, "GET", f"/v1/jobs/{job}/result")[2]
            np.testing.assert_allclose(np.array(body["result"], np.float32), mlp(x[None])[0], rtol=1e-6)
        # .npy bodies carry the id in the query
        job = id_owned_by(1, "user-npy")
        x = sample(3)
        status, response, body = server.on(0, "POST", f"/v1/jobs?id={job}", raw=npy(x),
                                           headers={"content-type": NPY_TYPE})
        assert status == 202 and body == {"id": job} and served_by(response) == 1, body
        status, response, row = server.on(0, "GET", f"/v1/jobs/{job}/result?wait_s=20", headers={"accept": NPY_TYPE})
        assert status == 200 and served_by(response) == 1 and np.array_equal(row, mlp(x[None])[0])
        for where in (0, 1):
            status, response, body = server.on(where, "POST", f"/v1/jobs?id={job}", raw=npy(sample(4)),
                                               headers={"content-type": NPY_TYPE})
            assert status == 202 and body == {"id": job} and served_by(response) == 1
        assert np.array_equal(server.on(0, "GET", f"/v1/jobs/{job}/result", headers={"accept": NPY_TYPE})[2],
                              mlp(x[None])[0])
        # each id was submitted once, by its owner: 2 jobs on process 1 (user-json, user-npy), 1 on 0
        assert (submitted_count(server, 0), submitted_count(server, 1)) == (1, 2)
        # bad ids are refused wherever they are posted, and nothing is submitted
        for where in (0, 1):
            for bad in ("../bad", ".hidden", "a" * 129, "sp ace"):
                status, response, body = server.on(where, "POST", "/v1/jobs", {"inputs": x.tolist(), "id": bad})
                assert status == 400 and "job_id" in body["error"], (where, bad, status, body)
            status, _, body = server.on(where, "POST", "/v1/jobs?id=../x", raw=npy(x),
                                        headers={"content-type": NPY_TYPE})
            assert status == 400, body
            status, _, body = server.on(where, "POST", "/v1/jobs", {"inputs": [1.0, 2.0], "id": "wrong-shape"})
            assert status == 400 and "shape" in body["error"], body
            assert server.on(where, "GET", "/v1/jobs/wrong-shape")[0] == 404
        assert (submitted_count(server, 0), submitted_count(server, 1)) == (1, 2)


# ---------------------------------------------------------------- cancel


def test_delete_cancels_a_queued_job_from_either_process_and_an_unknown_id_is_404(tmp_path):
    with gated_fleet(tmp_path) as (server, open_gate):
        held, queued = {}, {}
        for p in (0, 1):
            held[p] = server.on(p, "POST", "/v1/jobs", {"inputs": [float(p)]})[2]["id"]
            wait_for(lambda: server.on(p, "GET", f"/v1/jobs/{held[p]}")[2]["status"] == "running")
            queued[p] = server.on(p, "POST", "/v1/jobs", {"inputs": [10.0 + p]})[2]["id"]
            assert owner_of(held[p], 2) == owner_of(queued[p], 2) == p
        named = id_owned_by(0, "named-queued")
        assert server.on(1, "POST", "/v1/jobs", {"inputs": [20.0], "id": named})[0] == 202
        for p in (0, 1):
            other = 1 - p
            status, response, body = server.on(other, "GET", f"/v1/jobs/{queued[p]}")
            assert status == 200 and body["status"] == "queued" and served_by(response) == p
            status, response, body = server.on(other, "DELETE", f"/v1/jobs/{queued[p]}")
            assert (status, body) == (200, {"id": queued[p], "cancelled": True, "status": "failed"})
            assert served_by(response) == p
            status, response, body = server.on(other, "DELETE", f"/v1/jobs/{held[p]}")  # running: not cancelled
            assert (status, body["cancelled"], served_by(response)) == (409, False, p), body
            status, response, body = server.on(other, "GET", f"/v1/jobs/{queued[p]}/result")
            assert status == 422 and body["cancelled"] is True and served_by(response) == p, body
            with pytest.raises(JobCancelled):
                Client(server.base, timeout=5).result(queued[p])
        status, response, body = server.on(1, "DELETE", f"/v1/jobs/{named}")
        assert (status, body["cancelled"], served_by(response)) == (200, True, 0), body
        for where in (0, 1):
            for unknown in (id_owned_by(0, "unknown"), id_owned_by(1, "unknown"), "f" * 32):
                status, response, body = server.on(where, "DELETE", f"/v1/jobs/{unknown}")
                assert status == 404 and served_by(response) == owner_of(unknown, 2), (where, unknown, body)
                assert server.on(where, "GET", f"/v1/jobs/{unknown}")[0] == 404
                assert server.on(where, "GET", f"/v1/jobs/{unknown}/result")[0] == 404
            assert server.on(where, "DELETE", "/v1/jobs/..bad")[0] == 404  # not a valid id: unknown
        open_gate()
        for p in (0, 1):
            status, response, body = server.on(1 - p, "GET", f"/v1/jobs/{held[p]}/result?wait_s=20")
            assert status == 200 and body["result"] == [2.0 * p] and served_by(response) == p, body
            assert server.on(1 - p, "GET", f"/v1/jobs/{queued[p]}")[2]["status"] == "failed"


# ---------------------------------------------------------------- WebSockets


def hears_done(ws, job: str, timeout: float) -> bool:
    """Whether `ws` brings the done event of `job` within `timeout` s (other events skipped)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            event = json.loads(ws.recv(timeout=max(0.0, deadline - time.monotonic())))
        except TimeoutError:
            return False
        if event["id"] == job and event["status"] == "done":
            return True


def test_a_jobs_websocket_on_the_other_process_sees_queued_running_done(tmp_path):
    with gated_fleet(tmp_path) as (server, open_gate):
        held = server.on(0, "POST", "/v1/jobs", {"inputs": [1.0]})[2]["id"]
        wait_for(lambda: server.on(0, "GET", f"/v1/jobs/{held}")[2]["status"] == "running")
        job = server.on(0, "POST", "/v1/jobs", {"inputs": [2.0]})[2]["id"]
        with server.websocket(1, f"/v1/jobs/{job}/events") as ws:
            first = json.loads(ws.recv(timeout=10))
            open_gate()
            seen = [first] + [json.loads(message) for message in ws]  # ends at the server's close
        assert seen == [{"id": job, "status": s} for s in ("queued", "running", "done")], seen
        assert ws.close_code == 1000
        with server.websocket(1, f"/v1/jobs/{job}/events") as ws:  # a finished job: its status, then closed
            assert [json.loads(m) for m in ws] == [{"id": job, "status": "done"}]
        with server.websocket(1, f"/v1/jobs/{job}/events?result=1") as ws:  # JSON inputs, no declared dtype
            assert [json.loads(m) for m in ws] == [{"id": job, "status": "done", "dtype": "float64", "shape": [1],
                                                   "result": [4.0]}]
        unknown = id_owned_by(0, "no-such-job")
        for where in (0, 1):  # refused as one process refuses it: the handshake is answered 403
            with pytest.raises(InvalidStatus) as refused:
                server.websocket(where, f"/v1/jobs/{unknown}/events")
            assert refused.value.response.status_code == 403, (where, refused.value)


def events_until_done(ws, jobs, timeout: float = 10.0) -> dict[str, list[str]]:
    """The statuses `ws` brings for each of `jobs` until all are done, or `timeout` s pass."""
    heard: dict[str, list[str]] = {}
    deadline = time.monotonic() + timeout
    while any(heard.get(job, [None])[-1] != "done" for job in jobs) and time.monotonic() < deadline:
        try:
            event = json.loads(ws.recv(timeout=max(0.0, deadline - time.monotonic())))
        except TimeoutError:
            break
        heard.setdefault(event["id"], []).append(event["status"])
    return heard


def submit_to_both(server: Fleet, first: int, k0: int = 0) -> dict[str, int]:
    """Three jobs on each process, alternating, process `first` first: job id -> its process."""
    jobs = {server.on(p, "POST", "/v1/jobs", {"inputs": sample(k0 + k).tolist()})[2]["id"]: p
            for k in range(3) for p in (first, 1 - first)}
    assert sorted(owner_of(job, 2) == p for job, p in jobs.items()) == [True] * 6
    return jobs


def test_the_every_job_websocket_of_one_process_streams_the_jobs_of_both(checkpoint):
    with fleet("--model", checkpoint, "--store", "memory") as server:
        for listener in (0, 1):
            with server.websocket(listener, "/v1/events") as ws:
                wait_for(lambda: hears_done(ws, server.on(1 - listener, "POST", "/v1/jobs", {
                    "inputs": sample(99).tolist()})[2]["id"], 1.0), timeout=20)  # it has joined the other
                jobs = submit_to_both(server, 1 - listener)
                heard = events_until_done(ws, jobs)
            for job, p in jobs.items():
                assert heard.get(job) == ["queued", "running", "done"], (listener, job, p, heard)


def test_the_every_job_websocket_hears_jobs_submitted_right_after_it_was_accepted(checkpoint):
    with fleet("--model", checkpoint, "--store", "memory") as server:
        for listener in (0, 1):
            with server.websocket(listener, "/v1/events") as ws:
                jobs = submit_to_both(server, 1 - listener)  # at once: an accepted stream is listening
                heard = events_until_done(ws, jobs)
            missed = {job: (p, heard.get(job)) for job, p in jobs.items()
                      if heard.get(job) != ["queued", "running", "done"]}
            assert not missed, f"/v1/events on process {listener} missed (job: (its process, heard)): {missed}"


# ---------------------------------------------------------------- a killed process


def test_a_killed_process_is_replaced_and_with_the_memory_store_its_jobs_are_gone(checkpoint, mlp):
    with fleet("--model", checkpoint, "--store", "memory") as server:
        jobs = {p: [server.on(p, "POST", "/v1/jobs", {"inputs": sample(10 + k).tolist()})[2]["id"]
                    for k in range(3)] for p in (0, 1)}
        for p in (0, 1):
            for job in jobs[p]:
                assert server.on(p, "GET", f"/v1/jobs/{job}/result?wait_s=20")[0] == 200
        victim, survivor = 1, 0
        pid = server.pid_of(victim)
        with server.websocket(survivor, "/v1/events") as ws:
            os.kill(pid, signal.SIGKILL)
            answers = set()
            for job in jobs[victim]:  # down or already replaced: 503 (with Retry-After) or 404, never a hang or 500
                for method, path in (("GET", f"/v1/jobs/{job}"), ("GET", f"/v1/jobs/{job}/result?wait_s=2"),
                                     ("DELETE", f"/v1/jobs/{job}")):
                    started = time.monotonic()
                    status, response, body = server.on(survivor, method, path)
                    assert time.monotonic() - started < 8, (method, path)
                    assert status in (503, 404), (method, path, status, body)
                    if status == 503:
                        assert response.getheader("retry-after"), response.getheaders()
                    answers.add(status)
            for k in range(4):  # new jobs keep being served meanwhile
                status, response, body = server.on(survivor, "POST", "/v1/jobs", {"inputs": sample(20 + k).tolist()})
                assert status == 202 and served_by(response) == survivor
                row = server.on(survivor, "GET", f"/v1/jobs/{body['id']}/result?wait_s=20")[2]["result"]
                np.testing.assert_allclose(np.array(row, np.float32), mlp(sample(20 + k)[None])[0], rtol=1e-6)
            wait_for(lambda: pid not in children_of(server.proc.pid) and len(children_of(server.proc.pid)) == 2)
            assert server.pid_of(victim) != pid  # the replacement took process 1's place
            for job in jobs[victim]:  # gone with the process, as for one in-memory server
                for where in (survivor, victim):
                    status, response, body = server.on(where, "GET", f"/v1/jobs/{job}")
                    assert status == 404 and served_by(response) == victim, (where, status, body)
                    assert server.on(where, "GET", f"/v1/jobs/{job}/result")[0] == 404
            for job in jobs[survivor]:
                assert server.on(victim, "GET", f"/v1/jobs/{job}")[2]["status"] == "done"
            # the replacement serves, and the survivor's /v1/events, opened before the kill, hears
            # its jobs again once it has joined the replacement (events in between may be lost)
            deadline, probes = time.monotonic() + 20, 0
            while True:
                fresh = server.on(victim, "POST", "/v1/jobs", {"inputs": sample(30).tolist()})[2]["id"]
                assert owner_of(fresh, 2) == victim
                probes += 1
                if hears_done(ws, fresh, 2.0):
                    break
                assert time.monotonic() < deadline, f"the survivor's /v1/events never heard the replacement ({probes})"
        body = server.on(survivor, "GET", f"/v1/jobs/{fresh}/result?wait_s=20")[2]
        np.testing.assert_allclose(np.array(body["result"], np.float32), mlp(sample(30)[None])[0], rtol=1e-6)
        output = server.stop()
    assert f"server process {pid} died (signal 9); starting another" in output, output


def test_with_a_file_store_a_replaced_process_answers_its_finished_jobs(checkpoint, mlp, tmp_path):
    store = tmp_path / "jobs"
    with fleet("--model", checkpoint, "--store", f"file:{store}") as server:
        jobs = {p: [server.on(p, "POST", "/v1/jobs", {"inputs": sample(40 + 3 * p + k).tolist()})[2]["id"]
                    for k in range(3)] for p in (0, 1)}
        results = {}
        for p in (0, 1):
            for job in jobs[p]:
                status, response, row = server.on(1 - p, "GET", f"/v1/jobs/{job}/result?wait_s=20",
                                                  headers={"accept": NPY_TYPE})
                assert status == 200 and served_by(response) == p
                results[job] = row
        assert sorted(os.listdir(store)) == ["process-0", "process-1"]
        victim, survivor = 0, 1
        pid = server.pid_of(victim)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: pid not in children_of(server.proc.pid) and len(children_of(server.proc.pid)) == 2)
        assert server.pid_of(victim) != pid
        for p in (victim, survivor):
            for k, job in enumerate(jobs[p]):
                for where in (survivor, victim):
                    # 503 only while the owner is still coming back
                    assert wait_until(lambda: server.on(where, "GET", f"/v1/jobs/{job}")[0] != 503)
                    status, response, row = server.on(where, "GET", f"/v1/jobs/{job}/result",
                                                      headers={"accept": NPY_TYPE})
                    assert status == 200 and served_by(response) == p, (where, job, status, row)
                    assert np.array_equal(row, results[job])
                    np.testing.assert_allclose(row, mlp(sample(40 + 3 * p + k)[None])[0], rtol=1e-6)
        fresh = server.on(victim, "POST", "/v1/jobs", {"inputs": sample(50).tolist()})[2]["id"]
        body = server.on(survivor, "GET", f"/v1/jobs/{fresh}/result?wait_s=20")[2]
        np.testing.assert_allclose(np.array(body["result"], np.float32), mlp(sample(50)[None])[0], rtol=1e-6)
        output = server.stop()
    assert f"server process {pid} died (signal 9); starting another" in output, output


def test_the_cli_no_longer_refuses_processes_without_redis_and_refuses_nonsense(checkpoint):
    for args, words in ((["--processes", "0"], "--processes"), (["--processes", "2", "--queue", "redis"], "redis://")):
        proc = subprocess.run([sys.executable, "-m", "fastloop", "serve", "--model", checkpoint,
                               "--port", str(free_port()), *args], env=ENV, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and words in proc.stderr, (args, proc.returncode, proc.stderr)


def test_keep_alive_clients_are_moved_until_the_processes_hold_even_shares(checkpoint):
    """24 kept-alive connections land where the kernel puts them; a process holding more
    than its share answers with "connection: close" and the client reconnects: once no
    answer moves a client, the processes hold 12 each, within one, and no request failed."""
    with fleet("--model", checkpoint, "--store", "memory") as server:
        conns = [http.client.HTTPConnection("127.0.0.1", server.port, timeout=10) for _ in range(24)]
        rounds = []
        while not rounds or rounds[-1][1]:  # until a round in which no client was moved
            assert len(rounds) < 30, rounds
            held, moved = {0: 0, 1: 0}, 0
            for conn in conns:  # http.client reconnects by itself after a "connection: close"
                status, response, body = request(conn, "GET", "/healthz")
                assert status == 200, body
                if response.will_close:
                    moved += 1
                else:
                    held[served_by(response)] += 1
            rounds.append((held, moved))
        for conn in conns:
            conn.close()
        held, _ = rounds[-1]
        assert abs(held[0] - held[1]) <= 2, rounds  # each at most one over the fair 12


def test_tritonclient_infers_against_the_fastloop_serve_command(checkpoint, mlp):
    """Triton's own HTTP client, unchanged, against `python -m fastloop serve` (2 processes):
    health, the checkpoint's model metadata, and JSON and binary infers of a row and a batch,
    each answered with the model's own outputs, whichever process takes the connection."""
    httpclient = pytest.importorskip("tritonclient.http",
                                     reason="tritonclient is not installed: pip install 'tritonclient[http]'")
    with fleet("--model", checkpoint, "--store", "memory", "--num-workers", "1") as server:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
        try:
            assert client.is_server_live() and client.is_server_ready()
            (name,) = [model["name"] for model in server.on(0, "GET", "/v1/models")[2]["models"]]
            metadata = client.get_model_metadata(name)
            (given,) = metadata["inputs"]
            assert given["datatype"] == "FP32" and given["shape"] == [-1, IN]
            for rows, binary in ((1, False), (5, True)):
                x = np.stack([sample(300 + rows + i) for i in range(rows)])
                tensor = httpclient.InferInput(given["name"], list(x.shape), "FP32")
                tensor.set_data_from_numpy(x, binary_data=binary)
                answer = client.infer(name, [tensor], request_id=f"cli-{rows}")
                assert answer.get_response()["id"] == f"cli-{rows}"
                (output,) = answer.get_response()["outputs"]
                np.testing.assert_allclose(answer.as_numpy(output["name"]), mlp(x), rtol=1e-5, atol=1e-6)
        finally:
            client.close()
