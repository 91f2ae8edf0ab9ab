"""Connection limits for the HTTP front under uvicorn: a cap on a request's header bytes and
deadlines for a client that connects and sends nothing, stops mid-headers (slowloris) or
stops mid-body, so such clients cannot hold file descriptors until the server refuses
everyone. uvicorn itself has no header cap and no header/body timeout on its default
(httptools) parser; this protocol adds them.

    >>> config = uvicorn_config(app, host="0.0.0.0", port=8000)   # the limits below, as keywords
    >>> uvicorn.Server(config).run()

A header over ``max_header_bytes`` is answered 431 and the connection closed; headers not
complete ``header_timeout_s`` after the connection opened (or after the previous response)
close the connection; a body not complete ``body_timeout_s`` after its headers is answered 408.
Idle keep-alive connections close after uvicorn's ``timeout_keep_alive``.

The protocol subclasses uvicorn's private ``HttpToolsProtocol``: the serve extra pins the
uvicorn versions it was tested with (pyproject.toml), ``shape_problems()`` lists what changed
in the methods and attributes relied on (a test fails naming the class), and
``uvicorn_config`` refuses to start when a relied-on method is gone.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from typing import Any, Callable

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["LimitedHttpProtocol", "uvicorn_config", "LIMITS", "shape_problems", "PROTOCOL"]

PROTOCOL = "uvicorn.protocols.http.httptools_impl.HttpToolsProtocol"  # the private class subclassed below
# Its methods overridden or called below -> their parameters after self, as this module calls them.
RELIED_ON = {"connection_made": ["transport"], "connection_lost": ["exc"], "data_received": ["data"],
             "send_400_response": ["msg"], "on_message_begin": [], "on_url": ["url"],
             "on_header": ["name", "value"], "on_headers_complete": [], "on_message_complete": [],
             "on_response_complete": [], "handle_websocket_upgrade": []}
PROTOCOL_ATTRIBUTES = ("loop", "transport", "cycle")  # read on the protocol
CYCLE_ATTRIBUTES = ("response_started", "disconnected", "message_event")  # read or set on its cycle

LIMITS = {"max_header_bytes": 32 << 10, "header_timeout_s": 10.0, "body_timeout_s": 30.0, "keep_alive_s": 5.0}


class _HeaderTooLarge(Exception):
    pass


def _response(status: bytes, message: str) -> bytes:
    body = message.encode()
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header-size cap and header/body deadlines; the
    limits come from the class attributes (uvicorn_config makes a subclass holding them)."""

    max_header_bytes = LIMITS["max_header_bytes"]
    header_timeout_s = LIMITS["header_timeout_s"]
    body_timeout_s = LIMITS["body_timeout_s"]
    on_connections: Callable[[int], None] | None = None  # told +1 / -1 as TCP connections open and close

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._in_body = False

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._in_body and self.cycle is not None and not self.cycle.response_started:
            self.transport.write(_response(b"408 Request Timeout",
                                           f"the body did not arrive within {self.body_timeout_s} s"))
            self.cycle.disconnected = True  # the app's receive() sees a disconnect
            self.cycle.message_event.set()
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout_s)  # a client that connects and sends nothing
        # a TCP client's connection (a unix socket's are other server processes) is counted
        self._counted = self.on_connections is not None and not isinstance(transport.get_extra_info("sockname"), str)
        if self._counted:
            self.on_connections(1)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._uncount()
        super().connection_lost(exc)

    def _uncount(self) -> None:
        if getattr(self, "_counted", False):
            self._counted = False
            self.on_connections(-1)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        try:
            super().data_received(data)
        except _HeaderTooLarge:  # raised from on_url/on_header, before uvicorn's own handler
            self._refuse_header()

    def _refuse_header(self) -> None:
        self._disarm()
        self.transport.write(_response(b"431 Request Header Fields Too Large",
                                       f"the request's headers are over {self.max_header_bytes} bytes"))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        # httptools wraps a callback's exception in its parser error, which uvicorn answers 400
        if self._header_bytes > self.max_header_bytes:
            self._refuse_header()
        else:
            super().send_400_response(msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes, self._in_body = 0, False
        if self._deadline is None:  # a pipelined request: its clock starts now
            self._arm(self.header_timeout_s)

    def _count(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > self.max_header_bytes:
            raise _HeaderTooLarge()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_body = True
        self._arm(self.body_timeout_s)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_body = False
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # uvicorn armed its keep-alive timer; the next request's headers get their own deadline
        # from on_message_begin, and a client that sends part of one and stops is caught there

    def handle_websocket_upgrade(self) -> None:
        self._disarm()  # the WebSocket protocol has its own pings and timeouts
        self._uncount()  # a WebSocket is not a keep-alive connection to move
        super().handle_websocket_upgrade()


def shape_problems(deep: bool = True) -> list[str]:
    """What changed in uvicorn's HttpToolsProtocol that LimitedHttpProtocol relies on: a
    method gone or taking other parameters; with ``deep``, an attribute its methods (or its
    RequestResponseCycle's) no longer assign (read from the module's source). [] when none."""
    from uvicorn.protocols.http import httptools_impl

    problems = []
    for name, parameters in RELIED_ON.items():
        method = getattr(HttpToolsProtocol, name, None)
        if not callable(method):
            problems.append(f"{PROTOCOL}.{name}() is gone")
            continue
        if not deep:
            continue
        have = [p for p in inspect.signature(method).parameters if p != "self"]
        if have != parameters:
            problems.append(f"{PROTOCOL}.{name}() takes {have}, not {parameters}")
    if deep:
        for cls, names in ((HttpToolsProtocol, PROTOCOL_ATTRIBUTES),
                           (getattr(httptools_impl, "RequestResponseCycle", None), CYCLE_ATTRIBUTES)):
            if cls is None:
                problems.append(f"{httptools_impl.__name__}.RequestResponseCycle is gone")
                continue
            assigned = set(re.findall(r"self\.(\w+)\s*(?::[^=\n]+)?=[^=]", inspect.getsource(cls)))
            problems += [f"{httptools_impl.__name__}.{cls.__name__} no longer sets self.{name}"
                         for name in names if name not in assigned]
    return problems


def uvicorn_config(app: Any, max_header_bytes: int = LIMITS["max_header_bytes"],
                   header_timeout_s: float = LIMITS["header_timeout_s"],
                   body_timeout_s: float = LIMITS["body_timeout_s"],
                   keep_alive_s: float = LIMITS["keep_alive_s"],
                   on_connections: Callable[[int], None] | None = None, **kwargs: Any) -> Any:
    """A uvicorn.Config serving `app` with the limits above; other keywords go to uvicorn.
    ``on_connections(+1 / -1)`` hears TCP client connections open and close (peers.py)."""
    import uvicorn

    if max_header_bytes < 1 or header_timeout_s <= 0 or body_timeout_s <= 0 or keep_alive_s <= 0:
        raise ValueError("max_header_bytes and the timeouts must be > 0")
    gone = shape_problems(deep=False)
    if gone:  # the limits would silently not apply: refuse rather than serve without them
        raise RuntimeError(f"uvicorn {uvicorn.__version__} changed {PROTOCOL}, which fastloop's connection "
                           f"limits subclass: {'; '.join(gone)}. Install the uvicorn the serve extra pins.")
    protocol = type("LimitedHttpProtocol", (LimitedHttpProtocol,),
                    {"max_header_bytes": max_header_bytes, "header_timeout_s": header_timeout_s,
                     "body_timeout_s": body_timeout_s,
                     "on_connections": None if on_connections is None else staticmethod(on_connections)})
    kwargs.setdefault("lifespan", "on")
    return uvicorn.Config(app, http=protocol, timeout_keep_alive=keep_alive_s,
                          h11_max_incomplete_event_size=max_header_bytes, **kwargs)
