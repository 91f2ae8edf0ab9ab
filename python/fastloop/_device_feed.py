"""Loader batches onto a CUDA device: pinned slots, one loading stream, GPU preprocessing.

With ``Loader(..., device="cuda")`` the workers fill host slots as usual; this module pins
those slots once (cudaHostRegister), queues each batch's copy on a stream of its own one
batch ahead of the consumer (so the copy of batch i+1 overlaps the training step on batch
i), and hands out fastloop.cuda.DeviceArrays. When the Loader's transform is a Pipeline of
[RandomCrop | CenterCrop] [RandomHFlip] Normalize on uint8 images, the workers only gather
the raw images and the crop, flip and normalize run on the GPU after the copy (4x fewer
bytes cross the bus than float32 would). A DeviceArray carries its stream in
``__cuda_array_interface__``, so fastloop.nn and torch wait for the copy on their own
stream without blocking the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from .ops import CenterCrop, Normalize, Pipeline, RandomCrop, RandomHFlip


@dataclass(frozen=True)
class GpuPlan:
    """What the GPU does to the first field: a crop (random or centered), a flip with
    probability p, and a normalization with a layout change."""

    crop: tuple[int, int] | None
    random_crop: bool
    flip_p: float
    mean: tuple[float, ...] | float
    std: tuple[float, ...] | float
    layout: str  # fastloop.cuda.preprocess's: "HWC->CHW", "CHW", "HWC", "CHW->HWC"


def _size(size: int | tuple[int, int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def gpu_plan(pipeline: Pipeline | None, first_field: Any) -> GpuPlan | None:
    """The GPU version of `pipeline` on uint8 images, or None when it has no exact one
    (then the pipeline runs on the CPU and its float32 output is copied)."""
    if pipeline is None or getattr(first_field, "dtype", None) != np.uint8:
        return None
    steps = list(pipeline.steps)
    crop = steps.pop(0) if steps and isinstance(steps[0], (RandomCrop, CenterCrop)) else None
    flip = steps.pop(0) if steps and isinstance(steps[0], RandomHFlip) else None
    if len(steps) != 1 or not isinstance(steps[0], Normalize):
        return None
    normalize = steps[0]
    out_layout = pipeline.layout if normalize.layout is None else normalize.layout.split("->")[-1]
    layout = pipeline.layout if out_layout == pipeline.layout else f"{pipeline.layout}->{out_layout}"

    def values(v: Any) -> tuple[float, ...] | float:
        return float(v) if np.ndim(v) == 0 else tuple(float(x) for x in np.ravel(v))

    return GpuPlan(
        crop=_size(crop.size) if crop is not None else None,
        random_crop=isinstance(crop, RandomCrop),
        flip_p=flip.p if flip is not None else 0.0,
        mean=values(normalize.mean),
        std=values(normalize.std),
        layout=layout,
    )


def draws(plan: GpuPlan, image_hw: tuple[int, int], n: int, seed: int, epoch: int, batch: int) -> tuple[Any, Any]:
    """Per-image crop offsets (n, 2) and flip flags (n,) for one batch, reproducible from
    (seed, epoch, batch index); None where the plan has no random step."""
    rng = np.random.default_rng([seed % 2**63, epoch, batch])
    offsets = None
    if plan.crop is not None and plan.random_crop:
        (h, w), (ch, cw) = image_hw, plan.crop
        if ch > h or cw > w:
            raise ValueError(f"RandomCrop{plan.crop} is larger than the images ({h}, {w})")
        offsets = np.stack([rng.integers(0, h - ch + 1, n), rng.integers(0, w - cw + 1, n)], axis=1).astype(np.int32)
    flips = (rng.random(n) < plan.flip_p) if plan.flip_p > 0 else None
    return offsets, flips


class DeviceFeed:
    """Turns host batches (tuples of slot views) into DeviceArrays on `device`."""

    def __init__(self, device: int, plan: GpuPlan | None, pin: bool, seed: int) -> None:
        from . import cuda

        self.cuda = cuda.require()
        self.device, self.plan, self.pin, self.seed = device, plan, pin, seed
        self.stream = cuda.Stream(device)
        self._pinned: dict[tuple[int, int], Any] = {}  # (address, bytes) of a slot field -> region

    def _pin(self, array: np.ndarray) -> None:
        """Pins slot memory once (slots are reused for the loader's life); a batch copied out
        because every slot was held is not pinned (it would be freed while registered)."""
        from ._core import _SlotLease

        if not self.pin or not isinstance(array.base, _SlotLease) or array.nbytes == 0:
            return
        key = (array.__array_interface__["data"][0], array.nbytes)
        if key not in self._pinned:
            self._pinned[key] = self.cuda.pin(array)

    def upload(self, fields: tuple[np.ndarray, ...], epoch: int, batch: int) -> tuple[Any, ...]:
        """Queues the copies (and the GPU preprocessing of field 0) on the loading stream."""
        from . import cuda

        out = []
        for i, field in enumerate(fields):
            self._pin(field)
            if i == 0 and self.plan is not None:
                plan = self.plan
                image_hw = field.shape[1:3] if plan.layout.startswith("HWC") else field.shape[2:4]
                offsets, flips = draws(plan, image_hw, len(field), self.seed, epoch, batch)
                out.append(cuda.preprocess(field, mean=plan.mean, std=plan.std, layout=plan.layout, crop=plan.crop,
                                           offsets=offsets, flips=flips, stream=self.stream, device=self.device))
            else:
                out.append(cuda.to_device(field, self.device, stream=self.stream))
        return tuple(out)

    def iterate(self, host_batches: Iterator[Any], single: bool, epoch: int) -> Iterator[Any]:
        """Yields device batches, the next one's copy queued before the current is handed out."""
        pending = None
        for index, host in enumerate(host_batches):
            fields = (host,) if single else tuple(host)
            queued = self.upload(fields, epoch, index)
            if pending is not None:
                yield pending[0] if single else pending
            pending = queued
        if pending is not None:
            yield pending[0] if single else pending

    def close(self) -> None:
        """Waits for queued copies, then unpins the slots."""
        self.stream.synchronize()
        for region in self._pinned.values():
            region.close()
        self._pinned.clear()
