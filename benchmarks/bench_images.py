"""The ImageNet train pipeline on JPEG files: fastloop.Loader's C threads against torch's
DataLoader and Pillow in Python threads, side by side in one run (issue 13's targets).

Data (fastloop.bench.image_data, written once and cached): >= 5,000 JPEGs, quality 90,
sizes spread around 500x375, smooth shading + sharp-edged shapes + noise; in ImageFolder
layout and as tar shards of the same bytes. Pipeline: RandomResizedCrop(224) + horizontal
flip + normalize, float32 CHW, batch 128, shuffled.

Rows, each in a fresh interpreter:
* fastloop threads, 2 workers, over fastloop.ImageFolder and fastloop.TarShards (fused
  decode -> crop -> resize -> flip -> normalize in C);
* torch DataLoader, num_workers 0, 1, 2, over torchvision's ImageFolder with its
  transforms (Pillow decoding) where torchvision imports in --torch-python, else a Pillow
  reimplementation of the same per-image work;
* Pillow decoding + the same per-image work in 2 Python threads (a ThreadPoolExecutor).
Per row: the time to build the loader (dataset scan or shard index included) and to hold
batch 0 (worker start included; imports are not timed), and samples/s over 16 batches of the
second epoch (workers running); rows run interleaved for `--rounds` rounds, each keeping its
best. Then fastloop's ImageFolder row runs 1 + 10 whole epochs with the RSS of the process
tree read after each (it must stay flat).

    $ python benchmarks/bench_images.py [--quick] [--torch-python /path/to/python-with-torchvision]
Under pytest: a tiny set and two epochs fill the table (numbers go to BENCHMARKS.md; nothing
is asserted about speed).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from typing import Any, Callable, Iterable

import numpy as np

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


# ---- measuring one configuration (in its own interpreter; torch rows may run without fastloop) ----

def tree_rss_mib(pid: int | None = None) -> float:
    """Resident memory of a process and all its descendants, in MiB (Linux /proc)."""
    pid = pid or os.getpid()
    total = 0.0
    try:
        with open(f"/proc/{pid}/status") as f:
            total = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                total += sum(tree_rss_mib(int(child)) for child in f.read().split())
    except (OSError, StopIteration):  # the process ended meanwhile
        pass
    return total


def measure(make_loader: Callable[[], Iterable], epochs: int, limit: int | None) -> dict:
    """Builds the loader (dataset included) and iterates `epochs` epochs (at most `limit`
    batches each); samples/s over epochs 1.., RSS after each of them."""
    start = time.perf_counter()
    loader = make_loader()
    built = time.perf_counter() - start
    it = iter(loader)
    next(it)
    first = time.perf_counter() - start
    for i, _ in enumerate(it, 2):  # the rest of epoch 0 (at most `limit` batches)
        if limit is not None and i >= limit:
            break
    seen, rss = 0, []
    start = time.perf_counter()
    for _ in range(1, epochs):
        for i, (_, y) in enumerate(loader):
            seen += len(y)
            if limit is not None and i + 1 >= limit:
                break
        rss.append(tree_rss_mib())
    elapsed = time.perf_counter() - start
    return {"build_s": built, "first_batch_s": first, "samples_per_s": seen / elapsed, "rss_mib": rss}


def fastloop_loader(config: dict) -> Callable[[], Any]:
    import fastloop
    from fastloop import ops

    def make() -> Any:
        source = (fastloop.ImageFolder(config["folder"]) if config["source"] == "ImageFolder"
                  else fastloop.TarShards(config["shards"]))
        pipeline = ops.Pipeline([ops.RandomResizedCrop(config["crop"]), ops.RandomHFlip(),
                                 ops.Normalize(MEAN, STD, layout="HWC->CHW")])
        return fastloop.Loader(source, batch_size=config["batch"], shuffle=True, seed=0, workers=config["workers"],
                               transform=pipeline)

    return make


def crop_params(height: int, width: int, rng: random.Random) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params (scale (0.08, 1), ratio (3/4, 4/3)):
    ten tries, then the centre-crop fallback."""
    area = height * width
    log_ratio = (np.log(3 / 4), np.log(4 / 3))
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = float(np.exp(rng.uniform(*log_ratio)))
        w, h = int(round(np.sqrt(target * aspect))), int(round(np.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    ratio = width / height
    if ratio < 3 / 4:
        w, h = width, int(round(width / (3 / 4)))
    elif ratio > 4 / 3:
        h, w = height, int(round(height * 4 / 3))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def pillow_sample(path: str, crop: int, rng: random.Random) -> np.ndarray:
    """What torchvision's ImageFolder + RandomResizedCrop + RandomHorizontalFlip + ToTensor +
    Normalize do per image, with Pillow and NumPy: float32 CHW."""
    from PIL import Image

    with open(path, "rb") as f:
        image = Image.open(f).convert("RGB")
    top, left, h, w = crop_params(image.height, image.width, rng)
    image = image.resize((crop, crop), Image.BILINEAR, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        image = image.transpose(Image.FLIP_LEFT_RIGHT)
    x = np.asarray(image, np.float32) / 255
    return ((x - np.float32(MEAN)) / np.float32(STD)).transpose(2, 0, 1)


def image_files(root: str) -> list[tuple[str, int]]:
    """ImageFolder's (path, label) list, torchvision's order."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    return [(os.path.join(d, f), label) for label, name in enumerate(classes)
            for d, _, files in sorted(os.walk(os.path.join(root, name))) for f in sorted(files)]


def torch_loader(config: dict) -> Callable[[], Any]:
    import torch

    try:  # imported before the clock starts, as fastloop is
        from torchvision import datasets, transforms
    except ImportError:
        datasets = None

    def make() -> Any:
        if datasets is not None:
            tf = transforms.Compose([transforms.RandomResizedCrop(config["crop"]), transforms.RandomHorizontalFlip(),
                                     transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
            dataset: Any = datasets.ImageFolder(config["folder"], transform=tf)
        else:
            dataset = PillowImageFolder(config["folder"], config["crop"])
        return torch.utils.data.DataLoader(dataset, batch_size=config["batch"], shuffle=True,
                                           num_workers=config["workers"], persistent_workers=config["workers"] > 0)

    return make


class PillowImageFolder:
    """The torch Dataset used where torchvision does not install: Pillow + NumPy, as above."""

    def __init__(self, root: str, crop: int) -> None:
        self.samples, self.crop, self.rng = image_files(root), crop, random.Random()

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple:
        import torch

        path, label = self.samples[i]
        return torch.from_numpy(pillow_sample(path, self.crop, self.rng)), label


class PillowThreads:
    """Batches made by 2 Python threads running Pillow (decode + the same per-image work)."""

    def __init__(self, config: dict) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.samples, self.config = image_files(config["folder"]), config
        self.pool = ThreadPoolExecutor(config["workers"])
        self.rng = random.Random(0)

    def __iter__(self) -> Any:
        order = list(range(len(self.samples)))
        self.rng.shuffle(order)
        batch, crop = self.config["batch"], self.config["crop"]
        for start in range(0, len(order), batch):
            ids = order[start:start + batch]
            seeds = [self.rng.random() for _ in ids]
            images = list(self.pool.map(lambda a: pillow_sample(self.samples[a[0]][0], crop, random.Random(a[1])),
                                        zip(ids, seeds)))
            yield np.stack(images), np.array([self.samples[i][1] for i in ids])


def measure_one(config: dict) -> dict:
    kind = config["kind"]
    make = (fastloop_loader(config) if kind == "fastloop" else torch_loader(config) if kind == "torch"
            else lambda: PillowThreads(config))
    result = measure(make, config["epochs"], config.get("limit"))
    if kind == "torch":
        import torch

        try:
            import torchvision

            result["dataset"] = f"torchvision {torchvision.__version__} ImageFolder + transforms, torch {torch.__version__}"
        except ImportError:
            result["dataset"] = f"Pillow reimplementation (no torchvision), torch {torch.__version__}"
    return {**config, **result}


# ---- the run ----

def configs(data: Any, quick: bool, batch: int, crop: int, torch_workers: Iterable[int]) -> list[dict]:
    """The throughput rows (2 epochs of at most `limit` batches: equal work for every row)."""
    common = {"folder": data.image_folder, "shards": data.shards, "batch": batch, "crop": crop, "epochs": 2,
              "limit": None if quick else 16}
    return [
        {**common, "name": "fastloop threads, ImageFolder", "kind": "fastloop", "source": "ImageFolder", "workers": 2},
        {**common, "name": "fastloop threads, TarShards", "kind": "fastloop", "source": "TarShards", "workers": 2},
        *({**common, "name": f"torch DataLoader, num_workers={w}", "kind": "torch", "workers": w}
          for w in torch_workers),
        {**common, "name": "Pillow, 2 Python threads", "kind": "pillow", "workers": 2},
    ]


def rss_config(data: Any, quick: bool, batch: int, crop: int) -> dict:
    """fastloop over whole epochs: 1 + 10 (2 when quick), RSS read after each."""
    return {"folder": data.image_folder, "shards": data.shards, "batch": batch, "crop": crop,
            "name": "fastloop threads, ImageFolder, full epochs", "kind": "fastloop", "source": "ImageFolder",
            "workers": 2, "epochs": 3 if quick else 11, "limit": None}


def run(data: Any, quick: bool, torch_python: str | None, batch: int = 128, crop: int = 224,
        torch_workers: Iterable[int] = (0, 1, 2), only: list[str] | None = None, rounds: int = 1) -> list[dict]:
    """Every configuration in a fresh interpreter (torch_python=None: in this one, for tests),
    `rounds` times interleaved, each row keeping its best round; then the RSS row."""
    todo = [c for c in configs(data, quick, batch, crop, torch_workers) + [rss_config(data, quick, batch, crop)]
            if not only or any(word in c["name"] for word in only)]
    best: dict[str, dict] = {}
    for round_ in range(rounds):
        for config in todo:
            if config["epochs"] > 2 and round_:  # the long RSS row runs once
                continue
            row = one(config, torch_python)
            old = best.get(config["name"])
            if old is None:
                best[config["name"]] = row
            else:  # the least disturbed round of each measure
                old["samples_per_s"] = max(old["samples_per_s"], row["samples_per_s"])
                for key in ("build_s", "first_batch_s"):
                    old[key] = min(old[key], row[key])
    return list(best.values())


def one(config: dict, torch_python: str | None) -> dict:
    if torch_python is None:
        return measure_one(config)
    python = torch_python if config["kind"] == "torch" else sys.executable
    out = subprocess.run([python, os.path.abspath(__file__), "--one", json.dumps(config)], capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{config['name']} failed:\n{out.stdout}{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> list[str]:
    torch_rows = [r for r in rows if r["kind"] == "torch"]
    best_torch = max(torch_rows, key=lambda r: r["samples_per_s"])
    torch_first = min(r["first_batch_s"] for r in torch_rows if r["workers"] > 0)
    pillow = next(r for r in rows if r["kind"] == "pillow")
    lines = [f"{'configuration':42} {'build s':>7} {'first batch s':>13} {'samples/s':>9} {'vs best DataLoader':>18} "
             f"{'vs Pillow threads':>17}"]
    for r in rows:
        lines.append(f"{r['name']:42} {r['build_s']:7.2f} {r['first_batch_s']:13.2f} {r['samples_per_s']:9.0f} "
                     f"{r['samples_per_s'] / best_torch['samples_per_s']:17.2f}x "
                     f"{r['samples_per_s'] / pillow['samples_per_s']:16.2f}x")
    for r in rows:
        if r["kind"] == "fastloop" and r["epochs"] == 2:
            lines.append(f"{r['name']}: first batch {r['first_batch_s'] / torch_first:.3f}x torch's best with "
                         f"workers ({torch_first:.2f} s)")
        elif r["kind"] == "fastloop":
            rss = r["rss_mib"]
            lines.append(f"{r['name']}: RSS after epoch 1 {rss[0]:.0f} MiB, after epoch {len(rss)} {rss[-1]:.0f} MiB, "
                         f"at most {(max(rss) / rss[0] - 1) * 100:+.1f}% over {len(rss) - 1} more epochs")
    lines.append(f"best DataLoader: {best_torch['name']}; its dataset: {best_torch['dataset']}")
    return lines


def test_quick_run_fills_the_table(tmp_path: Any, monkeypatch: Any) -> None:
    import pytest

    monkeypatch.setenv("FASTLOOP_CACHE", str(tmp_path / "cache"))  # TarShards' index cache
    pytest.importorskip("PIL")
    pytest.importorskip("torch")
    from fastloop.bench.image_data import dataset

    data = dataset(count=32, classes=3, shard_count=2, folder=str(tmp_path))
    rows = run(data, quick=True, torch_python=None, batch=16, crop=64, torch_workers=(0, 1))
    assert [r["kind"] for r in rows] == ["fastloop", "fastloop", "torch", "torch", "pillow", "fastloop"]
    assert all(r["samples_per_s"] > 0 and r["first_batch_s"] > r["build_s"] > 0 for r in rows)
    assert len(rows[-1]["rss_mib"]) == 2
    assert len(table(rows)) == len(rows) + 5


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--one":
        print(json.dumps(measure_one(json.loads(argv[1]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="640 images, 2 epochs per row")
    parser.add_argument("--images", type=int, default=5120)
    parser.add_argument("--torch-python", default=os.environ.get("FASTLOOP_BENCH_TORCH_PYTHON", sys.executable),
                        help="the interpreter of the torch rows (one with torchvision, to compare with it)")
    parser.add_argument("--only", action="append", help="run the rows whose name contains this (repeatable)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; each row keeps its best")
    args = parser.parse_args(argv)
    from fastloop.bench.image_data import dataset
    from fastloop.bench.report import machine_summary

    count = 640 if args.quick else args.images
    data = dataset(count)
    rows = run(data, args.quick, args.torch_python, only=args.only, rounds=args.rounds)
    if args.only:  # a partial run: the rows as measured
        print("\n".join(json.dumps(r) for r in rows))
        return 0
    print(f"{count} JPEGs (quality 90, ~500x375) in ImageFolder layout / {data.shard_count} tar shards; "
          f"RandomResizedCrop(224) + flip + normalize, float32 CHW, batch 128, shuffled; best of {args.rounds} "
          f"interleaved rounds; {machine_summary()}")
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
