"""Status events for the HTTP front's WebSockets and long polls: a stream's queue of events
(``Watcher``) and the loop that sends them to one client (``stream``).

A client is too slow when its socket pushes back (a send waits for the client to read) while
more than ``limit`` events wait; a burst the loop delivers faster than it gets to send them
does not count, so only the client's own slowness drops it (closed with 1008).

    >>> watcher = Watcher(("mnist", job_id), limit=256)
    >>> await stream(watcher, first, receive, send, result_message, dropped)
"""

from __future__ import annotations

import asyncio
import collections
import json
from typing import Any, Awaitable, Callable

from .jobs import DONE, EXPIRED, FAILED, QUEUED, RUNNING

__all__ = ["Watcher", "stream", "ended", "TERMINAL"]

TERMINAL = (DONE, FAILED, EXPIRED)
_ORDER = {QUEUED: 0, RUNNING: 1, DONE: 2, FAILED: 2, EXPIRED: 3}
Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


class Watcher:
    """One stream of (id, status) events the loop has for it, not yet sent. ``key``: (model,
    job id), the job id None for a stream of every job of that model."""

    def __init__(self, key: tuple[str, str | None], limit: int, with_result: bool = False) -> None:
        self.key, self.limit, self.with_result = key, limit, with_result
        self.job_id = key[1]
        self.events: collections.deque[tuple[str, str]] = collections.deque()
        self.ready = asyncio.Event()
        self.overflow = asyncio.Event()
        self.sending = False  # inside a send() that waits for the client to read

    def put(self, event: tuple[str, str]) -> None:
        self.events.append(event)
        self.ready.set()
        if self.sending and len(self.events) > self.limit:
            self.overflow.set()

    async def get(self) -> tuple[str, str]:
        while not self.events:
            self.ready.clear()
            await self.ready.wait()
        return self.events.popleft()


async def ended(watcher: Watcher) -> None:
    """Returns once the watched job's stream brings a terminal status."""
    while (await watcher.get())[1] not in TERMINAL:
        pass


async def stream(watcher: Watcher, first: tuple[str, str] | None, receive: Receive, send: Send,
                 result_message: Callable[[str], Awaitable[dict[str, Any]]], dropped: Callable[[], None]) -> None:
    """Sends events until a terminal status (one job), the client leaves, or it falls `limit`
    events behind (then ``dropped()`` is called and it is closed with 1008).
    ``result_message(id)``: what a done event carries when the stream asked for results."""

    async def pump() -> str:
        last = -1
        event = first
        while True:
            if event is not None:
                job_id, status = event
                if watcher.job_id is None or _ORDER[status] > last:  # a job's stream never goes back
                    last = _ORDER[status]
                    message = {"id": job_id, "status": status}
                    if watcher.with_result and status == DONE:  # ?result=1: the result rides along
                        message.update(await result_message(job_id))
                    watcher.sending = True  # stays True only while the send waits on the client
                    try:
                        await send({"type": "websocket.send", "text": json.dumps(message)})
                    finally:
                        watcher.sending = False
                    if watcher.job_id is not None and status in TERMINAL:
                        return "done"
            event = await watcher.get()

    async def listen() -> str:
        while (await receive())["type"] != "websocket.disconnect":
            pass
        return "left"

    tasks = {asyncio.ensure_future(pump()), asyncio.ensure_future(listen()),
             asyncio.ensure_future(watcher.overflow.wait())}
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    outcomes = {task.result() for task in done if not task.cancelled() and task.exception() is None}
    if "left" in outcomes or not outcomes:  # gone, or a send failed: it is gone
        return
    if True in outcomes:  # the overflow event: the client fell behind
        dropped()
        code, reason = 1008, f"too slow: more than {watcher.limit} events behind"
    else:
        code, reason = 1000, "terminal status"
    try:  # a client that does not read may never let the close through: do not wait on it
        await asyncio.wait_for(send({"type": "websocket.close", "code": code, "reason": reason}), 1.0)
    except (asyncio.TimeoutError, OSError, RuntimeError):
        pass
