"""A throwaway redis-server on a free loopback port: a fixture of the RedisStore tests, which
fastloop.bench.serve also uses when it runs from a source checkout.

Needs the redis-server binary (Debian: apt-get install redis-server) and redis-py.

    >>> with tempfile.TemporaryDirectory() as d:
    ...     server = RedisServer(d); server.start()
    ...     store = RedisStore(server.url)
    ...     server.stop()
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from typing import Any

__all__ = ["RedisServer", "available"]


def available() -> bool:
    """True when redis-server and redis-py are both installed."""
    try:
        import redis  # noqa: F401
    except ImportError:
        return False
    return shutil.which("redis-server") is not None


class RedisServer:
    """A redis-server on a free port in its own directory, without persistence; stop() and
    start() keep the port (a restart, as a test of reconnecting needs)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        import redis

        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.directory, "--logfile", os.path.join(self.directory, "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    break
            except redis.exceptions.RedisError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port} (see {self.directory}/redis.log)")
            time.sleep(0.01)
        client.close()

    def stop(self, save: bool = False) -> None:
        """save: a graceful SHUTDOWN SAVE (dump.rdb, loaded by the next start); else SIGKILL,
        which loses everything (this server keeps no other persistence)."""
        import redis

        if self.process is None:
            return
        if save:
            try:
                redis.Redis(port=self.port, socket_timeout=5).shutdown(save=True)
            except redis.exceptions.ConnectionError:
                pass  # redis-py may see the connection close as an error
        elif self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)

    def client(self) -> Any:
        import redis

        return redis.Redis(port=self.port, socket_timeout=2)
