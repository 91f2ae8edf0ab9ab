"""A uvicorn server whose SIGTERM (what Docker and Kubernetes send) and SIGINT drain, then
exit 0: the front stops accepting jobs (503 with Retry-After; /healthz 503 "draining"), keeps
answering while the service runs what it accepted, and only then does uvicorn stop (closing
its connections once their requests are answered), so a predict or long poll in progress
gets its result.

uvicorn 0.55 re-raises the signal it caught once it has shut down (``capture_signals``), so
with plain uvicorn a SIGTERM ends the process (status 143) before any code after
``server.run()`` can close the service. Here the signal starts the drain and is not re-raised;
a second one stops at once (a second Ctrl-C also cancels the requests in progress, as in
uvicorn).

    >>> server = DrainingServer(config, front=app, busy=service.busy, drain_s=10)
    >>> try:
    ...     server.run()
    ... finally:
    ...     service.close(timeout=server.drain_left())
"""

from __future__ import annotations

import signal
import time
from types import FrameType
from typing import Any, Callable

import uvicorn

__all__ = ["DrainingServer"]

_MIN_GRACE_S = 0.5  # uvicorn's wait for requests in progress, even when the drain used its time


class DrainingServer(uvicorn.Server):
    """``front``: what stops accepting (its ``drain()``); ``busy()``: the jobs still to run
    (0: the drain is over); ``drain_s``: how long a drain may take, from the signal, before
    uvicorn stops anyway (what it leaves, InferenceService.close() fails)."""

    def __init__(self, config: Any, front: Any, busy: Callable[[], int], drain_s: float) -> None:
        super().__init__(config)
        self.front, self.busy, self.drain_s = front, busy, max(0.0, drain_s)
        self.drain_deadline: float | None = None
        self.drain_started: float | None = None  # time.monotonic() of the signal
        self.drained: float | None = None  # when uvicorn was told to stop (the jobs ran, or time was up)

    def stop(self) -> None:
        """Starts the drain (safe from a signal handler: it only sets flags)."""
        if self.drain_deadline is None:
            self.drain_started = time.monotonic()
            self.drain_deadline = self.drain_started + self.drain_s
            self.front.drain()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_deadline is None:
            self.stop()  # not appended to _captured_signals: uvicorn re-raises none at its end
            return
        self.should_exit = True  # a second signal: stop now
        if sig == signal.SIGINT:
            self.force_exit = True

    def drain_left(self) -> float:
        """Seconds left of the drain (all of drain_s when no signal came)."""
        if self.drain_deadline is None:
            return self.drain_s
        return max(0.0, self.drain_deadline - time.monotonic())

    async def on_tick(self, counter: int) -> bool:
        if self.drain_deadline is not None and not self.should_exit:
            left = self.drain_left()
            if left <= 0 or self.busy() == 0:
                self.config.timeout_graceful_shutdown = max(_MIN_GRACE_S, left)  # requests still being answered
                self.drained = time.monotonic()
                self.should_exit = True
        return await super().on_tick(counter)
