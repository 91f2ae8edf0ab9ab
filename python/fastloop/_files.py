"""Writing a file so that no reader ever sees it torn: a temporary file, fsync, rename.

The Python side's one home for it (the C core's is fl_file.c, which _core does not expose).

    >>> write_atomically("jobs/a/record.json", lambda f: f.write(data), temp_dir="jobs")
    >>> sync_dir("jobs/a")  # the rename survives a power loss too
"""

from __future__ import annotations

import os
import uuid
from typing import IO, Any, Callable

TEMP_PREFIX = ".tmp-"  # a leftover of a crash starts with this


def write_atomically(path: str, write: Callable[[IO[bytes]], Any], *, durable: bool = True,
                     temp_dir: str | None = None) -> None:
    """Writes `path` with `write(file)` into a temporary file in `temp_dir` (default: beside
    `path`; it must be on the same file system), fsynced when `durable`, then renamed over
    `path`. Raises what `write` or the file system raises (OSError: disk full, permissions),
    after removing the temporary file; `path` is then as it was."""
    temp = os.path.join(temp_dir or os.path.dirname(path) or ".", f"{TEMP_PREFIX}{uuid.uuid4().hex}")
    try:
        with open(temp, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise


def sync_dir(path: str) -> None:
    """fsync the folder `path`, so that the files created or renamed in it survive a power
    loss. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
