"""fastloop.serve against hostile clients: odd ids, special files named as inputs, numbers
no float holds, non-numbers in inputs, NaN in results, and connection abuse."""

from __future__ import annotations

import concurrent.futures
import contextlib
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
from waiting import wait_for, wait_until  # noqa: E402


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
    service = InferenceService(model, num_workers=1, store=MemoryStore())
    with serving(App(service, input_root=str(root), num_workers=4)) as base:
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

    service = InferenceService(model, num_workers=1, store=MemoryStore())
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


def sent_raw(base: str, request: bytes) -> bytes:
    """Sends raw request bytes on a fresh connection; returns what the server sent until it
    closed the connection."""
    with connect(base) as sock:
        sock.sendall(request)
        return closed_by_server(sock)


@pytest.fixture()
def limited():
    service = InferenceService(lambda b: b, num_workers=1, store=MemoryStore())
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
    reply = sent_raw(limited, b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                              b"content-length: 100\r\n\r\n{\"inputs\": [1")
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
    reply = sent_raw(limited, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (16 << 10) + b"\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 431"), reply[:80]


def test_an_idle_keep_alive_connection_is_closed(limited):
    reply = sent_raw(limited, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200")


# ---------------------------------------------------------------- deadlines and stuck models


def test_a_queued_job_past_its_deadline_fails_without_running():
    release = threading.Event()
    ran = []

    def model(batch):
        ran.extend(batch[:, 0].tolist())
        assert release.wait(20)
        return batch

    service = InferenceService(model, num_workers=1, max_batch=1, max_delay_s=0, store=MemoryStore())
    try:
        blocker = service.submit([1.0, 0.0])
        late = service.submit([2.0, 0.0], timeout=0.2)
        with pytest.raises(fl.serve.JobFailed, match="deadline exceeded: still queued"):
            service.result(late, timeout=10)
        release.set()
        assert service.result(blocker, timeout=10).tolist() == [1.0, 0.0]
        assert 2.0 not in ran
        assert service.stats()["deadline_exceeded"] == 1
    finally:
        release.set()
        service.close()


@pytest.mark.filterwarnings("ignore:InferenceService.*stuck:RuntimeWarning")
def test_a_hanging_model_fails_the_job_replaces_the_worker_and_healthz_reports_it():
    hang = threading.Event()
    release = threading.Event()

    def model(batch):
        if (batch[:, 0] == 666).any():
            hang.set()
            assert release.wait(30)
        return batch * 2

    service = InferenceService(model, num_workers=1, max_batch=1, max_delay_s=0, store=MemoryStore(), timeout=0.3)
    try:
        with serving(App(service)) as base:
            stuck = service.submit([666.0, 0.0])
            with pytest.raises(fl.serve.JobFailed, match="deadline exceeded: the model call was still running"):
                service.result(stuck, timeout=10)
            assert hang.is_set()
            # the replacement worker serves the next job while the stuck one still hangs
            assert service.result(service.submit([1.0, 2.0]), timeout=10).tolist() == [2.0, 4.0]
            status, _, body = call(base, "GET", "/healthz")
            assert status == 200 and body["stuck_workers"] == 1 and body["workers"] == 1
            # a second hang: the cap (num_workers=1 stuck at once) is reached, no replacement
            second = service.submit([666.0, 1.0])
            with pytest.raises(fl.serve.JobFailed, match="deadline exceeded"):
                service.result(second, timeout=10)
            status, _, body = call(base, "GET", "/healthz")
            assert status == 503 and body["status"] == "degraded" and body["workers"] == 0, body
            release.set()
            deadline = time.monotonic() + 10
            while service.health()["stuck_workers"] and time.monotonic() < deadline:
                time.sleep(0.01)  # polling the real condition: the stuck threads end
            assert service.health()["stuck_workers"] == 0
    finally:
        release.set()
        service.close()


class Held:
    """A model whose calls wait until released (holding no lock); counts the calls that entered."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = 0

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        self.entered += 1
        assert self.release.wait(20), "the test never released the model"
        return batch * 2


@pytest.mark.filterwarnings("ignore:InferenceService.*stuck:RuntimeWarning")
def test_workers_come_back_once_more_calls_than_workers_were_stuck_at_once():
    """Issue 37, item 1: short client deadlines leave every worker stuck (2 + 2 replacements,
    then no more); once the calls return, the service serves with `workers` workers again."""
    model = Held()
    service = InferenceService(model, num_workers=2, max_batch=1, max_delay_s=0, store=MemoryStore())
    try:
        for attempt in range(40):  # each job's deadline passes in its model call (or in the queue)
            with pytest.raises(fl.serve.JobFailed, match="deadline exceeded"):
                service.result(service.submit([float(attempt), 0.0], timeout=0.05), timeout=10)
            if service.health()["workers"] == 0:
                break
        health = service.health()
        assert health == {"status": "degraded", "workers": 0, "stuck_workers": 4}, health
        model.release.set()  # the stuck calls return
        assert wait_until(lambda: service.health() == {"status": "ok", "workers": 2, "stuck_workers": 0},
                          timeout=10), service.health()
        assert service.result(service.submit([1.0, 2.0]), timeout=10).tolist() == [2.0, 4.0]
        assert service.stats()["workers"] == 2
    finally:
        model.release.set()
        service.close()


@pytest.mark.filterwarnings("ignore:InferenceService.*stuck:RuntimeWarning")
def test_the_issue_repro_over_http_leaves_healthz_at_two_workers():
    """16 predicts, 8 at a time, each with timeout_s 0.01, against 2 workers whose model is
    held: every one answers 504, and /healthz reports both workers once the calls return."""
    model = Held()
    service = InferenceService(model, num_workers=2, store=MemoryStore())
    try:
        with serving(App(service, num_workers=8)) as base:
            def client(i: int) -> int:
                return call(base, "POST", "/v1/predict", {"inputs": [float(i), 1.0], "timeout_s": 0.01})[0]

            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                assert sorted(set(pool.map(client, range(16)))) == [504]
            model.release.set()
            assert wait_until(lambda: call(base, "GET", "/healthz")[2] ==
                              {"status": "ok", "workers": 2, "stuck_workers": 0}, timeout=10), \
                call(base, "GET", "/healthz")
            status, _, body = call(base, "POST", "/v1/predict", {"inputs": [1.0, 2.0]})
            assert status == 200 and body["result"] == [2.0, 4.0], body
    finally:
        model.release.set()
        service.close()


def test_timeout_s_over_http_is_taken_from_the_body_and_checked(server):
    base, _ = server
    status, _, body = call(base, "POST", "/v1/jobs", {"inputs": sample(3).tolist(), "timeout_s": 30})
    assert status == 202 and poll(base, body["id"])["status"] == "done"
    for bad in ("10", -1, 0):
        status, _, body = call(base, "POST", "/v1/jobs", {"inputs": sample(3).tolist(), "timeout_s": bad})
        assert status == 400 and "timeout_s" in body["error"], body


@pytest.mark.parametrize("error", [SystemExit, KeyboardInterrupt, GeneratorExit])
def test_a_base_exception_fails_only_the_input_that_raised_it(error):
    def model(batch):
        if (batch[:, 0] == 13).any():
            raise error("unlucky")
        return batch + 1

    gate = threading.Event()
    first = threading.Event()

    def gated(batch):
        first.set()
        assert gate.wait(20)
        return model(batch)

    service = InferenceService(gated, num_workers=1, max_batch=8, max_delay_s=0.05, store=MemoryStore())
    try:
        warm = service.submit([0.0, 0.0])
        assert first.wait(10)
        ids = [service.submit([float(v), 0.0]) for v in (1, 13, 2)]  # queued together: one batch
        gate.set()
        service.result(warm, timeout=10)
        assert service.result(ids[0], timeout=10).tolist() == [2.0, 1.0]
        assert service.result(ids[2], timeout=10).tolist() == [3.0, 1.0]
        with pytest.raises(fl.serve.JobFailed, match=error.__name__):
            service.result(ids[1], timeout=10)
        assert service.stats()["workers"] == 1
    finally:
        gate.set()
        service.close()


# ---------------------------------------------------------------- in-doubt submits


class LostReplyStore(MemoryStore):
    """A MemoryStore whose next create is written but answered with a ConnectionError, as a
    Redis that stops after taking a command and before replying."""

    def __init__(self) -> None:
        super().__init__()
        self.lose_next = False
        self.down = threading.Event()  # get() fails while set: the store is unreachable

    def create(self, record, inputs):
        created = super().create(record, inputs)
        if self.lose_next:
            self.lose_next = False
            self.down.set()
            raise ConnectionError("the connection dropped before the reply")
        return created

    def get(self, job_id):
        if self.down.is_set():
            raise ConnectionError("unreachable")
        return super().get(job_id)


def test_an_in_doubt_submit_that_is_not_retried_is_removed_once_the_store_is_back():
    store = LostReplyStore()
    ran = []
    service = InferenceService(lambda b: ran.append(b.copy()) or b, num_workers=1, store=store)
    try:
        store.lose_next = True
        with pytest.raises(ConnectionError):
            service.submit([1.0, 2.0], job_id="ghost")
        assert service.stats()["in_doubt"] == 1
        assert MemoryStore.get(store, "ghost").status == "queued"  # written, and nobody holds it
        store.down.clear()  # the store is back
        wait_for(lambda: service.stats()["in_doubt"] == 0)
        with pytest.raises(KeyError):
            service.status("ghost")  # an error meant: not accepted
        assert service.stats()["in_doubt_removed"] == 1 and ran == []
        assert store.recover() == []  # a restart would find no ghost to run
    finally:
        service.close()


def test_an_in_doubt_submit_retried_with_its_id_runs_exactly_once():
    store = LostReplyStore()
    ran = []
    service = InferenceService(lambda b: ran.append(b[:, 0].tolist()) or b, num_workers=1, store=store)
    try:
        store.lose_next = True
        with pytest.raises(ConnectionError):
            service.submit([5.0, 0.0], job_id="retry-me")
        store.down.clear()
        assert service.submit([5.0, 0.0], job_id="retry-me") == "retry-me"  # adopted or created again
        assert service.result("retry-me", timeout=10).tolist() == [5.0, 0.0]
        wait_for(lambda: service.stats()["in_doubt"] == 0)
        assert ran == [[5.0]] and service.status("retry-me") == "done"
    finally:
        service.close()


def test_metrics_label_values_are_escaped_newlines_included():
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    from fastloop.serve.metrics import render, service_registry

    odd = 'a\nb"c\\d'
    text = render(service_registry(lambda: {}, lambda: {"responses": {odd: 3}}, max_batch=4))
    assert 'code="a\\nb\\"c\\\\d"' in text  # one line, escaped
    samples = {s.labels.get("code"): s.value for f in text_string_to_metric_families(text)
               for s in f.samples if s.name == "fastloop_http_responses_total"}
    assert samples == {odd: 3.0}  # a Prometheus parser reads the value back whole


# ---------------------------------------------------------------- query parameters, priorities, huge numbers


def test_query_options_are_honoured_with_a_json_body(server):
    """Issue 37, item 3: ?id= and ?timeout_s= apply to a JSON body as to a .npy one."""
    base, service = server
    body = {"inputs": sample(4).tolist()}
    status, response, answer = call(base, "POST", "/v1/jobs?id=q-json", body)
    assert status == 202 and answer["id"] == "q-json" and response.getheader("location").endswith("/q-json")
    status, _, answer = call(base, "POST", "/v1/jobs?timeout_s=7", body)
    assert status == 202
    record = service.record(answer["id"])
    assert record.deadline == pytest.approx(record.submitted + 7)
    status, _, answer = call(base, "POST", "/v1/predict?timeout_s=5&id=q-predict", body)
    assert status == 200 and answer["id"] == "q-predict", answer
    record = service.record("q-predict")
    assert record.deadline == pytest.approx(record.submitted + 5)


@pytest.mark.parametrize("query, words", [
    ("timeout_s=abc", "'timeout_s' must be a finite number"),
    ("timeout_s=nan", "'timeout_s' must be a finite number"),
    ("timeout_s=inf", "'timeout_s' must be a finite number"),
    ("timeout_s=-1", "(timeout_s over HTTP) must be a number of seconds > 0"),
    ("timeout=5", "unknown query parameter 'timeout'"),
    ("id=a&id=b", "'id' is given more than once"),
    ("id=bad%0A", "not valid"),
    ("priority=urgent", "priority must be one of 'high', 'normal', 'low'"),
    ("priority=high", "needs a queue with priorities"),
])
@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/predict"])
def test_a_bad_query_parameter_is_400_naming_it_for_json_and_npy_bodies(server, path, query, words):
    base, service = server
    submitted = service.stats()["submitted"]
    for headers, raw in (({"content-type": "application/json"}, json.dumps({"inputs": sample(5).tolist()}).encode()),
                         ({"content-type": "application/x-npy"}, npy_bytes(sample(5)))):
        status, _, body = call(base, "POST", f"{path}?{query}", raw=raw, headers=headers)
        assert status == 400 and words in body["error"], (headers, body)
    assert service.stats()["submitted"] == submitted


@pytest.mark.parametrize("name, value", [("id", "q-both"), ("timeout_s", 3)])
def test_an_option_in_both_the_body_and_the_query_is_400_naming_it(server, name, value):
    base, _ = server
    status, _, body = call(base, "POST", f"/v1/jobs?{name}={value}", {"inputs": sample(6).tolist(), name: value})
    assert status == 400 and f"'{name}' is given both in the body and in the query" in body["error"], body


def test_an_unknown_priority_has_its_own_400_naming_the_priorities(server):
    """Issue 37, item 4: "urgent" is no priority at all; "high" is one this queue lacks."""
    base, service = server
    status, _, body = call(base, "POST", "/v1/jobs", {"inputs": sample(7).tolist(), "priority": "urgent"})
    assert status == 400 and "priority must be one of 'high', 'normal', 'low', not 'urgent'" in body["error"], body
    status, _, body = call(base, "POST", "/v1/jobs", {"inputs": sample(7).tolist(), "priority": "high"})
    assert status == 400 and "needs a queue with priorities" in body["error"] and "one of" not in body["error"]
    with pytest.raises(ValueError, match="priority must be one of"):
        service.submit(sample(7), priority="urgent")


def test_a_100000_digit_integer_is_bad_input_not_a_plain_value_error(server):
    from fastloop.serve.http_inputs import BadInput, parse_body

    huge = b"1" + b"0" * 100_000
    for body in (b'{"inputs": [' + huge + b", 1.0]}", b'{"inputs": [1.0, 2.0], "timeout_s": ' + huge + b"}"):
        for dtype in (None, np.dtype(np.float32), np.dtype(np.int64)):
            with pytest.raises(BadInput, match="not valid JSON"):
                parse_body(body, dtype)
        base, _ = server
        status, _, answer = call(base, "POST", "/v1/jobs", raw=body, headers={"content-type": "application/json"})
        assert status == 400 and "not valid JSON" in answer["error"], answer


# ---------------------------------------------------------------- WebSocket subscribers


def test_websockets_over_max_websockets_are_closed_1013_naming_the_limit():
    from test_serve_http import ws_client, ws_url
    from websockets.exceptions import ConnectionClosed

    service = InferenceService(lambda batch: batch * 2, num_workers=1, store=MemoryStore())
    app = App(service, max_websockets=2)
    try:
        with serving(app) as base:
            with ws_client.connect(ws_url(base, "/v1/events"), open_timeout=5), \
                    ws_client.connect(ws_url(base, "/v1/events"), open_timeout=5):
                with ws_client.connect(ws_url(base, "/v1/events"), open_timeout=5) as third:
                    with pytest.raises(ConnectionClosed):
                        third.recv(timeout=5)
                assert third.close_code == 1013 and "max_websockets=2" in third.close_reason, third.close_reason
                assert "fastloop_ws_refused_total 1.0" in call(base, "GET", "/metrics")[2]
            wait_for(lambda: app._http_counts()["ws_open"] == 0)  # the two closed: room again
            with ws_client.connect(ws_url(base, "/v1/events"), open_timeout=5) as again:
                job = service.submit([1.0, 2.0])
                assert json.loads(again.recv(timeout=5))["id"] == job
    finally:
        service.close()


def test_result_streams_share_one_store_read_per_done_job():
    """Issue 37, item 4: N ?result=1 subscribers cost one result read per finished job, not N."""
    from test_serve_http import ws_client, ws_url

    service = InferenceService(lambda batch: batch * 2, num_workers=1, store=MemoryStore())
    app = App(service)
    front = app.fronts["default"]
    reads = []
    read_result = front.result

    def counted(job_id, *args):
        reads.append(job_id)
        return read_result(job_id, *args)

    front.result = counted
    try:
        with serving(app) as base:
            with contextlib.ExitStack() as stack:
                streams = [stack.enter_context(ws_client.connect(ws_url(base, "/v1/events?result=1"), open_timeout=5))
                           for _ in range(5)]
                jobs = [service.submit([float(i), 1.0]) for i in range(3)]
                for ws in streams:
                    done = {}
                    while len(done) < len(jobs):
                        message = json.loads(ws.recv(timeout=10))
                        if message["status"] == "done":
                            done[message["id"]] = message["result"]
                    assert done == {job: [2.0 * i, 2.0] for i, job in enumerate(jobs)}
        assert sorted(reads) == sorted(jobs), reads
    finally:
        service.close()


def test_a_predict_waits_for_the_query_deadline_past_predict_timeout_s(monkeypatch):
    """?timeout_s= longer than App(predict_timeout_s) is the job's deadline, and the predict
    waits for it instead of answering 504 at predict_timeout_s."""
    import fastloop.serve.http as front

    monkeypatch.setattr(front, "_PREDICT_MARGIN_S", 0.0)  # without the fix: a 504 after 1 ms
    model = Held()
    service = InferenceService(model, num_workers=1, store=MemoryStore())
    try:
        with serving(App(service, predict_timeout_s=0.001)) as base:
            answers = []
            thread = threading.Thread(target=lambda: answers.append(
                call(base, "POST", "/v1/predict?timeout_s=20&id=long", {"inputs": [1.0, 2.0]})))
            thread.start()
            wait_for(lambda: model.entered == 1)
            wait_for(lambda: service.stats()["running"] == 1)
            model.release.set()
            thread.join(15)
            status, _, body = answers[0]
            assert status == 200 and body["result"] == [2.0, 4.0], body
    finally:
        model.release.set()
        service.close()
