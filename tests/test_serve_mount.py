"""fastloop.serve inside a user's own app: the front mounted in FastAPI (and honouring a
proxy's root_path), and the documented Flask pattern (docs/serve.md), end to end with the
real frameworks."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")

from fastloop.serve import InferenceService, MemoryStore  # noqa: E402
from fastloop.serve.http import App  # noqa: E402
from test_serve_http import call, poll, serving, ws_client, ws_url  # noqa: E402


def double(batch: np.ndarray) -> np.ndarray:
    return batch * 2


@pytest.fixture()
def service():
    svc = InferenceService(double, workers=1, store=MemoryStore())
    yield svc
    svc.close()


def test_the_front_mounted_in_a_fastapi_app_serves_under_the_mount_path(service):
    fastapi = pytest.importorskip("fastapi")
    app = fastapi.FastAPI()

    @app.get("/hello")
    def hello() -> dict:
        return {"hello": "world"}

    front = App(service)
    app.mount("/inference", front)
    with serving(app) as base:
        assert call(base, "GET", "/hello")[2] == {"hello": "world"}
        status, response, body = call(base, "POST", "/inference/v1/jobs", {"inputs": [1.0, 2.0]})
        assert status == 202 and response.getheader("location") == f"/inference/v1/jobs/{body['id']}"
        location = response.getheader("location")
        service.result(body["id"], timeout=10)  # waits for the job itself
        status, _, job = call(base, "GET", location)
        assert status == 200 and job["status"] == "done"
        status, _, answer = call(base, "GET", location + "/result")
        assert status == 200 and answer["result"] == [2.0, 4.0]
        assert call(base, "GET", "/inference/healthz")[0] == 200
        assert call(base, "GET", "/inference/metrics")[0] == 200
        assert call(base, "GET", "/inference/nope")[0] == 404
        # WebSocket events through the mount
        job_id = call(base, "POST", "/inference/v1/jobs", {"inputs": [3.0, 4.0]})[2]["id"]
        with ws_client.connect(ws_url(base, f"/inference/v1/jobs/{job_id}/events")) as ws:
            statuses = []
            while True:
                try:
                    statuses.append(json.loads(ws.recv(timeout=10))["status"])
                except Exception:
                    break
        assert statuses[-1] == "done"
    front.detach()


def test_a_proxy_root_path_is_honoured_in_location(service):
    front = App(service)
    with serving(front, root_path="/api") as base:
        status, response, body = call(base, "POST", "/v1/jobs", {"inputs": [1.0]})
        assert status == 202 and response.getheader("location") == f"/api/v1/jobs/{body['id']}"
        assert poll(base, body["id"])["status"] == "done"


def flask_app(service: InferenceService):
    """The Flask (WSGI) pattern of docs/serve.md: the views call the service directly (its
    calls are thread-safe and never wait for a model call); result() is polled."""
    import flask

    from fastloop.errors import QueueFull
    from fastloop.serve import JobFailed

    app = flask.Flask(__name__)

    @app.post("/predict")
    def predict():
        try:
            job_id = service.submit(flask.request.get_json()["inputs"])
        except QueueFull as error:
            return {"error": str(error)}, 429, {"retry-after": "1"}
        except (TypeError, ValueError) as error:
            return {"error": str(error)}, 400
        return {"id": job_id}, 202, {"location": flask.url_for("job", job_id=job_id)}

    @app.get("/jobs/<job_id>")
    def job(job_id: str):
        try:
            status = service.status(job_id)
        except (KeyError, ValueError):
            return {"error": f"unknown job {job_id!r}"}, 404
        if status != "done":
            return {"id": job_id, "status": status}, 200
        try:
            return {"id": job_id, "status": status, "result": service.result(job_id, timeout=0).tolist()}, 200
        except JobFailed as error:
            return {"id": job_id, "status": "failed", "error": error.reason}, 422

    return app


def test_the_documented_flask_pattern_serves_jobs(service):
    pytest.importorskip("flask")
    client = flask_app(service).test_client()
    answer = client.post("/predict", json={"inputs": [1.5, 2.5]})
    assert answer.status_code == 202
    location = answer.headers["location"]
    service.result(answer.get_json()["id"], timeout=10)  # waits for the job itself
    body = client.get(location).get_json()
    assert body["status"] == "done" and body["result"] == [3.0, 5.0]
    assert client.post("/predict", json={"inputs": [[1.0], [2.0, 3.0]]}).status_code == 400
    assert client.get("/jobs/nope").status_code == 404


def test_a_websocket_to_an_unknown_path_is_refused(service):
    with serving(App(service)) as base:
        with pytest.raises(Exception) as refused:
            with ws_client.connect(ws_url(base, "/v1/nowhere")) as ws:
                ws.recv(timeout=5)
        assert "403" in str(refused.value) or "1008" in str(refused.value), refused.value
