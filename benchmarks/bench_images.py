"""The ImageNet train pipeline on JPEG files: fastloop.Loader's C threads against torch's
DataLoader, Pillow in Python threads, SPDL and DALI's CPU pipeline, side by side in one run
(issue 13's targets). The measuring code is fastloop.bench.images (its docstring says what
each row does).

As a script: prints the table, the first-batch ratios against the decode floor, the RSS line.
    python benchmarks/bench_images.py [--quick] [--torch-python PY] [--peers-python PY]
Under pytest: a tiny set and two epochs fill the table (numbers go to BENCHMARKS.md; nothing
is asserted about speed).
"""

from __future__ import annotations

import sys
from typing import Any

from fastloop.bench import images


def test_quick_run_fills_the_table(tmp_path: Any, monkeypatch: Any) -> None:
    import pytest

    monkeypatch.setenv("FASTLOOP_CACHE", str(tmp_path / "cache"))  # TarShards' index cache
    pytest.importorskip("PIL")
    pytest.importorskip("torch")
    from fastloop.bench.image_data import dataset

    data = dataset(count=32, classes=3, shard_count=2, folder=str(tmp_path))
    rows = images.run(data, quick=True, torch_python=None, batch=16, crop=64, torch_workers=(0, 1))
    assert [r["kind"] for r in rows] == ["fastloop", "fastloop", "torch", "torch", "pillow", "spdl", "dali",
                                         "dali-fused", "fastloop"]
    measured = [r for r in rows if "skipped" not in r]  # SPDL and DALI only where they import
    assert all(r["samples_per_s"] > 0 and r["first_batch_s"] > r["build_s"] > 0 for r in measured)
    assert len(rows[-1]["rss_mib"]) == 2
    peers = len(rows) - len(measured) + sum(r["kind"] in images.PEERS for r in measured)
    table = images.table(rows, images.decode_floor(data.image_folder, 8))
    assert len(table) == len(measured) + 6 + peers


def test_the_bench_command_suite_measures_fastloop_pillow_and_torch(tmp_path: Any, monkeypatch: Any) -> None:
    import pytest

    monkeypatch.setenv("FASTLOOP_CACHE", str(tmp_path / "cache"))
    pytest.importorskip("PIL")
    has_torch = __import__("importlib").util.find_spec("torch") is not None
    monkeypatch.setattr(images, "SUITE_SIZES", {True: (48, 16), False: (48, 16)})
    rows = images.suite(quick=True, python=None)  # in this interpreter: no start-ups to wait for
    kinds = [r["kind"] for r in rows]
    assert kinds == ["fastloop", "fastloop"] + ["torch"] * 3 * has_torch + ["pillow"]
    assert all(r["samples_per_s"] > 0 for r in rows)
    assert len(images.table_rows(rows)) == len(rows) and images.summary(rows)


if __name__ == "__main__":
    sys.exit(images.main(sys.argv[1:]))
