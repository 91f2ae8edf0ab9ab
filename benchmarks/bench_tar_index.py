"""Indexing tar shards (python/fastloop/data/_tar_index.py, what TarShards reads first), with
and without a large global pax header: a header of many keys must cost its parse once, not
once per later member.

As a script: builds each tar in a temporary folder and prints the best of a few index times.
    python benchmarks/bench_tar_index.py [--repeat N]
Under pytest: each row is built small, indexed once, and lists the members it should.
"""

from __future__ import annotations

import argparse
import io
import os
import tarfile
import tempfile
import time

from fastloop.data import _tar_index

MAX_EXTENDED = _tar_index.MAX_EXTENDED


def global_keys(count: int) -> dict[str, str]:
    """`count` pax keys of no meaning to a reader ("1f=1"): what a hostile shard carries."""
    return {f"{i:x}": "1" for i in range(count)}


def build(path: str, keys: int, entries: int, kind: str) -> int:
    """A pax tar: one global header of `keys` keys, then `entries` members (directories or empty
    files: a header each, no data). Returns the size of its global header's data."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers=global_keys(keys)) as tar:
        for i in range(entries):
            info = tarfile.TarInfo(f"d{i}" if kind == "dir" else f"f{i}.bin")
            info.type = tarfile.DIRTYPE if kind == "dir" else tarfile.REGTYPE
            tar.addfile(info)
    data = out.getvalue()
    with open(path, "wb") as f:
        f.write(data)
    return _tar_index._number(data[124:136], "size", 0) if keys else 0


def index_s(path: str, repeat: int) -> tuple[float, int]:
    """Best time of `repeat` full indexes, and how many regular members the index lists."""
    best, listed = float("inf"), 0
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(repeat):
            start = time.perf_counter()
            listed = sum(1 for _ in _tar_index.members(fd, size))
            best = min(best, time.perf_counter() - start)
    finally:
        os.close(fd)
    return best, listed


# (row, global keys, entries, kind of entry): the two hostile shards and a plain one
ROWS = [
    ("80k-key global header, 2,000 directories", 80_000, 2_000, "dir"),
    ("107k-key (1 MiB) global header, 2,000 files", 107_000, 2_000, "file"),
    ("no global header, 10,000 files", 0, 10_000, "file"),
]


def run(scale: float, repeat: int) -> list[tuple[str, int, float, int]]:
    """(row, file bytes, best seconds, members listed) per row, sizes scaled by `scale`."""
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for name, keys, entries, kind in ROWS:
            path = os.path.join(folder, "shard.tar")
            header = build(path, int(keys * scale), max(1, int(entries * scale)), kind)
            assert header <= MAX_EXTENDED, f"{name}: a {header}-byte global header is over the reader's cap"
            seconds, listed = index_s(path, repeat)
            results.append((name, os.path.getsize(path), seconds, listed))
    return results


def test_each_row_is_indexed():
    for (name, _, entries, kind), (_, size, seconds, listed) in zip(ROWS, run(0.01, 1)):
        assert seconds > 0 and size > 0
        assert listed == (0 if kind == "dir" else max(1, int(entries * 0.01))), name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="index each tar this many times, keep the best")
    args = parser.parse_args()
    print(f"{'tar':<48} {'MB':>6} {'index s':>9} {'members':>8}")
    for name, size, seconds, listed in run(1.0, args.repeat):
        print(f"{name:<48} {size / 1e6:>6.2f} {seconds:>9.3f} {listed:>8}")


if __name__ == "__main__":
    main()
