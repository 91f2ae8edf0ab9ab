"""POST /v1/predict (one call: the result in the answer) and requests of several rows, over
HTTP against live servers on loopback; Client.predict; a draining front."""

from __future__ import annotations

import http.client
import io
import json
import threading
import urllib.parse

import numpy as np
import pytest

pytest.importorskip("uvicorn")

from fastloop.serve import InferenceService, Input, JobFailed, MemoryStore, RowsFailed  # noqa: E402
from fastloop.serve.client import BadRequest, Client, ServiceUnavailable  # noqa: E402
from fastloop.serve.http import App  # noqa: E402
from fastloop.serve.http_inputs import NPY_TYPE as NPY  # noqa: E402
from test_serve_http import IN, OUT, Gate, call, mlp, poll, serving  # noqa: E402, F401 (mlp: a fixture)
from waiting import wait_for  # noqa: E402

@pytest.fixture(scope="module")
def mlp_server(mlp):
    service = InferenceService(mlp, num_workers=2, store=MemoryStore())
    with serving(App(service)) as base:
        yield base, service
    service.close()


@pytest.fixture()
def gate_server():
    gate = Gate()
    service = InferenceService(gate, num_workers=1, max_queue=2, max_batch=1, max_delay_s=0, store=MemoryStore(),
                               inputs=Input("float64", (1,)))
    app = App(service, retry_after_s=3)
    with serving(app) as base:
        yield base, service, gate, app
        gate.open.set()
    service.close(timeout=5)


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def binary(base: str, path: str, data: bytes, headers: dict[str, str]):
    """(status, response, body bytes) of a POST that may answer .npy."""
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    conn.request("POST", path, body=data, headers=headers)
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    return response.status, response, raw


def x_of(n: int) -> np.ndarray:
    return np.random.default_rng(n).standard_normal((n, IN)).astype(np.float32)


def test_predict_answers_the_result_in_one_call_as_json_or_npy(mlp_server, mlp):
    base, service = mlp_server
    x = x_of(1)[0]
    status, _, body = call(base, "POST", "/v1/predict", {"inputs": x.tolist()})
    assert status == 200 and body["status"] == "done" and body["shape"] == [OUT]
    np.testing.assert_allclose(body["result"], mlp(x), rtol=1e-5, atol=1e-6)
    assert service.status(body["id"]) == "done"  # a job like any other, its status kept
    status, response, raw = binary(base, "/v1/predict", npy(x), {"content-type": NPY, "accept": NPY})
    got = np.load(io.BytesIO(raw), allow_pickle=False)
    assert status == 200 and got.dtype == np.float32 and response.getheader("x-job-id")
    np.testing.assert_allclose(got, mlp(x), rtol=1e-5, atol=1e-6)
    client = Client(base)
    np.testing.assert_allclose(client.predict(x), mlp(x), rtol=1e-5, atol=1e-6)  # .npy both ways
    np.testing.assert_allclose(client.predict(x.tolist()), mlp(x), rtol=1e-5, atol=1e-6)  # JSON


def test_several_rows_in_one_request_come_back_in_order(mlp_server, mlp):
    base, service = mlp_server
    x = x_of(8)
    status, _, body = call(base, "POST", "/v1/predict", {"inputs": x.tolist()})
    assert status == 200 and body["shape"] == [8, OUT] and "errors" not in body
    np.testing.assert_allclose(body["result"], mlp(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(Client(base).predict(x), mlp(x), rtol=1e-5, atol=1e-6)
    status, _, body = call(base, "POST", "/v1/jobs", {"inputs": x.tolist()})
    assert status == 202
    assert poll(base, body["id"])["rows"] == 8
    np.testing.assert_allclose(Client(base).result(body["id"]), mlp(x), rtol=1e-5, atol=1e-6)


def test_predicts_from_many_clients_batch_together(mlp_server, mlp):
    base, service = mlp_server
    before = service.stats()["batches"], service.stats()["done"]
    x = x_of(64)
    got: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def client(c: int) -> None:
        one = Client(base, timeout=60)
        try:
            for i in range(c, 64, 16):
                got[i] = one.predict(x[i])
        except BaseException as error:  # reported below, not lost in a thread
            errors.append(error)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[:3]
    np.testing.assert_allclose(np.stack([got[i] for i in range(64)]), mlp(x), rtol=1e-5, atol=1e-6)
    batches, done = service.stats()["batches"] - before[0], service.stats()["done"] - before[1]
    assert done >= 64 and batches <= done


def test_a_failed_job_is_422_and_one_past_its_deadline_504(gate_server):
    base, service, gate, _ = gate_server
    client = Client(base)
    gate.open.set()
    status, _, body = call(base, "POST", "/v1/predict", {"inputs": [999.0]})
    assert status == 422 and body["status"] == "failed" and "999 is not a number" in body["error"]
    with pytest.raises(JobFailed, match="999 is not a number"):
        client.predict([999.0])
    gate.open.clear()
    busy = call(base, "POST", "/v1/jobs", {"inputs": [3.0]})[2]["id"]  # holds the one worker
    wait_for(lambda: service.status(busy) == "running")
    status, _, body = call(base, "POST", "/v1/predict", {"inputs": [1.0], "timeout_s": 0.2})
    assert status == 504 and body["error"].startswith("deadline exceeded: still queued"), body
    assert service.status(body["id"]) == "failed"
    with pytest.raises(TimeoutError, match="deadline exceeded"):
        client.predict(np.array([2.0]), timeout=0.2)
    gate.open.set()
    assert poll(base, busy)["status"] == "done"


def test_a_full_queue_is_429(gate_server):
    base, service, gate, _ = gate_server
    busy = [call(base, "POST", "/v1/jobs", {"inputs": [3.0]})[2]["id"]]
    wait_for(lambda: gate.calls == 1)  # it runs, held by the gate: the queue's 2 slots are free
    busy += [call(base, "POST", "/v1/jobs", {"inputs": [3.0]})[2]["id"] for _ in range(2)]
    wait_for(lambda: service.stats()["queue_depth"] == 2)
    status, response, body = call(base, "POST", "/v1/predict", {"inputs": [4.0]})
    assert status == 429 and response.getheader("retry-after") == "3"
    gate.open.set()
    assert [poll(base, job)["status"] for job in busy] == ["done"] * 3


def test_a_row_that_fails_fails_its_entry_and_the_others_are_answered():
    gate = Gate()
    gate.open.set()
    with InferenceService(gate, store=MemoryStore(), inputs=Input("float64", (1,))) as service, \
            serving(App(service)) as base:
        _rows_that_fail(base, gate)


def _rows_that_fail(base: str, gate: Gate) -> None:
    x = [[1.0], [999.0], [3.0]]
    status, _, body = call(base, "POST", "/v1/predict", {"inputs": x})
    assert status == 200 and body["result"] == [[2.0], None, [6.0]]
    assert body["errors"] == [None, "ValueError: 999 is not a number this model takes", None]
    status, response, raw = binary(base, "/v1/predict", json.dumps({"inputs": x}).encode(), {"accept": NPY})
    assert status == 200 and response.getheader("x-failed-rows") == "1"
    assert np.load(io.BytesIO(raw), allow_pickle=False).tolist() == [[2.0], [0.0], [6.0]]
    with pytest.raises(RowsFailed) as failed:
        Client(base).predict(np.array(x))
    assert failed.value.errors == {1: "ValueError: 999 is not a number this model takes"}
    assert failed.value.result.tolist() == [[2.0], [0.0], [6.0]]
    status, _, body = call(base, "POST", "/v1/predict", {"inputs": [[999.0], [999.0]]})
    assert status == 422 and "every one of the 2 rows failed" in body["error"] and len(body["errors"]) == 2


def test_several_rows_count_against_the_queue_and_too_many_are_refused(gate_server):
    base, service, gate, _ = gate_server
    status, _, body = call(base, "POST", "/v1/predict", {"inputs": [[1.0]] * 3})
    assert status == 400 and "3 rows, more than the queue holds (max_queue=2)" in body["error"]
    with pytest.raises(BadRequest, match="more than the queue holds"):
        Client(base).submit(np.ones((3, 1)))


def test_a_draining_front_refuses_new_jobs_with_503_and_answers_the_accepted(gate_server):
    base, service, gate, app = gate_server
    accepted = call(base, "POST", "/v1/jobs", {"inputs": [5.0]})[2]["id"]
    app.drain()
    for path in ("/v1/jobs", "/v1/predict"):
        status, response, body = call(base, "POST", path, {"inputs": [1.0]})
        assert status == 503 and response.getheader("retry-after") == "3" and "stopping" in body["error"]
    status, _, health = call(base, "GET", "/healthz")
    assert status == 503 and health["status"] == "draining"
    with pytest.raises(ServiceUnavailable):
        Client(base).predict([1.0])
    gate.open.set()
    assert poll(base, accepted)["status"] == "done"
    assert call(base, "GET", f"/v1/jobs/{accepted}/result")[2]["result"] == [10.0]
    assert service.stats()["submitted"] == 1


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\ncontent-length: 16\r\n\r\n",  # no body
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 40\r\n\r\n{\"error\":",  # cut short
    b"HTTP/1.1 20",  # cut inside the status line
], ids=["headers-only", "body-cut", "status-line-cut"])
def test_a_server_that_dies_mid_answer_is_unavailable_not_a_crash(answer):
    """A host killed while it answers (its headers sent, its body not, or less): the client says
    ServiceUnavailable (a ConnectionError, what a retry loop catches), never http.client's own
    IncompleteRead, which escaped it before."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer_and_die() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(answer)
        listener.close()

    thread = threading.Thread(target=answer_and_die)
    thread.start()
    try:
        with pytest.raises(ServiceUnavailable, match=f"POST http://127.0.0.1:{port}/v1/jobs"):
            Client(f"http://127.0.0.1:{port}", timeout=5).submit(inputs=[1.0], job_id="j-1")
    finally:
        thread.join(10)


def test_the_metrics_count_predict_answers(mlp_server):
    base, _ = mlp_server
    call(base, "POST", "/v1/predict", {"inputs": [0.0] * IN})
    status, _, text = call(base, "GET", "/metrics")
    assert status == 200 and 'fastloop_http_responses_total{code="200"}' in text
    assert json.loads(json.dumps(text)) == text


@pytest.mark.parametrize("number", ["1e400", "-1e400", "1e309"])
def test_a_json_number_past_float64s_range_is_400_not_a_row_of_nulls(mlp_server, number):
    base, service = mlp_server
    body = ('{"inputs": [' + ", ".join(["0.5"] * (IN - 1) + [number]) + "]}").encode()
    for path in ("/v1/predict", "/v1/jobs"):
        status, _, answer = call(base, "POST", path, raw=body, headers={"content-type": "application/json"})
        assert status == 400 and "too large for any float" in answer["error"], answer
