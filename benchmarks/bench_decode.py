"""Per core: the fused image pipelines against libjpeg-turbo's own full decode of the same files.

Target (issue 13): the fused ImageNet train pipeline (RandomResizedCrop 224 + flip + normalize,
float32 CHW) runs at >= 0.8x the full-decode rate of libjpeg-turbo on one core, and faster
where decoding only the crop's rows/columns or at a DCT-reduced scale saves work. Everything
runs on one thread: the full decode through fastloop.images.decode (the same libjpeg-turbo the
Loader uses), the pipelines through a Loader with num_workers=0 (the calling thread fills every
batch), Pillow for reference.

Files: 400 (64 with --quick) JPEGs from fastloop.bench.image_data, the generator
bench_images.py loads (quality 90, around 500x375, photo-like content), cached.

Also for the fused path (2 worker threads): the time to the first batch (Loader built, threads
started, decoders made) against a steady batch's, and the RSS after each of 10 epochs (target:
no growth > 2% from the first epoch to the last).

As a script: prints the table (best of `rounds` per row), then those two lines.
    python benchmarks/bench_decode.py [--quick]
Under pytest: a quick run fills the table (no timing assertions: numbers go to BENCHMARKS.md).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

import fastloop
from fastloop import ops
from fastloop.bench.image_data import dataset

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def image_paths(count: int, folder: str | None) -> list[str]:
    """The first `count` JPEGs of fastloop.bench.image_data's set (the files bench_images.py
    loads: quality 90, around 500x375, photo-like content), written once under `folder`
    (default: the fastloop cache) and reused."""
    data = dataset(count, classes=1, shard_count=1, folder=folder)
    return [path for path, _ in fastloop.ImageFolder(data.image_folder).samples]


class Files:
    """The `_encoded_spec` contract over plain files (what ImageFolder/Images give the Loader)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths, self.targets = paths, [0] * len(paths)

    def __len__(self) -> int:
        return len(self.paths)

    def _encoded_spec(self) -> tuple:
        n = len(self.paths)
        return ([os.fsencode(p) for p in self.paths], np.arange(n, dtype=np.int32), np.zeros(n, np.int64),
                np.full(n, -1, np.int64))


def best_rate(run: Callable[[], int], rounds: int) -> float:
    """Images per CPU second of the calling thread, the fastest of `rounds` runs. All the work
    of a row runs on this thread, so its CPU time is the per-core cost, and unlike wall time
    it does not grow when other processes share the core."""
    best = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        count = run()
        best = min(best, (time.thread_time() - start) / count)
    return 1.0 / best


def loader_run(paths: list[str], pipeline: ops.Pipeline) -> Callable[[], int]:
    loader = fastloop.Loader(Files(paths), batch_size=64, num_workers=0, transform=pipeline, shuffle=True)

    def run() -> int:
        return sum(len(y) for _, y in loader)

    return run


def pillow_train(paths: list[str]) -> Callable[[], int]:
    """What a torchvision ImageFolder + RandomResizedCrop + flip + ToTensor + Normalize does per
    image with Pillow (its crop rule from fastloop, which follows torchvision's)."""
    from PIL import Image

    rrc, mean, std = ops.RandomResizedCrop(224), np.float32(MEAN), np.float32(STD)

    def run() -> int:
        for i, path in enumerate(paths):
            image = Image.open(path).convert("RGB")
            top, left, h, w = rrc.params(image.height, image.width, seed=1, index=i)
            image = image.crop((left, top, left + w, top + h)).resize((224, 224), Image.BILINEAR)
            x = np.asarray(image)[:, ::-1].astype(np.float32) / 255
            ((x - mean) / std).transpose(2, 0, 1).copy()
        return len(paths)

    return run


def rows(paths: list[str], rounds: int) -> list[tuple[str, float]]:
    data = [Path(p).read_bytes() for p in paths]
    normalize = ops.Normalize(MEAN, STD, layout="HWC->CHW")
    table = [("libjpeg-turbo full decode (fastloop.images.decode)", best_rate(lambda: sum(1 for d in data if fastloop.images.decode(d) is not None), rounds))]
    from PIL import Image

    table.append(("Pillow full decode (Image.open().convert('RGB'))",
                  best_rate(lambda: sum(1 for p in paths if Image.open(p).convert("RGB").load() is not None), rounds)))
    for name, pipeline in [
        ("fused train: RandomResizedCrop 224 + flip + normalize", ops.Pipeline([ops.RandomResizedCrop(224), ops.RandomHFlip(), normalize])),
        ("fused train, full-scale decode (reduced_decode=False)", ops.Pipeline([ops.RandomResizedCrop(224, reduced_decode=False), ops.RandomHFlip(), normalize])),
        ("fused eval: Resize 256 + CenterCrop 224 + normalize", ops.Pipeline([ops.Resize(256), ops.CenterCrop(224), normalize])),
        ("fused train at 112 (decodes at 1/2 or less)", ops.Pipeline([ops.RandomResizedCrop(112), ops.RandomHFlip(), normalize])),
    ]:
        table.append((name, best_rate(loader_run(paths, pipeline), rounds)))
    table.append(("Pillow + NumPy train (torchvision's per-image work)", best_rate(pillow_train(paths), rounds)))
    return table


def rss_bytes() -> int:
    """This process's resident set now (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def startup_and_memory(paths: list[str], epochs: int = 10) -> dict[str, float]:
    """Seconds to the first batch and per steady batch, and RSS after each epoch, of the fused
    train pipeline with 2 worker threads."""
    pipeline = ops.Pipeline([ops.RandomResizedCrop(224), ops.RandomHFlip(),
                             ops.Normalize(MEAN, STD, layout="HWC->CHW")])
    start = time.perf_counter()
    with fastloop.Loader(Files(paths), batch_size=32, num_workers=2, transform=pipeline, shuffle=True) as loader:
        batches = iter(loader)
        next(batches)
        first = time.perf_counter() - start
        for _ in batches:
            pass
        rss, steady = [], float("inf")
        for _ in range(epochs):
            began, count = time.perf_counter(), 0
            for _ in loader:
                count += 1
            steady = min(steady, (time.perf_counter() - began) / count)
            rss.append(rss_bytes())
    return {"first_batch_s": first, "steady_batch_s": steady, "rss_first": rss[0], "rss_last": rss[-1],
            "rss_growth": rss[-1] / rss[0] - 1}


def run(count: int, rounds: int, folder: str | None = None) -> tuple[list[tuple[str, float]], dict[str, float]]:
    paths = image_paths(count, folder)
    return rows(paths, rounds), startup_and_memory(paths)


def print_table(table: list[tuple[str, float]], fused: dict[str, float]) -> None:
    base = table[0][1]
    print(f"{'one core, same files':58} {'images/s':>9} {'vs full decode':>15}  (per CPU second of the thread)")
    for name, rate in table:
        print(f"{name:58} {rate:9.0f} {rate / base:14.2f}x")
    print(f"fused train, 2 threads, batch 32: first batch {fused['first_batch_s'] * 1e3:.1f} ms "
          f"(Loader built, threads started), a steady batch {fused['steady_batch_s'] * 1e3:.1f} ms "
          f"({fused['first_batch_s'] / fused['steady_batch_s']:.1f} batches' worth)")
    print(f"RSS after epoch 1 {fused['rss_first'] / 2**20:.1f} MiB, after epoch 10 "
          f"{fused['rss_last'] / 2**20:.1f} MiB: {fused['rss_growth'] * 100:+.2f}%")


def test_quick_run_fills_the_table(tmp_path: Path) -> None:
    table, fused = run(count=8, rounds=1, folder=str(tmp_path))
    assert len(table) == 7 and all(rate > 0 for _, rate in table)
    assert fused["first_batch_s"] > 0 and fused["rss_first"] > 0


def decoders() -> str:
    """Which libjpeg each side decodes with: fastloop's (linked in or loaded) and Pillow's bundled one."""
    import PIL
    from PIL import features

    jpeg = fastloop.images.info()["jpeg"]
    return (f"fastloop: {jpeg['decoder']}, from {jpeg['path']}; "
            f"Pillow {PIL.__version__}: libjpeg-turbo {features.version('libjpeg_turbo')}")


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    print(decoders())
    print_table(*run(count=64 if quick else 400, rounds=2 if quick else 3))
