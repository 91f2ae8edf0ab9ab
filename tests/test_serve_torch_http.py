"""Serving torch models over HTTP as a user would: uvicorn on a free port and the stdlib
Client, JSON and .npy bodies, dict outputs, wrong inputs answered 400, the WebSocket
carrying the result when asked, and ``python -m fastloop serve --model module:factory``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("uvicorn")
ws_client = pytest.importorskip("websockets.sync.client")

from fastloop.serve import BadRequest, Client, InferenceService, Input, MemoryStore  # noqa: E402
from fastloop.serve import cli  # noqa: E402
from fastloop.serve.http import App  # noqa: E402
from test_serve_http import ROOT, call, free_port, serving, ws_url  # noqa: E402
from waiting import wait_for  # noqa: E402


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()


class Scorer(torch.nn.Module):
    """Two inputs (features, a per-row weight) in; a dict of logits and their argmax out."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.fc = torch.nn.Linear(6, 3)

    def forward(self, features: torch.Tensor, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.fc(features) * weight.unsqueeze(-1)
        return {"logits": logits, "label": logits.argmax(1)}


def reference(model: torch.nn.Module, *xs: np.ndarray):
    with torch.no_grad():
        return model(*(torch.from_numpy(x[None]) for x in xs))


@pytest.fixture(scope="module")
def mlp_server():
    model = mlp()
    service = InferenceService(model, inputs=Input(torch.float32, (16,)), store=MemoryStore())
    with serving(App(service)) as base:
        yield base, model
    service.close()


@pytest.fixture(scope="module")
def scorer_server():
    model = Scorer().eval()
    inputs = {"features": Input(torch.float32, (6,)), "weight": Input(torch.float32, ())}
    service = InferenceService(model, inputs=inputs, store=MemoryStore())
    with serving(App(service)) as base:
        yield base, model
    service.close()


def test_a_torch_mlp_over_http_takes_json_lists_and_npy_arrays(mlp_server):
    base, model = mlp_server
    client = Client(base)
    x = np.random.default_rng(0).standard_normal(16).astype(np.float32)
    want = reference(model, x)[0].numpy()
    for job in (client.submit(inputs=x.tolist()), client.submit(inputs=x)):
        y = client.result(job, timeout=10)
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("server, inputs, words", [
    pytest.param("mlp_server", np.zeros(16, np.float64), ["'input'", "float32", "float64"], id="mlp-float64"),
    pytest.param("mlp_server", [0.0] * 15, ["'input'", "(16,)", "(15,)"], id="mlp-short"),
    # the front refuses non-numbers before the spec sees them
    pytest.param("mlp_server", ["x"] * 16, ["'inputs'", "str"], id="mlp-strings"),
    pytest.param("mlp_server", {"a": [1.0]}, ["'input'", "dict"], id="mlp-dict"),
    pytest.param("scorer_server", {"features": [0.0] * 6}, ["missing ['weight']"], id="scorer-missing-weight"),
    pytest.param("scorer_server", {"features": [0.0] * 5, "weight": 1}, ["'features'", "(6,)", "(5,)"],
                 id="scorer-short-features"),
    pytest.param("scorer_server", {"features": np.zeros(6, np.float64), "weight": np.ones((), np.float32)},
                 ["'features'", "float64"], id="scorer-float64-features"),
    pytest.param("scorer_server", {"features": [0.0] * 6, "weight": "heavy"}, ["'weight'", "str"],
                 id="scorer-string-weight"),
])
def test_wrong_inputs_over_http_are_400_naming_the_input(request, server, inputs, words):
    with pytest.raises(BadRequest) as raised:
        Client(request.getfixturevalue(server)[0]).submit(inputs=inputs)
    assert raised.value.status == 400
    assert all(word in raised.value.reason for word in words), raised.value.reason


def test_multi_input_dict_outputs_over_json_npy_and_the_client(scorer_server):
    base, model = scorer_server
    features = np.arange(6, dtype=np.float32) / 10
    want = reference(model, features, np.float32(2.0) * np.ones((), np.float32))
    status, _, body = call(base, "POST", "/v1/jobs", {"inputs": {"features": features.tolist(), "weight": 2}})
    assert status == 202, body
    job = body["id"]
    y = Client(base).result(job, timeout=10)  # .npy: a structured row, back as a dict
    assert set(y) == {"logits", "label"} and y["label"].dtype == np.int64
    np.testing.assert_allclose(y["logits"], want["logits"][0].numpy(), rtol=1e-5, atol=1e-6)
    status, _, body = call(base, "GET", f"/v1/jobs/{job}/result")  # JSON: an object per key
    assert status == 200
    assert body["dtype"] == {"logits": "float32", "label": "int64"}
    assert body["shape"] == {"logits": [3], "label": []}
    assert body["result"]["label"] == int(want["label"][0])
    status, row = Client(base)._request("GET", f"/v1/jobs/{job}/result")  # asks for .npy
    assert status == 200 and row.dtype.names == ("logits", "label") and row.shape == ()
    # the Client sends named arrays as one structured .npy row, each keeping its dtype
    y2 = Client(base).result(Client(base).submit(inputs={"features": features, "weight": np.float32(2.0) * np.ones(
        (), np.float32)}), timeout=10)
    np.testing.assert_array_equal(y2["logits"], y["logits"])


def test_websocket_carries_the_result_when_asked(scorer_server):
    base, model = scorer_server
    client = Client(base)
    job = client.submit(inputs={"features": [0.5] * 6, "weight": 1.0})
    client.result(job, timeout=10)
    with ws_client.connect(ws_url(base, f"/v1/jobs/{job}/events?result=1"), open_timeout=5) as ws:
        event = json.loads(ws.recv(timeout=10))
    assert event["status"] == "done" and event["dtype"]["logits"] == "float32"
    want = reference(model, np.full(6, 0.5, np.float32), np.ones((), np.float32))["logits"][0].numpy()
    np.testing.assert_allclose(event["result"]["logits"], want, rtol=1e-5, atol=1e-6)
    with ws_client.connect(ws_url(base, f"/v1/jobs/{job}/events"), open_timeout=5) as ws:
        assert json.loads(ws.recv(timeout=10)) == {"id": job, "status": "done"}  # not asked: no result


def test_websocket_pushes_the_result_of_a_job_that_finishes_while_it_listens():
    release = threading.Event()

    class Held(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = mlp()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            assert release.wait(20), "the test never released the model"
            return self.inner(x)

    model = Held().eval()
    service = InferenceService(model, inputs=Input(torch.float32, (16,)), num_workers=1, store=MemoryStore())
    try:
        with serving(App(service)) as base:
            x = np.linspace(-1, 1, 16, dtype=np.float32)
            job = Client(base).submit(inputs=x)
            with ws_client.connect(ws_url(base, f"/v1/jobs/{job}/events?result=1"), open_timeout=5) as ws:
                first = json.loads(ws.recv(timeout=10))
                assert first["status"] in ("queued", "running") and "result" not in first
                release.set()
                events = [first]
                while events[-1]["status"] != "done":
                    events.append(json.loads(ws.recv(timeout=10)))
            np.testing.assert_allclose(events[-1]["result"], reference(model.inner, x)[0].numpy(), rtol=1e-5,
                                       atol=1e-6)
            assert events[-1]["dtype"] == "float32" and events[-1]["shape"] == [4]
    finally:
        release.set()
        service.close()


# ---------------------------------------------------------------- CLI

FACTORY = """
import torch
from fastloop.serve import Input

def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    return model, Input(torch.float32, (16,))   # in training mode: the CLI calls eval()


def bare():
    return build()[0]   # no inputs declared
"""


def run_cli(args: list[str], cwd: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "fastloop", "serve", *args, "--log-level", "warning"], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def serve_and_check(args: list[str], cwd: str) -> None:
    port = free_port()
    proc = run_cli([*args, "--port", str(port), "--store", "memory", "--torch-threads", "1"], cwd)
    try:
        client = Client(f"http://127.0.0.1:{port}", timeout=5)
        wait_for(lambda: client.healthz() or proc.poll() is not None, timeout=60)
        assert proc.poll() is None, proc.stdout.read().decode()
        x = np.random.default_rng(5).standard_normal(16).astype(np.float32)
        np.testing.assert_allclose(client.result(client.submit(inputs=x.tolist()), timeout=10),
                                   reference(mlp(), x)[0].numpy(), rtol=1e-5, atol=1e-6)
        with pytest.raises(BadRequest, match="expected shape"):
            client.submit(inputs=[1.0, 2.0])
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=20)
        output = proc.stdout.read().decode()
        assert rc in (0, 130) and "Traceback" not in output, output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_serves_a_model_built_by_the_users_factory(tmp_path):
    (tmp_path / "my_models.py").write_text(textwrap.dedent(FACTORY))
    serve_and_check(["--model", "my_models:build"], str(tmp_path))


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_cli_serves_a_torchscript_file_with_its_input_on_the_command_line(tmp_path):
    torch.jit.save(torch.jit.script(mlp()), str(tmp_path / "mlp.ts"))
    serve_and_check(["--model", "mlp.ts", "--input", "float32:16"], str(tmp_path))


def test_cli_serves_a_torch_export_program_with_a_dynamic_batch(tmp_path):
    batch = torch.export.Dim("batch")
    program = torch.export.export(mlp(), (torch.zeros(2, 16),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(tmp_path / "mlp.pt2"))
    serve_and_check(["--model", "mlp.pt2", "--input", "x=float32:16"], str(tmp_path))


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
@pytest.mark.parametrize("setup, args, words", [
    ("state_dict", ["--model", "weights.pt"], ["torch.save file", "--model module:factory"]),
    ("script", ["--model", "mlp.ts"], ["declare its inputs with --input DTYPE:SHAPE"]),
    ("factory", ["--model", "my_models:bare"], ["Sequential is a torch model", "--input DTYPE:SHAPE",
                                                "return (model, inputs) from a factory"]),
    ("none", ["--model", "missing_module:build"], ["cannot import 'missing_module'"]),
    ("factory", ["--model", "my_models:nothing"], ["has no 'nothing'"]),
    ("script", ["--model", "mlp.ts", "--input", "float32"], ["[NAME=]DTYPE:SHAPE"]),
    ("script", ["--model", "mlp.ts", "--input", "float32:16,x"], ["invalid literal"]),
])
def test_cli_refuses_what_it_cannot_serve_with_the_way_out(tmp_path, monkeypatch, capsys, setup, args, words):
    if setup == "state_dict":
        torch.save(mlp().state_dict(), str(tmp_path / "weights.pt"))
    elif setup == "script":
        torch.jit.save(torch.jit.script(mlp()), str(tmp_path / "mlp.ts"))
    elif setup == "factory":
        (tmp_path / "my_models.py").write_text(textwrap.dedent(FACTORY))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path)] + sys.path)  # as `python -m` puts the working directory first
    try:
        assert cli.main([*args, "--port", str(free_port())]) == 2  # refused before any server starts
    finally:
        sys.modules.pop("my_models", None)
    output = capsys.readouterr().err
    assert all(word in output for word in words), output
    assert "(784,)" not in output, output  # no made-up shape (it once suggested Input(torch.float32, (784,)))
