"""The public surface: what fastloop exports, its docstrings, its errors and its CLI."""

from __future__ import annotations

import inspect
import queue
import subprocess
import sys

import pytest

import fastloop


def test_public_names_are_exported_and_documented_with_an_example():
    for name in fastloop.__all__:
        obj = getattr(fastloop, name)
        if name.startswith("__") or inspect.ismodule(obj):
            continue
        doc = inspect.getdoc(obj) or ""
        assert doc, f"fastloop.{name} has no docstring"
    for name in fastloop.ops.__all__:
        doc = getattr(fastloop.ops, name).__doc__
        assert "fastloop.ops." + name in doc, f"ops.{name}'s docstring lacks an example"
        assert inspect.signature(getattr(fastloop.ops, name)), f"ops.{name} has no signature"


def test_signatures_are_introspectable():
    assert list(inspect.signature(fastloop.ops.normalize).parameters) == ["x", "mean", "std", "layout", "out", "num_threads"]
    assert "timeout" in inspect.signature(fastloop.Queue.get).parameters


def test_error_hierarchy():
    assert issubclass(fastloop.Empty, fastloop.Error) and issubclass(fastloop.Empty, queue.Empty)
    assert issubclass(fastloop.QueueFull, queue.Full)
    assert issubclass(fastloop.Closed, RuntimeError)
    assert issubclass(fastloop.CudaUnavailable, fastloop.Error)
    error = fastloop.CudaError("boom", code=35)
    assert error.code == 35 and str(error) == "boom"


def test_serve_exports_the_job_record_and_every_job_exception_once():
    from fastloop import serve
    from fastloop.serve import jobs

    exceptions = {name for name, obj in vars(jobs).items()
                  if inspect.isclass(obj) and issubclass(obj, Exception) and obj.__module__ == jobs.__name__}
    assert sorted(jobs.__all__) == sorted(exceptions | {"JobRecord"})
    assert len(serve.__all__) == len(set(serve.__all__))
    for name in jobs.__all__:
        assert getattr(serve, name) is getattr(jobs, name) and name in serve.__all__


def test_cli_info_runs():
    out = subprocess.run([sys.executable, "-m", "fastloop", "info"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "CUDA built:" in out.stdout and "CUDA available:" in out.stdout


def test_cli_rejects_unknown_commands():
    out = subprocess.run([sys.executable, "-m", "fastloop", "fly"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_exit_with_a_blocked_daemon_thread_and_a_busy_pool_does_not_hang():
    script = (
        "import threading, numpy, fastloop\n"
        "q = fastloop.Queue()\n"
        "threading.Thread(target=q.get, daemon=True).start()\n"
        "x = numpy.zeros((64, 224, 224, 3), numpy.uint8)\n"
        "fastloop.ops.normalize(x, 0.5, 0.25, num_threads=2)\n"
        "def spin():\n"
        "    while True: fastloop.ops.normalize(x, 0.5, 0.25, num_threads=2)\n"
        "threading.Thread(target=spin, daemon=True).start()\n"
        "print('exiting')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "exiting"
