"""Share-nothing server processes on one machine: ``python -m fastloop serve --processes N``
without a Redis store.

Each process keeps its own queue, workers and store (the in-memory queue of one server, so a
job costs what it costs there: no Redis round trips). A job belongs to one process, named by
its id: ``owner_of(id, n) = crc32(id) % n``. A job submitted without an id gets a fresh one
that the accepting process owns; a job submitted with its own id belongs to its owner
wherever it was posted (so resubmitting an id stays idempotent). The kernel spreads the
port's connections over the processes; a request naming a job that reaches another process
(status, result and its long poll, cancel, a submit with an id, the job's WebSocket) is
forwarded to the owner over the owner's unix socket, and the client gets the owner's answer
(503 with Retry-After while the owner is being restarted). The WebSocket of every job
(/v1/events) merges the events of all processes. /healthz and /metrics answer for the
process the connection reached. Every answer names the process that made it in the
``x-fastloop-process`` header.

What a process holds is lost with it, as with one server: with the memory store its jobs are
unknown after its restart; with ``--store file:DIR`` (DIR/process-<i> per process) the
replacement of process i recovers i's jobs as one restarted server does. For jobs that must
outlive their process and run on any process or machine, use ``--store redis://``: the queue
is then shared (shared.py).

    >>> app = PeerRouter(App(service), index=0, peers=["/run/p0.sock", "/run/p1.sock"])
    >>> service = InferenceService(model, new_id=lambda: owned_id(0, 2))
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import mmap
import re
import uuid
import zlib
from typing import Any, Awaitable, Callable

__all__ = ["owner_of", "owned_id", "PeerRouter", "ConnectionShares", "KeepShares", "FORWARDED", "PROCESS"]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

FORWARDED = b"x-fastloop-forwarded"  # set on a forwarded request: its receiver answers it itself
PROCESS = b"x-fastloop-process"  # on every answer: the index of the process that made it
_JOB_PATH = re.compile(r"/v1/(?:models/[^/]+/)?jobs/([^/]+)(?:/result|/events)?")
_SUBMIT_PATH = re.compile(r"/v1/(?:models/[^/]+/)?(?:jobs|predict)")  # a POST that may name its job's id
_EVENTS_PATH = re.compile(r"/v1/(?:models/[^/]+/)?events")  # every job's events (of one model)
_DROPPED = {b"date", b"server", b"connection", b"keep-alive", b"transfer-encoding"}  # uvicorn sets its own
_CONNECT_S = 2.0  # a peer's socket that does not accept by then is down
_IDLE_PER_PEER = 16  # kept-alive connections to each peer
_RESUBSCRIBE_S = 1.0  # /v1/events: a peer down is tried again this often


def _check_processes(n: int, index: int = 0) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"the number of processes must be an int >= 1, not {n!r}")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n:
        raise ValueError(f"the process index must be an int in [0, {n}), not {index!r}")


def owner_of(job_id: str, n: int) -> int:
    """The index of the process (of n) that holds job `job_id`."""
    _check_processes(n)
    if not isinstance(job_id, str):
        raise TypeError(f"job_id must be a str, not {type(job_id).__name__}")
    return zlib.crc32(job_id.encode()) % n


def owned_id(index: int, n: int) -> str:
    """A fresh random id (32 hex digits) that process `index` of n owns (n tries on average)."""
    _check_processes(n, index)
    while True:
        job_id = uuid.uuid4().hex
        if owner_of(job_id, n) == index:
            return job_id


class ConnectionShares:
    """How many client connections each of n processes holds, in memory shared across fork
    (make it before forking): a process holding more than its fair share asks a client to
    reconnect (``connection: close`` on an answer), and the kernel places the new connection
    afresh. Keep-alive clients that connect at once are otherwise split by chance (40 to 24
    of 64 in one run) and stay so: the busier process caps the throughput. Each process
    writes only its own count (from its event loop); a stale read only delays a move."""

    def __init__(self, n: int) -> None:
        _check_processes(n)
        self.n = n
        self._map = mmap.mmap(-1, 8 * n)  # anonymous and MAP_SHARED: the forked children share it
        self._counts = memoryview(self._map).cast("q")

    def reset(self, index: int) -> None:
        """A (re)started process holds none yet (a killed one's count would stay)."""
        self._counts[index] = 0

    def add(self, index: int, delta: int) -> None:
        self._counts[index] += delta

    def count(self, index: int) -> int:
        return self._counts[index]

    def over_share(self, index: int) -> bool:
        """True while process `index` holds more than one connection over its fair share."""
        total = sum(self._counts)
        return self._counts[index] > -(-total // self.n) + 1


class KeepShares:
    """ASGI middleware for server processes that share a queue (not their jobs): answers a
    client with ``connection: close`` while this process holds more than its share of
    connections (ConnectionShares). PeerRouter does the same for share-nothing processes."""

    def __init__(self, app: Any, index: int, shares: ConnectionShares) -> None:
        self.app, self.index, self.shares = app, index, shares

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def moving(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and self.shares.over_share(self.index):
                message = {**message, "headers": list(message.get("headers", ())) + [(b"connection", b"close")]}
            await send(message)
        await self.app(scope, receive, moving)


class _Unavailable(Exception):
    """The owner's socket did not answer (it is being restarted, or stopping)."""


class _PeerHTTP:
    """HTTP/1.1 over one peer's unix socket, with a few kept-alive connections."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def request(self, method: str, target: str, headers: list[tuple[bytes, bytes]],
                      body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        head = [f"{method} {target} HTTP/1.1\r\nhost: localhost\r\ncontent-length: {len(body)}\r\n".encode()]
        head += [name + b": " + value + b"\r\n" for name, value in headers]
        message = b"".join(head) + FORWARDED + b": 1\r\n\r\n" + body
        reused = bool(self._idle)
        conn = self._idle.pop() if reused else await self._connect()
        try:
            answer, reusable = await self._exchange(conn, message)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            conn[1].close()
            if not reused:
                raise _Unavailable(f"the connection to {self.path} broke") from None
            conn = await self._connect()  # a kept-alive connection the peer had closed: once more, fresh
            try:
                answer, reusable = await self._exchange(conn, message)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                conn[1].close()
                raise _Unavailable(f"the connection to {self.path} broke") from None
            except BaseException:
                conn[1].close()
                raise
        except BaseException:  # cancelled mid-answer: the connection's state is unknown
            conn[1].close()
            raise
        if reusable and len(self._idle) < _IDLE_PER_PEER:
            self._idle.append(conn)
        else:
            conn[1].close()
        return answer

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await asyncio.wait_for(asyncio.open_unix_connection(self.path), _CONNECT_S)
        except (OSError, asyncio.TimeoutError) as error:
            raise _Unavailable(f"{self.path}: {error or type(error).__name__}") from None

    @staticmethod
    async def _exchange(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                        message: bytes) -> tuple[tuple[int, list[tuple[bytes, bytes]], bytes], bool]:
        """(status, headers, body) of the answer, and whether the connection can carry another."""
        reader, writer = conn
        writer.write(message)
        await writer.drain()
        lines = (await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        headers, length, close = [], None, False
        for line in lines[1:]:
            if not line:
                continue
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection":
                close = value.lower() == b"close"
            elif name not in _DROPPED:
                headers.append((name, value))
        if length is None:  # not one of the app's answers (they all have a length): read to the end
            return (status, headers, await reader.read()), False
        return (status, headers, await reader.readexactly(length)), not close

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


class PeerRouter:
    """The ASGI app of process `index` of ``len(peers)``: `app` (a fastloop.serve.App) for
    what this process holds; requests naming another process's job go to that process's
    unix socket (``peers[i]``); /v1/events merges every process's events."""

    def __init__(self, app: Any, index: int, peers: list[str], shares: ConnectionShares | None = None) -> None:
        _check_processes(len(peers), index)
        self.app, self.index, self.peers, self.shares = app, index, list(peers), shares
        self._name = str(index).encode()
        self._clients = [_PeerHTTP(path) for path in self.peers]

    def owner(self, job_id: str) -> int:
        return owner_of(job_id, len(self.peers))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" or _from_a_peer(scope):
            return await self.app(scope, receive, self._named(send, forwarded=True))
        if scope["type"] == "websocket":
            return await self._websocket(scope, receive, send)
        match = _JOB_PATH.fullmatch(scope["path"])
        if match is not None:
            owner = self.owner(match.group(1))
        elif scope["method"] == "POST" and _SUBMIT_PATH.fullmatch(scope["path"]):
            owner, receive = await self._submit_owner(scope, receive)
        else:
            owner = self.index
        if owner == self.index:
            return await self.app(scope, receive, self._named(send))
        await self._forward_http(owner, scope, receive, send)

    def _named(self, send: Send, forwarded: bool = False) -> Send:
        """`send` with this process's name on the answer, and ``connection: close`` on a
        client's while this process holds more than its share of connections."""
        async def named(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                extra = [(PROCESS, self._name)]
                if not forwarded and self.shares is not None and self.shares.over_share(self.index):
                    extra.append((b"connection", b"close"))
                message = {**message, "headers": list(message.get("headers", ())) + extra}
            await send(message)
        return named

    async def _submit_owner(self, scope: Scope, receive: Receive) -> tuple[int, Receive]:
        """The owner of a POST .../jobs or .../predict (this process unless it names an id), and a receive
        that hands the app the body again. A body over the app's limit is left to the app
        (it answers 413) without reading the rest."""
        query = dict(_query_pairs(scope))
        content_type = dict(scope.get("headers", ())).get(b"content-type", b"").split(b";")[0].strip().lower()
        limit = getattr(self.app, "max_body_bytes", 4 << 20)
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            size += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body", False) or size > limit:
                break
        replay = _replay(messages, receive)
        if size > limit or messages[-1]["type"] != "http.request":
            return self.index, replay
        if content_type == b"application/x-npy" or "id" in query:  # a body JSON is not (a model's preprocess reads it)
            job_id = query.get("id")
        else:
            body = b"".join(m.get("body", b"") for m in messages)
            job_id = _body_id(body) if b'"id"' in body else None
        return (self.index if job_id is None else self.owner(job_id)), replay

    async def _forward_http(self, owner: int, scope: Scope, receive: Receive, send: Send) -> None:
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        headers = [(k, v) for k, v in scope.get("headers", ()) if k in (b"content-type", b"accept")]
        try:
            status, answer_headers, body = await self._clients[owner].request(
                scope["method"], target.decode("latin-1"), headers, b"".join(chunks))
        except _Unavailable as error:
            status, body = 503, json.dumps({"error": f"the server process holding this job ({owner}) is not "
                                                     f"answering ({error}); retry later"}).encode()
            answer_headers = [(b"content-type", b"application/json"), (b"retry-after", b"1"), (PROCESS, self._name)]
        answer_headers.append((b"content-length", str(len(body)).encode()))
        if self.shares is not None and self.shares.over_share(self.index):
            answer_headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": answer_headers})
        await send({"type": "http.response.body", "body": body})

    # ------------------------------------------------------------ WebSockets
    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = _JOB_PATH.fullmatch(scope["path"])
        if match is not None and scope["path"].endswith("/events"):
            owner = self.owner(match.group(1))
            if owner != self.index:
                return await self._forward_websocket(owner, scope, receive, send)
        elif _EVENTS_PATH.fullmatch(scope["path"]) and len(self.peers) > 1:
            return await self._merged_events(scope, receive, send)
        await self.app(scope, receive, send)

    def _peer_uri(self, scope: Scope) -> str:
        query = scope.get("query_string", b"").decode("latin-1")
        return f"ws://localhost{scope['path']}" + (f"?{query}" if query else "")

    async def _forward_websocket(self, owner: int, scope: Scope, receive: Receive, send: Send) -> None:
        """The owner's event stream of one job, relayed (its refusal of an unknown job too)."""
        from websockets.asyncio.client import unix_connect
        from websockets.exceptions import ConnectionClosed, InvalidStatus

        if (await receive())["type"] != "websocket.connect":
            return
        try:
            peer = await asyncio.wait_for(unix_connect(self.peers[owner], self._peer_uri(scope), close_timeout=1,
                                                       additional_headers={FORWARDED.decode(): "1"}), _CONNECT_S)
        except InvalidStatus:  # the owner refused it before accepting (an unknown job)
            await send({"type": "websocket.close", "code": 1008, "reason": f"unknown job {scope['path'].split('/')[3]}"})
            return
        except (OSError, asyncio.TimeoutError):
            await send({"type": "websocket.close", "code": 1013,
                        "reason": f"the server process holding this job ({owner}) is not answering; retry later"})
            return
        await send({"type": "websocket.accept"})
        relay = asyncio.ensure_future(_relay(peer, send))
        left = asyncio.ensure_future(_client_left(receive))
        try:
            await asyncio.wait({relay, left}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (relay, left):
                task.cancel()
            await asyncio.gather(relay, left, return_exceptions=True)
            await peer.close()
        if relay.done() and not relay.cancelled() and relay.exception() is None:
            code, reason = relay.result()
            with contextlib.suppress(OSError, RuntimeError, ConnectionClosed):
                await send({"type": "websocket.close", "code": code, "reason": reason})

    async def _merged_events(self, scope: Scope, receive: Receive, send: Send) -> None:
        """This process's /v1/events (the app's own stream, its slow-client rule included)
        with the other processes' streams sent beside it. The other streams are joined
        before the client is accepted, so no event after the accept is missed (what they
        send meanwhile waits in their connections)."""
        from websockets.asyncio.client import unix_connect
        from websockets.exceptions import ConnectionClosed, InvalidHandshake

        accepted = asyncio.Event()
        lock = asyncio.Lock()
        lost = (OSError, ConnectionClosed, InvalidHandshake, asyncio.TimeoutError)

        async def locked_send(message: dict[str, Any]) -> None:
            async with lock:
                await send(message)
            if message["type"] == "websocket.accept":
                accepted.set()

        async def join(path: str) -> Any:
            try:
                return await asyncio.wait_for(unix_connect(path, self._peer_uri(scope),
                                                           additional_headers={FORWARDED.decode(): "1"}, close_timeout=1),
                                          _CONNECT_S)
            except lost:
                return None  # being restarted: relay() tries again

        async def relay(path: str, peer: Any) -> None:
            try:
                await accepted.wait()
                while True:
                    if peer is not None:
                        try:
                            async for text in peer:
                                await locked_send({"type": "websocket.send", "text": text})
                        except lost:
                            pass
                        await peer.close()
                    await asyncio.sleep(_RESUBSCRIBE_S)  # a peer gone (restarting) is joined again
                    peer = await join(path)
            finally:
                if peer is not None:
                    await peer.close()

        others = [path for i, path in enumerate(self.peers) if i != self.index]
        joined = await asyncio.gather(*(join(path) for path in others))
        relays = [asyncio.ensure_future(relay(path, peer)) for path, peer in zip(others, joined)]
        try:
            await self.app(scope, receive, locked_send)
        finally:
            for task in relays:
                task.cancel()
            await asyncio.gather(*relays, return_exceptions=True)
            for peer in joined:
                if peer is not None:
                    await peer.close()

    def close(self) -> None:
        for client in self._clients:
            client.close()


async def _relay(peer: Any, send: Send) -> tuple[int, str]:
    """Sends the peer's messages on; returns its close code and reason."""
    from websockets.exceptions import ConnectionClosed

    try:
        async for text in peer:
            await send({"type": "websocket.send", "text": text})
    except ConnectionClosed:
        pass
    return (peer.close_code or 1000), (peer.close_reason or "")


async def _client_left(receive: Receive) -> None:
    while (await receive())["type"] != "websocket.disconnect":
        pass


def _from_a_peer(scope: Scope) -> bool:
    """A request another process forwarded: marked so, on the unix socket (whose server
    address uvicorn gives as (path, None); a TCP client cannot pass for a peer)."""
    server = scope.get("server")
    on_unix = server is None or server[1] is None
    return on_unix and any(name == FORWARDED for name, _ in scope.get("headers", ()))


def _replay(messages: list[dict[str, Any]], receive: Receive) -> Receive:
    """A receive that returns `messages` first, then what `receive` returns."""
    pending = list(messages)

    async def replay() -> dict[str, Any]:
        return pending.pop(0) if pending else await receive()
    return replay


def _query_pairs(scope: Scope) -> list[tuple[str, str]]:
    import urllib.parse
    return urllib.parse.parse_qsl(scope.get("query_string", b"").decode("latin-1"))


def _body_id(body: bytes) -> str | None:
    """The "id" of a JSON submit body; None when there is none (or the body is not JSON:
    the app answers that)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    job_id = data.get("id") if isinstance(data, dict) else None
    return job_id if isinstance(job_id, str) else None
