"""fastloop.serve.peers in one process: who owns an id, the router's choice between its own
app and a peer's socket, and the peer connections' failure handling (the CLI-level behaviour
is tests/test_serve_local_processes.py's)."""

from __future__ import annotations

import asyncio
import json
import os
import zlib

import pytest

from fastloop.serve.jobs import check_job_id
from fastloop.serve.peers import PROCESS, ConnectionShares, KeepShares, PeerRouter, owned_id, owner_of


def test_owned_ids_are_fresh_valid_ids_of_their_owner():
    for n in (1, 2, 3, 8):
        for index in range(n):
            ids = {owned_id(index, n) for _ in range(50)}
            assert len(ids) == 50
            assert all(check_job_id(i) == i and len(i) == 32 and owner_of(i, n) == index for i in ids)
    assert owner_of("job-7", 5) == zlib.crc32(b"job-7") % 5


class Recorder:
    """An ASGI app that answers 200 with what it got: the route taken when it answers."""

    def __init__(self, max_body_bytes: int = 1 << 20) -> None:
        self.max_body_bytes = max_body_bytes
        self.bodies: list[bytes] = []

    async def __call__(self, scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"{}"})


def _call(app, method: str, path: str, body: bytes = b"", chunks: int = 1, headers=(), server=("127.0.0.1", 8000)):
    """(status, headers, body) of one HTTP request through the ASGI app."""
    size = -(-len(body) // chunks) or 1
    pieces = [body[i:i + size] for i in range(0, len(body), size)] or [b""]
    messages = [{"type": "http.request", "body": p, "more_body": i < len(pieces) - 1} for i, p in enumerate(pieces)]
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"content-type", b"application/json"), *headers], "server": server}
    asyncio.run(app(scope, receive, send))
    start = sent[0]
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def _id_of(owner: int, n: int = 2) -> str:
    return next(f"job-{i}" for i in range(1000) if owner_of(f"job-{i}", n) == owner)


def test_requests_for_its_own_jobs_and_unnamed_submits_stay_in_the_process(tmp_path):
    inner = Recorder()
    router = PeerRouter(inner, 0, [str(tmp_path / "p0.sock"), str(tmp_path / "p1.sock")])
    status, headers, _ = _call(router, "GET", f"/v1/jobs/{_id_of(0)}/result")
    assert status == 200 and headers[PROCESS] == b"0"
    body = json.dumps({"inputs": [1.0, 2.0]}).encode()
    assert _call(router, "POST", "/v1/jobs", body, chunks=3)[0] == 200
    assert inner.bodies[-1] == body  # the body read to find the id is handed on whole
    assert _call(router, "POST", "/v1/jobs", json.dumps({"inputs": [1], "id": _id_of(0)}).encode())[0] == 200
    assert _call(router, "GET", "/healthz")[0] == 200


def test_a_peer_that_is_not_there_is_a_503_with_retry_after(tmp_path):
    router = PeerRouter(Recorder(), 0, [str(tmp_path / "p0.sock"), str(tmp_path / "p1.sock")])
    for method, path, body in (("GET", f"/v1/jobs/{_id_of(1)}", b""), ("DELETE", f"/v1/jobs/{_id_of(1)}", b""),
                               ("POST", "/v1/jobs", json.dumps({"inputs": [1], "id": _id_of(1)}).encode())):
        status, headers, answer = _call(router, method, path, body)
        assert status == 503 and headers[b"retry-after"] == b"1" and headers[PROCESS] == b"0"
        assert "(1) is not answering" in json.loads(answer)["error"]


def test_a_body_over_the_limit_is_left_to_the_app_which_answers_it(tmp_path):
    inner = Recorder(max_body_bytes=10)
    router = PeerRouter(inner, 0, [str(tmp_path / "p0.sock"), str(tmp_path / "p1.sock")])
    body = json.dumps({"inputs": [1.0] * 20, "id": _id_of(1)}).encode()
    assert _call(router, "POST", "/v1/jobs", body, chunks=4)[0] == 200  # not forwarded: the app's 413 to give
    assert inner.bodies[-1] == body


def test_a_kept_alive_connection_the_peer_closed_is_replaced_and_the_request_answered(tmp_path):
    """The peer answers one request per connection and then closes it (as a keep-alive
    timeout or a restart does): every request still gets its answer."""
    path = str(tmp_path / "p1.sock")
    served = []

    async def main():
        async def one_answer(reader, writer):
            head = await reader.readuntil(b"\r\n\r\n")
            served.append(head.split(b"\r\n")[0])
            assert b"x-fastloop-forwarded: 1" in head
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-fastloop-process: 1\r\n\r\n{}")
            await writer.drain()
            writer.close()

        server = await asyncio.start_unix_server(one_answer, path)
        router = PeerRouter(Recorder(), 0, [str(tmp_path / "p0.sock"), path])
        answers = []
        for _ in range(3):
            sent = []

            async def send(message):
                sent.append(message)

            async def receive():
                return {"type": "http.request", "body": b"", "more_body": False}

            scope = {"type": "http", "method": "GET", "path": f"/v1/jobs/{_id_of(1)}", "query_string": b"",
                     "headers": []}
            await router(scope, receive, send)
            answers.append((sent[0]["status"], dict(sent[0]["headers"])[PROCESS]))
        server.close()
        router.close()
        return answers

    assert asyncio.run(main()) == [(200, b"1")] * 3
    assert len(served) == 3


def test_bad_process_counts_indexes_and_ids_are_refused_by_name():
    with pytest.raises(ValueError, match="process index"):
        PeerRouter(Recorder(), 2, ["a", "b"])
    with pytest.raises(ValueError, match="process index"):
        owned_id(2, 2)  # no id could ever be its: refused, not searched for forever
    with pytest.raises(ValueError, match="number of processes"):
        owner_of("a", 0)
    with pytest.raises(ValueError, match="number of processes"):
        ConnectionShares(0)
    with pytest.raises(ValueError, match="number of processes"):
        PeerRouter(Recorder(), 0, [])
    with pytest.raises(TypeError, match="job_id must be a str"):
        owner_of(b"a", 2)


def test_connection_shares_are_shared_across_fork_and_name_the_process_over_its_share():
    shares = ConnectionShares(2)
    shares.add(0, 3)
    pid = os.fork()
    if pid == 0:  # the child counts its connections where the parent sees them
        shares.add(1, 2)
        os._exit(0)
    os.waitpid(pid, 0)
    assert (shares.count(0), shares.count(1)) == (3, 2)
    assert not shares.over_share(0) and not shares.over_share(1)  # 3 of 5: the fair 3, within one
    shares.add(0, 2)
    assert not shares.over_share(0)  # 5 of 7: the fair 4, within one
    shares.add(0, 1)
    assert shares.over_share(0) and not shares.over_share(1)  # 6 of 8 > 4 + 1
    shares.reset(0)
    assert shares.count(0) == 0 and not shares.over_share(1)  # 2 of 2: the fair 1, within one
    shares.add(1, 2)
    assert shares.over_share(1)  # 4 of 4 > 2 + 1


def test_an_answer_of_a_process_over_its_share_asks_the_client_to_reconnect(tmp_path):
    shares = ConnectionShares(2)
    router = PeerRouter(Recorder(), 0, [str(tmp_path / "p0.sock"), str(tmp_path / "p1.sock")], shares)
    shares.add(0, 4)
    shares.add(1, 2)
    assert b"connection" not in _call(router, "GET", "/healthz")[1]  # 4 of 6: within one of 3
    shares.add(0, 2)
    assert _call(router, "GET", "/healthz")[1][b"connection"] == b"close"  # 6 of 8 > 4 + 1
    forwarded = _call(router, "GET", "/healthz", headers=[(b"x-fastloop-forwarded", b"1")], server=("/run/p0.sock", None))[1]
    assert b"connection" not in forwarded  # another process's connection is not a client's to move


def test_processes_sharing_a_queue_move_clients_too():
    shares = ConnectionShares(2)
    app = KeepShares(Recorder(), 1, shares)
    shares.add(1, 4)
    assert _call(app, "GET", "/healthz")[1] == {b"content-length": b"2", b"connection": b"close"}  # 4 of 4 > 2 + 1
    shares.add(0, 4)
    assert _call(app, "GET", "/healthz")[1] == {b"content-length": b"2"}


def test_only_the_unix_socket_takes_a_request_as_forwarded(tmp_path):
    """A TCP client sending the peers' header is still routed to the job's owner (it cannot
    make a process hold another's job); on the unix socket the header is a peer's."""
    inner = Recorder()
    router = PeerRouter(inner, 0, [str(tmp_path / "p0.sock"), str(tmp_path / "p1.sock")])
    body = json.dumps({"inputs": [1], "id": _id_of(1)}).encode()
    marked = [(b"x-fastloop-forwarded", b"1")]
    assert _call(router, "POST", "/v1/jobs", body, headers=marked)[0] == 503  # owner 1 is not there
    assert inner.bodies == []
    assert _call(router, "POST", "/v1/jobs", body, headers=marked, server=("/run/p0.sock", None))[0] == 200
    assert inner.bodies == [body]
