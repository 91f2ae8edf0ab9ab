"""The fixtures of the tests that need Redis (test_redis_store.py, test_serve_shared.py): a
redis-server of their own per test module, and a key prefix per test so tests never see each
other's keys. Importing this module skips the importing test module, saying why, when
redis-py or the redis-server binary is missing.

    from redis_fixtures import prefix, redis, server  # noqa: E402,F401 (fixtures)
"""

from __future__ import annotations

import shutil
import time

import pytest

redis = pytest.importorskip("redis", reason="the redis package (redis-py) is not installed: pip install redis")
if shutil.which("redis-server") is None:
    pytest.skip("the redis-server binary is not installed (Debian: apt-get install redis-server)",
                allow_module_level=True)

from redis_launcher import RedisServer  # noqa: E402

__all__ = ["redis", "server", "prefix"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A redis-server on a free loopback port for the module; killed at its end."""
    srv = RedisServer(str(tmp_path_factory.mktemp("redis")))
    srv.start()
    yield srv
    if srv.process.poll() is None:
        srv.process.kill()
        srv.process.wait()


@pytest.fixture
def prefix(request) -> str:
    """A key prefix of this test's own."""
    return f"t-{request.node.name[:40]}-{time.monotonic_ns()}:"
