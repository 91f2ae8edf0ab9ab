"""The OpenAPI document against the live server, checked by schemathesis: every check (no
server error, status codes, content types, headers and bodies as documented, schema-valid
requests accepted, invalid ones refused, the Allow header and 405s) and the stateful phase,
which follows the document's links from POST .../jobs to GET and DELETE .../jobs/{job_id}
and its result. The server is a real uvicorn one in a process of its own; schemathesis runs as its CLI in
a subprocess (its stable interface), with a fixed seed and few examples per operation.
Skips, saying why, where schemathesis is not installed (.ci/run installs it)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

pytest.importorskip("schemathesis", reason="schemathesis is not installed: pip install schemathesis")
uvicorn = pytest.importorskip("uvicorn", reason="uvicorn is not installed: pip install 'fastloop[serve]'")

from fastloop.serve import Input, InferenceService, MemoryStore  # noqa: E402
from fastloop.serve.http import App  # noqa: E402
from waiting import wait_for  # noqa: E402

CLI = "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())"


SERVER = """
import sys, uvicorn
sys.path.insert(0, sys.argv[2])
from test_serve_openapi_schemathesis import app
uvicorn.run(app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serving():
    """The App of app() under uvicorn in a server process of its own (as fastloop serve runs
    it); yields the base URL once it answers, stops it at the end."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", SERVER, str(port), os.path.dirname(os.path.abspath(__file__))],
                               env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert process.poll() is None, "the server process ended"
        try:
            return urllib.request.urlopen(f"{base}/healthz", timeout=5).status == 200
        except OSError:
            return False
    try:
        wait_for(answers, timeout=30)
        yield base
    finally:
        process.terminate()
        process.wait(10)


def affine(batch: np.ndarray) -> np.ndarray:
    return batch * 2 + 1


def masked(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return ids * mask[:, None]


# What the checks take as right besides their defaults, each a documented answer by design:
# - 503 and 504 are not server errors here: 504 answers a predict whose deadline (timeout_s,
#   any number > 0) passed, 503 a v2 infer's (Triton's UNAVAILABLE);
# - 410 and 422 answer a valid request about a job that expired or failed (its deadline
#   passed, or it was cancelled): the request is right, the job's outcome is the answer.
# use_after_free is on: a DELETE that answers 200 cancelled a queued job, and GET answers 410
# for it from then on; a DELETE of a running or ended job answers 409 and deletes nothing.
CONFIG = """
[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", "503", "504"]
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "410", "422", "429", "5xx"]
"""


def run_schemathesis(base: str, tmp_path) -> None:
    """schemathesis run with every check and phase; fails with its report unless it found nothing."""
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [sys.executable, "-c", CLI, "--config-file", str(config), "run", f"{base}/openapi.json",
               "--checks", "all",
               "--phases", "examples,coverage,fuzzing,stateful", "--max-examples", "15", "--seed", "1",
               "--workers", "1", "--request-timeout", "20"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    report = done.stdout[-20000:] + done.stderr[-5000:]
    assert done.returncode == 0, report
    assert "stateful" in report.lower(), report  # the stateful phase ran (the links were followed)


def app() -> App:
    """Two models with declared inputs: one of one input, one of two (a row or rows each)."""
    return App({
        "affine": InferenceService(affine, inputs=Input("float32", (2,)), store=MemoryStore(), max_queue=4),
        "masked": InferenceService(masked, inputs={"ids": Input("int16", (3,)), "mask": Input("uint8", ())},
                                   store=MemoryStore(), max_queue=4),
    })


def test_schemathesis_finds_no_failure_against_the_live_server(tmp_path):
    with serving() as base:
        run_schemathesis(base, tmp_path)
