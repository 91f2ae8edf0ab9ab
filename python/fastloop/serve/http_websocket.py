"""The HTTP front's event streams: the service's status listener hands each event to the
loop (only when a stream watches it), WebSockets stream them (http_events.stream), and a
done job's ?result=1 message is read from the store once for every stream.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from .http_events import Watcher, stream
from .http_model import ModelFront, Reply
from .http_requests import _query_flag

__all__ = ["WS_FULL"]

_RESULT_READS_KEPT = 64  # done jobs whose ?result=1 event message is kept, read once for every stream
WS_FULL = 1013  # "try again later": the close code of a WebSocket refused over max_websockets


class _EventRoutes:
    """App's event streams (a part of App: see http.py, which holds the state they use:
    ``_watchers``, ``_loop``, ``_result_reads``, the counts)."""

    def _listener(self, model: str) -> Callable[[str, str], None]:
        """The service's listener for `model`, on the thread that changed a status: hands the
        event to the loop only when a stream watches it."""
        def on_status(job_id: str, status: str) -> None:
            watched = (model, job_id) in self._watchers or (model, None) in self._watchers
            if watched and self._loop is not None:
                try:
                    self._loop.call_soon_threadsafe(self._deliver, model, job_id, status)
                except RuntimeError:  # the loop is closed: the server stopped
                    pass
        return on_status

    def _deliver(self, model: str, job_id: str, status: str) -> None:
        for key in ((model, job_id), (model, None)):
            for watcher in list(self._watchers.get(key, ())):
                watcher.put((job_id, status))

    def watching(self, job_id: str | None, model: str | None = None) -> bool:
        """Whether a WebSocket or long poll waits on events of `job_id` (None: a stream of every
        job) of `model` (default: the first)."""
        return ((self.default.name if model is None else model), job_id) in self._watchers

    def _watch(self, watcher: Watcher) -> None:
        self._watchers.setdefault(watcher.key, set()).add(watcher)

    def _unwatch(self, watcher: Watcher) -> None:
        group = self._watchers.get(watcher.key)
        if group is not None:
            group.discard(watcher)
            if not group:
                del self._watchers[watcher.key]

    async def _ep_no_websocket(self, websocket: Any) -> None:
        await websocket.receive()  # websocket.connect
        await websocket.send({"type": "websocket.close", "code": 1008, "reason": "no such endpoint"})

    async def _ep_websocket(self, websocket: Any) -> None:
        job_id = websocket.path_params.get("job_id")  # None: .../events, every job
        receive, send = websocket.receive, websocket.send
        if (await receive())["type"] != "websocket.connect":
            return
        try:
            front = self._front(websocket.scope)
        except Reply as reply:
            await send({"type": "websocket.close", "code": 1008, "reason": reply.body["error"][:120]})
            return
        if self._ws_open >= self.max_websockets:  # accepted, then closed: a close code needs a handshake
            with self._counts_lock:
                self._ws_refused += 1
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": WS_FULL,
                        "reason": f"too many event streams open (max_websockets={self.max_websockets}): retry later"})
            return
        watcher = Watcher((front.name, job_id), self.ws_buffer, _query_flag(websocket.scope, "result"))
        self._ws_open += 1
        self._watch(watcher)  # before reading the status, so no change falls between
        try:
            first: tuple[str, str] | None = None
            if job_id is not None:
                try:
                    first = (job_id, (await self._call(front.record, job_id)).status)
                except Reply:
                    await send({"type": "websocket.close", "code": 1008, "reason": f"unknown job {job_id}"})
                    return
            await send({"type": "websocket.accept"})

            async def result_message(done_id: str) -> dict[str, Any]:
                return await self._result_message(front, done_id)

            def dropped() -> None:
                self._unwatch(watcher)
                with self._counts_lock:
                    self._ws_dropped += 1

            await stream(watcher, first, receive, send, result_message, dropped)
        finally:
            self._ws_open -= 1
            self._unwatch(watcher)

    async def _result_message(self, front: ModelFront, job_id: str) -> dict[str, Any]:
        """A done job's event message for ?result=1 streams: one store read however many
        streams send it (a done job's result does not change; the last few are kept, an
        error is not)."""
        key = (front.name, job_id)
        read = self._result_reads.get(key)
        if read is None:
            read = asyncio.ensure_future(self._read_result_message(front, job_id))
            self._result_reads[key] = read
            while len(self._result_reads) > _RESULT_READS_KEPT:
                del self._result_reads[next(iter(self._result_reads))]  # the oldest

            def forget_errors(done: "asyncio.Future[dict[str, Any]]") -> None:
                if (done.cancelled() or done.exception() is not None or "error" in done.result()) \
                        and self._result_reads.get(key) is done:
                    del self._result_reads[key]
            read.add_done_callback(forget_errors)
        return dict(await asyncio.shield(read))  # a stream that leaves does not cancel the others' read

    async def _read_result_message(self, front: ModelFront, job_id: str) -> dict[str, Any]:
        """A done job's dtype/shape/result for its event (as GET .../result answers them),
        or the error that kept the result out of it."""
        try:
            status, body, _ = await self._call(front.result, job_id)
        except Reply as reply:
            return {"error": reply.body.get("error", f"HTTP {reply.status}")}
        return {k: body[k] for k in ("dtype", "shape", "result") if k in body} if status == 200 \
            else {"error": body.get("error", f"HTTP {status}")}
