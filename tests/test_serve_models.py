"""Several models in one server (App of a dict; the CLI's repeated --model NAME=MODEL): each
with its own queue, workers, batch size and labelled metrics, its routes under
/v1/models/{name}/, /v1/models listing their inputs, /openapi.json written from each model's
declared inputs; and a model's pre- and post-processing hooks."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

pytest.importorskip("uvicorn")

from fastloop.serve import InferenceService, Input, MemoryStore  # noqa: E402
from fastloop.serve.client import Client  # noqa: E402
from fastloop.serve.http import App  # noqa: E402
from test_serve_http import ROOT, call, free_port, poll, serving, ws_statuses  # noqa: E402
from waiting import wait_for  # noqa: E402


def double(batch: np.ndarray) -> np.ndarray:
    return batch * 2


def square(batch: np.ndarray) -> np.ndarray:
    return batch * batch


def square_x(x: np.ndarray, k: np.ndarray) -> np.ndarray:  # two declared inputs: two arguments
    return x * x + 0 * k[:, None]


@pytest.fixture(scope="module")
def two_models():
    services = {"double": InferenceService(double, max_batch=8, store=MemoryStore(), inputs=Input("float32", (2,))),
                "square": InferenceService(square_x, num_workers=1, max_batch=1, store=MemoryStore(),
                                           inputs={"x": Input("float32", (2,)), "k": Input("int64", ())})}
    app = App(services)
    with serving(app) as base:
        yield base, services, app
    for service in services.values():
        service.close()


def test_each_model_answers_under_its_name_and_the_first_also_at_v1(two_models):
    base, services, _ = two_models
    status, _, body = call(base, "POST", "/v1/models/double/predict", {"inputs": [1.0, 2.0]})
    assert status == 200 and body["result"] == [2.0, 4.0]
    status, _, body = call(base, "POST", "/v1/models/square/predict", {"inputs": {"x": [3.0, 4.0], "k": 1}})
    assert status == 200 and body["result"] == [9.0, 16.0]
    assert call(base, "POST", "/v1/predict", {"inputs": [5.0, 6.0]})[2]["result"] == [10.0, 12.0]  # the first
    status, response, body = call(base, "POST", "/v1/models/square/jobs", {"inputs": {"x": [1.0, 2.0], "k": 3}})
    assert status == 202 and response.getheader("location") == f"/v1/models/square/jobs/{body['id']}"
    assert call(base, "GET", f"/v1/jobs/{body['id']}")[0] == 404  # not a job of the first model
    assert poll(base, body["id"], timeout=10)["error"]  # (the same: poll reads /v1/jobs/{id})
    status, _, job = call(base, "GET", f"/v1/models/square/jobs/{body['id']}")
    assert status == 200 and job["status"] in ("queued", "running", "done")
    status, _, answer = call(base, "GET", f"/v1/models/square/jobs/{body['id']}/result?wait_s=10")
    assert status == 200 and answer["result"] == [1.0, 4.0]
    status, _, body = call(base, "POST", "/v1/models/nope/predict", {"inputs": [1.0, 2.0]})
    assert status == 404 and "no model named 'nope'" in body["error"] and "'double', 'square'" in body["error"]
    with pytest.raises(ValueError, match="expected float32 numbers"):  # /v1/ is the first model's
        Client(base).predict({"x": [1.0, 2.0], "k": 1})


def test_the_same_id_on_two_models_is_two_jobs(two_models):
    base, services, _ = two_models
    for model in ("double", "square"):
        body = {"inputs": [2.0, 3.0], "id": "same"} if model == "double" else \
            {"inputs": {"x": [2.0, 3.0], "k": 0}, "id": "same"}
        assert call(base, "POST", f"/v1/models/{model}/jobs", body)[0] == 202
    results = {model: call(base, "GET", f"/v1/models/{model}/jobs/same/result?wait_s=10")[2]["result"]
               for model in ("double", "square")}
    assert results == {"double": [4.0, 6.0], "square": [4.0, 9.0]}


def test_v1_models_lists_each_models_inputs_and_settings(two_models):
    base, _, _ = two_models
    status, _, body = call(base, "GET", "/v1/models")
    assert status == 200
    by_name = {m["name"]: m for m in body["models"]}
    assert by_name["double"]["inputs"] == [{"name": "input", "dtype": "float32", "shape": [2]}]
    assert by_name["square"]["inputs"] == [{"name": "x", "dtype": "float32", "shape": [2]},
                                           {"name": "k", "dtype": "int64", "shape": []}]
    assert (by_name["double"]["default"], by_name["square"]["default"]) == (True, False)
    assert (by_name["double"]["max_batch"], by_name["square"]["max_batch"], by_name["square"]["workers"]) == (8, 1, 1)


def test_each_model_has_its_own_batching_and_labelled_metrics(two_models):
    base, services, _ = two_models
    before = services["square"].stats()["batch_sizes"].copy()
    threads = [threading.Thread(target=call, args=(base, "POST", "/v1/models/square/predict",
                                                   {"inputs": {"x": [1.0, 1.0], "k": i}})) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert set(services["square"].stats()["batch_sizes"]) == {1}  # max_batch=1: never more
    assert services["square"].stats()["batch_sizes"][1] >= before.get(1, 0) + 6
    status, _, text = call(base, "GET", "/metrics")
    assert status == 200
    for model in ("double", "square"):
        assert re.search(rf'^fastloop_serve_jobs_total\{{model="{model}",outcome="done"\}} [1-9]', text, re.M), model
        assert f'fastloop_serve_queue_depth{{model="{model}"}}' in text
        assert f'fastloop_serve_batch_size_bucket{{le="1",model="{model}"}}' in text
    assert text.count("# TYPE fastloop_serve_jobs_total counter") == 1


def test_websocket_events_are_per_model(two_models):
    base, _, _ = two_models
    job = call(base, "POST", "/v1/models/square/jobs", {"inputs": {"x": [1.0, 1.0], "k": 0}})[2]["id"]
    assert ws_statuses(base, f"/v1/models/square/jobs/{job}/events")[-1] == "done"


def test_openapi_is_written_per_model_from_the_declared_inputs(two_models):
    base, _, _ = two_models
    status, _, schema = call(base, "GET", "/openapi.json")
    assert status == 200 and schema["openapi"].startswith("3.")
    paths = schema["paths"]
    for path in ("/v1/models/double/predict", "/v1/models/double/jobs", "/v1/models/square/predict",
                 "/v1/models/square/jobs", "/v1/predict", "/v1/jobs"):
        assert "post" in paths[path], path
    for path in ("/v1/jobs/{job_id}", "/v1/jobs/{job_id}/result", "/v1/models", "/healthz", "/metrics"):
        assert path in paths, path
    assert {"get", "delete"} <= set(paths["/v1/models/square/jobs/{job_id}"])

    def body(path):
        return paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]

    one_row = body("/v1/models/double/jobs")["properties"]["inputs"]["anyOf"][0]
    assert (one_row["type"], one_row["minItems"], one_row["maxItems"], one_row["items"]["type"]) == \
        ("array", 2, 2, "number")
    square = body("/v1/models/square/jobs")["properties"]["inputs"]["anyOf"][0]  # one row of each input
    assert set(square["required"]) == {"x", "k"} and square["properties"]["k"]["type"] == "integer"
    assert body("/v1/jobs")["properties"]["priority"]["enum"] == ["normal"]  # no priorities in memory
    assert "422" in paths["/v1/models/square/predict"]["post"]["responses"]


def test_health_is_the_worst_of_the_models():
    services = {"a": InferenceService(double, store=MemoryStore()), "b": InferenceService(square, store=MemoryStore())}
    app = App(services)
    with serving(app) as base:
        status, _, body = call(base, "GET", "/healthz")
        assert status == 200 and set(body["models"]) == {"a", "b"}
        services["b"].close()
        status, _, body = call(base, "GET", "/healthz")
        assert status == 503 and body["status"] == "closed" and body["models"]["a"]["status"] == "ok"
    services["a"].close()


# ---------------------------------------------------------------- hooks


class ColourModel:
    """Takes a JPEG body (decoded in preprocess, off the event loop), answers top labels."""

    def __init__(self) -> None:
        self.threads: set[str] = set()

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        return batch  # the mean red, green, blue: the logits of three labels

    def preprocess(self, body: bytes) -> np.ndarray:
        import fastloop.images

        self.threads.add(threading.current_thread().name)
        return fastloop.images.decode(body).reshape(-1, 3).mean(axis=0).astype(np.float32)

    def postprocess(self, output: np.ndarray) -> list[str]:
        return [["red", "green", "blue"][i] for i in np.argsort(-output)]


def jpeg(colour) -> bytes:
    image = pytest.importorskip("PIL.Image")
    buffer = io.BytesIO()
    image.fromarray(np.full((16, 16, 3), colour, np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def test_preprocess_reads_the_raw_body_in_the_pool_and_postprocess_shapes_the_json_answer():
    model = ColourModel()
    service = InferenceService(model, store=MemoryStore(), inputs=Input("float32", (3,)))
    assert service.preprocess == model.preprocess and service.postprocess == model.postprocess
    with serving(App(service)) as base:
        status, _, body = call(base, "POST", "/v1/predict", raw=jpeg((120, 220, 0)),
                               headers={"content-type": "image/jpeg"})
        assert status == 200 and body["result"] == ["green", "red", "blue"] and "dtype" not in body
        status, _, body = call(base, "POST", "/v1/jobs?id=blue-one", raw=jpeg((0, 0, 250)))
        assert status == 202 and body["id"] == "blue-one"
        assert call(base, "GET", "/v1/jobs/blue-one/result?wait_s=10")[2]["result"][0] == "blue"
        status, _, body = call(base, "POST", "/v1/predict", raw=b"not a picture")
        assert status == 400 and "not a JPEG or PNG" in body["error"]
        assert model.threads and all(name.startswith("fastloop-http") for name in model.threads)
        raw = Client(base).result("blue-one")  # .npy answers stay the model's raw output
        assert raw.dtype == np.float32 and raw.shape == (3,)
    service.close()


def test_a_postprocess_that_fails_is_a_500_naming_it():
    def broken(output):
        raise RuntimeError("no labels today")

    service = InferenceService(double, store=MemoryStore(), postprocess=broken)
    with serving(App(service)) as base:
        status, _, body = call(base, "POST", "/v1/predict", {"inputs": [1.0]})
        assert status == 500 and "postprocess failed: RuntimeError: no labels today" in body["error"]
    service.close()


# ---------------------------------------------------------------- CLI

MODELS = '''
from fastloop.serve import Input


def doubler():
    return (lambda batch: batch * 2), Input("float32", (2,))


def negator():
    return (lambda batch: -batch), Input("float32", (3,))
'''


def test_cli_serves_several_models_named_on_the_command_line(tmp_path):
    (tmp_path / "two_models.py").write_text(MODELS)
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "fastloop", "serve", "--model", "twice=two_models:doubler",
                             "--model", "minus=two_models:negator", "--port", str(port), "--log-level", "warning",
                             "--store", f"file:{tmp_path / 'jobs'}"],
                            cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: Client(base).healthz() or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, proc.stdout.read().decode()
        assert call(base, "POST", "/v1/models/twice/predict", {"inputs": [1.0, 2.0]})[2]["result"] == [2.0, 4.0]
        assert call(base, "POST", "/v1/models/minus/predict", {"inputs": [1.0, 2.0, 3.0]})[2]["result"] == \
            [-1.0, -2.0, -3.0]
        assert [m["name"] for m in call(base, "GET", "/v1/models")[2]["models"]] == ["twice", "minus"]
        proc.terminate()
        assert proc.wait(timeout=30) == 0
        assert sorted(os.listdir(tmp_path / "jobs")) == ["minus", "twice"]  # a store of its own each
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("args, words", [
    (["--model", "a:b", "--model", "c:d"], "name each one, NAME=MODEL"),
    (["--model", "x=a:b", "--model", "x=c:d"], "a name of its own"),
    (["--model", "x=a:b", "--model", "y=c:d", "--input", "float32:2"], "--input declares the inputs of one model"),
])
def test_cli_refuses_several_models_it_cannot_tell_apart(args, words, capsys):
    from fastloop.serve import cli

    assert cli.main([*args, "--port", str(free_port())]) == 2
    assert words in capsys.readouterr().err
