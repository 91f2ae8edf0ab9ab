"""Several server processes on one port: a pre-forking supervisor (gunicorn's model).

The parent binds the port, then forks ``n`` children; each builds its own
service and serves the port with uvicorn (a listening socket of its own where SO_REUSEPORT
exists, else the inherited one), so the kernel spreads connections over
them. The parent only supervises: a child that dies (a crash, kill -9) is replaced, unless
children keep dying (5 within 10 s: the parent stops them all and exits 1). SIGTERM or
SIGINT to the parent stops every child gracefully (each drains as one server does) and the
parent returns when they are gone. A child whose parent dies gets SIGTERM (Linux
PR_SET_PDEATHSIG), so no orphan keeps the port. ``kill -USR1 <pid>`` makes a server process
print every thread's stack to stderr.

    >>> run_processes(4, listen("0.0.0.0", 8000), serve_one)   # serve_one(sock, index) -> exit code
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import faulthandler
import os
import signal
import socket
import sys
import threading
import time
from typing import Callable

__all__ = ["run_processes", "listen", "listen_unix", "when_stopped", "note_stops"]

_CRASH_WINDOW_S, _CRASH_LIMIT = 10.0, 5
_REUSE_PORT = sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")  # elsewhere it does not spread connections


def listen(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """The TCP socket on (host, port) that forked children serve. Where the system has
    SO_REUSEPORT (Linux) it is bound but not listening: it holds the port, and each child
    listens on a socket of its own at the same address (own_listener), among which the
    kernel spreads connections evenly; children accepting from one shared socket split them
    by who woke first (43 to 21 of 64 connections in one run). Elsewhere it is that shared
    listening socket."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if _REUSE_PORT:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise OSError(error.errno, f"cannot listen on {host}:{port}: {error.strerror}") from None
    if not _REUSE_PORT:
        sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def own_listener(sock: socket.socket, backlog: int = 2048) -> socket.socket:
    """A child's listening socket: one of its own at `sock`'s address when `sock` (from
    listen()) only holds the port, else `sock` itself."""
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        return sock
    own = socket.socket(sock.family, socket.SOCK_STREAM)
    own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    own.bind(sock.getsockname()[:2])
    own.listen(backlog)
    sock.close()
    return own


def listen_unix(path: str, backlog: int = 2048) -> socket.socket:
    """A listening unix socket at `path` (a stale one, left by a killed process, is replaced)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as error:
        sock.close()
        raise OSError(error.errno, f"cannot listen on {path}: {error.strerror}") from None
    sock.listen(backlog)
    return sock


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: an orphan serves until stopped
        pass


_stop_requested = False
_on_stop: list[Callable[[], None]] = []


def _note_stop(signum: int, frame: object) -> None:
    global _stop_requested
    _stop_requested = True
    for fn in _on_stop:
        fn()


def when_stopped(fn: Callable[[], None]) -> None:
    """Calls fn (from a signal handler: it must only set a flag) once this server process is
    asked to stop, at once if it already was: by SIGTERM or SIGINT in a process forked by
    run_processes, by SIGTERM after note_stops(). Once uvicorn serves, its own handlers
    take the signals (and restore these when it ends)."""
    _on_stop.append(fn)
    if _stop_requested:
        fn()


def note_stops() -> None:
    """Remembers a SIGTERM (for when_stopped) instead of dying of it: a single server process
    calls it before loading its model, as run_processes' children do once forked."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _note_stop)


def _spawn(sock: socket.socket, serve_one: Callable[[socket.socket, int], int], index: int, mask: set[int]) -> int:
    """Forks a server process; called with SIGTERM and SIGINT blocked, so that a stop cannot
    reach the child while it still has the parent's handlers (`mask`: the mask to restore)."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        # A stop may come while the child starts (loading the model): it is remembered and
        # handed to the server once there is one (when_stopped). An exception raised from
        # the handler instead could land in a __del__ and be lost.
        signal.signal(signal.SIGTERM, _note_stop)
        signal.signal(signal.SIGINT, _note_stop)
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1 PID: every thread's stack
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a stop that came meanwhile arrives now
        _die_with_parent()
        if os.getppid() != parent:  # the parent died before prctl
            os._exit(1)
        code = serve_one(own_listener(sock), index)
    except BaseException as error:  # the child never returns into the parent's code
        print(f"fastloop serve: process {os.getpid()} failed: {type(error).__name__}: {error}", file=sys.stderr)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return 0  # not reached


def _reap_until(children: set[int], deadline: float) -> list[int]:
    """Waits for the stopping children until `deadline`, then kills those left; returns them."""
    while children and time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return []
        if pid:
            children.discard(pid)
        else:
            time.sleep(0.05)  # polls the children's exit; signals from the terminal interrupt it
    left = sorted(children)
    for pid in left:
        print(f"fastloop serve: server process {pid} did not stop within the grace period; killing it",
              file=sys.stderr)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    children.clear()
    return left


def run_processes(n: int, sock: socket.socket, serve_one: Callable[[socket.socket, int], int],
                  grace_s: float = 30.0) -> int:
    """Forks n children serving `sock` (``serve_one(sock, index)``, index 0..n-1: a child
    that replaces a dead one gets its index) and supervises them until SIGTERM/SIGINT; returns 0,
    or 1 when children kept dying or one was still running `grace_s` after the stop (it is
    then killed: nothing hangs at exit). Call it before the process starts threads."""
    if n < 1:
        raise ValueError(f"processes must be >= 1, not {n}")
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    children: dict[int, int] = {}  # pid -> index
    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    crashes: collections.deque[float] = collections.deque()
    failed = False
    try:
        def spawn(index: int) -> None:
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
            try:
                children[_spawn(sock, serve_one, index, mask)] = index
            finally:  # the new child is in `children` before stop() can run
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)

        for index in range(n):
            spawn(index)
        while children:
            if stopping:
                stop(signal.SIGTERM, None)  # again: reaches any child started since (a second SIGTERM is harmless)
                killed = _reap_until(set(children), time.monotonic() + grace_s)
                failed = failed or bool(killed)
                break
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            index = children.pop(pid, None)
            if stopping or failed or index is None:
                continue
            how = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                   else f"exit code {os.WEXITSTATUS(status)}")
            now = time.monotonic()
            crashes.append(now)
            while crashes and crashes[0] < now - _CRASH_WINDOW_S:
                crashes.popleft()
            if len(crashes) >= _CRASH_LIMIT:
                print(f"fastloop serve: {len(crashes)} server processes died within {_CRASH_WINDOW_S:g} s "
                      f"(the last: pid {pid}, {how}); stopping", file=sys.stderr)
                failed = True
                stop(signal.SIGTERM, None)
                continue
            print(f"fastloop serve: server process {pid} died ({how}); starting another", file=sys.stderr)
            spawn(index)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        sock.close()
    return 1 if failed else 0
