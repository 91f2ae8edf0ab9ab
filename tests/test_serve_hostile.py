"""fastloop.serve against hostile clients: odd ids, special files named as inputs, numbers
no float holds, non-numbers in inputs, NaN in results, and connection abuse."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import numpy as np
import pytest

uvicorn = pytest.importorskip("uvicorn")

import fastloop as fl  # noqa: E402
from fastloop.serve import InferenceService, MemoryStore  # noqa: E402
from fastloop.serve.http import App  # noqa: E402
from fastloop.serve.http_inputs import npy_bytes  # noqa: E402
from fastloop.serve.jobs import check_job_id  # noqa: E402
from test_serve_http import IN, call, poll, sample, serving  # noqa: E402


def strict_json(text: str):
    """json.loads that refuses NaN/Infinity, as JavaScript's JSON.parse and Go's decoder do."""
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    (base / "dir.npy").mkdir()
    os.mkfifo(base / "fifo.npy")
    np.save(base / "ok.npy", sample(1))
    header = npy_bytes(np.zeros(IN, np.float32)).replace(f"({IN},)".encode(), b"(1099511627776,)")
    (base / "huge.npy").write_bytes(header)
    return base


@pytest.fixture(scope="module")
def server(root):
    fl.nn.manual_seed(0)
    model = fl.nn.Sequential(fl.nn.Linear(IN, 4))
    service = InferenceService(model, workers=1, store=MemoryStore())
    with serving(App(service, input_root=str(root), threads=4)) as base:
        yield base, service
    service.close()


def test_a_job_id_ending_in_a_newline_is_refused():
    with pytest.raises(ValueError, match="not valid"):
        check_job_id("job-1\n")
    assert check_job_id("job-1") == "job-1"


def test_a_newline_id_over_http_is_400_and_nothing_is_stored(server):
    base, service = server
    status, _, body = call(base, "POST", "/v1/jobs", {"inputs": sample(0).tolist(), "id": "abc\n"})
    assert status == 400 and "not valid" in body["error"]
    with pytest.raises(KeyError):
        service.status("abc\n")


def test_special_files_named_as_inputs_are_400_without_leaking_fds_or_blocking(server):
    base, _ = server
    fds_before = len(os.listdir("/proc/self/fd"))
    done = threading.Event()

    def flood():
        for _ in range(12):  # more than the pool's 4 threads: a blocking FIFO would freeze it
            status, _, body = call(base, "POST", "/v1/jobs", {"path": "fifo.npy"})
            assert status == 400 and "not a regular file" in body["error"], body
        done.set()

    thread = threading.Thread(target=flood)
    thread.start()
    thread.join(20)
    assert done.is_set(), "FIFO inputs blocked the server"
    for _ in range(20):
        status, _, body = call(base, "POST", "/v1/jobs", {"path": "dir.npy"})
        assert status == 400 and "not a regular file" in body["error"], body
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 2  # the client's own socket may linger
    status, _, body = call(base, "POST", "/v1/jobs", {"path": "ok.npy"})
    assert status == 202 and poll(base, body["id"])["status"] == "done"


def test_a_path_of_many_components_is_refused_quickly(server):
    base, _ = server
    started = time.monotonic()
    status, _, body = call(base, "POST", "/v1/jobs", raw=json.dumps({"path": "a/" * 250_000 + "x.npy"}).encode())
    # the body limit (4 MiB) lets 500 kB through: the path bound must answer, not realpath
    assert status == 400 and "too long" in body["error"], body
    assert time.monotonic() - started < 5


def test_a_400_digit_integer_is_400_not_500(server):
    base, _ = server
    raw = b'{"inputs": [' + b"9" * 400 + b"]}"
    status, _, body = call(base, "POST", "/v1/jobs", raw=raw)
    assert status == 400 and "too large" in body["error"], body
    raw = json.dumps({"inputs": [1e300] + [0.0] * (IN - 1)}).encode()  # past float32's range
    status, _, body = call(base, "POST", "/v1/jobs", raw=raw)
    assert status == 400 and "too large" in body["error"], body


def test_a_npy_claiming_terabytes_is_400_not_500(server, root):
    base, _ = server
    status, _, body = call(base, "POST", "/v1/jobs", {"path": "huge.npy"})
    assert status == 400 and "claims shape" in body["error"], body
    status, _, body = call(base, "POST", "/v1/jobs", raw=(root / "huge.npy").read_bytes(),
                           headers={"content-type": "application/x-npy"})
    assert status == 400 and "claims shape" in body["error"], body


@pytest.mark.parametrize("bad", [None, "1", True, {"a": 1}])
def test_null_strings_and_booleans_inside_inputs_are_400(server, bad):
    base, _ = server
    inputs = sample(2).tolist()
    inputs[3] = bad
    status, _, body = call(base, "POST", "/v1/jobs", {"inputs": inputs})
    assert status == 400 and "numbers" in body["error"], body


@pytest.mark.parametrize("token", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_standard_json_tokens_in_inputs_are_400(server, token):
    base, _ = server
    raw = b'{"inputs": [' + token + b"" + b", 0.0" * (IN - 1) + b"]}"
    status, _, body = call(base, "POST", "/v1/jobs", raw=raw)
    assert status == 400 and "not JSON" in body["error"], body


def test_nan_and_inf_in_a_result_are_sent_as_null_in_strict_json():
    def model(batch):
        out = batch.copy()
        out[:, 0], out[:, 1], out[:, 2] = np.nan, np.inf, -np.inf
        return out

    service = InferenceService(model, workers=1, store=MemoryStore())
    with serving(App(service)) as base:
        status, _, body = call(base, "POST", "/v1/jobs", {"inputs": [1.0, 2.0, 3.0, 4.0]})
        assert status == 202 and poll(base, body["id"])["status"] == "done"
        import http.client
        import urllib.parse
        url = urllib.parse.urlsplit(base)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
        conn.request("GET", f"/v1/jobs/{body['id']}/result")
        answer = strict_json(conn.getresponse().read().decode())
        conn.close()
        assert answer["result"] == [None, None, None, 4.0]
        from fastloop.serve.client import Client
        got = Client(base).result(body["id"])  # asks for .npy: the exact values, inf kept
        assert np.isnan(got[0]) and got[1] == np.inf and got[2] == -np.inf and got[3] == 4.0
    service.close()


# ---------------------------------------------------------------- connection abuse


def connect(base: str) -> socket.socket:
    host, port = base.rsplit("/", 1)[-1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def closed_by_server(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """Reads until the server closes the connection; returns what it sent."""
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


@pytest.fixture()
def limited():
    service = InferenceService(lambda b: b, workers=1, store=MemoryStore())
    with serving(App(service), header_timeout_s=0.5, body_timeout_s=0.5, keep_alive_s=0.5,
                 max_header_bytes=8 << 10) as base:
        yield base
    service.close()


def test_slowloris_connections_are_closed_and_healthz_keeps_answering(limited):
    silent = [connect(limited) for _ in range(10)]  # connect and send nothing
    partial = [connect(limited) for _ in range(10)]  # stop in the middle of the headers
    for sock in partial:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    assert call(limited, "GET", "/healthz")[0] == 200
    started = time.monotonic()
    for sock in silent + partial:
        assert closed_by_server(sock) == b""  # closed without an answer
        sock.close()
    assert time.monotonic() - started < 5  # by the 0.5 s deadline, not a client's patience
    assert call(limited, "GET", "/healthz")[0] == 200


def test_a_body_that_stops_midway_is_answered_408(limited):
    sock = connect(limited)
    sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: 100\r\n\r\n{\"inputs\": [1")
    reply = closed_by_server(sock)
    sock.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply[:80]


def test_a_64_mib_header_is_refused_with_431_without_reading_it_all(limited):
    sock = connect(limited)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
    sent = 0
    try:
        while sent < 64 << 20:
            sock.sendall(b"a" * (1 << 20))
            sent += 1 << 20
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server closed the connection: what it answered is still readable
    assert sent < 64 << 20, "the server read a 64 MiB header whole"
    reply = closed_by_server(sock)
    sock.close()
    assert reply == b"" or reply.startswith(b"HTTP/1.1 431"), reply[:80]
    assert call(limited, "GET", "/healthz")[0] == 200


def test_a_header_over_the_limit_in_one_piece_is_431(limited):
    sock = connect(limited)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (16 << 10) + b"\r\n\r\n")
    reply = closed_by_server(sock)
    sock.close()
    assert reply.startswith(b"HTTP/1.1 431"), reply[:80]


def test_an_idle_keep_alive_connection_is_closed(limited):
    sock = connect(limited)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = closed_by_server(sock)
    sock.close()
    assert reply.startswith(b"HTTP/1.1 200")
