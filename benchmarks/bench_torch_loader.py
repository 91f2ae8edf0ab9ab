"""fastloop.Loader in processes mode vs torch's DataLoader on the path PyTorch users take: a
torchvision ImageFolder of JPEG files with RandomResizedCrop + ToTensor + Normalize, the same
dataset object, batch size, shuffle and worker count on both sides.

Reported per loader and worker count: samples/s over epochs 1-2 (workers already running, as
in training), the time from constructing the loader to its first batch, the peak PSS of the
process tree (shared pages split between processes; sampled in epochs 0 and 3, not while
timing), and the CPU time per sample of the workers and of the main process. Each
configuration runs in a fresh interpreter that has imported torch and used its thread pool, as
a training script has (the case that used to hang fastloop's workers). The floor, what the
dataset itself costs (dataset[i] in a loop, torch on one thread), tells how much any loader
could gain: with every core busy, samples/s is at most cores / (CPU per sample). The loader's
own cost is measured apart, on a dataset whose __getitem__ returns a ready sample of the same
shapes (a 3x112x112 float tensor and an int): all the CPU the loaders spend there is theirs.

    $ python benchmarks/bench_torch_loader.py [--quick] [--images N] [--workers 1,2]
Under pytest: one quick fastloop configuration is measured (numbers go to BENCHMARKS.md,
not asserted); skipped without torchvision and Pillow.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from fastloop.bench.timing import LoaderCpu, epochs_cpu_us

BATCH, CROP = 32, 112
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def write_image_folder(root: str, n: int, classes: int = 4, size: tuple[int, int] = (320, 240)) -> str:
    """n JPEG files (smooth gradients plus noise, quality 90) in root/class_k/ folders."""
    from PIL import Image

    rng = np.random.default_rng(0)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    for i in range(n):
        folder = os.path.join(root, f"class_{i % classes}")
        os.makedirs(folder, exist_ok=True)
        base = np.stack([(xx * rng.uniform(0.2, 1) + yy * rng.uniform(0.2, 1) + rng.uniform(0, 255)) % 256
                         for _ in range(3)], axis=-1)
        pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f"{i:05d}.jpg"), quality=90)
    return root


def make_dataset(root: str):
    from torchvision import datasets, transforms

    tf = transforms.Compose([transforms.RandomResizedCrop(CROP), transforms.ToTensor(),
                             transforms.Normalize(MEAN, STD)])
    return datasets.ImageFolder(root, transform=tf)


def make_loader(kind: str, dataset, workers: int):
    if kind == "torch DataLoader":
        import torch

        return torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers,
                                           persistent_workers=True, timeout=120)
    import fastloop

    return fastloop.Loader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers, mode="processes",
                           output="torch", timeout=120)


def measure_one(kind: str, workers: int, root: str, timed_epochs: int = 2) -> dict:
    """One configuration, in this (fresh) interpreter: epoch 0 (first batch, peak PSS), then
    `timed_epochs` epochs timed with no PSS sampler running (its /proc reads take CPU the
    workers compete for), with the CPU time of the main process and of the workers."""
    import torch

    from fastloop.bench.loader import PeakPss

    torch.nn.functional.interpolate(torch.rand(8, 3, 128, 128), size=(200, 200), mode="bilinear")  # the pool runs
    dataset = make_dataset(root)
    with PeakPss() as pss:
        start = time.perf_counter()
        loader = make_loader(kind, dataset, workers)
        it = iter(loader)
        next(it)
        first = time.perf_counter() - start
        for _ in it:  # the rest of epoch 0
            pass
    cpu = LoaderCpu(loader)
    start, seen = time.perf_counter(), 0
    for _ in range(timed_epochs):
        for x, _ in loader:  # workers running, as in training
            seen += len(x)
    elapsed = time.perf_counter() - start
    main_cpu, worker_cpu = cpu.spent()
    with PeakPss() as later:  # memory after the workers have run a while (copy-on-write grows)
        for _ in loader:
            pass
    del loader, it
    return {"loader": kind, "workers": workers, "samples_per_s": seen / elapsed, "first_batch_s": first,
            "peak_pss_mib": max(pss.peak, later.peak) / 2**20, "main_cpu_ms": 1e3 * main_cpu / seen,
            "worker_cpu_ms": 1e3 * worker_cpu / seen}


class ReadySamples:
    """A dataset that costs nothing: the same ready (image tensor, label) every time."""

    def __init__(self, n: int) -> None:
        import torch

        self.n, self.image = n, torch.rand(3, CROP, CROP)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.image, i % 4


def measure_own_cost(kind: str, workers: int, samples: int = 6400, timed_epochs: int = 3) -> dict:
    """CPU per sample each loader spends on itself (workers, main process), with ReadySamples."""
    import torch

    torch.set_num_threads(1)
    loader = make_loader(kind, ReadySamples(samples), workers)
    for _ in loader:  # workers started
        pass
    main_us, worker_us = epochs_cpu_us(loader, timed_epochs, samples)
    return {"own_cost": kind, "workers": workers, "main_us": main_us, "worker_us": worker_us}


def measure_floor(root: str) -> dict:
    """The dataset's own cost: dataset[i] over a shuffled epoch in this process, torch on one
    thread as in a worker; no loader can spend less CPU per sample than this."""
    import torch

    torch.set_num_threads(1)
    dataset = make_dataset(root)
    order = np.random.default_rng(0).permutation(len(dataset))
    dataset[0]
    start = time.process_time()
    for i in order:
        dataset[int(i)]
    return {"loader": "dataset[i] alone", "workers": 0, "cpu_ms": 1e3 * (time.process_time() - start) / len(order)}


def run(images: int, workers_list: list[int], repeats: int) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as root:
        write_image_folder(root, images)
        for repeat in range(repeats):  # interleaved, so load from other work hits both alike
            kinds = ("torch DataLoader", "fastloop processes")
            configs = [("--floor",)] + [(mode, kind, str(w)) for mode in ("--one", "--own-cost")
                                        for w in workers_list for kind in kinds]
            for config in configs:
                out = subprocess.run([sys.executable, __file__, *config, root], capture_output=True, text=True,
                                     check=True)
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return rows


def table(rows: list[dict]) -> list[str]:
    floor = min(r["cpu_ms"] for r in rows if r.get("loader") == "dataset[i] alone")
    best: dict[tuple[str, int], dict] = {}
    own: dict[tuple[str, int], dict] = {}
    for r in rows:  # the least of the repeats: the least disturbed
        key = (r.get("own_cost", ""), r["workers"])
        if "own_cost" in r and (key not in own or r["worker_us"] + r["main_us"] <
                                own[key]["worker_us"] + own[key]["main_us"]):
            own[key] = r
    for r in rows:  # the best of the repeats: the least disturbed by other work on the machine
        key = (r.get("loader", ""), r["workers"])
        if "samples_per_s" in r and (key not in best or r["samples_per_s"] > best[key]["samples_per_s"]):
            best[key] = r
    lines = [f"{'loader':<20} {'workers':>7} {'samples/s':>10} {'first batch s':>14} {'peak PSS MiB':>13} "
             f"{'CPU ms/sample: workers':>23} {'main':>5}"]
    for (kind, workers), r in sorted(best.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        lines.append(f"{kind:<20} {workers:>7} {r['samples_per_s']:>10.0f} {r['first_batch_s']:>14.2f} "
                     f"{r['peak_pss_mib']:>13.0f} {r['worker_cpu_ms']:>23.3f} {r['main_cpu_ms']:>5.3f}")
    lines.append(f"dataset[i] alone (one process, torch on 1 thread): {floor:.3f} CPU ms/sample (best of repeats)")
    for (kind, workers), r in sorted(own.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        lines.append(f"own cost, {kind}, workers={workers}: {r['worker_us']:.1f} us/sample in the workers, "
                     f"{r['main_us']:.1f} in the main process (a dataset returning a ready sample)")
    for workers in sorted({w for _, w in best}):
        fl, tv = best.get(("fastloop processes", workers)), best.get(("torch DataLoader", workers))
        if fl and tv:
            fl_cpu, tv_cpu = (r["worker_cpu_ms"] + r["main_cpu_ms"] for r in (fl, tv))
            lines.append(f"workers={workers}: fastloop / DataLoader = {fl['samples_per_s'] / tv['samples_per_s']:.2f}x "
                         f"samples/s, peak PSS {fl['peak_pss_mib']:.0f} vs {tv['peak_pss_mib']:.0f} MiB; "
                         f"CPU per sample {fl_cpu:.3f} vs {tv_cpu:.3f} ms (DataLoader / fastloop "
                         f"{tv_cpu / fl_cpu:.2f}x; DataLoader / dataset alone {tv_cpu / floor:.2f}x: the most any "
                         f"loader could gain with every core busy)")
    return lines


def test_fastloop_processes_on_an_image_folder_is_measured(tmp_path):
    import pytest

    pytest.importorskip("torchvision")
    pytest.importorskip("PIL")
    write_image_folder(str(tmp_path), 64)
    row = measure_one("fastloop processes", 1, str(tmp_path), timed_epochs=1)
    assert row["samples_per_s"] > 0 and 0 < row["first_batch_s"] < 120 and row["peak_pss_mib"] > 0
    assert row["worker_cpu_ms"] > 0 and measure_floor(str(tmp_path))["cpu_ms"] > 0
    own = measure_own_cost("fastloop processes", 1, samples=640, timed_epochs=1)
    assert own["worker_us"] >= 0 and own["main_us"] >= 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--one":
        print(json.dumps(measure_one(argv[1], int(argv[2]), argv[3])))
        return 0
    if argv and argv[0] == "--own-cost":
        print(json.dumps(measure_own_cost(argv[1], int(argv[2]))))
        return 0
    if argv and argv[0] == "--floor":
        print(json.dumps(measure_floor(argv[1])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="192 images, one repeat")
    parser.add_argument("--images", type=int, default=640)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    images, repeats = (192, 1) if args.quick else (args.images, args.repeats)
    rows = run(images, [int(w) for w in args.workers.split(",")], repeats)
    print(f"{images} JPEGs 320x240 in an ImageFolder, RandomResizedCrop({CROP}) + ToTensor + Normalize, "
          f"batch {BATCH}, shuffled; best of {repeats}")
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
