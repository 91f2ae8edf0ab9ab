"""fastloop.bench.timing's CPU accounting: a child's CPU time counts while it runs and after it
was waited for, once (no timing: the child spins until its own CPU clock has advanced)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fastloop.bench.timing import process_cpu_s, tree_cpu_s

SPIN_S = 0.3
CHILD = f"""
import sys, time
while time.process_time() < {SPIN_S}:
    pass
print("spun", flush=True)
sys.stdin.read()  # held alive until the parent closes stdin
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_childs_cpu_counts_while_alive_and_once_reaped():
    before = process_cpu_s()
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "spun\n"
        alive = process_cpu_s() - before
        assert tree_cpu_s([child.pid]) >= SPIN_S - 0.02  # clock ticks: 10 ms
        assert alive >= SPIN_S - 0.02
    finally:
        child.stdin.close()
        child.wait()
    reaped = process_cpu_s() - before
    assert SPIN_S - 0.02 <= reaped < alive + SPIN_S  # counted once, not twice
