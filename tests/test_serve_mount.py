"""fastloop.serve inside a user's own app: the front mounted in FastAPI (and honouring a
proxy's root_path), and the documented Flask pattern (docs/serve.md), end to end with the
real frameworks."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from fastloop.serve import InferenceService, JobFailed, MemoryStore  # noqa: E402
from fastloop.serve.http import App  # noqa: E402
from test_serve_http import ROOT, call, poll, serving, ws_client, ws_statuses, ws_url  # noqa: E402


def double(batch: np.ndarray) -> np.ndarray:
    return batch * 2


@pytest.fixture()
def service():
    svc = InferenceService(double, num_workers=1, store=MemoryStore())
    yield svc
    svc.close()


def recipe(marker: str, model) -> dict:
    """Runs the Python block of docs/serve.md that holds `marker` (the recipes are tested as
    they are written there), with `model` defined; returns its names."""
    with open(os.path.join(ROOT, "docs", "serve.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    (code,) = [block for block in blocks if marker in block]
    namespace = {"model": model, "__name__": "recipe"}
    exec(compile(code, "docs/serve.md", "exec"), namespace)
    return namespace


def doubles_or_refuses_negatives(batch: np.ndarray) -> np.ndarray:
    if (batch < 0).any():
        raise ValueError("a negative number")
    return batch * 2


def test_the_fastapi_recipe_serves_under_the_mount_path_and_its_lifespan_closes_the_service():
    pytest.importorskip("fastapi")
    names = recipe("fastapi.FastAPI(lifespan=lifespan)", double)
    app, service = names["app"], names["service"]

    @app.get("/hello")
    def hello() -> dict:
        return {"hello": "world"}

    with serving(app) as base:
        assert call(base, "GET", "/hello")[2] == {"hello": "world"}
        status, _, body = call(base, "POST", "/inference/v1/predict", {"inputs": [1.0, 2.0]})
        assert status == 200 and body["result"] == [2.0, 4.0]
        status, response, body = call(base, "POST", "/inference/v1/jobs", {"inputs": [1.0, 2.0]})
        assert status == 202 and response.getheader("location") == f"/inference/v1/jobs/{body['id']}"
        location = response.getheader("location")
        service.result(body["id"], timeout=10)  # waits for the job itself
        status, _, job = call(base, "GET", location)
        assert status == 200 and job["status"] == "done"
        status, _, answer = call(base, "GET", location + "/result")
        assert status == 200 and answer["result"] == [2.0, 4.0]
        assert call(base, "GET", "/inference/healthz")[0] == 200
        status, _, schema = call(base, "GET", "/inference/openapi.json")  # a generated client's base URL
        assert status == 200 and schema["servers"] == [{"url": "/inference"}] and "/v1/predict" in schema["paths"]
        assert call(base, "GET", "/inference/metrics")[0] == 200
        assert call(base, "GET", "/inference/nope")[0] == 404
        # WebSocket events through the mount
        job_id = call(base, "POST", "/inference/v1/jobs", {"inputs": [3.0, 4.0]})[2]["id"]
        assert ws_statuses(base, f"/inference/v1/jobs/{job_id}/events")[-1] == "done"
        assert not service.closed
    assert service.closed  # the recipe's lifespan closed it when the server stopped


def test_a_proxy_root_path_is_honoured_in_location(service):
    front = App(service)
    with serving(front, root_path="/api") as base:
        status, response, body = call(base, "POST", "/v1/jobs", {"inputs": [1.0]})
        assert status == 202 and response.getheader("location") == f"/api/v1/jobs/{body['id']}"
        assert poll(base, body["id"])["status"] == "done"


def test_openapi_names_the_mount_prefix_or_root_path_in_servers(service):
    pytest.importorskip("fastapi")
    with serving(App(service), root_path="/api") as base:
        status, _, schema = call(base, "GET", "/openapi.json")
        assert status == 200 and schema["servers"] == [{"url": "/api"}], schema.get("servers")
    with serving(App(service)) as base:  # unmounted: no servers entry (its paths are the URLs)
        status, _, schema = call(base, "GET", "/openapi.json")
        assert status == 200 and "servers" not in schema


def test_the_flask_recipe_answers_400_for_bad_bodies_422_for_failed_jobs_and_the_results():
    pytest.importorskip("flask")
    names = recipe("import flask", doubles_or_refuses_negatives)
    client, service = names["app"].test_client(), names["service"]
    try:
        answer = client.post("/predict", json={"inputs": [1.5, 2.5]})
        assert answer.status_code == 200 and answer.get_json()["result"] == [3.0, 5.0]
        answer = client.post("/jobs", json={"inputs": [1.5, 2.5]})
        assert answer.status_code == 202
        location = answer.headers["location"]
        service.result(answer.get_json()["id"], timeout=10)  # waits for the job itself
        body = client.get(location).get_json()
        assert body["status"] == "done" and body["result"] == [3.0, 5.0]
        for bad in (b"{}", b'{"inputs": [NaN, 1.0]}', b'{"inputs": [1e400, 1.0]}', b'{"inputs": ["1"]}',
                    b'{"inputs": [[1.0], [2.0, 3.0]]}', b"not json", b'{"path": "x.npy"}'):
            answer = client.post("/predict", data=bad, content_type="application/json")
            assert answer.status_code == 400 and answer.get_json()["error"], bad  # never a 500
        failed = client.post("/predict", json={"inputs": [-1.0, 2.0]})
        assert failed.status_code == 422 and "a negative number" in failed.get_json()["error"]
        job_id = client.post("/jobs", json={"inputs": [-1.0, 2.0]}).get_json()["id"]
        with pytest.raises(JobFailed):
            service.result(job_id, timeout=10)
        answer = client.get(f"/jobs/{job_id}")
        assert answer.status_code == 422 and answer.get_json()["status"] == "failed"
        assert client.get("/jobs/nope").status_code == 404
    finally:
        service.close()


def test_a_websocket_to_an_unknown_path_is_refused(service):
    with serving(App(service)) as base:
        with pytest.raises(Exception) as refused:
            with ws_client.connect(ws_url(base, "/v1/nowhere")) as ws:
                ws.recv(timeout=5)
        assert "403" in str(refused.value) or "1008" in str(refused.value), refused.value
