"""Waiting in tests on a real condition, never a fixed sleep: poll it until it holds or a
generous timeout passes (a loaded machine or a sanitizer build only makes it take longer).

    from waiting import wait_for, wait_until
    wait_for(lambda: service.stats()["done"] == 3)        # AssertionError when it never holds
    assert wait_until(lambda: not alive(pid)), "still alive"   # False when it never holds
"""

from __future__ import annotations

import os
import time
from typing import Callable

__all__ = ["wait_until", "wait_for", "alive"]

TIMEOUT_S = 30.0


def wait_until(condition: Callable[[], object], timeout: float = TIMEOUT_S, interval: float = 0.005) -> bool:
    """True as soon as condition() is true; False once `timeout` seconds passed without."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)  # paces the polling; the condition decides
    return True


def wait_for(condition: Callable[[], object], timeout: float = TIMEOUT_S, interval: float = 0.005) -> None:
    """Returns once condition() is true; AssertionError once `timeout` seconds passed without."""
    assert wait_until(condition, timeout, interval), f"condition not reached in {timeout:g} s"


def alive(pid: int) -> bool:
    """Whether process `pid` exists (a zombie counts until it is reaped): what a test of a
    worker's end waits on."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
