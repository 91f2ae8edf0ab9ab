"""Waiting in tests on a real condition, never a fixed sleep: poll it until it holds or a
generous timeout passes (a loaded machine or a sanitizer build only makes it take longer).

    from waiting import wait_for, wait_until
    wait_for(lambda: service.stats()["done"] == 3)        # AssertionError when it never holds
    assert wait_until(lambda: not alive(pid)), "still alive"   # False when it never holds
    stacks = read_until(proc.stdout, lambda out: b"most recent call first" in out)  # a child's output
"""

from __future__ import annotations

import os
import time
from typing import IO, Callable

__all__ = ["wait_until", "wait_for", "alive", "read_until"]

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


def read_until(pipe: IO[bytes], condition: Callable[[bytes], object], timeout: float = TIMEOUT_S) -> bytes:
    """What `pipe` gives until condition(all of it) holds, its writers close it, or `timeout`
    seconds pass: what a test waits on for a child's output (a stack dump it was asked for)."""
    fd, got, ended = pipe.fileno(), bytearray(), []
    blocking = os.get_blocking(fd)
    os.set_blocking(fd, False)

    def arrived() -> bool:
        try:
            while True:
                chunk = os.read(fd, 1 << 16)
                if not chunk:  # every writer closed it
                    ended.append(True)
                    break
                got.extend(chunk)
        except BlockingIOError:
            pass
        return bool(ended) or bool(condition(bytes(got)))

    try:
        wait_until(arrived, timeout)
    finally:
        os.set_blocking(fd, blocking)
    return bytes(got)
