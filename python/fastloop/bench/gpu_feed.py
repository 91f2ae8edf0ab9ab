"""Keeping a GPU fed (issue 23): ResNets trained from each way of loading JPEGs, side by side in
one run, against the same model fed tensors already on the GPU (the limit). The command is
benchmarks/bench_gpu_feed.py; the loaders and the timing are fastloop.bench.feeds.

Data: `images` JPEGs from fastloop.bench.image_data (~500x375, quality 90) in ImageFolder layout.
Pipeline: RandomResizedCrop(crop) + horizontal flip + normalize, shuffled, drop_last.

Sections, each row measured on its own (one that fails or cannot run says why in its note, with
no number, and the others still run):
  train <model> (torchvision ResNet-18/50, bf16 autocast, channels_last, SGD), fed by
    synthetic            tensors already on the device: the limit, the section's 100%
    torch DataLoader     torchvision ImageFolder + RandomResizedCrop + flip + ToTensor + Normalize,
                         num_workers = `workers`, pin_memory=True, .cuda(non_blocking=True)
    fastloop CPU decode  Loader(device="cuda", output="torch", dtype="bfloat16",
                         memory_format="channels_last", decode="cpu"), `workers` threads
    fastloop nvJPEG      the same with decode="gpu"
  loader alone: the three loaders without a model, to device tensors (share: of torch's)
  copy uint8 batches: the same uint8 batches (from memory, no transform) through
    Loader(pin_memory=True) + torch's .cuda(non_blocking=True), and through Loader(device="cuda");
    the best of two interleaved rounds each (share: of torch's)
Per row: img/s, the share of the section's first row, the CPU cores the process used (its threads
and child processes), the seconds from building the loader to its first batch on the device, and
for a fastloop loader which decoders ran (Settings.decoder_counts reads its counters).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

import fastloop

from .feeds import (CLASSES, LOADER_TIMEOUT_S, Batches, Feed, NotAvailable, Target, count_images, fastloop_images,
                    synthetic, timed, torch_dataloader, torch_ready)
from .report import format_table, machine_summary

MODELS = {"resnet18": "ResNet-18", "resnet50": "ResNet-50", "tiny": "tiny CNN"}
HEADERS = ["section", "feed", "img/s", "share", "CPU cores", "first batch s", "decoded by", "note"]
LEGEND = ("share: img/s over the section's first row (synthetic for training, torch's for the loaders and "
          "copies). CPU cores: CPU time of the process's threads and child processes / wall time. decoded by: "
          "a fastloop loader's own counts of the images its nvJPEG hardware engine, its fallback backend and "
          "the CPU decoded, and whether the engine decoded only the crops (regions); n/a where it has none.")


@dataclass
class Settings:
    device: str = "cuda"  # "cpu": the smoke run
    images: int = 3072
    batch: int = 128
    crop: int = 224
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    seconds: float = 6.0  # timed per training row
    loader_seconds: float = 4.0  # timed per loader-alone and copy row
    warmup_s: float = 1.5  # untimed, before each timed stretch (and at least feeds.WARMUP_STEPS steps)
    models: tuple[str, ...] = ("resnet18", "resnet50")
    copy_images: int = 1024  # uint8 images in memory for the copy rows
    data: str | None = None  # where the JPEGs are kept and reused (None: a temporary folder)
    # what a fastloop Loader's decoders did, for its row's "decoded by" (bench_gpu_feed.py's)
    decoder_counts: Callable[[Any], str] | None = None

    @property
    def batches(self) -> Batches:
        return Batches(self.batch, self.crop, self.workers)


# --quick (about a minute on an H200), and the smoke run on the CPU (tiny: its numbers mean nothing)
QUICK = dict(images=512, seconds=1.0, loader_seconds=0.5, warmup_s=0.5, copy_images=256)
SMOKE = dict(device="cpu", images=24, batch=4, crop=32, workers=2, seconds=0.2, loader_seconds=0.2, warmup_s=0.0,
             models=("resnet18",), copy_images=16)


@dataclass
class Row:
    section: str
    feed: str
    images_per_s: float | None = None
    cores: float | None = None
    first_batch_s: float | None = None
    share: float | None = None  # of the section's first row
    decoded_by: str = ""  # Settings.decoder_counts of a fastloop loader's row
    note: str = ""

    def cells(self) -> list[str]:
        def show(value: float | None, fmt: str) -> str:
            return "-" if value is None else format(value, fmt)

        first = show(self.first_batch_s, ".3f" if (self.first_batch_s or 0) < 1 else ".2f")
        share = "-" if self.share is None else f"{100 * self.share:.0f}%"
        return [self.section, self.feed, show(self.images_per_s, ",.0f"), share, show(self.cores, ".1f"), first,
                self.decoded_by or "-", self.note]


def measure(row: Row, make_feed: Callable[[], Feed], consume: Callable[[Any], int], seconds: float,
            settings: Settings, target: Target) -> Row:
    """Fills `row` (rate, cores, first batch) or its note, and prints it to stderr; never
    raises an Exception (a failure's traceback goes to stderr)."""
    feed = None
    try:
        feed = make_feed()
        row.first_batch_s = feed.first_batch_s
        row.images_per_s, row.cores = timed(feed, consume, seconds, settings.warmup_s, target)
    except NotAvailable as error:
        row.note = f"not available: {error}"
    except Exception as error:
        traceback.print_exc()
        row.note = f"failed: {type(error).__name__}: {error}"
    finally:
        if feed is not None:
            if settings.decoder_counts is not None and isinstance(feed.loader, fastloop.Loader):
                row.decoded_by = settings.decoder_counts(feed.loader)
            feed.close()
    _progress(row)
    return row


def _progress(row: Row) -> None:
    print(" | ".join(c for c in row.cells() if c), file=sys.stderr, flush=True)


def loader_feeds(settings: Settings, root: str, target: Target) -> list[tuple[str, Callable[[], Feed]]]:
    """(name, Feed factory) of the three JPEG loaders: torch's, fastloop CPU decode, nvJPEG."""
    b, w = settings.batches, settings.workers
    return [(f"torch DataLoader, {w} workers, pin_memory",
             lambda: Feed(torch_dataloader(root, b, target), target, torch_ready(target))),
            (f"fastloop CPU decode, {w} threads", lambda: Feed(fastloop_images(root, b, target, "cpu"), target)),
            (f"fastloop nvJPEG (decode='gpu'), {w} threads",
             lambda: Feed(fastloop_images(root, b, target, "gpu"), target))]


class Trainer:
    """A torchvision ResNet (or the tiny CNN) in channels_last with SGD; step() trains on one
    batch in bf16 autocast and returns its size."""

    def __init__(self, name: str, target: Target) -> None:
        torch = self.torch = target.torch
        self.device = target.name
        try:
            model = build_model(name, torch)
        except ImportError as error:
            raise NotAvailable(f"{type(error).__name__}: {error}") from error
        self.model = model.to(target.name, memory_format=torch.channels_last).train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss = torch.nn.CrossEntropyLoss()

    def step(self, batch: tuple) -> int:
        x, y = batch
        with self.torch.autocast(self.device, dtype=self.torch.bfloat16):
            loss = self.loss(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return int(y.shape[0])


def build_model(name: str, torch: Any) -> Any:
    if name == "tiny":  # the smoke run's model where torchvision is missing
        nn = torch.nn
        return nn.Sequential(nn.Conv2d(3, 16, 3, stride=2), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                             nn.Flatten(), nn.Linear(16, 1000))
    from torchvision import models

    return getattr(models, name)(weights=None)


def train_rows(name: str, settings: Settings, root: str, target: Target) -> list[Row]:
    section = f"train {MODELS[name]}"
    feeds = [("synthetic (tensors already on the device: the limit)",
              lambda: Feed(synthetic(settings.batches, target), target))] + loader_feeds(settings, root, target)
    rows = [Row(section, feed) for feed, _ in feeds]
    try:
        trainer = Trainer(name, target)
    except NotAvailable as error:
        for row in rows:
            row.note = f"not available: {error}"
            _progress(row)
        return rows
    for row, (_, make_feed) in zip(rows, feeds):
        measure(row, make_feed, trainer.step, settings.seconds, settings, target)
    del trainer
    if target.cuda:
        target.torch.cuda.empty_cache()
    return rows


def loader_rows(settings: Settings, root: str, target: Target) -> list[Row]:
    return [measure(Row("loader alone", feed), make_feed, count_images, settings.loader_seconds, settings, target)
            for feed, make_feed in loader_feeds(settings, root, target)]


def copy_rows(settings: Settings, target: Target) -> list[Row]:
    """The same uint8 batches from memory (no transform) onto the device two ways: pinned by the
    Loader and copied by torch, or copied by the Loader itself (device="cuda"); the best of two
    rounds, interleaved."""
    s = settings
    images = np.random.default_rng(0).integers(0, 256, (s.copy_images, s.crop, s.crop, 3), dtype=np.uint8)
    section = f"copy uint8 batches {s.batch}x{s.crop}x{s.crop}x3"

    def make(**arguments: Any) -> Callable[[], Iterable]:
        return lambda: fastloop.Loader(images, batch_size=s.batch, shuffle=True, drop_last=True, num_workers=s.workers,
                                       timeout=LOADER_TIMEOUT_S, **arguments)

    ways = [(Row(section, "Loader(pin_memory=True) + torch .cuda(non_blocking=True)"),
             lambda: Feed(make(output="torch", pin_memory=target.cuda), target, target.to_device)),
            (Row(section, "Loader(device='cuda')"),
             lambda: Feed(make(**target.loader_arguments(images=False)), target))]
    best: dict[str, Row] = {}
    for order in (ways, ways[::-1]):  # interleaved: A B, then B A
        for template, make_feed in order:
            row = measure(dataclasses.replace(template), make_feed, count_images, s.loader_seconds / 2, s, target)
            kept = best.get(row.feed)
            if kept is None or (row.images_per_s or 0) > (kept.images_per_s or 0):
                best[row.feed] = row
    rows = [best[template.feed] for template, _ in ways]
    for row in rows if not target.cuda else []:
        row.note = row.note or "the cpu smoke run: nothing is copied"
    return rows


def add_shares(rows: list[Row]) -> list[Row]:
    """Each row's rate over its section's first row's."""
    reference: dict[str, float | None] = {}
    for row in rows:
        base = reference.setdefault(row.section, row.images_per_s)
        row.share = row.images_per_s / base if row.images_per_s is not None and base else None
    return rows


def image_folder(settings: Settings) -> tuple[str, Callable[[], None]]:
    """(ImageFolder root of the JPEGs, cleanup): under settings.data (kept), else in a temporary folder."""
    from .image_data import dataset

    base = settings.data or tempfile.mkdtemp(prefix="fastloop-gpu-feed-")
    root = dataset(settings.images, classes=CLASSES, shard_count=1, folder=base).image_folder
    return root, (lambda: None) if settings.data else (lambda: shutil.rmtree(base, ignore_errors=True))


def run(settings: Settings, out: str | None = None) -> list[Row]:
    """Every section's rows, in order; with `out`, the markdown report is rewritten after each
    section (a run cut short still leaves what it measured)."""
    target = Target(settings.device)
    if target.cuda:
        target.torch.backends.cudnn.benchmark = True
    root, cleanup = image_folder(settings)
    rows: list[Row] = []
    sections: list[Callable[[], list[Row]]] = [
        *[(lambda name=name: train_rows(name, settings, root, target)) for name in settings.models],
        lambda: loader_rows(settings, root, target),
        lambda: copy_rows(settings, target)]
    try:
        for section in sections:
            rows += section()
            if out:
                write_markdown(out, add_shares(rows), settings)
    finally:
        cleanup()
    return add_shares(rows)


def describe(settings: Settings) -> list[str]:
    """The lines above the table: machine, GPU, versions, settings."""
    lines = [f"Machine: {machine_summary()}"]
    try:
        import torch

        gpu = f", {torch.cuda.get_device_name()}" if settings.device == "cuda" and torch.cuda.is_available() else ""
        lines.append(f"torch {torch.__version__}{gpu}")
        import torchvision

        lines[-1] += f", torchvision {torchvision.__version__}"
    except ImportError as error:
        lines.append(f"({error})")
    lines.append(f"fastloop {fastloop.__version__}; its CUDA kernels: {fastloop.cuda.is_available().reason}")
    s = settings
    lines.append(f"{s.images} JPEGs ~500x375 q90, RandomResizedCrop({s.crop}) + flip + normalize, batch {s.batch}, "
                 f"{s.workers} workers/threads, models in bf16 autocast + channels_last + SGD; {s.seconds:g} s "
                 f"timed per training row, {s.loader_seconds:g} s per loader row, after a {s.warmup_s:g} s warm-up; "
                 f"device {s.device}")
    return lines


def table(rows: list[Row], *, markdown: bool = False) -> str:
    return format_table(HEADERS, [r.cells() for r in rows], markdown=markdown)


def write_markdown(path: str, rows: list[Row], settings: Settings) -> None:
    """The description, the table and its legend as markdown, replacing `path` whole."""
    text = "\n\n".join(["\n".join(describe(settings)), table(rows, markdown=True), LEGEND]) + "\n"
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
