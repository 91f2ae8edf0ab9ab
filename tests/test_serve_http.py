"""fastloop.serve's HTTP front (ASGI on uvicorn), WebSocket events, Client and CLI, end to
end against live servers on loopback."""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import numpy as np
import pytest

uvicorn = pytest.importorskip("uvicorn")
ws_client = pytest.importorskip("websockets.sync.client")

import fastloop as fl  # noqa: E402
from fastloop.serve import (InferenceService, JobCancelled, JobExpired, JobFailed, MemoryStore,  # noqa: E402
                            StoreError)
from fastloop.serve import arch_of  # noqa: E402
from fastloop.serve.client import BadRequest, Client  # noqa: E402
from fastloop.serve.http import App  # noqa: E402
from fastloop.serve.http_inputs import NPY_TYPE as NPY  # noqa: E402
from fastloop.serve.http_limits import uvicorn_config  # noqa: E402
from waiting import wait_for  # noqa: E402

IN, OUT = 16, 4
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sample(i: int) -> np.ndarray:
    return np.random.default_rng(i).standard_normal(IN).astype(np.float32)


class Gate:
    """A model that blocks (holding no lock) until released; raises on rows whose first value
    is 999."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.calls = 0

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.calls += 1
        assert self.open.wait(20), "the test never released the gate"
        if (batch[:, 0] == 999).any():
            raise ValueError("999 is not a number this model takes")
        return batch * 2


@contextlib.contextmanager
def serving(app: App, sndbuf: int | None = None, **limits):
    """Runs `app` under uvicorn (with the front's connection limits, as the CLI does) in a
    thread on a free loopback port; yields the base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if sndbuf is not None:  # accepted sockets inherit it: a slow reader fills it sooner
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn_config(app, log_level="warning", ws="websockets-sansio", **limits)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_for(lambda: server.started or not thread.is_alive())
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def call(base: str, method: str, path: str, body=None, raw: bytes | None = None, headers=None):
    """(status, headers, decoded JSON or text) of one request."""
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    conn.request(method, path, body=data, headers=headers or {})
    response = conn.getresponse()
    text = response.read().decode()
    conn.close()
    kind = response.getheader("content-type", "")
    return response.status, response, (json.loads(text) if kind.startswith("application/json") else text)


def poll(base: str, job_id: str, until=("done", "failed"), timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status, _, body = call(base, "GET", f"/v1/jobs/{job_id}")
        if status != 200 or body["status"] in until:
            return body
        assert time.monotonic() < deadline, f"job {job_id} still {body['status']}"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def mlp():
    fl.nn.manual_seed(0)
    return fl.nn.Sequential(fl.nn.Linear(IN, 32), fl.nn.ReLU(), fl.nn.Linear(32, OUT))


@pytest.fixture(scope="module")
def inputs_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("serve-http")
    root = base / "inputs"
    root.mkdir()
    np.save(root / "x.npy", sample(7))
    np.save(base / "outside.npy", sample(8))
    os.symlink(base / "outside.npy", root / "escape.npy")
    np.save(root / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with open(root / "pickle.npy", "wb") as f:
        pickle.dump([1.0] * IN, f)
    return root


@pytest.fixture(scope="module")
def mlp_server(mlp, inputs_dir):
    service = InferenceService(mlp, num_workers=2, store=MemoryStore())
    app = App(service, input_root=str(inputs_dir), max_body_bytes=64 << 10)
    with serving(app) as base:
        yield base, service
    service.close()


APPS: dict[str, App] = {}  # base URL -> the App it serves (for tests that look inside)


@pytest.fixture()
def gate_server():
    gate = Gate()
    service = InferenceService(gate, num_workers=1, max_queue=2, max_batch=1, max_delay_s=0, store=MemoryStore())
    app = App(service, retry_after_s=3)
    with serving(app) as base:
        APPS[base] = app
        yield base, service, gate
        gate.open.set()
    service.close(timeout=5)


# ---------------------------------------------------------------- submit, poll, result


def test_json_submit_returns_202_with_location_and_the_result_equals_the_model(mlp_server, mlp):
    base, _ = mlp_server
    x = sample(1)
    status, response, body = call(base, "POST", "/v1/jobs", {"inputs": x.tolist()})
    assert status == 202 and response.getheader("location") == f"/v1/jobs/{body['id']}"
    assert poll(base, body["id"])["status"] == "done"
    status, _, answer = call(base, "GET", f"/v1/jobs/{body['id']}/result")
    assert status == 200 and answer["dtype"] == "float32"
    np.testing.assert_array_equal(np.array(answer["result"], np.float32), mlp(x[None])[0])


def test_a_client_id_makes_submit_idempotent(mlp_server):
    base, service = mlp_server
    first = call(base, "POST", "/v1/jobs", {"inputs": sample(2).tolist(), "id": "same-id"})
    again = call(base, "POST", "/v1/jobs", {"inputs": sample(3).tolist(), "id": "same-id"})
    assert first[0] == again[0] == 202 and first[2]["id"] == again[2]["id"] == "same-id"
    poll(base, "same-id")
    assert service.stats()["submitted"] >= 1


def test_npy_path_under_the_input_root_is_served(mlp_server, mlp):
    base, _ = mlp_server
    status, _, body = call(base, "POST", "/v1/jobs", {"path": "x.npy"})
    assert status == 202
    poll(base, body["id"])
    answer = call(base, "GET", f"/v1/jobs/{body['id']}/result")[2]
    np.testing.assert_array_equal(np.array(answer["result"], np.float32), mlp(sample(7)[None])[0])


@pytest.mark.parametrize("path", ["../outside.npy", "escape.npy", "ABS", "missing.npy", "x.txt",
                                  "objects.npy", "pickle.npy"])
def test_paths_outside_the_root_symlink_escapes_and_pickles_are_refused_with_400(mlp_server, inputs_dir, path):
    base, _ = mlp_server
    if path == "ABS":
        path = str(inputs_dir.parent / "outside.npy")
    status, _, body = call(base, "POST", "/v1/jobs", {"path": path})
    assert status == 400 and body["error"], body


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'{"inputs": [1, 2, 3]}', b'{"inputs": [["a"]]}',
                                 b'{"inputs": "abc"}', b'{"inputs": [1], "path": "x.npy"}', b'{"other": 1}',
                                 b'{"inputs": [0], "id": "../bad"}'])
def test_malformed_json_wrong_shape_and_non_numbers_are_400_with_the_reason(mlp_server, raw):
    base, _ = mlp_server
    status, response, body = call(base, "POST", "/v1/jobs", raw=raw, headers={"content-type": "application/json"})
    assert status == 400 and response.getheader("content-type") == "application/json"
    assert isinstance(body["error"], str) and body["error"]


def test_an_oversize_body_is_413_by_content_length_and_by_streamed_size(mlp_server):
    base, _ = mlp_server
    big = json.dumps({"inputs": [0.0] * 40000}).encode()
    assert call(base, "POST", "/v1/jobs", raw=big)[0] == 413
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    conn.request("POST", "/v1/jobs", body=iter([big[i:i + 8192] for i in range(0, len(big), 8192)]),
                 encode_chunked=True)  # no Content-Length: the server counts what arrives
    assert conn.getresponse().status == 413
    conn.close()


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=array.dtype == object)
    return buffer.getvalue()


def call_npy(base: str, method: str, path: str, raw: bytes | None = None):
    """(status, headers, array | decoded JSON) of a request sending and accepting .npy."""
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    conn.request(method, path, body=raw, headers={"content-type": NPY, "accept": NPY})
    response = conn.getresponse()
    data = response.read()
    conn.close()
    if response.getheader("content-type") == NPY:
        return response.status, response, np.load(io.BytesIO(data), allow_pickle=False)
    return response.status, response, json.loads(data)


def test_a_npy_body_is_served_and_a_npy_result_keeps_the_dtype_exactly(mlp_server, mlp):
    base, _ = mlp_server
    x = sample(12)
    status, response, body = call_npy(base, "POST", "/v1/jobs", npy(x))
    assert status == 202 and response.getheader("location") == f"/v1/jobs/{body['id']}"
    assert poll(base, body["id"])["status"] == "done"
    status, response, row = call_npy(base, "GET", f"/v1/jobs/{body['id']}/result")
    assert status == 200 and response.getheader("x-job-id") == body["id"]
    assert row.dtype == np.float32 and np.array_equal(row, mlp(x[None])[0])
    assert call(base, "GET", f"/v1/jobs/{body['id']}/result")[2]["result"] == row.tolist()  # JSON unless asked
    pixels = np.arange(IN, dtype=np.uint8)  # integers convert to the model's dtype, as a JSON list would
    job = call_npy(base, "POST", "/v1/jobs", npy(pixels))[2]["id"]
    assert poll(base, job)["status"] == "done"
    assert np.array_equal(call_npy(base, "GET", f"/v1/jobs/{job}/result")[2], mlp(pixels[None].astype(np.float32))[0])


def test_a_npy_body_takes_its_id_from_the_query_and_stays_idempotent(mlp_server):
    base, service = mlp_server
    first = call_npy(base, "POST", "/v1/jobs?id=npy-job-1", npy(sample(13)))
    again = call_npy(base, "POST", "/v1/jobs?id=npy-job-1", npy(sample(14)))
    assert first[0] == again[0] == 202 and first[2]["id"] == again[2]["id"] == "npy-job-1"
    assert call_npy(base, "POST", "/v1/jobs?id=../x", npy(sample(13)))[0] == 400


@pytest.mark.parametrize("raw, words", [
    (b"not an array at all", "not a .npy array"),
    (npy(np.array([{"a": 1}], dtype=object)), "not a .npy array"),  # pickled objects
    (npy(sample(1))[:-5], "not a .npy array"),  # truncated
    (npy(sample(1)) + b"tail", "4 bytes after"),
    (npy(sample(1).astype(np.float64)), "dtype float64.*float32"),
    (npy(sample(1)[:3]), r"shape \(3,\)"),
    (npy(np.array(["a"] * IN)), "numbers"),
])
def test_bad_npy_bodies_are_400_naming_the_cause(mlp_server, raw, words):
    base, service = mlp_server
    submitted = service.stats()["submitted"]
    status, _, body = call_npy(base, "POST", "/v1/jobs", raw)
    assert status == 400 and re.search(words, body["error"]), body
    assert service.stats()["submitted"] == submitted


def test_unknown_job_is_404_and_healthz_is_ok(mlp_server):
    base, _ = mlp_server
    assert call(base, "GET", "/v1/jobs/nope")[0] == 404
    assert call(base, "GET", "/v1/jobs/nope/result")[0] == 404
    assert call(base, "DELETE", "/v1/jobs/nope")[0] == 404
    assert call(base, "GET", "/v1/nothing")[0] == 404
    status, _, body = call(base, "GET", "/healthz")
    assert status == 200 and body["status"] == "ok" and body["stuck_workers"] == 0


# ---------------------------------------------------------------- queue full, failures, cancel, expiry


class SlowCreateStore(MemoryStore):
    """A MemoryStore whose create() of the job "slow" waits until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()  # set once a create() of "slow" waits

    def create(self, record, inputs):
        if record.id == "slow":
            self.entered.set()
            assert self.release.wait(20), "the test never released the store"
        return super().create(record, inputs)


def test_a_store_that_blocks_is_written_in_the_pool_and_never_stalls_the_loop():
    # A MemoryStore subclass may block (a durable write, a network): its submits go through
    # the pool, so while one waits there the loop answers /healthz and takes other jobs.
    store = SlowCreateStore()
    service = InferenceService(lambda batch: batch * 2, num_workers=1, max_delay_s=0, store=store)
    answers = {}
    with serving(App(service)) as base, contextlib.ExitStack() as undo:
        undo.callback(store.release.set)
        slow = threading.Thread(target=lambda: answers.update(slow=call(base, "POST", "/v1/predict",
                                                                         {"inputs": [1.0], "id": "slow"})))
        slow.start()
        assert store.entered.wait(10)  # the slow predict's create() waits in the store now
        assert call(base, "GET", "/healthz")[0] == 200
        status, _, body = call(base, "POST", "/v1/predict", {"inputs": [2.0]})
        assert status == 200 and body["result"] == [4.0]
        assert "slow" not in answers
        store.release.set()
        slow.join(10)
        assert answers["slow"][0] == 200 and answers["slow"][2]["result"] == [2.0], answers
    service.close(timeout=5)


def test_small_json_bodies_are_submitted_on_the_loop_large_ones_and_paths_in_the_pool(inputs_dir):
    # The memory store never blocks: a JSON body under 64 KB is parsed and submitted on the
    # event loop. One of 64 KB or more (parsed in C without the GIL), and a "path" input
    # (a file read), go through the pool. The "queued" event comes from the submitting thread.
    service = InferenceService(lambda batch: batch[:, :1], max_delay_s=0, store=MemoryStore())
    submitted_on: dict[str, str] = {}

    def listener(job_id: str, status: str) -> None:
        if status == "queued":
            submitted_on[job_id] = threading.current_thread().name

    service.subscribe(listener)
    with serving(App(service, input_root=str(inputs_dir))) as base:
        small, large = [0.5] * 64, [0.5] * (20 << 10)
        assert len(json.dumps({"inputs": large})) >= 64 << 10 > len(json.dumps({"inputs": small}))
        for job_id, body in [("small", {"inputs": small}), ("large", {"inputs": large}),
                             ("path", {"path": "x.npy"})]:
            status, _, answer = call(base, "POST", f"/v1/predict?id={job_id}", body)
            assert status == 200 and answer["id"] == job_id, answer
        status, _, answer = call(base, "POST", "/v1/jobs", {"path": "missing.npy"})  # refused in the pool
        assert status == 400 and "missing.npy" in answer["error"]
    service.close(timeout=5)
    assert not submitted_on["small"].startswith("fastloop-http"), submitted_on
    assert submitted_on["large"].startswith("fastloop-http") and submitted_on["path"].startswith("fastloop-http")


def test_a_request_admitted_on_the_loop_keeps_its_slot_while_it_waits_for_the_pool():
    gate, store = Gate(), SlowCreateStore()
    service = InferenceService(gate, num_workers=1, max_queue=2, max_batch=1, max_delay_s=0, store=store)
    answers = {}

    def post(name, body):
        answers[name] = call(base, "POST", "/v1/jobs", body)

    with serving(App(service, num_workers=1)) as base, contextlib.ExitStack() as undo:  # one pool thread
        undo.callback(gate.open.set)  # a failed assertion must not leave the threads waiting
        undo.callback(store.release.set)
        running = call(base, "POST", "/v1/jobs", {"inputs": [1.0]})[2]["id"]
        wait_for(lambda: gate.calls == 1)  # the queue is empty again: 2 slots
        posts = [threading.Thread(target=post, args=("slow", {"inputs": [2.0], "id": "slow"}))]
        posts[0].start()  # holds slot 1 and the pool's thread until the store is released
        wait_for(lambda: service.stats()["queue_depth"] == 1)
        posts.append(threading.Thread(target=post, args=("admitted", {"inputs": [3.0]})))
        posts[1].start()  # admitted on the loop: slot 2 is its own while it waits for the pool
        wait_for(lambda: service.reject_if_full())
        with pytest.raises(fl.QueueFull):
            service.submit(np.array([4.0]))  # a later submit finds no slot
        store.release.set()
        for thread in posts:
            thread.join(10)
        assert answers["slow"][0] == 202 and answers["admitted"][0] == 202, answers
        gate.open.set()
        jobs = [running, "slow", answers["admitted"][2]["id"]]
        assert [poll(base, job)["status"] for job in jobs] == ["done"] * 3
    service.close(timeout=5)


def test_a_full_queue_answers_429_with_retry_after_and_stores_nothing(gate_server):
    base, service, gate = gate_server
    running = call(base, "POST", "/v1/jobs", {"inputs": [1.0]})[2]["id"]
    wait_for(lambda: gate.calls == 1)  # the worker holds it: the queue is empty again
    queued = [call(base, "POST", "/v1/jobs", {"inputs": [float(i)]})[2]["id"] for i in range(2)]
    status, response, body = call(base, "POST", "/v1/jobs", {"inputs": [5.0], "id": "refused"})
    assert status == 429 and response.getheader("retry-after") == "3" and "full" in body["error"]
    assert call(base, "GET", "/v1/jobs/refused")[0] == 404
    status, response, body = call(base, "POST", "/v1/jobs", {"inputs": [6.0]})  # answered before parsing
    assert status == 429 and response.getheader("retry-after") == "3" and "full" in body["error"]
    assert call_npy(base, "POST", "/v1/jobs", npy(np.ones(1)))[0] == 429  # .npy bodies too
    again = call(base, "POST", "/v1/jobs", {"inputs": [0.0], "id": queued[0]})  # a known id stays idempotent
    assert again[0] == 202 and again[2]["id"] == queued[0]
    again = call_npy(base, "POST", f"/v1/jobs?id={queued[1]}", npy(np.ones(1)))
    assert again[0] == 202 and again[2]["id"] == queued[1]
    assert service.stats()["rejected"] == 3
    assert call(base, "GET", "/healthz")[0] == 200  # the worker is busy in the model; the front is not
    assert call(base, "GET", f"/v1/jobs/{running}/result")[:3:2] == (202, {"id": running, "status": "running"})
    gate.open.set()
    assert [poll(base, job)["status"] for job in [running, *queued]] == ["done"] * 3


def test_a_model_error_fails_that_job_only_and_the_server_keeps_serving(gate_server):
    base, _, gate = gate_server
    gate.open.set()
    bad = call(base, "POST", "/v1/jobs", {"inputs": [999.0]})[2]["id"]
    body = poll(base, bad)
    assert body["status"] == "failed" and "999" in body["error"]
    status, _, answer = call(base, "GET", f"/v1/jobs/{bad}/result")
    assert status == 422 and answer["cancelled"] is False and "ValueError" in answer["error"]
    good = call(base, "POST", "/v1/jobs", {"inputs": [1.5]})[2]["id"]
    assert poll(base, good)["status"] == "done"
    assert call(base, "GET", f"/v1/jobs/{good}/result")[2]["result"] == [3.0]


def test_a_long_poll_answers_when_the_job_ends_or_202_after_wait_s(gate_server):
    base, service, gate = gate_server
    job = call(base, "POST", "/v1/jobs", {"inputs": [1.5]})[2]["id"]
    wait_for(lambda: gate.calls == 1)  # running, held in the model
    started = time.monotonic()
    status, response, body = call(base, "GET", f"/v1/jobs/{job}/result?wait_s=0.3")
    assert (status, body) == (202, {"id": job, "status": "running"}) and time.monotonic() - started >= 0.3
    answer: dict = {}
    waiter = threading.Thread(target=lambda: answer.update(got=call(base, "GET", f"/v1/jobs/{job}/result?wait_s=20")))
    waiter.start()
    wait_for(lambda: APPS[base].watching(job))  # the long poll waits on the job's status events
    gate.open.set()
    waiter.join(20)
    status, _, body = answer["got"]
    assert status == 200 and body["result"] == [3.0]
    assert call(base, "GET", f"/v1/jobs/{job}/result?wait_s=5")[2]["result"] == [3.0]  # done: at once
    for bad in ("-1", "nan", "61", "soon"):
        status, _, body = call(base, "GET", f"/v1/jobs/{job}/result?wait_s={bad}")
        assert status == 400 and "wait_s" in body["error"], bad
    assert call(base, "GET", "/v1/jobs/nosuchjob/result?wait_s=1")[0] == 404


def test_delete_cancels_a_queued_job(gate_server):
    base, _, gate = gate_server
    first = call(base, "POST", "/v1/jobs", {"inputs": [1.0]})[2]["id"]
    wait_for(lambda: gate.calls == 1)
    second = call(base, "POST", "/v1/jobs", {"inputs": [2.0]})[2]["id"]
    assert call(base, "DELETE", f"/v1/jobs/{second}")[:3:2] == (200, {"id": second, "cancelled": True,
                                                                     "status": "failed"})
    status, _, answer = call(base, "DELETE", f"/v1/jobs/{first}")  # running: nothing deleted
    assert (status, answer["cancelled"], answer["status"]) == (409, False, "running") and "queued" in answer["error"]
    status, _, answer = call(base, "GET", f"/v1/jobs/{second}/result")
    assert status == 422 and answer["cancelled"] is True
    status, _, answer = call(base, "GET", f"/v1/jobs/{second}")  # deleted: gone from then on
    assert status == 410 and answer["cancelled"] is True and answer["status"] == "failed"
    gate.open.set()


def test_an_expired_result_is_410_gone(mlp):
    service = InferenceService(mlp, store=MemoryStore(), result_ttl_s=0.2, expired_ttl_s=30)
    with serving(App(service)) as base:
        job = call(base, "POST", "/v1/jobs", {"inputs": sample(4).tolist()})[2]["id"]
        poll(base, job)
        wait_for(lambda: call(base, "GET", f"/v1/jobs/{job}")[0] == 410, timeout=5)
        status, _, body = call(base, "GET", f"/v1/jobs/{job}/result")
        assert status == 410 and body["status"] == "expired"
    service.close()


class DownStore(MemoryStore):
    """A store whose backend is unreachable once `down` is set."""

    down = False

    def create(self, record, inputs):
        if self.down:
            raise ConnectionError("the store is down")
        return super().create(record, inputs)

    def get(self, job_id):
        if self.down:
            raise StoreError("the store is down")
        return super().get(job_id)


def test_a_store_that_is_down_answers_503_and_the_server_recovers(mlp):
    store = DownStore()
    service = InferenceService(mlp, store=store)
    with serving(App(service)) as base:
        job = call(base, "POST", "/v1/jobs", {"inputs": sample(12).tolist()})[2]["id"]
        poll(base, job)
        store.down = True
        status, response, body = call(base, "POST", "/v1/jobs", {"inputs": sample(13).tolist()})
        assert status == 503 and response.getheader("retry-after") and "down" in body["error"]
        assert call(base, "GET", f"/v1/jobs/{job}")[0] == 503
        assert call(base, "GET", "/healthz")[0] == 200
        with pytest.raises(ConnectionError):
            Client(base).submit(inputs=sample(14))
        store.down = False
        assert call(base, "GET", f"/v1/jobs/{job}/result")[0] == 200
        assert call(base, "POST", "/v1/jobs", {"inputs": sample(13).tolist()})[0] == 202
    service.close()


# ---------------------------------------------------------------- WebSocket


def ws_url(base: str, path: str) -> str:
    return base.replace("http://", "ws://") + path


def ws_statuses(base: str, path: str) -> list[str]:
    """The statuses a job's events WebSocket at path sends until the server closes it."""
    statuses = []
    with ws_client.connect(ws_url(base, path)) as ws:
        while True:
            try:
                statuses.append(json.loads(ws.recv(timeout=10))["status"])
            except Exception:
                break
    return statuses


def test_websocket_pushes_queued_running_done_then_closes(gate_server):
    base, _, gate = gate_server
    call(base, "POST", "/v1/jobs", {"inputs": [1.0]})
    wait_for(lambda: gate.calls == 1)
    job = call(base, "POST", "/v1/jobs", {"inputs": [2.0]})[2]["id"]
    with ws_client.connect(ws_url(base, f"/v1/jobs/{job}/events"), open_timeout=5) as ws:
        first = json.loads(ws.recv(timeout=5))
        gate.open.set()
        seen = [first] + [json.loads(message) for message in ws]  # iteration ends at the server's close
    assert seen[0] == {"id": job, "status": "queued"}
    assert [m["status"] for m in seen] == ["queued", "running", "done"]
    assert ws.close_code == 1000


def test_websocket_for_a_finished_job_sends_its_status_and_closes(mlp_server):
    base, _ = mlp_server
    job = call(base, "POST", "/v1/jobs", {"inputs": sample(5).tolist()})[2]["id"]
    poll(base, job)
    with ws_client.connect(ws_url(base, f"/v1/jobs/{job}/events"), open_timeout=5) as ws:
        assert [json.loads(m) for m in ws] == [{"id": job, "status": "done"}]


def raw_websocket(base: str, path: str, rcvbuf: int) -> socket.socket:
    """A WebSocket opened by hand on a socket with a tiny receive buffer, that the test then
    does not read: the slowest client there is."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: it sets the window
    sock.settimeout(10)
    sock.connect(("127.0.0.1", int(base.rsplit(":", 1)[1])))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def test_a_slow_websocket_client_is_dropped_while_a_reading_one_gets_every_event(mlp):
    service = InferenceService(mlp, num_workers=2, max_queue=100000, store=MemoryStore())
    app = App(service, ws_buffer=256)
    with serving(app, sndbuf=4096) as base:
        slow = raw_websocket(base, "/v1/events", rcvbuf=2048)
        with ws_client.connect(ws_url(base, "/v1/events"), open_timeout=5) as fast:
            wait_for(lambda: "fastloop_ws_connections 2" in call(base, "GET", "/metrics")[2])
            n = 3000
            got: list[dict] = []
            reader = threading.Thread(target=lambda: got.extend(json.loads(m) for _, m in zip(range(3 * n), fast)))
            reader.start()
            x = sample(6)
            # Paced so the reading client is never more than 40 jobs (120 events) behind, well
            # inside ws_buffer, while the one that never reads falls further back each round.
            for start in range(0, n, 40):
                for _ in range(40):
                    service.submit(x)
                wait_for(lambda: len(got) >= 3 * (start + 40))
            reader.join(30)
        assert len(got) == 3 * n, f"the reading client got {len(got)} of {3 * n} events"
        assert "fastloop_ws_dropped_total 1" in call(base, "GET", "/metrics")[2]
        received = b""
        while b"\x03\xf0too slow" not in received:  # what was buffered, then the 1008 close frame,
            chunk = slow.recv(65536)
            if not chunk:  # or the end of the stream: a peer that reads nothing may never get the frame
                break
            received += chunk
        assert 0 < received.count(b'"status"') < 3 * n
        slow.close()
    service.close()


# ---------------------------------------------------------------- metrics


_SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="[^"]*",?)*\})? '
                     r'(-?[0-9.]+(e[+-]?[0-9]+)?|NaN|[+-]Inf)$')


def test_metrics_is_prometheus_text_with_queue_depth_counters_and_histograms(mlp_server):
    base, _ = mlp_server
    job = call(base, "POST", "/v1/jobs", {"inputs": sample(9).tolist()})[2]["id"]
    poll(base, job)
    status, response, text = call(base, "GET", "/metrics")
    assert status == 200 and response.getheader("content-type").startswith("text/plain; version=0.0.4")
    samples = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$", line), line
            continue
        assert _SAMPLE.match(line), f"not a Prometheus sample line: {line!r}"
        name, value = line.rsplit(" ", 1)
        samples[name] = float(value)
    assert samples["fastloop_serve_queue_depth"] == 0
    assert samples['fastloop_serve_jobs_total{outcome="done"}'] >= 1
    assert samples['fastloop_serve_batch_size_bucket{le="+Inf"}'] == samples["fastloop_serve_batch_size_count"] >= 1
    assert 'fastloop_serve_latency_seconds{quantile="0.99"}' in samples
    assert 'fastloop_http_rejections_total{reason="queue_full"}' in samples
    assert samples['fastloop_http_responses_total{code="202"}'] >= 1


# ---------------------------------------------------------------- Client


def test_client_submit_result_cancel_and_errors(gate_server):
    base, _, gate = gate_server
    client = Client(base, timeout=5)
    running = client.submit(inputs=np.array([1.0]))
    wait_for(lambda: gate.calls == 1)
    with pytest.raises(TimeoutError):
        client.result(running, timeout=0.1)
    queued = client.submit(inputs=[2.0], job_id="client-queued")
    assert queued == "client-queued" and client.status(queued) == "queued"
    client.submit(inputs=[3.0])
    with pytest.raises(fl.QueueFull) as full:
        client.submit(inputs=[4.0])
    assert full.value.retry_after == 3
    assert client.cancel(queued) is True
    with pytest.raises(JobCancelled):
        client.result(queued)
    gate.open.set()
    np.testing.assert_array_equal(client.result(running, timeout=10), [2.0])
    with pytest.raises(JobFailed, match="999"):
        client.result(client.submit(inputs=[999.0]), timeout=10)
    with pytest.raises(KeyError):
        client.status("unknown-id")
    with pytest.raises(BadRequest):
        client.submit(path="x.npy")  # this server has no input root
    assert client.healthz()
    with pytest.raises(ConnectionError):
        Client("http://127.0.0.1:9", timeout=2).submit(inputs=[1.0])


def test_client_sends_arrays_as_npy_keeping_their_dtype_and_lists_as_json(mlp_server, mlp):
    base, _ = mlp_server
    client = Client(base, timeout=5)
    x = sample(21)
    row = client.result(client.submit(inputs=x, job_id="client-npy"), timeout=10)
    assert row.dtype == np.float32 and np.array_equal(row, mlp(x[None])[0])
    assert client.submit(inputs=x, job_id="client-npy") == "client-npy"
    np.testing.assert_array_equal(client.result(client.submit(inputs=x.astype(np.float64).tolist()), timeout=10), row)
    with pytest.raises(BadRequest, match="dtype float64, the model computes in float32"):
        client.submit(inputs=x.astype(np.float64))  # an array keeps its dtype: convert it first


def test_client_result_of_an_expired_job_raises_job_expired(mlp):
    service = InferenceService(mlp, store=MemoryStore(), result_ttl_s=0.2, expired_ttl_s=30)
    with serving(App(service)) as base:
        client = Client(base)
        job = client.submit(inputs=sample(10))
        client.result(job, timeout=10)
        wait_for(lambda: client.status(job) == "expired", timeout=5)
        with pytest.raises(JobExpired):
            client.result(job)
    service.close()


# ---------------------------------------------------------------- CLI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("priority", ["normal", pytest.param("idle", marks=pytest.mark.skipif(
    not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's"))])
def test_cli_serves_a_checkpoint_and_stops_cleanly_on_ctrl_c(mlp, tmp_path, priority):
    ckpt = fl.Checkpointer(str(tmp_path / "ckpts"))
    ckpt.save(fl.nn.training_state(mlp, arch=arch_of(mlp), step=1), 1)
    ckpt.wait()
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "fastloop", "serve", "--model", str(tmp_path / "ckpts"),
                             "--port", str(port), "--store", f"file:{tmp_path / 'jobs'}", "--log-level", "warning",
                             "--worker-priority", priority],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        client = Client(f"http://127.0.0.1:{port}", timeout=5)
        wait_for(lambda: client.healthz() or proc.poll() is not None, timeout=30)
        assert proc.poll() is None, proc.stdout.read().decode()
        x = sample(11)
        np.testing.assert_array_equal(client.result(client.submit(inputs=x), timeout=10), mlp(x[None])[0])
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=15)
        output = proc.stdout.read().decode()
        assert rc in (0, 130), output
        assert "Traceback" not in output, output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
