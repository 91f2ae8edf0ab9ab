"""Runs fuzz_tar.check over every file in the directories given (`make fuzz-replay`): each
input must be indexed or refused with an error naming its byte offset, in a bounded number of
reads, and agree with Python's tarfile wherever the index accepts it. An input still running
after HANG_S seconds is a hang (a loop that reads nothing, as "0 x=y" made): it fails. Prints
the slowest input's time (a report, not a check).

    python3 tests/fuzz/replay_tar.py tests/fuzz/corpus/tar
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fuzz_tar import check  # noqa: E402

HANG_S = 10  # a hang guard, far above the milliseconds an input takes


def _hung(signum: int, frame: object) -> None:
    raise TimeoutError(f"still running after {HANG_S} s: a loop")


def main(dirs: list[str]) -> int:
    count, failures, slowest = 0, 0, (0.0, "")
    for folder in dirs:
        files = sorted(Path(folder).iterdir()) if Path(folder).is_dir() else []
        if not files:
            print(f"replay_tar: no inputs in {folder}", file=sys.stderr)
            return 1
        for path in files:
            start = time.monotonic()
            signal.signal(signal.SIGALRM, _hung)
            signal.alarm(HANG_S)
            try:
                check(path.read_bytes())
            except Exception as error:  # a broken check, a hang, or an error that is not a TarError
                failures += 1
                print(f"replay_tar: {path}: {error!r}", file=sys.stderr)
            finally:
                signal.alarm(0)
            slowest = max(slowest, (time.monotonic() - start, path.name))
            count += 1
    if failures:
        print(f"replay_tar: {failures} of {count} inputs failed", file=sys.stderr)
        return 1
    print(f"replay_tar: {count} inputs replayed, all checks hold (slowest {slowest[0] * 1000:.1f} ms: {slowest[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
