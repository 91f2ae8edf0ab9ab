"""Shared fixtures: a watchdog so a hanging test fails instead of stalling CI."""

from __future__ import annotations

import faulthandler
import signal
import sys

import pytest


@pytest.fixture(autouse=True)
def hang_watchdog():
    """Dumps every thread's stack and exits if one test runs over 120 s."""
    faulthandler.dump_traceback_later(120, exit=True, file=sys.stderr)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture
def sigint_raises():
    """Ctrl-C raises KeyboardInterrupt in this test even where the runner was started with
    SIGINT ignored (a background job: `make stress &`, some CI shells), as Python then does
    not install its handler."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def pytest_report_header(config):
    """Under `make pytest-asan`, proves the sanitized extension is the one imported."""
    import os

    expected = os.environ.get("FASTLOOP_EXPECT_CORE")
    if not expected:
        return None
    from fastloop import _core

    if os.path.realpath(_core.__file__) != os.path.realpath(expected):
        raise pytest.UsageError(f"fastloop._core came from {_core.__file__}, not the sanitized {expected}")
    return f"fastloop._core: {_core.__file__} (ASan+UBSan)"
