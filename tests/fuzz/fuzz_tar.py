"""A fuzz target for the tar header index (python/fastloop/data/_tar_index.py, what TarShards reads).

check(data) holds for every input or raises AssertionError:
- the index either lists members or raises TarError (a ValueError) whose message names the
  byte offset of the fault ("byte N");
- it reads at most one header per 512 bytes of the file (plus sparse extension blocks), so no
  input can loop: a read past that bound fails at once instead of hanging;
- when it lists members, Python's tarfile reads the same archive and lists the same regular
  files (data offset and size) in the same order: the index is never more lenient than tarfile
  (tarfile stops quietly at a bad header after the first; the index raises there).

Run it with atheris (a coverage-guided fuzzer for Python), where it is installed:

    pip install atheris && python3 tests/fuzz/fuzz_tar.py tests/fuzz/corpus/tar -max_total_time=600

replay_tar.py runs check() over the corpus (`make fuzz-replay`). The module is loaded from its
file, so neither needs fastloop built.
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("_tar_index", ROOT / "python" / "fastloop" / "data" / "_tar_index.py")
tar_index = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tar_index)  # type: ignore[union-attr]

REGULAR = {tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE}


class _CountingOs:
    """os for the index, counting its reads: more than the file has blocks is a loop."""

    def __init__(self, limit: int) -> None:
        self.reads, self.limit = 0, limit

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        self.reads += 1
        assert self.reads <= self.limit, f"more than {self.limit} reads: the index does not move forward"
        return os.pread(fd, n, offset)


def index(path: str) -> tuple[list[tuple[str, int, int]] | None, Exception | None]:
    """(members, None) or (None, the TarError), reading `path` with a bounded number of reads."""
    size = os.path.getsize(path)
    counting = _CountingOs(2 * (size // tar_index.BLOCK) + 4)  # a header, maybe its extended data
    saved, tar_index.os = tar_index.os, counting
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            return list(tar_index.members(fd, size)), None
        except tar_index.TarError as error:
            return None, error
        finally:
            os.close(fd)
    finally:
        tar_index.os = saved


def tarfile_members(data: bytes) -> list[tuple[int, int]] | None:
    """(data offset, size) of tarfile's regular members, or None when tarfile refuses the file
    (an archive of no member at all is [], though tarfile refuses to open it)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            return [(m.offset_data, m.size) for m in tar.getmembers() if m.type in REGULAR]
    except tarfile.ReadError as error:
        return [] if str(error) in ("empty file", "end of file header") else None
    except (tarfile.TarError, ValueError, EOFError, OverflowError):
        return None


def check(data: bytes) -> None:
    with tempfile.NamedTemporaryFile(suffix=".tar") as f:
        f.write(data)
        f.flush()
        found, error = index(f.name)
    if error is not None:
        assert isinstance(error, ValueError) and re.search(r"\bbyte \d+", str(error)), repr(error)
        return
    theirs = tarfile_members(data)
    assert theirs is not None, "the index read a file tarfile refuses"
    assert [(offset, size) for _, offset, size in found] == theirs, (found, theirs)


def main() -> None:
    import atheris

    atheris.Setup(sys.argv, check)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
