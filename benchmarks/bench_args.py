"""Argument-parsing overhead of the hot calls: the loader's next, Monitor.scalar and
Queue.put (what the serve queue's submit calls), counted in CPU instructions per call.

As a script: runs each call's loop under callgrind twice (N and 2N calls) and prints the
instructions per call, (Ir(2N) - Ir(N)) / N: the whole call from the Python loop, its
argument parsing included, with the loop's own bytecode the same before and after a change.
    python benchmarks/bench_args.py [--calls N]        (needs valgrind)
    python benchmarks/bench_args.py --loop scalar --calls N   (one loop, what callgrind runs)
Under pytest: each loop runs a few calls and does what it says (no valgrind, no counts).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

import fastloop


def ended_loader():
    """A loader whose epoch has ended: next() then parses and returns None at once."""
    loader = fastloop.Loader(np.zeros((4, 2), np.float32), batch_size=2, num_workers=1)
    for _ in loader:
        pass
    return loader


def loop_next(calls: int) -> None:
    loader = ended_loader()
    core, timeout = loader._core, loader.timeout
    for _ in range(calls):
        assert core.next(timeout) is None
    loader.close()


def loop_scalar(calls: int) -> None:
    # nothing sampled or flushed during the loop: the writer thread stays asleep, so the main
    # thread never meets it on the queue's lock (a meeting costs a varying number of spins)
    with fastloop.Monitor(sinks=[], interval_s=3600, flush_interval_s=3600, host=False, gpu=False,
                          queue_size=calls + 1) as mon:
        scalar = mon.scalar
        for step in range(calls):
            scalar("loss", 0.5, step)


def loop_put(calls: int) -> None:
    queue = fastloop.Queue(maxsize=calls + 1)
    item = b"job"
    for _ in range(calls):
        queue.put(item)
    assert queue.qsize() == calls


def loop_put_keywords(calls: int) -> None:
    queue = fastloop.Queue(maxsize=calls + 1)
    item = b"job"
    for _ in range(calls):
        queue.put(item, block=True, timeout=None)
    assert queue.qsize() == calls


LOOPS = {"next": loop_next, "scalar": loop_scalar, "put": loop_put, "put_keywords": loop_put_keywords}
CALLS = {"next": "loader._core.next(timeout)  (epoch ended)", "scalar": 'mon.scalar("loss", 0.5, step)',
         "put": "queue.put(item)", "put_keywords": "queue.put(item, block=True, timeout=None)"}


def test_each_loop_makes_its_calls():
    for loop in LOOPS.values():
        loop(3)


def instructions(loop: str, calls: int) -> int:
    """Instructions (Ir) of the main thread of this script running `loop` `calls` times: the
    monitor's and the loader's own threads are counted apart and left out, and a fixed hash
    seed makes the interpreter's work the same from run to run."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}",
                        sys.executable, __file__, "--loop", loop, "--calls", str(calls)], check=True,
                       capture_output=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        with open(out + "-01") as f:  # thread 1, the main thread
            return int(re.search(r"^(?:summary|totals): (\d+)", f.read(), re.M).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loop", choices=sorted(LOOPS))
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    if args.loop:
        LOOPS[args.loop](args.calls)
        return
    print(f"{'call':<45} {'instructions per call':>22}")
    for name in LOOPS:
        per_call = (instructions(name, 2 * args.calls) - instructions(name, args.calls)) / args.calls
        print(f"{CALLS[name]:<45} {per_call:>22.0f}")


if __name__ == "__main__":
    main()
