"""Keeping a GPU fed (issue 23): ResNet-18 and ResNet-50 trained from torch's DataLoader, from
fastloop decoding on the CPU and from fastloop with nvJPEG, side by side in one run, against the
same model fed tensors already on the GPU; the loaders alone; Loader(device="cuda") against torch's
pinned .cuda(non_blocking=True). fastloop.bench.gpu_feed says what each row measures.

    python benchmarks/bench_gpu_feed.py [--quick] [--out FILE] [--data DIR] [--seconds S] ...
    python benchmarks/bench_gpu_feed.py --device cpu     # a smoke run of the same code, tiny, no GPU

Defaults: 3,072 JPEGs in a temporary folder, batch 128, crop 224, all cores as workers/threads,
6 s timed per training row and 4 s per loader row after 1.5 s of warm-up: about 2.5 minutes on an
H200 with 16 cores (--quick: about 1). A row that cannot run here (no nvJPEG, no torchvision)
says "not available: <why>" instead of a number; with --out, the markdown report is rewritten
after each section, so a run cut short keeps what it measured.

Under pytest: the smoke run on the CPU (torchvision's ResNet-18 where torchvision imports, else a
tiny CNN) and the --quick run where torch sees a GPU; each checks that every row has a number or
says why not, and that none failed. Nothing about speed is asserted (numbers go to BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from fastloop.bench.gpu_feed import LEGEND, MODELS, QUICK, SMOKE, Row, Settings, describe, run, table


def parse_args(argv: list[str]) -> tuple[Settings, str | None]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="512 images, 1 s a row (about a minute on an H200; the cpu smoke run is tiny anyway)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a tiny smoke run of the same code where no GPU exists (its numbers mean nothing)")
    parser.add_argument("--out", help="also write the report as markdown to this file")
    parser.add_argument("--data", help="keep the JPEGs under this folder and reuse them (default: a temporary one)")
    parser.add_argument("--images", type=int, help="JPEGs in the ImageFolder (default 3072)")
    parser.add_argument("--batch", type=int, help="batch size (default 128)")
    parser.add_argument("--crop", type=int, help="RandomResizedCrop size (default 224)")
    parser.add_argument("--workers", type=int, help="loader threads and DataLoader workers (default: all cores)")
    parser.add_argument("--seconds", type=float, help="timed seconds per training row (default 6)")
    parser.add_argument("--loader-seconds", type=float, help="timed seconds per loader and copy row (default 4)")
    parser.add_argument("--models", help=f"comma-separated, of {', '.join(MODELS)} (default resnet18,resnet50)")
    args = parser.parse_args(argv)
    values: dict[str, Any] = dict(SMOKE) if args.device == "cpu" else dict(QUICK) if args.quick else {}
    for name in ("images", "batch", "crop", "workers", "seconds", "loader_seconds"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, not {value}")
        if value is not None:
            values[name] = value
    if args.data is not None:
        values["data"] = args.data
    if args.models is not None:
        models = tuple(m.strip() for m in args.models.split(",") if m.strip())
        if not models or any(m not in MODELS for m in models):
            parser.error(f"--models takes {', '.join(MODELS)} (comma-separated), not {args.models!r}")
        values["models"] = models
    return Settings(**values), args.out


def main(argv: list[str]) -> int:
    settings, out = parse_args(argv)
    if settings.device == "cuda":
        try:
            import torch
        except ImportError:
            print("no GPU feed benchmark: torch is not installed")
            return 1
        if not torch.cuda.is_available():
            print(f"no GPU feed benchmark: torch {torch.__version__} sees no CUDA device (--device cpu runs the "
                  "smoke version)")
            return 1
    start = time.perf_counter()
    rows = run(settings, out)
    print("\n".join(describe(settings)))
    print(table(rows))
    print(LEGEND)
    print(f"({time.perf_counter() - start:.0f} s in all)")
    return 0


# ---- under pytest ----

def _check_filled(rows: list[Row], settings: Settings) -> None:
    sections = [f"train {MODELS[m]}" for m in settings.models for _ in range(4)] + ["loader alone"] * 3
    assert [r.section for r in rows[:-2]] == sections and rows[-1].section.startswith("copy uint8 batches")
    for row in rows:  # a number, or a note saying why not; none failed
        if row.images_per_s is None:
            assert row.note.startswith("not available: "), row
        else:
            assert row.images_per_s > 0 and row.cores is not None and row.first_batch_s, row
    assert table(rows, markdown=True).count("\n") == len(rows) + 1


def test_the_smoke_run_on_the_cpu_fills_every_row_or_says_why(tmp_path: Any) -> None:
    import pytest

    pytest.importorskip("torch")
    pytest.importorskip("PIL")
    torchvision = _imports("torchvision")
    report = tmp_path / "feed.md"
    settings, out = parse_args(["--device", "cpu", "--models", "resnet18" if torchvision else "tiny",
                                "--data", str(tmp_path / "data"), "--out", str(report)])
    rows = run(settings, out)
    _check_filled(rows, settings)
    runs_here = ("synthetic", "fastloop CPU decode", "Loader(") + (("torch DataLoader",) if torchvision else ())
    for row in rows:  # nvJPEG: decode="gpu" needs a device
        assert bool(row.images_per_s) == row.feed.startswith(runs_here), row
    assert report.read_text().count("\n| ") == len(rows) + 1


def test_quick_run_on_a_gpu_fills_every_row_or_says_why(tmp_path: Any) -> None:
    import pytest

    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} sees no CUDA device")
    settings, _ = parse_args(["--quick", "--data", str(tmp_path)])
    rows = run(settings)
    _check_filled(rows, settings)
    assert all(r.images_per_s for r in rows if "nvJPEG" not in r.feed), table(rows)


def test_without_a_gpu_the_gpu_loaders_stop_only_at_the_missing_device(tmp_path: Any) -> None:
    """The GPU rows' Loader arguments pass every check that runs before CUDA is needed."""
    import pytest

    torch = pytest.importorskip("torch")
    pytest.importorskip("PIL")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the quick run covers these loaders")
    from fastloop.bench.feeds import Batches, Feed, NotAvailable, Target, fastloop_images
    from fastloop.bench.image_data import dataset

    root = dataset(8, classes=2, shard_count=1, folder=str(tmp_path)).image_folder
    cuda = Target("cuda")
    with pytest.raises(NotAvailable, match="^CudaUnavailable: .*CUDA"):
        Feed(fastloop_images(root, Batches(4, 32, 1), cuda, "cpu"), cuda)


def test_bad_arguments_are_refused_naming_the_option(capsys: Any) -> None:
    import pytest

    for bad, named in ((["--batch", "0"], "--batch"), (["--seconds", "-1"], "--seconds"),
                       (["--models", "resnet18,vgg"], "--models"), (["--models", ","], "--models"),
                       (["--device", "tpu"], "--device")):
        with pytest.raises(SystemExit):
            parse_args(bad)
        assert named in capsys.readouterr().err
    settings, out = parse_args(["--quick", "--workers", "3", "--models", "resnet50", "--out", "t.md"])
    assert (settings.images, settings.workers, settings.models, out) == (512, 3, ("resnet50",), "t.md")
    assert parse_args(["--device", "cpu"])[0].batch == 4 and parse_args([])[0].batch == 128


def _imports(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
