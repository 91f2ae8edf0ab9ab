"""Keeping a GPU fed (issue 23): ResNet-18 and ResNet-50 trained from torch's DataLoader, from
fastloop decoding on the CPU and from fastloop with nvJPEG, side by side in one run, against the
same model fed tensors already on the GPU; the loaders alone; Loader(device="cuda") against torch's
pinned .cuda(non_blocking=True). fastloop.bench.gpu_feed says what each row measures.

    python benchmarks/bench_gpu_feed.py [--quick] [--out FILE] [--data DIR] [--seconds S] ...
    python benchmarks/bench_gpu_feed.py --device cpu     # a smoke run of the same code, tiny, no GPU
    python benchmarks/bench_gpu_feed.py --dry-run --out F  # made-up rows through the report code

Defaults: 3,072 JPEGs in a temporary folder, batch 128, crop 224, all cores as workers/threads,
6 s timed per training row and 4 s per loader row after 1.5 s of warm-up: about 2.5 minutes on an
H200 with 16 cores (--quick: about 1). A row that cannot run here (no nvJPEG, no torchvision)
says "not available: <why>" instead of a number; with --out, the markdown report is rewritten
after each section, so a run cut short keeps what it measured. Each fastloop row says which
decoder ran ("decoded by": decoder_counts below reads the loader's counters).

Under pytest: the smoke run on the CPU (torchvision's ResNet-18 where torchvision imports, else a
tiny CNN) and the --quick run where torch sees a GPU; each checks that every row has a number or
says why not, and that none failed. Nothing about speed is asserted (numbers go to BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace
from typing import Any

from fastloop.bench.gpu_feed import (LEGEND, MODELS, QUICK, SMOKE, Row, Settings, add_shares, describe, loader_feeds,
                                     run, table, write_markdown)

# The decode counters a fastloop Loader may hold, read defensively: absent ones print "n/a".
# Looked for, the first found wins: the Loader's public `decode_counts` (a dict, or a method
# returning one), else its nvJPEG decoder `loader._jpeg`: its `decode_stats` (GpuJpeg's: the full
# set), `counts` or `decoded` dict and its
# `regions` (or `decoder.regions`). Keys, each under any of these names:
ENGINE_KEYS = ("hardware", "engine")  # images nvJPEG's hardware engine decoded
FALLBACK_KEYS = ("fallback", "cuda", "hybrid")  # images nvJPEG's CUDA (hybrid) backend decoded
CPU_KEYS = ("cpu",)  # images the CPU decoded (the workers, or the refused ones)
REGIONS_KEYS = ("regions", "regions_used")  # the engine decoded only each image's crop (bool or a count)


def decoder_counts(loader: Any) -> str:
    """'engine E / fallback F / CPU C, regions R' from the loader's counters; "n/a" for each
    one it lacks, and "n/a (why)" where it has none (decode="cpu", another fastloop)."""
    try:
        counts = _read_counts(loader)
    except Exception as error:  # a counter that raises must not fail the row
        return f"n/a ({type(error).__name__}: {error})"
    if counts is None:
        return "n/a (no nvJPEG decoder)"

    def pick(keys: tuple[str, ...]) -> str:
        value = next((counts[k] for k in keys if k in counts and counts[k] is not None), None)
        if value is None:
            return "n/a"
        if isinstance(value, bool):
            return "yes" if value else "no"
        return f"{value:,}" if isinstance(value, int) else str(value)

    return (f"engine {pick(ENGINE_KEYS)} / fallback {pick(FALLBACK_KEYS)} / CPU {pick(CPU_KEYS)}, "
            f"regions {pick(REGIONS_KEYS)}")


def _read_counts(loader: Any) -> dict | None:
    public = getattr(loader, "decode_counts", None)
    if public is not None:
        found = public() if callable(public) else public
        return dict(found) if found is not None else None
    jpeg = getattr(loader, "_jpeg", None)
    if jpeg is None:
        return None
    names = ("decode_stats", "counts", "decoded")
    found = next((getattr(jpeg, name) for name in names if getattr(jpeg, name, None) is not None), {})
    counts = dict(found() if callable(found) else found)
    if not any(k in counts for k in REGIONS_KEYS):
        for holder in (jpeg, getattr(jpeg, "decoder", None)):
            regions = getattr(holder, "regions", None) if holder is not None else None
            if regions is not None:
                counts["regions"] = regions
                break
    return counts


def parse_args(argv: list[str]) -> tuple[Settings, str | None]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="512 images, 1 s a row (about a minute on an H200; the cpu smoke run is tiny anyway)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a tiny smoke run of the same code where no GPU exists (its numbers mean nothing)")
    parser.add_argument("--out", help="also write the report as markdown to this file")
    parser.add_argument("--dry-run", action="store_true",
                        help="no loader runs: made-up rows through the report code (gpu_check.sh --dry-run)")
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
    values["decoder_counts"] = decoder_counts
    if args.dry_run:
        values["device"] = "dry run"
    return Settings(**values), args.out


def dry_run_rows(settings: Settings) -> list[Row]:
    """Every row run() makes, in its order, with made-up numbers (labelled so) and the decoded-by
    column read by decoder_counts from stand-in loaders: the report's code without a loader."""
    feeds = [name for name, _ in loader_feeds(settings, "", None)]  # type: ignore[arg-type]
    stand_ins = {  # what the loaders' counters might say: the engine, a CPU decode, none at all
        "nvJPEG": SimpleNamespace(_jpeg=SimpleNamespace(decoded={"hardware": 3968, "cuda": 24, "cpu": 8},
                                                        decoder=SimpleNamespace(regions=True))),
        "CPU decode": SimpleNamespace(_jpeg=None)}
    rows = []
    sections = [(f"train {MODELS[m]}", ["synthetic (tensors already on the device: the limit)", *feeds])
                for m in settings.models]
    sections += [("loader alone", feeds), (f"copy uint8 batches {settings.batch}x{settings.crop}x{settings.crop}x3",
                                           ["Loader(pin_memory=True) + torch .cuda(non_blocking=True)",
                                            "Loader(device='cuda')"])]
    for section, names in sections:
        for i, feed in enumerate(names):
            loader = next((s for key, s in stand_ins.items() if key in feed), None)
            rows.append(Row(section, feed, images_per_s=1000.0 + 100 * i, cores=1.0, first_batch_s=0.5,
                            decoded_by=decoder_counts(loader) if loader is not None else "",
                            note="dry run: made up"))
    return add_shares(rows)


def main(argv: list[str]) -> int:
    settings, out = parse_args(argv)
    if settings.device == "dry run":
        rows = dry_run_rows(settings)
        if out:
            write_markdown(out, rows, settings)
        print(table(rows))
        return 0
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


def test_decoder_counts_reads_what_the_loader_has_and_says_n_a_for_the_rest():
    engine = SimpleNamespace(decoded={"hardware": 4096, "cuda": 3, "cpu": 1}, decoder=SimpleNamespace(regions=False))
    assert decoder_counts(SimpleNamespace(_jpeg=engine)) == "engine 4,096 / fallback 3 / CPU 1, regions no"
    # other names for the same counters, on the loader itself (a method) or on its decoder
    public = SimpleNamespace(decode_counts=lambda: {"engine": 7, "fallback": 2, "cpu": 0, "regions_used": 5})
    assert decoder_counts(public) == "engine 7 / fallback 2 / CPU 0, regions 5"
    counts = SimpleNamespace(_jpeg=SimpleNamespace(counts={"hardware": 1, "hybrid": 2}, regions=True))
    assert decoder_counts(counts) == "engine 1 / fallback 2 / CPU n/a, regions yes"
    assert decoder_counts(SimpleNamespace(_jpeg=SimpleNamespace(decoded={}))) == (
        "engine n/a / fallback n/a / CPU n/a, regions n/a")
    assert decoder_counts(SimpleNamespace(_jpeg=None)) == "n/a (no nvJPEG decoder)"
    assert decoder_counts(object()) == "n/a (no nvJPEG decoder)"

    class Broken:
        @property
        def decode_counts(self) -> dict:
            raise RuntimeError("closed")

    assert decoder_counts(Broken()) == "n/a (RuntimeError: closed)"


def test_the_dry_run_fills_every_row_through_the_report_code(tmp_path: Any, capsys: Any) -> None:
    report = tmp_path / "feed.md"
    assert main(["--quick", "--dry-run", "--out", str(report)]) == 0
    settings, _ = parse_args(["--quick", "--dry-run"])
    rows = dry_run_rows(settings)
    _check_filled(rows, settings)
    decoded = {r.feed.split(",")[0]: r.decoded_by for r in rows}
    assert decoded["fastloop nvJPEG (decode='gpu')"].startswith("engine 3,968 / fallback 24 / CPU 8")
    assert decoded["fastloop CPU decode"] == "n/a (no nvJPEG decoder)"
    text = report.read_text()
    assert text.count("\n| ") == len(rows) + 1 and "| decoded by " in text and "device dry run" in text
    assert "dry run: made up" in capsys.readouterr().out


def _imports(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
