"""The test watchdog (tests/conftest.py): a hung test has its stacks written and its run ended,
and the watchdog runs no thread of its own, so a test that forks copies no lock it holds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))

HUNG_TEST = textwrap.dedent(
    """
    import os, threading

    BEFORE = set(os.listdir("/proc/self/task"))  # at collection, before the watchdog's fixture runs

    def test_hangs_forever():
        added = set(os.listdir("/proc/self/task")) - BEFORE  # started by the fixtures: the watchdog's own
        with open(os.environ["THREADS_FILE"], "w") as f:
            f.write(str(len(added)))
        threading.Event().wait()  # a hang, by definition
    """
)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_a_hung_test_gets_its_stacks_written_and_its_run_ended_by_a_watchdog_without_a_thread(tmp_path):
    (tmp_path / "test_hung.py").write_text(HUNG_TEST)
    env = dict(os.environ, FASTLOOP_TEST_TIMEOUT="1", FASTLOOP_HANG_LOG=str(tmp_path / "hang.log"),
               THREADS_FILE=str(tmp_path / "threads"),
               PYTHONPATH=os.pathsep.join([TESTS] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.pop("FASTLOOP_EXPECT_CORE", None)  # the child imports no fastloop
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                          "--rootdir", str(tmp_path), str(tmp_path / "test_hung.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == -signal.SIGALRM, run.stdout + run.stderr
    log = (tmp_path / "hang.log").read_text()
    assert "running test_hung.py::test_hangs_forever" in log
    assert "most recent call first" in log and "test_hangs_forever" in log, log
    # no thread of the watchdog's (counting only those started since collection: how many the
    # interpreter, BLAS or pytest's plugins run depends on the machine): a watchdog thread per
    # test, exiting as the next one forks, could hold an allocator lock the forked child then
    # waits on forever (ASan's allocator)
    assert (tmp_path / "threads").read_text() == "0"
