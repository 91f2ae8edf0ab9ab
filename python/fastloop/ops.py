"""Fused, GIL-free preprocessing kernels on NumPy arrays, and pipelines of them.

Every function takes NumPy arrays or CPU torch tensors (read and written through zero-copy
views; results are arrays), checks dtype, shape and contiguity at the call (a TypeError or ValueError
naming the argument), reads its input once and writes its output once, accepts ``out=``
to reuse a buffer, releases the GIL while it runs (inputs of 2 KiB and more), and takes
``threads=`` to split the work over fastloop's C thread pool. Random choices (``crop``,
``hflip``) are drawn per image from ``seed``, so results never depend on ``threads``.

    >>> x = numpy.zeros((8, 224, 224, 3), numpy.uint8)
    >>> fastloop.ops.normalize(x, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]).shape
    (8, 3, 224, 224)

A ``Pipeline`` chains crop, flip, normalize and cast into one C call per batch -- what
``fastloop.Loader`` workers run with no Python at all:

    >>> aug = fastloop.ops.Pipeline([RandomCrop(56), RandomHFlip(), Normalize(MEAN, STD)], layout="CHW")
    >>> aug(batch_u8, seed=epoch).shape
    (256, 3, 56, 56)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar, Union

import numpy as np
import numpy.typing as npt

from . import _core
from ._core import _Pipeline
from ._torch_interop import as_array_if_tensor

_F = TypeVar("_F", bound=Callable[..., Any])


def _tensors_as_arrays(op: _F) -> _F:
    """The op with CPU torch tensors (x, out=, a list of images) taken as zero-copy arrays."""

    @functools.wraps(op)
    def call(x: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(x, (list, tuple)):
            x = [as_array_if_tensor(v, f"x[{i}]") for i, v in enumerate(x)]
        else:
            x = as_array_if_tensor(x, "x")
        if kwargs.get("out") is not None:
            kwargs["out"] = as_array_if_tensor(kwargs["out"], "out")
        return op(x, *args, **kwargs)

    return call  # type: ignore[return-value]


cast = _tensors_as_arrays(_core.cast)
crop = _tensors_as_arrays(_core.crop)
divide_by_max = _tensors_as_arrays(_core.divide_by_max)
hflip = _tensors_as_arrays(_core.hflip)
normalize = _tensors_as_arrays(_core.normalize)
stack = _tensors_as_arrays(_core.stack)

__all__ = [
    "normalize",
    "cast",
    "crop",
    "hflip",
    "stack",
    "divide_by_max",
    "Pipeline",
    "RandomCrop",
    "CenterCrop",
    "RandomHFlip",
    "Normalize",
    "Cast",
]


def _size(size: int | tuple[int, int]) -> tuple[int, int]:
    h, w = (size, size) if isinstance(size, int) else size
    return int(h), int(w)


@dataclass(frozen=True)
class RandomCrop:
    """Crop each image to `size` (int or (h, w)) at a uniform random position.

    >>> fastloop.ops.Pipeline([fastloop.ops.RandomCrop(56)], layout="CHW")
    """

    size: int | tuple[int, int]

    def _spec(self) -> tuple:
        return ("crop", *_size(self.size), False)


@dataclass(frozen=True)
class CenterCrop:
    """Crop each image to `size` at its center (torchvision's rounding).

    >>> fastloop.ops.Pipeline([fastloop.ops.CenterCrop(224)])
    """

    size: int | tuple[int, int]

    def _spec(self) -> tuple:
        return ("crop", *_size(self.size), True)


@dataclass(frozen=True)
class RandomHFlip:
    """Mirror each image left-right with probability p.

    >>> fastloop.ops.Pipeline([fastloop.ops.RandomHFlip(p=0.5)])
    """

    p: float = 0.5

    def _spec(self) -> tuple:
        return ("hflip", float(self.p))


@dataclass(frozen=True)
class Normalize:
    """(x * scale - mean) / std per channel to float32 (scale 1/255 for uint8); layout
    "CHW"/"HWC" keeps the layout, "HWC->CHW"/"CHW->HWC" changes it.

    >>> fastloop.ops.Pipeline([fastloop.ops.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225], layout="HWC->CHW")])
    """

    mean: Union[float, Sequence[float]]
    std: Union[float, Sequence[float]]
    layout: str | None = None  # None: keep the pipeline's layout

    def _spec(self, current: str, channels: int) -> tuple:
        out = current if self.layout is None else self.layout.split("->")[-1]
        if self.layout is not None and "->" in self.layout and self.layout.split("->")[0] != current:
            raise ValueError(f"Normalize(layout={self.layout!r}) follows a step that yields {current} images")
        mean, std = (_per_channel(name, value, channels, current)
                     for name, value in (("mean", self.mean), ("std", self.std)))
        return ("normalize", mean, std, out)


def _per_channel(name: str, value: Any, channels: int, layout: str) -> np.ndarray:
    """mean/std as one value per channel, or a ValueError saying which dimension was taken as
    the channels (the usual mistake: a layout="CHW" Pipeline given HWC images or back)."""
    values = np.asarray(value, np.float32).reshape(-1)
    if values.size not in (1, channels):
        where = "last" if layout == "HWC" else "first"
        raise ValueError(f"Normalize: {name} has {values.size} values, but the images have {channels} channels "
                         f"(the {where} dimension of a {layout} image): is the Pipeline's layout right?")
    return np.ascontiguousarray(np.broadcast_to(values, (channels,)))


@dataclass(frozen=True)
class Cast:
    """Convert to dtype (float -> int saturates, as fastloop.ops.cast).

    >>> fastloop.ops.Pipeline([fastloop.ops.RandomCrop(56), fastloop.ops.Cast(numpy.float16)])
    """

    dtype: npt.DTypeLike

    def _spec(self) -> tuple:
        return ("cast", np.dtype(self.dtype))


Step = Union[RandomCrop, CenterCrop, RandomHFlip, Normalize, Cast]


class Pipeline:
    """A sequence of steps run in C with the GIL released: what Loader workers apply to the
    first field of every batch, one image at a time. Random choices for each image are
    drawn from (seed, step, the image's dataset index), so an image gets the same
    augmentation whichever worker or batch handles it.

    `layout` is the input images' layout: "HWC" (height, width, channels) or "CHW".

        from fastloop.ops import Normalize, RandomCrop, RandomHFlip
        aug = fastloop.ops.Pipeline([RandomCrop(56), RandomHFlip(), Normalize(mean, std)], layout="CHW")
        y = aug(x_u8, seed=epoch)            # or: fastloop.Loader(x_u8, transform=aug)
    """

    def __init__(self, steps: Sequence[Step], layout: str = "HWC", channels: int | None = None) -> None:
        if layout not in ("HWC", "CHW"):
            raise ValueError(f"'layout' must be 'HWC' or 'CHW', not {layout!r}")
        self.steps = tuple(steps)
        self.layout = layout
        self._channels = channels
        self._built: dict[int, _Pipeline] = {}
        for step in self.steps:
            if not isinstance(step, (RandomCrop, CenterCrop, RandomHFlip, Normalize, Cast)):
                raise TypeError(f"pipeline steps are RandomCrop, CenterCrop, RandomHFlip, Normalize or Cast, "
                                f"not {type(step).__name__}")

    def _core(self, channels: int) -> _Pipeline:
        """The C pipeline for images with `channels` channels (mean/std broadcast to them)."""
        if channels not in self._built:
            specs, current = [], self.layout
            for step in self.steps:
                if isinstance(step, Normalize):
                    spec = step._spec(current, channels)
                    current = spec[3]
                else:
                    spec = step._spec()
                specs.append(spec)
            self._built[channels] = _Pipeline(self.layout, specs)
        return self._built[channels]

    def channels_of(self, x_shape: Sequence[int]) -> int:
        """Channel count of images (or batches) of this shape in the pipeline's layout."""
        return int(x_shape[-1] if self.layout == "HWC" else x_shape[-3])

    def __call__(self, x: np.ndarray, seed: int | None = None, ids: Any = None, threads: int = 1) -> np.ndarray:
        """Run on one image or a batch. ids: the images' dataset indices for the random
        draws (default 0..n-1)."""
        x = as_array_if_tensor(x, "x")
        if not isinstance(x, np.ndarray) or x.ndim not in (3, 4):
            shape = f"shape {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
            raise ValueError(f"'x' must be an image or a batch of images (3 or 4 dimensions), not {shape}")
        return self._core(self.channels_of(x.shape)).run(x, seed, ids, threads)

    def __repr__(self) -> str:
        return f"Pipeline({list(self.steps)!r}, layout={self.layout!r})"
