"""Serving across "hosts": Redis and two servers, each in a network namespace this test makes
(``ip netns`` + veth pairs on a bridge), a client spreading jobs over both servers, and one
server killed with SIGKILL mid-load. Every job the client submitted ends done or failed with
a reason; none is lost; and none ran twice without saying so (the model logs every row it
runs: a job that ran twice would have to be a failed one whose reason says why).

Needs root (CAP_NET_ADMIN), iproute2 with bridge support, redis-server, redis-py and
uvicorn; skips naming what is missing. The namespaces and links are removed at the end."""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("redis", reason="the redis package (redis-py) is not installed: pip install redis")
pytest.importorskip("uvicorn", reason="uvicorn is not installed: pip install 'fastloop[serve]'")
if shutil.which("redis-server") is None:
    pytest.skip("the redis-server binary is not installed", allow_module_level=True)
if shutil.which("ip") is None:
    pytest.skip("iproute2's ip is not installed", allow_module_level=True)

from fastloop.serve import Client, JobFailed  # noqa: E402
from fastloop.errors import QueueFull  # noqa: E402
from fastloop.serve.client import ServiceUnavailable  # noqa: E402
from waiting import wait_for  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = os.path.join(ROOT, "tests", "serve_shared_child.py")
ENV = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
JOBS = 240


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Network:
    """A bridge in this namespace and one namespace per name, each joined to it by a veth pair,
    addresses 10.<a>.<b>.(1 + i); this namespace is .1 (the client's side)."""

    def __init__(self, names: list[str]) -> None:
        tag = f"{os.getpid() % 100000}"
        self.bridge = f"flbr{tag}"
        self.subnet = f"10.{200 + os.getpid() % 50}.{(os.getpid() // 50) % 250}"
        self.namespaces = {name: f"fl{name}{tag}" for name in names}
        self.addresses = {name: f"{self.subnet}.{2 + i}" for i, name in enumerate(names)}
        self.links: list[str] = []

    def __enter__(self) -> "Network":
        try:
            _ip("link", "add", "name", self.bridge, "type", "bridge")
        except (subprocess.CalledProcessError, OSError) as error:
            stderr = getattr(error, "stderr", b"") or b""
            pytest.skip(f"cannot create a bridge (needs root and CAP_NET_ADMIN): {stderr.decode().strip() or error}")
        try:
            _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, (name, ns) in enumerate(self.namespaces.items()):
                _ip("netns", "add", ns)
                host_end, ns_end = f"flv{i}h{self.bridge[4:]}", f"flv{i}n{self.bridge[4:]}"
                _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
                self.links.append(host_end)
                _ip("link", "set", ns_end, "netns", ns)
                _ip("link", "set", host_end, "master", self.bridge)
                _ip("link", "set", host_end, "up")
                _ip("-n", ns, "addr", "add", f"{self.addresses[name]}/24", "dev", ns_end)
                _ip("-n", ns, "link", "set", ns_end, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for link in self.links:
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=10)
        for ns in self.namespaces.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=10)

    def run(self, name: str, args: list[str], **kwargs) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.namespaces[name], *args], env=ENV,
                                start_new_session=True, **kwargs)


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _up(client: Client) -> bool:
    try:
        return client.healthz()
    except OSError:
        return False


def _redis_up(url: str) -> bool:
    import redis
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5).ping())
    except redis.exceptions.RedisError:
        return False


def test_two_hosts_on_one_redis_one_killed_mid_load_every_job_ends_once_or_says_why(tmp_path):
    with Network(["redis", "a", "b"]) as net:
        redis_url = f"redis://{net.addresses['redis']}:6379/0"
        procs: list[subprocess.Popen] = []
        try:
            procs.append(net.run("redis", ["redis-server", "--bind", net.addresses["redis"], "--port", "6379",
                                           "--save", "", "--appendonly", "no", "--dir", str(tmp_path),
                                           "--protected-mode", "no"],  # the namespaces' network is the test's own
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_for(lambda: _redis_up(redis_url), interval=0.02)
            hosts = {}
            for name in ("a", "b"):
                log = tmp_path / f"ran-{name}.log"
                procs.append(net.run(name, [sys.executable, CHILD, redis_url, "hosts:", "--num-workers", "2",
                                            "--max-batch", "4", "--model", "logged", "--model-s", "0.01",
                                            "--log", str(log), "--visibility-timeout-s", "1",
                                            "--http", f"{net.addresses[name]}:8000"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
                hosts[name] = (procs[-1], Client(f"http://{net.addresses[name]}:8000", timeout=5))
            for name, (proc, client) in hosts.items():
                wait_for(lambda: proc.poll() is not None or _up(client), interval=0.02)
                assert proc.poll() is None, proc.stdout.read().decode()

            accepted: dict[str, int] = {}
            lock = threading.Lock()
            killed = threading.Event()

            def submit(i: int) -> None:
                job_id = f"job-{i}"
                order = ["a", "b"] if i % 2 == 0 else ["b", "a"]
                deadline, attempt = time.monotonic() + 60, 0
                while time.monotonic() < deadline:  # a retry with the same id never makes a second job
                    name = "b" if killed.is_set() else order[attempt % 2]
                    attempt += 1
                    try:
                        hosts[name][1].submit(inputs=np.full(4, i, np.float32), job_id=job_id)
                    except (OSError, ServiceUnavailable, QueueFull):
                        time.sleep(0.05)  # paces the retries
                        continue
                    with lock:
                        accepted[job_id] = i
                    return

            def load(start: int) -> None:
                for i in range(start, JOBS, 4):
                    submit(i)
                    # host a dies mid-load: once it has run jobs (so that it likely runs some now)
                    if len(accepted) >= JOBS // 3 and (tmp_path / "ran-a.log").exists() and not killed.is_set():
                        with lock:
                            if not killed.is_set():
                                _stop(hosts["a"][0], signal.SIGKILL)
                                killed.set()

            threads = [threading.Thread(target=load, args=(k,)) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert killed.is_set()
            assert len(accepted) == JOBS  # every job was accepted by one host or the other

            survivor = hosts["b"][1]
            outcomes: dict[str, str] = {}
            for job_id, i in accepted.items():
                try:
                    np.testing.assert_array_equal(survivor.result(job_id, timeout=60), np.full(4, 2 * i + 1))
                    outcomes[job_id] = "done"
                except JobFailed as error:
                    assert "worker process stopped while the job was running" in error.reason, error.reason
                    outcomes[job_id] = "failed"
            runs = collections.Counter()
            for name in ("a", "b"):
                path = tmp_path / f"ran-{name}.log"
                if path.exists():
                    runs.update(int(line) for line in path.read_text().split())
            assert max(runs.values()) == 1, [tag for tag, n in runs.items() if n > 1]  # nothing ran twice
            for job_id, i in accepted.items():
                assert runs[i] == 1 or outcomes[job_id] == "failed", (job_id, outcomes[job_id])
            assert sum(o == "done" for o in outcomes.values()) >= JOBS // 2
        finally:
            for proc in reversed(procs):
                _stop(proc)
