"""The Open Inference Protocol (KServe v2) routes of the HTTP front, against a live uvicorn
server: with plain HTTP requests (the error shapes and status codes the clients hide), with
Triton's ``tritonclient.http`` and with KServe's ``InferenceRESTClient`` (each test of a client
skips, saying why, where it is not installed: pip install 'tritonclient[http]' kserve)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import http.client
import json
import struct
import threading
import urllib.parse

import numpy as np
import pytest

uvicorn = pytest.importorskip("uvicorn", reason="uvicorn is not installed: pip install 'fastloop[serve]'")

from fastloop.serve import Input, InferenceService, MemoryStore  # noqa: E402
from fastloop.serve.http import App  # noqa: E402
from fastloop.serve.v2_tensors import (BadInput, decode_binary, decode_bytes, encode_bytes,  # noqa: E402
                                       read_request, write_response)
from test_serve_http import serving  # noqa: E402
from waiting import wait_for  # noqa: E402


def affine(batch: np.ndarray) -> np.ndarray:
    """The "affine" model: elementwise, so a row's answer does not depend on its batch."""
    return batch * 2 + 1


def scaled(x: np.ndarray, k: np.ndarray) -> dict[str, np.ndarray]:
    """The "scaled" model: two inputs, a dict of two outputs."""
    return {"scaled": x * k[:, None].astype(np.float32), "twice": k * 2}


class Gate:
    """A model that blocks until the test opens it."""

    def __init__(self) -> None:
        self.open = threading.Event()

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        assert self.open.wait(30), "the test never opened the gate"
        return batch


def call(base: str, method: str, path: str, body: bytes | dict | None = None, headers: dict | None = None):
    """(status, headers, body bytes) of one plain request."""
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    conn.request(method, path, body=data, headers=headers or {})
    response = conn.getresponse()
    raw = response.read()
    conn.close()
    return response.status, response, raw


def call_json(base: str, method: str, path: str, body=None, headers=None):
    status, response, raw = call(base, method, path, body, headers)
    assert response.getheader("content-type") == "application/json", (status, raw[:200])
    return status, json.loads(raw)


@pytest.fixture(scope="module")
def models():
    services = {
        "affine": InferenceService(affine, inputs=Input("float32", (4,), name="x"), store=MemoryStore(),
                                   max_batch=8),
        "scaled": InferenceService(scaled, inputs={"x": Input("float32", (2,)), "k": Input("int64", ())},
                                   store=MemoryStore()),
    }
    app = App(services)
    with serving(app) as base:
        yield base, services
    for service in services.values():
        service.close()


@contextlib.contextmanager
def gated(**options):
    """A server of one blocking model ("gate"); yields (base URL, its Gate, the service)."""
    gate = Gate()
    service = InferenceService(gate, inputs=Input("float32", (2,), name="x"), store=MemoryStore(), num_workers=1, **options)
    try:
        with serving(App({"gate": service})) as base:
            yield base, gate, service
    finally:
        gate.open.set()
        service.close()


X = np.arange(12, dtype=np.float32).reshape(3, 4) / 7


def v2_request(x: np.ndarray, name: str = "x", datatype: str = "FP32", **extra) -> dict:
    return {"inputs": [{"name": name, "shape": list(x.shape), "datatype": datatype, "data": x.ravel().tolist()}],
            **extra}


# ------------------------------------------------------------ the tensor codec alone
def test_binary_tensors_round_trip_and_bytes_are_length_prefixed():
    y = np.arange(6, dtype=np.int16).reshape(2, 3)
    body, header_length = write_response("m", "1", None, [("y", y, True), ("z", y.astype(np.float64), False)])
    head = json.loads(body[:header_length])
    assert head["outputs"][0] == {"name": "y", "datatype": "INT16", "shape": [2, 3],
                                  "parameters": {"binary_data_size": 12}}
    assert head["outputs"][1]["data"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and "id" not in head
    np.testing.assert_array_equal(decode_binary("INT16", (2, 3), body[header_length:], "y"), y)
    words = np.array([b"ab", b"", b"\xff"], dtype=object)
    raw = encode_bytes(words)
    assert raw == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0) + struct.pack("<I", 1) + b"\xff"
    assert list(decode_bytes(raw, 3, "w")) == [b"ab", b"", b"\xff"]
    with pytest.raises(BadInput, match="runs past"):
        decode_bytes(raw[:-1], 3, "w")
    bf16 = np.array([1.5, -2.0], np.float32).view(np.uint32) >> 16  # the upper halves
    np.testing.assert_array_equal(decode_binary("BF16", (2,), bf16.astype("<u2").tobytes(), "b"), [1.5, -2.0])


def test_a_request_names_what_is_wrong_with_it():
    ok = json.dumps(v2_request(X)).encode()
    assert read_request(ok, None).inputs[0].array.dtype == np.float32
    for body, message in [
        (b"[1]", "must be a JSON object"),
        (json.dumps(v2_request(X, datatype="FP8")).encode(), "is not one of"),
        (json.dumps({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0]}]}).encode(),
         "holds 2 elements"),
        (json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [1.5]}]}).encode(),
         "not integers"),
        (json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": ["1"]}]}).encode(),
         "list of numbers"),
        (json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "BOOL", "data": [2]}]}).encode(),
         "true or false"),
        (json.dumps(v2_request(X, parameters={"sequence_id": 3})).encode(), "unsupported request parameters"),
    ]:
        with pytest.raises(BadInput, match=message):
            read_request(body, None)
    with pytest.raises(BadInput, match="Inference-Header-Content-Length"):
        read_request(ok, len(ok) + 1)


# ------------------------------------------------------------ plain HTTP
def test_health_and_metadata(models):
    base, _ = models
    assert call_json(base, "GET", "/v2/health/live") == (200, {"live": True})
    assert call_json(base, "GET", "/v2/health/ready") == (200, {"ready": True})
    status, server = call_json(base, "GET", "/v2")
    assert status == 200 and server["name"] == "fastloop" and "binary_tensor_data" in server["extensions"]
    status, meta = call_json(base, "GET", "/v2/models/scaled")
    assert status == 200 and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 2]},
                              {"name": "k", "datatype": "INT64", "shape": [-1]}]
    assert call_json(base, "GET", "/v2/models/scaled/versions/1/ready") == (200, {"name": "scaled", "ready": True})


def test_json_infer_echoes_the_id_and_answers_the_requested_outputs(models):
    base, _ = models
    body = {"id": "r-1", "inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]},
                                    {"name": "k", "shape": [2], "datatype": "INT64", "data": [3, -1]}],
            "outputs": [{"name": "twice"}]}
    status, answer = call_json(base, "POST", "/v2/models/scaled/infer", body)
    assert status == 200, answer
    assert answer == {"model_name": "scaled", "model_version": "1", "id": "r-1",
                      "outputs": [{"name": "twice", "datatype": "INT64", "shape": [2], "data": [6, -2]}]}
    status, meta = call_json(base, "GET", "/v2/models/scaled")
    assert {o["name"]: o["datatype"] for o in meta["outputs"]} == {"scaled": "FP32", "twice": "INT64"}
    _, services = models
    assert services["scaled"].stats()["done"] >= 1  # a job of the model's service, as /v1's
    status, _, metrics = call(base, "GET", "/metrics")
    assert status == 200 and 'fastloop_serve_jobs_total{model="scaled",outcome="done"}' in metrics.decode()


def test_binary_infer_by_hand_and_gzip(models):
    base, _ = models
    head = json.dumps({"inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP32",
                                   "parameters": {"binary_data_size": X.nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()
    for encoding, body in (("", head + X.tobytes()), ("gzip", gzip.compress(head + X.tobytes()))):
        headers = {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}
        if encoding:
            headers["Content-Encoding"] = encoding
        status, response, raw = call(base, "POST", "/v2/models/affine/infer", body, headers)
        assert status == 200, raw
        length = int(response.getheader("inference-header-content-length"))
        out = json.loads(raw[:length])["outputs"][0]
        assert out["parameters"] == {"binary_data_size": X.nbytes} and out["shape"] == [3, 4]
        np.testing.assert_array_equal(np.frombuffer(raw[length:], "<f4").reshape(3, 4), affine(X))


@pytest.mark.parametrize("path, body, status, message", [
    ("/v2/models/nope/infer", v2_request(X), 404, "unknown model 'nope'"),
    ("/v2/models/affine/versions/2/infer", v2_request(X), 404, "no version '2'"),
    ("/v2/models/affine/infer", v2_request(X.astype(np.float64), datatype="FP64"), 400,
     "datatype FP64, the model takes FP32"),
    ("/v2/models/affine/infer", v2_request(X[:, :3]), 400, "shape [3, 3], the model takes [-1, 4]"),
    ("/v2/models/affine/infer", v2_request(X[0]), 400, "the model takes [-1, 4]"),
    ("/v2/models/affine/infer", v2_request(X, name="y"), 400, "takes inputs ['x']"),
    ("/v2/models/affine/infer", v2_request(X, outputs=[{"name": "logits"}]), 400, "unknown outputs ['logits']"),
    ("/v2/models/affine/infer", v2_request(X, parameters={"priority": 1}), 400, "needs a queue with priorities"),
    ("/v2/models/affine/infer", b"{not json", 400, "not valid"),
])
def test_errors_are_json_with_the_protocol_status(models, path, body, status, message):
    base, _ = models
    got, answer = call_json(base, "POST", path, body)
    assert got == status and message in answer["error"], answer
    assert set(answer) == {"error"}


def test_the_openapi_document_lists_the_v2_routes(models):
    base, _ = models
    status, schema = call_json(base, "GET", "/openapi.json")
    assert status == 200
    for path, method in (("/v2", "get"), ("/v2/health/ready", "get"), ("/v2/models/affine", "get"),
                         ("/v2/models/scaled/ready", "get"), ("/v2/models/scaled/infer", "post")):
        assert method in schema["paths"][path], path
    infer = schema["paths"]["/v2/models/affine/infer"]["post"]
    assert {"200", "400", "413", "500", "503"} <= set(infer["responses"])  # a model's own path: no 404
    assert "application/octet-stream" in infer["responses"]["200"]["content"]  # binary_data_output
    request = infer["requestBody"]["content"]["application/json"]["schema"]
    assert request["required"] == ["inputs"] and request["additionalProperties"] is False
    assert "/v1/models/affine/predict" in schema["paths"]  # the v1 routes stay


def test_unknown_model_metadata_and_readiness_are_404(models):
    base, _ = models
    for path in ("/v2/models/nope", "/v2/models/nope/ready"):
        status, answer = call_json(base, "GET", path)
        assert status == 404 and "unknown model 'nope'" in answer["error"]


@pytest.mark.filterwarnings("ignore:InferenceService.*stuck:RuntimeWarning")  # the gate outlives the deadline
def test_a_missed_deadline_is_503_and_a_full_queue_503():
    with gated(max_queue=1) as (base, gate, service):
        status, answer = call_json(base, "POST", "/v2/models/gate/infer",
                                   v2_request(np.ones((1, 2), np.float32), parameters={"timeout": 200_000}))
        assert status == 503 and "deadline exceeded" in answer["error"], answer
        wait_for(lambda: service.stats()["running"] == 0 and service.stats()["queue_depth"] == 0)
        # one request in the model (stuck behind the gate) and one queued fill max_queue=1
        answers = []
        threads = [threading.Thread(target=lambda: answers.append(call_json(
            base, "POST", "/v2/models/gate/infer", v2_request(np.ones((1, 2), np.float32))))) for _ in range(2)]
        threads[0].start()
        wait_for(lambda: service.stats()["running"] == 1)
        threads[1].start()
        wait_for(lambda: service.stats()["queue_depth"] == 1)
        status, response, raw = call(base, "POST", "/v2/models/gate/infer",
                                     json.dumps(v2_request(np.ones((1, 2), np.float32))).encode())
        assert status == 503 and "queue is full" in json.loads(raw)["error"]
        assert response.getheader("retry-after") == "1"
        status, answer = call_json(base, "GET", "/v2/health/ready")
        assert status == 200  # busy is not unready
        gate.open.set()
        for thread in threads:
            thread.join(30)
        assert [status for status, _ in answers] == [200, 200]


def test_readiness_is_503_while_draining():
    with gated() as (base, gate, service):
        app_ready = call_json(base, "GET", "/v2/models/gate/ready")
        assert app_ready == (200, {"name": "gate", "ready": True})
    app = App({"m": InferenceService(affine, inputs=Input("float32", (4,), name="x"), store=MemoryStore())})
    with serving(app) as base:
        app.drain()
        status, answer = call_json(base, "GET", "/v2/health/ready")
        assert status == 503 and answer["ready"] is False and "stopping" in answer["error"]
        assert call_json(base, "GET", "/v2/health/live") == (200, {"live": True})
        status, answer = call_json(base, "POST", "/v2/models/m/infer", v2_request(X))
        assert status == 503 and "stopping" in answer["error"]
    app.models["m"].close()


# ------------------------------------------------------------ tritonclient
def triton(base: str):
    httpclient = pytest.importorskip("tritonclient.http",
                                     reason="tritonclient is not installed: pip install 'tritonclient[http]'")
    return httpclient, httpclient.InferenceServerClient(url=base.removeprefix("http://"))


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("binary_in", [True, False])
@pytest.mark.parametrize("binary_out", [True, False])
def test_tritonclient_infers_one_row_and_a_batch(models, rows, binary_in, binary_out):
    base, _ = models
    httpclient, client = triton(base)
    x = X[:rows]
    given = httpclient.InferInput("x", list(x.shape), "FP32")
    given.set_data_from_numpy(x, binary_data=binary_in)
    result = client.infer("affine", [given], request_id="t-1",
                          outputs=[httpclient.InferRequestedOutput("output0", binary_data=binary_out)])
    np.testing.assert_array_equal(result.as_numpy("output0"), affine(x))
    assert result.get_response()["id"] == "t-1"
    assert ("parameters" in result.get_output("output0")) == binary_out


def test_tritonclient_health_metadata_and_several_inputs(models):
    base, _ = models
    httpclient, client = triton(base)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("scaled")
    assert client.get_server_metadata()["name"] == "fastloop"
    meta = client.get_model_metadata("affine")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    x, k = np.array([[1, 2], [3, 4]], np.float32), np.array([2, 5], np.int64)
    inputs = [httpclient.InferInput("x", [2, 2], "FP32"), httpclient.InferInput("k", [2], "INT64")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(k)
    result = client.infer("scaled", inputs)  # no outputs named: all of them, binary (the client's default)
    expected = scaled(x, k)
    for name in ("scaled", "twice"):
        np.testing.assert_array_equal(result.as_numpy(name), expected[name])


def test_tritonclient_sees_the_errors(models):
    base, _ = models
    httpclient, client = triton(base)
    from tritonclient.utils import InferenceServerException

    assert not client.is_model_ready("nope")
    cases = [("affine", X[:, :2], "FP32", "400", "the model takes [-1, 4]"),
             ("affine", X.astype(np.float64), "FP64", "400", "the model takes FP32"),
             ("nope", X, "FP32", "404", "unknown model")]
    for model, x, datatype, status, message in cases:
        given = httpclient.InferInput("x", list(x.shape), datatype)
        given.set_data_from_numpy(x)
        with pytest.raises(InferenceServerException) as error:
            client.infer(model, [given])
        assert error.value.status() == status and message in error.value.message()


@pytest.mark.filterwarnings("ignore:InferenceService.*stuck:RuntimeWarning")  # the gate outlives the deadline
def test_tritonclient_timeout_is_the_jobs_deadline():
    with gated() as (base, gate, service):
        httpclient, client = triton(base)
        from tritonclient.utils import InferenceServerException

        given = httpclient.InferInput("x", [1, 2], "FP32")
        given.set_data_from_numpy(np.ones((1, 2), np.float32))
        with pytest.raises(InferenceServerException) as error:
            client.infer("gate", [given], timeout=100_000)  # microseconds, as Triton takes it
        assert error.value.status() == "503" and "deadline exceeded" in error.value.message()


# ------------------------------------------------------------ KServe's REST client
def kserve_sdk():
    return pytest.importorskip("kserve", reason="the kserve SDK is not installed: pip install kserve")


@pytest.mark.parametrize("binary", [True, False])
def test_kserve_client_infers_and_sees_health(models, binary):
    base, _ = models
    kserve = kserve_sdk()

    async def run():
        client = kserve.InferenceRESTClient(kserve.RESTConfig(protocol="v2", retries=0))
        try:
            assert await client.is_server_live(base) and await client.is_server_ready(base)
            assert await client.is_model_ready(base, "affine")
            given = kserve.InferInput("x", list(X.shape), "FP32")
            given.set_data_from_numpy(X, binary_data=binary)
            request = kserve.InferRequest("affine", [given], request_id="k-1")
            response = await client.infer(base, request, model_name="affine")
            assert response.id == "k-1"
            np.testing.assert_array_equal(response.outputs[0].as_numpy(), affine(X))
            assert response.outputs[0].name == "output0"
        finally:
            await client.close()

    asyncio.run(run())


def test_kserve_client_sees_an_unknown_model_and_a_wrong_shape(models):
    base, _ = models
    kserve = kserve_sdk()
    import httpx

    async def run():
        client = kserve.InferenceRESTClient(kserve.RESTConfig(protocol="v2", retries=0))
        try:
            for model, x, status, message in (("nope", X, 404, "unknown model"),
                                              ("affine", X[:, :3], 400, "the model takes [-1, 4]")):
                given = kserve.InferInput("x", list(x.shape), "FP32")
                given.set_data_from_numpy(np.ascontiguousarray(x))
                with pytest.raises(httpx.HTTPStatusError) as error:
                    await client.infer(base, kserve.InferRequest(model, [given]), model_name=model)
                assert error.value.response.status_code == status and message in str(error.value)
        finally:
            await client.close()

    asyncio.run(run())


class DurableLike(MemoryStore):
    """A MemoryStore subclass: the front cannot know it never blocks, so it submits in the pool."""


def test_small_infers_are_submitted_on_the_loop_large_compressed_and_blocking_store_ones_in_the_pool():
    # /v1/predict's rule (ModelFront.inline): a body under 64 KB on the plain MemoryStore is
    # read and submitted on the event loop; anything else in the pool ("fastloop-http" threads).
    # The "queued" event comes from the submitting thread; the requests go one at a time.
    submitted_on: list[str] = []
    row = Input("float32", (4096,), name="x")
    services = {name: InferenceService(lambda batch: batch[:, :1], inputs=row, store=store, max_delay_s=0)
                for name, store in (("memory", MemoryStore()), ("durable", DurableLike()))}
    for service in services.values():
        service.subscribe(lambda job_id, status: status == "queued" and submitted_on.append(
            threading.current_thread().name))
    one, four = np.full((1, 4096), 0.5, np.float32), np.full((4, 4096), 0.5, np.float32)
    small, large = json.dumps(v2_request(one)).encode(), json.dumps(v2_request(four)).encode()
    assert len(large) >= 64 << 10 > len(small)
    with serving(App(services)) as base:
        for model, body, headers in [("memory", small, {}), ("memory", large, {}),
                                     ("memory", gzip.compress(small), {"content-encoding": "gzip"}),
                                     ("durable", small, {})]:
            status, answer = call_json(base, "POST", f"/v2/models/{model}/infer", body, headers)
            assert status == 200 and answer["outputs"][0]["data"] == [0.5] * (1 + 3 * (body is large)), answer
    for service in services.values():
        service.close(timeout=5)
    in_pool = [name.startswith("fastloop-http") for name in submitted_on]
    assert in_pool == [False, True, True, True], submitted_on
