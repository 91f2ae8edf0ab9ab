"""Shared fixtures: a watchdog so a hanging test fails instead of stalling CI."""

from __future__ import annotations

import faulthandler
import inspect
import os
import signal
import sys
import tempfile

import pytest


# pytest captures fd 2 during a test, so a dump written there dies with the process: the
# stacks go to this file instead, and the Makefile prints it when pytest fails.
HANG_LOG = os.environ.get("FASTLOOP_HANG_LOG", os.path.join(tempfile.gettempdir(), "fastloop-pytest-hang.log"))
TEST_TIMEOUT_S = float(os.environ.get("FASTLOOP_TEST_TIMEOUT", "120"))
_hang_log = None


def _open_hang_log():
    """Opens HANG_LOG once and makes SIGALRM dump every thread's stack there, then end the
    process. The dump runs in the signal handler, in C, so it works while a hung call holds
    the GIL; chain=True then re-raises SIGALRM with its default action, which terminates."""
    global _hang_log
    if _hang_log is None:
        os.makedirs(os.path.dirname(HANG_LOG) or ".", exist_ok=True)
        _hang_log = open(HANG_LOG, "w")
        faulthandler.register(signal.SIGALRM, file=_hang_log, all_threads=True, chain=True)
    return _hang_log


def pytest_unconfigure(config):
    if _hang_log is not None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.unregister(signal.SIGALRM)
        _hang_log.close()


@pytest.fixture(autouse=True)
def hang_watchdog(request):
    """Dumps every thread's stack to HANG_LOG and ends the process if one test runs over 120 s.

    A timer signal, not faulthandler.dump_traceback_later: that starts a thread for every test,
    and the last test's thread is still exiting when the next test forks. Under ASan (whose
    allocator, unlike glibc's malloc, takes no lock around fork in GCC 12's libasan) a forked
    worker could copy an allocator lock that exiting thread held and wait on it forever: two CI
    runs hung so in tests/test_loader.py, a worker stuck in malloc in PyOS_AfterFork_Child."""
    log = _open_hang_log()
    log.write(f"running {request.node.nodeid}\n")
    log.flush()
    signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT_S)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)


@pytest.fixture
def sigint_raises():
    """Ctrl-C raises KeyboardInterrupt in this test even where the runner was started with
    SIGINT ignored (a background job: `make stress &`, some CI shells), as Python then does
    not install its handler."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _expected_core():
    """Under `make pytest-asan` (and gpu_check.sh --wheel), proves the extension named by
    FASTLOOP_EXPECT_CORE (the sanitized one; the wheel's) is the one imported: its path, or
    None when the variable is unset."""
    import os

    expected = os.environ.get("FASTLOOP_EXPECT_CORE")
    if not expected:
        return None
    from fastloop import _core

    if os.path.realpath(_core.__file__) != os.path.realpath(expected):
        raise pytest.UsageError(f"fastloop._core came from {_core.__file__}, not {expected} (FASTLOOP_EXPECT_CORE)")
    return _core.__file__


def pytest_sessionstart(session):
    _expected_core()  # also under -q, which prints no header


def pytest_report_header(config):
    core = _expected_core()
    return None if core is None else f"fastloop._core: {core} (FASTLOOP_EXPECT_CORE)"


# Tests that cannot run as several copies at once in one process (`make test-threads`:
# pytest-run-parallel's --parallel-threads): they signal the main thread, count references
# or collect garbage process-wide, fork, or watch the whole process exit.
THREAD_UNSAFE_WORDS = ("ctrl_c", "sigint", "signal", "killed", "leak", "collected", "refcount", "fork",
                       "at_exit", "atexit", "exit", "interrupt", "subprocess", "frozen")


THREAD_UNSAFE_TESTS = {  # and these, whose names do not say so
    "test_concurrent_calls_are_serialized_and_correct": "seeds fastloop.nn's global generator for twin models",
    "test_backward_then_step_equals_train_step_and_set_grads": "seeds fastloop.nn's global generator for twin models",
    "test_a_loader_freed_by_the_code_its_own_worker_runs_ends_cleanly": "collects garbage process-wide",
    "test_mode_auto_picks_threads_for_python_code_only_where_threads_run_python_in_parallel":
        "monkeypatches the loader module",
    "test_stress_eight_threads_close_one_loader_while_two_iterate": "runs 10 threads of its own for many rounds",
}


# A test that forks worker processes (mode="processes") runs alone too: on a free-threaded
# interpreter, a fork while other threads wait on an object's lock can leave the child that
# lock locked for good (CPython hands a contended lock straight to a waiting thread, which the
# fork's stop-the-world has paused; the child has no such thread), and the worker hangs in its
# first Python code. Seen in make test-ft: a worker stuck in dict.get on sys.modules.
FORKS = 'mode="processes"'


def _forks_workers(item) -> bool:
    if "processes" in item.name:  # a parametrized mode
        return True
    try:
        return FORKS in inspect.getsource(item.function)
    except (OSError, TypeError):
        return False


def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin("run-parallel"):
        return
    for item in items:
        word = next((w for w in THREAD_UNSAFE_WORDS if w in item.name), None)
        reason = THREAD_UNSAFE_TESTS.get(item.originalname) or (word and f"its name says it uses process-wide state ({word})")
        if not reason and _forks_workers(item):
            reason = "forks worker processes while other threads run Python (see FORKS)"
        if reason:
            item.add_marker(pytest.mark.thread_unsafe(reason=reason))


# On a free-threaded interpreter (make test-ft) some test dependencies are not installed (Makefile,
# FT_DEPS). Their tests skip there through pytest.importorskip; this says why in the skip reason
# instead of a bare "could not import 'torch'".
ABSENT_ON_FT = {
    "torch": "PyPI's cp313t torch wheels are CUDA builds of several GB",
    "safetensors": "safetensors has no cp313t wheel",
    "tensorboard": "its grpcio has no cp313t wheel, only a C++ source build of half an hour",
}
FREE_THREADED = not getattr(sys, "_is_gil_enabled", lambda: True)()


def _say_why_module_is_absent(report) -> None:
    longrepr = report.longrepr
    if not (FREE_THREADED and report.skipped and isinstance(longrepr, tuple) and len(longrepr) == 3):
        return
    for module, why in ABSENT_ON_FT.items():
        if f"could not import '{module}" in str(longrepr[2]):
            report.longrepr = (longrepr[0], longrepr[1],
                               f"Skipped: {module} is not installed on the free-threaded interpreter ({why}); "
                               "its tests run on the GIL build (make test)")
            return


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _say_why_module_is_absent(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _say_why_module_is_absent(outcome.get_result())
