"""The ImageNet train pipeline on JPEG files: fastloop.Loader's C threads against torch's
DataLoader, Pillow in Python threads, SPDL and DALI's CPU pipeline, side by side in one run
(issue 13's targets).

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
* Pillow decoding + the same per-image work in 2 Python threads (a ThreadPoolExecutor);
* where --peers-python names an interpreter that has them: SPDL (a spdl.pipeline of 2
  threads, FFmpeg decoding through crop/scale/flip filters) and DALI's CPU pipeline (2
  threads; decode + random_resized_crop, and its fused image_random_crop decode).
Per row: the time to build the loader (dataset scan or shard index included) and to hold
batch 0 (worker start included; imports are not timed), and samples/s over 16 batches of the
second epoch (workers running); rows run interleaved for `--rounds` rounds, each keeping its
best. Then fastloop's ImageFolder row runs 1 + 10 whole epochs with the RSS of the process
tree read after each (it must stay flat).

    $ python benchmarks/bench_images.py [--quick] [--torch-python PY] [--peers-python PY]
`python -m fastloop bench` runs a small version (suite(): a generated set, the rows whose
libraries this interpreter has). This module runs by path in the torch and peer interpreters
(`--one`), which need not have fastloop: it imports only NumPy at the top.
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
        return fastloop.Loader(source, batch_size=config["batch"], shuffle=True, seed=0, num_workers=config["workers"],
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



class SpdlImages:
    """SPDL's way: a spdl.pipeline of 2 threads; per image FFmpeg (through spdl.io) demuxes,
    then decodes through a filter graph that crops (torchvision's RandomResizedCrop draw),
    scales bilinear to the crop size and flips; NumPy normalizes to float32 CHW in the same
    thread; batches of `batch`."""

    def __init__(self, config: dict) -> None:
        import spdl.io  # noqa: F401  (fails here, before the clock matters, when FFmpeg is missing)

        self.samples, self.config = image_files(config["folder"]), config
        self.rng = random.Random(0)

    def load(self, item: tuple) -> tuple:
        import spdl.io

        path, label, seed = item
        rng = random.Random(seed)
        packets = spdl.io.demux_image(path)
        top, left, h, w = crop_params(packets.height, packets.width, rng)
        crop = self.config["crop"]
        flip = "hflip," if rng.random() < 0.5 else ""
        frames = spdl.io.decode_packets(
            packets, filter_desc=f"crop={w}:{h}:{left}:{top},scale={crop}:{crop}:flags=bilinear,{flip}format=pix_fmts=rgb24")
        x = spdl.io.to_numpy(spdl.io.convert_frames(frames)).astype(np.float32) / 255
        return ((x - np.float32(MEAN)) / np.float32(STD)).transpose(2, 0, 1), label

    def __iter__(self) -> Any:
        from spdl.pipeline import PipelineBuilder

        order = list(range(len(self.samples)))
        self.rng.shuffle(order)
        source = [(*self.samples[i], self.rng.random()) for i in order]
        workers = self.config["workers"]
        pipeline = (PipelineBuilder().add_source(source).pipe(self.load, concurrency=workers)
                    .aggregate(self.config["batch"])
                    .pipe(lambda items: (np.stack([x for x, _ in items]), np.array([y for _, y in items])))
                    .add_sink(3).build(num_threads=workers))
        with pipeline.auto_stop():
            yield from pipeline.get_iterator(timeout=600)


class DaliImages:
    """DALI's CPU pipeline (device="cpu" everywhere, no GPU), 2 threads: its file reader
    (shuffled), then either fn.decoders.image + fn.random_resized_crop ("decode + crop", the
    two-step form) or fn.decoders.image_random_crop + fn.resize (its fused form that decodes
    only the crop's region, as its ImageNet examples do), then fn.crop_mirror_normalize
    (random flip, float32 CHW)."""

    def __init__(self, config: dict) -> None:
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        from nvidia.dali import pipeline_def

        crop, fused = config["crop"], config["kind"] == "dali-fused"

        @pipeline_def(batch_size=config["batch"], num_threads=config["workers"], device_id=None, seed=0)
        def pipeline() -> Any:
            jpegs, labels = fn.readers.file(file_root=config["folder"], random_shuffle=True, name="files")
            if fused:
                images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
                images = fn.resize(images, device="cpu", size=(crop, crop), interp_type=types.INTERP_LINEAR)
            else:
                images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
                images = fn.random_resized_crop(images, device="cpu", size=(crop, crop))
            images = fn.crop_mirror_normalize(images, device="cpu", dtype=types.FLOAT, output_layout="CHW",
                                              mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD],
                                              mirror=fn.random.coin_flip())
            return images, labels

        self.pipeline = pipeline()
        self.pipeline.build()
        self.batches = -(-len(image_files(config["folder"])) // config["batch"])

    def __iter__(self) -> Any:
        for _ in range(self.batches):
            images, labels = self.pipeline.run()
            yield images.as_array(), labels.as_array()


PEERS = {"spdl": SpdlImages, "dali": DaliImages, "dali-fused": DaliImages}


def peer_version(kind: str) -> str:
    from importlib.metadata import version

    return f"spdl {version('spdl')}" if kind == "spdl" else f"nvidia-dali-cuda120 {version('nvidia-dali-cuda120')}"


def measure_one(config: dict) -> dict:
    kind = config["kind"]
    if kind in PEERS:
        try:
            version = peer_version(kind)
            make: Callable[[], Iterable] = lambda: PEERS[kind](config)
            make()  # imported and working before the clock starts (a missing library: skipped)
        except Exception as error:  # noqa: BLE001  (the reason goes into the table)
            return {**config, "skipped": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"}
        return {**config, **measure(make, config["epochs"], config.get("limit")), "dataset": version}
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
        {**common, "name": "SPDL 2 threads (FFmpeg decode + filters)", "kind": "spdl", "workers": 2},
        {**common, "name": "DALI CPU 2 threads, decode + crop", "kind": "dali", "workers": 2},
        {**common, "name": "DALI CPU 2 threads, fused crop decode", "kind": "dali-fused", "workers": 2},
    ]


def rss_config(data: Any, quick: bool, batch: int, crop: int) -> dict:
    """fastloop over whole epochs: 1 + 10 (2 when quick), RSS read after each."""
    return {"folder": data.image_folder, "shards": data.shards, "batch": batch, "crop": crop,
            "name": "fastloop threads, ImageFolder, full epochs", "kind": "fastloop", "source": "ImageFolder",
            "workers": 2, "epochs": 3 if quick else 11, "limit": None}


def run(data: Any, quick: bool, torch_python: str | None, batch: int = 128, crop: int = 224,
        torch_workers: Iterable[int] = (0, 1, 2), only: list[str] | None = None, rounds: int = 1,
        peers_python: str | None = None) -> list[dict]:
    """Every configuration in a fresh interpreter (torch_python=None: in this one, for tests;
    SPDL and DALI in peers_python, skipped without it), `rounds` times interleaved, each row
    keeping its best round; then the RSS row."""
    todo = [c for c in configs(data, quick, batch, crop, torch_workers) + [rss_config(data, quick, batch, crop)]
            if not only or any(word in c["name"] for word in only)]
    best: dict[str, dict] = {}
    for round_ in range(rounds):
        for config in todo:
            if config["epochs"] > 2 and round_:  # the long RSS row runs once
                continue
            row = one(config, torch_python, peers_python)
            old = best.get(config["name"])
            if old is None or "skipped" in old:
                best[config["name"]] = row
            elif "skipped" not in row:  # the least disturbed round of each measure
                old["samples_per_s"] = max(old["samples_per_s"], row["samples_per_s"])
                for key in ("build_s", "first_batch_s"):
                    old[key] = min(old[key], row[key])
    return list(best.values())


def one(config: dict, torch_python: str | None, peers_python: str | None = None) -> dict:
    peer = config["kind"] in PEERS
    if peer and peers_python is None and torch_python is not None:
        return {**config, "skipped": "no --peers-python (an interpreter with spdl / nvidia-dali-cuda120) given"}
    if torch_python is None:
        return measure_one(config)
    python = peers_python if peer else torch_python if config["kind"] == "torch" else sys.executable
    out = subprocess.run([python, os.path.abspath(__file__), "--one", json.dumps(config)], capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{config['name']} failed:\n{out.stdout}{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[dict], floor: dict | None = None) -> list[str]:
    skipped = [r for r in rows if "skipped" in r]
    rows = [r for r in rows if "skipped" not in r]
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
    if floor is not None:
        batch, workers = rows[0]["batch"], rows[0]["workers"]
        least = batch / (workers * floor["decodes_per_cpu_s"])
        lines.append(f"decode floor of a first batch: {batch} full decodes / {workers} cores at libjpeg-turbo's "
                     f"{floor['decodes_per_cpu_s']:.0f} decodes per CPU second = {least:.3f} s; 1/10 of torch's best "
                     f"first batch with workers = {torch_first / 10:.3f} s")
    lines.append(f"best DataLoader: {best_torch['name']}; its dataset: {best_torch['dataset']}")
    lines += [f"{r['name']}: {r['dataset']}" for r in rows if r["kind"] in PEERS]
    lines += [f"{r['name']}: skipped ({r['skipped']})" for r in skipped]
    return lines


def decode_floor(folder: str, count: int = 256) -> dict:
    """libjpeg-turbo's full-decode rate on one core over the first `count` files, per CPU
    second of this thread (unlike wall time, it does not grow when other processes share the
    core): no loader can make a batch faster than its decodes at this rate."""
    import fastloop

    data = [open(path, "rb").read() for path, _ in image_files(folder)[:count]]
    start = time.thread_time()
    for d in data:
        fastloop.images.decode(d)
    return {"decodes_per_cpu_s": len(data) / (time.thread_time() - start)}


# ---- the small version `python -m fastloop bench` runs ----

SUITE_SIZES = {True: (512, 64), False: (2048, 128)}  # quick or not: (images, batch)
HEADERS = ["configuration", "build s", "first batch s", "samples/s", "x best DataLoader", "x Pillow threads"]


def suite(quick: bool = False, log: Callable[[str], None] = lambda _: None,
          python: str | None = sys.executable) -> list[dict]:
    """The rows this interpreter can run, each in a fresh interpreter, on a generated set
    (512 JPEGs, batch 64 when quick; else 2,048, batch 128): fastloop threads over ImageFolder
    and TarShards, Pillow in 2 threads, torch's DataLoader (0, 1, 2 workers) where torch
    imports. [] when Pillow (which writes the set) or a JPEG decoder is missing. python=None:
    every row in this interpreter (tests)."""
    import importlib.util

    from fastloop import images
    from fastloop.bench.image_data import dataset

    if importlib.util.find_spec("PIL") is None or images.info().get("jpeg") is None:
        log("images: skipped (needs Pillow to write the set, and a JPEG decoder: see fastloop.images.info())")
        return []
    count, batch = SUITE_SIZES[quick]
    log(f"images: {count} generated JPEGs (written once into the cache), batch {batch}")
    data = dataset(count, classes=8, shard_count=4)
    has_torch = importlib.util.find_spec("torch") is not None
    todo = [c for c in configs(data, True, batch, 224, (0, 1, 2))
            if c["kind"] in ("fastloop", "pillow") or c["kind"] == "torch" and has_torch]
    rows = []
    for config in todo:
        log(f"  {config['name']}")
        rows.append(one(config, python))
    return rows


def table_rows(rows: list[dict]) -> list[list[object]]:
    torch_rows = [r for r in rows if r["kind"] == "torch"]
    best = max((r["samples_per_s"] for r in torch_rows), default=None)
    pillow = next((r["samples_per_s"] for r in rows if r["kind"] == "pillow"), None)
    return [[r["name"], round(r["build_s"], 2), round(r["first_batch_s"], 2), round(r["samples_per_s"]),
             f"{r['samples_per_s'] / best:.2f}x" if best else "-", f"{r['samples_per_s'] / pillow:.2f}x" if pillow else "-"]
            for r in rows]


def summary(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    fast = max((r for r in rows if r["kind"] == "fastloop"), key=lambda r: r["samples_per_s"])
    lines = [f"images: {fast['name']} {fast['samples_per_s']:,.0f} samples/s, first batch {fast['first_batch_s']:.2f} s"]
    torch_rows = [r for r in rows if r["kind"] == "torch"]
    if torch_rows:
        best = max(torch_rows, key=lambda r: r["samples_per_s"])
        first = min((r["first_batch_s"] for r in torch_rows if r["workers"] > 0), default=None)
        line = f"vs torch DataLoader at best {best['samples_per_s']:,.0f}/s ({best['name']}; {best['dataset']})"
        if first:
            line += f"; first batch {fast['first_batch_s'] / first:.2f}x torch's with workers ({first:.2f} s)"
        lines.append(line)
    return lines


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
    parser.add_argument("--peers-python", default=os.environ.get("FASTLOOP_BENCH_PEERS_PYTHON"),
                        help="the interpreter of the SPDL and DALI rows (a venv with spdl and nvidia-dali-cuda120; "
                             "rows skipped without it)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; each row keeps its best")
    args = parser.parse_args(argv)
    from fastloop.bench.image_data import dataset
    from fastloop.bench.report import machine_summary

    count = 640 if args.quick else args.images
    data = dataset(count)
    floor = decode_floor(data.image_folder)
    rows = run(data, args.quick, args.torch_python, only=args.only, rounds=args.rounds, peers_python=args.peers_python)
    if args.only:  # a partial run: the rows as measured
        print("\n".join(json.dumps(r) for r in rows))
        return 0
    print(f"{count} JPEGs (quality 90, ~500x375) in ImageFolder layout / {data.shard_count} tar shards; "
          f"RandomResizedCrop(224) + flip + normalize, float32 CHW, batch 128, shuffled; best of {args.rounds} "
          f"interleaved rounds; {machine_summary()}")
    print("\n".join(table(rows, floor)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
