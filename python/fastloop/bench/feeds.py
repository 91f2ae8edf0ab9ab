"""Batches on a device from each way of loading JPEGs, and how fast a consumer takes them: the
parts of the GPU feed benchmark (fastloop.bench.gpu_feed) that know about loaders.

A Feed makes a loader (torch's DataLoader over torchvision's ImageFolder, fastloop.Loader with
CPU or nvJPEG decoding, or one synthetic batch already on the device), times its first batch and
then yields batches without end, each ready for the model. timed() runs a consumer (a training
step, or only counting) over them: images/s and the CPU cores the process used meanwhile.

    >>> feed = Feed(fastloop_images(root, Batches(128, 224, 16), Target("cuda"), "cpu"), Target("cuda"))
    >>> timed(feed, count_images, seconds=4, warmup_s=1, target=Target("cuda"))   # (img/s, cores)
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import fastloop
from fastloop import ops
from fastloop.errors import CodecUnavailable, CudaUnavailable

from .timing import process_cpu_s

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
CLASSES = 10  # of the synthetic labels (the image folders have 10 classes too)
WARMUP_STEPS = 3
LOADER_TIMEOUT_S = 30  # a batch later than this fails its row (a healthy one takes well under a second)
# what a loader raises when it cannot run here (no GPU, no nvJPEG, no torchvision, decode="gpu"
# without a device): its row says "not available" with the reason; anything else is a failure
UNAVAILABLE = (ImportError, ValueError, CudaUnavailable, CodecUnavailable)


class NotAvailable(Exception):
    """A loader or model cannot run here; the message says why."""


@dataclass(frozen=True)
class Batches:
    """What every loader makes: batches of `batch` images cropped to `crop` x `crop`, by
    `workers` threads or worker processes."""

    batch: int
    crop: int
    workers: int


class Target:
    """The device batches go to: "cuda" (the benchmark) or "cpu" (the smoke run of the same
    code where no GPU exists: nothing is copied)."""

    def __init__(self, name: str) -> None:
        import torch

        self.torch, self.name, self.cuda = torch, name, name == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def to_device(self, batch: Any) -> Any:
        """A host batch (a tensor, or a tuple or list of them) on the device, copied as torch users do."""
        if isinstance(batch, (tuple, list)):
            return tuple(self.to_device(t) for t in batch)
        return batch.to(self.name, non_blocking=True)

    def loader_arguments(self, images: bool) -> dict:
        """fastloop.Loader's arguments for batches on this device: bf16 channels_last images
        (`images`: a Pipeline ending in Normalize), else the fields as they are."""
        if not self.cuda:
            return {"output": "torch"}
        if not images:
            return {"output": "torch", "device": "cuda"}
        return {"output": "torch", "device": "cuda", "dtype": "bfloat16", "memory_format": "channels_last"}


class Feed:
    """Makes a loader and takes its first batch (first_batch_s: from making it to that batch on
    the device); then yields batches without end, each through `prepare` if given. Errors of
    the UNAVAILABLE kinds while starting become NotAvailable."""

    def __init__(self, make: Callable[[], Iterable], target: Target, prepare: Callable[[Any], Any] | None = None):
        self.loader: Any = None
        self._batches: Iterator[Any] | None = None
        start = time.perf_counter()
        try:
            self.loader = make()
            self._batches = self._epochs(prepare)
            self._first: Any = next(self._batches)
        except UNAVAILABLE as error:
            self.close()
            raise NotAvailable(f"{type(error).__name__}: {error}") from error
        except BaseException:
            self.close()
            raise
        target.sync()
        self.first_batch_s = time.perf_counter() - start

    def _epochs(self, prepare: Callable[[Any], Any] | None) -> Iterator[Any]:
        while True:
            for batch in self.loader:
                yield batch if prepare is None else prepare(batch)

    def __iter__(self) -> Iterator[Any]:
        if self._first is not None:
            first, self._first = self._first, None
            yield first
        assert self._batches is not None
        yield from self._batches

    def close(self) -> None:
        """Stops the loader's workers now (not while the next row is timed)."""
        if self._batches is not None:
            self._batches.close()  # type: ignore[attr-defined]
        if hasattr(self.loader, "close"):  # fastloop.Loader
            self.loader.close()
        workers = getattr(self.loader, "_iterator", None)  # a DataLoader's persistent workers (private)
        if workers is not None and hasattr(workers, "_shutdown_workers"):
            workers._shutdown_workers()  # ended and reaped
        self.loader = self._batches = self._first = None


def synthetic(batches: Batches, target: Target) -> Callable[[], Iterable]:
    """One batch already on the device, as fastloop hands it out (bf16 channels_last on a GPU)."""
    torch = target.torch

    def make() -> Iterable:
        b = batches
        x = torch.randn(b.batch, 3, b.crop, b.crop, device=target.name)
        x = x.to(torch.bfloat16 if target.cuda else torch.float32).contiguous(memory_format=torch.channels_last)
        return [(x, torch.randint(0, CLASSES, (b.batch,), device=target.name))]

    return make


def torch_dataloader(root: str, batches: Batches, target: Target) -> Callable[[], Iterable]:
    """torchvision's ImageFolder + RandomResizedCrop + flip + ToTensor + Normalize in DataLoader
    worker processes, pinned where there is a GPU."""

    def make() -> Iterable:
        import torch
        from torchvision import datasets, transforms

        b = batches
        tf = transforms.Compose([transforms.RandomResizedCrop(b.crop), transforms.RandomHorizontalFlip(),
                                 transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
        return torch.utils.data.DataLoader(datasets.ImageFolder(root, transform=tf), batch_size=b.batch, shuffle=True,
                                           drop_last=True, num_workers=b.workers, pin_memory=target.cuda,
                                           persistent_workers=True, timeout=LOADER_TIMEOUT_S)

    return make


def torch_ready(target: Target) -> Callable[[Any], Any]:
    """What a torch loop does to a DataLoader batch: .cuda(non_blocking=True), channels_last."""

    def prepare(batch: Any) -> Any:
        x, y = target.to_device(batch)
        return x.contiguous(memory_format=target.torch.channels_last), y

    return prepare


def fastloop_images(root: str, batches: Batches, target: Target, decode: str) -> Callable[[], Iterable]:
    """fastloop.Loader over fastloop.ImageFolder, the same augmentations in C threads, batches on
    the device as the model takes them; decode "cpu" or "gpu" (nvJPEG)."""

    def make() -> Iterable:
        b = batches
        pipeline = ops.Pipeline([ops.RandomResizedCrop(b.crop), ops.RandomHFlip(),
                                 ops.Normalize(MEAN, STD, layout="HWC->CHW")])
        return fastloop.Loader(fastloop.ImageFolder(root), batch_size=b.batch, shuffle=True, drop_last=True,
                               num_workers=b.workers, transform=pipeline, timeout=LOADER_TIMEOUT_S, decode=decode,
                               **target.loader_arguments(images=True))

    return make


def timed(batches: Iterable, consume: Callable[[Any], int], seconds: float, warmup_s: float,
          target: Target) -> tuple[float, float]:
    """(images/s, CPU cores) of consume(batch) -> images, over whole steps for `seconds`, the
    device synchronized at both ends, after an untimed warm-up of at least WARMUP_STEPS steps
    and `warmup_s` seconds. Cores: CPU time of the process's threads and children / wall time."""
    it = iter(batches)
    start = time.perf_counter()
    for steps in itertools.count(1):
        consume(next(it))
        if steps >= WARMUP_STEPS and time.perf_counter() - start >= warmup_s:
            break
    target.sync()
    cpu0, start, images = process_cpu_s(), time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        images += consume(next(it))
    target.sync()
    wall = time.perf_counter() - start
    return images / wall, (process_cpu_s() - cpu0) / wall


def count_images(batch: Any) -> int:
    """The samples in a batch: (x, y) or a single tensor."""
    return int((batch[-1] if isinstance(batch, (tuple, list)) else batch).shape[0])
