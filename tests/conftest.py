"""Shared fixtures: a watchdog so a hanging test fails instead of stalling CI."""

from __future__ import annotations

import faulthandler
import sys

import pytest


@pytest.fixture(autouse=True)
def hang_watchdog():
    """Dumps every thread's stack and exits if one test runs over 120 s."""
    faulthandler.dump_traceback_later(120, exit=True, file=sys.stderr)
    yield
    faulthandler.cancel_dump_traceback_later()
