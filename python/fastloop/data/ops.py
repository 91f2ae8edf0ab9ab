"""Fused, GIL-free preprocessing kernels on NumPy arrays, and pipelines of them.

Every function takes NumPy arrays or CPU torch tensors (read and written through zero-copy
views; results are arrays), checks dtype, shape and contiguity at the call (a TypeError or ValueError
naming the argument), reads its input once and writes its output once, accepts ``out=``
to reuse a buffer, releases the GIL while it runs (inputs of 2 KiB and more), and takes
``num_threads=`` to split the work over fastloop's C thread pool. Random choices (``crop``,
``hflip``) are drawn per image from ``seed``, so results never depend on ``num_threads``.

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

from .. import _core
from .._args import INT_MAX, int_arg
from .._core import _Pipeline, _image_transform, _resize, _resized_crop_params
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
    "resize",
    "Pipeline",
    "Resize",
    "RandomResizedCrop",
    "RandomCrop",
    "CenterCrop",
    "RandomHFlip",
    "Normalize",
    "Cast",
]


def _size(size: int | tuple[int, int]) -> tuple[int, int]:
    """(h, w) of an int or (h, w) `size`, each side a positive int of at most INT_MAX pixels."""
    if isinstance(size, (tuple, list)) and len(size) != 2:
        raise ValueError(f"'size' must be an int or an (h, w) pair, not {size!r}")
    h, w = (size, size) if not isinstance(size, (tuple, list)) else size
    return int_arg("size", h, 1, INT_MAX), int_arg("size", w, 1, INT_MAX)


def _resized_size(h: int, w: int, size: int | tuple[int, int]) -> tuple[int, int]:
    """torchvision's output size of Resize(size) for an h x w image (int: the shorter side)."""
    if not isinstance(size, int):
        return _size(size)
    short, long = (w, h) if w <= h else (h, w)
    new_long = max(1, int(size * long / short))
    return (new_long, size) if w <= h else (size, new_long)


def resize(image: np.ndarray, size: int | tuple[int, int]) -> np.ndarray:
    """Resize one (h, w, c) uint8 image, bilinear with antialiasing as Pillow and
    torchvision's ``v2.Resize(antialias=True)`` do (int `size`: the shorter side).

    >>> fastloop.ops.resize(numpy.zeros((375, 500, 3), numpy.uint8), 256).shape
    (256, 341, 3)
    """
    if not isinstance(image, np.ndarray) or image.ndim != 3 or image.dtype != np.uint8:
        raise ValueError("'image' must be an (h, w, c) uint8 array")
    _size(size)
    out_h, out_w = _resized_size(image.shape[0], image.shape[1], size)
    return _resize(np.ascontiguousarray(image), out_h, out_w)


@dataclass(frozen=True)
class Resize:
    """Resize to `size`: an int sets the shorter side (the other keeps the aspect ratio, as
    torchvision rounds it), (h, w) sets both; bilinear with antialiasing (Pillow's). As the
    first step of a Pipeline, with a CenterCrop after an int size, it runs fused with JPEG
    decoding in the Loader: `reduced_decode` lets libjpeg-turbo decode at 1/2..1/8 scale when
    the output is at most that size (faster; pixels differ slightly from a full decode).

    >>> fastloop.ops.Pipeline([fastloop.ops.Resize(256), fastloop.ops.CenterCrop(224)])
    """

    size: int | tuple[int, int]
    reduced_decode: bool = True

    def __post_init__(self) -> None:
        _size(self.size)  # a bad size fails here, naming 'size'


@dataclass(frozen=True)
class RandomResizedCrop:
    """torchvision's RandomResizedCrop: a crop of random area (fraction of the image in
    `scale`) and aspect ratio (log-uniform in `ratio`), ten tries then the centre-crop
    fallback, resized to `size` (bilinear, antialiased). Draws depend only on (seed, image
    index). `reduced_decode` as for Resize.

    >>> fastloop.ops.Pipeline([fastloop.ops.RandomResizedCrop(224), fastloop.ops.RandomHFlip()])
    """

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    reduced_decode: bool = True

    def __post_init__(self) -> None:
        _size(self.size)  # a bad size fails here, naming 'size'

    def params(self, height: int, width: int, seed: int, index: int) -> tuple[int, int, int, int]:
        """(top, left, height, width) of the crop drawn for image `index` of an image of
        height x width under `seed` (a Loader passes its epoch's seed).

        >>> fastloop.ops.RandomResizedCrop(224).params(375, 500, seed=0, index=7)
        """
        return _resized_crop_params(seed, index, height, width, tuple(self.scale), tuple(self.ratio))

    def _geometry(self) -> tuple:
        h, w = _size(self.size)
        return ("resized_crop", h, w, float(self.scale[0]), float(self.scale[1]), float(self.ratio[0]),
                float(self.ratio[1]), bool(self.reduced_decode))


@dataclass(frozen=True)
class RandomCrop:
    """Crop each image to `size` (int or (h, w)) at a uniform random position.

    >>> fastloop.ops.Pipeline([fastloop.ops.RandomCrop(56)], layout="CHW")
    """

    size: int | tuple[int, int]

    def __post_init__(self) -> None:
        _size(self.size)  # a bad size fails here, naming 'size'

    def _spec(self) -> tuple:
        return ("crop", *_size(self.size), False)


@dataclass(frozen=True)
class CenterCrop:
    """Crop each image to `size` at its center (torchvision's rounding).

    >>> fastloop.ops.Pipeline([fastloop.ops.CenterCrop(224)])
    """

    size: int | tuple[int, int]

    def __post_init__(self) -> None:
        _size(self.size)  # a bad size fails here, naming 'size'

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


Step = Union[RandomCrop, CenterCrop, RandomHFlip, Normalize, Cast, Resize, RandomResizedCrop]
_GEOMETRY_HINT = ("start the pipeline with RandomResizedCrop(size), Resize((h, w)) or Resize(size) followed "
                  "by CenterCrop(size)")


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
        for i, step in enumerate(self.steps):
            if not isinstance(step, (RandomCrop, CenterCrop, RandomHFlip, Normalize, Cast, Resize, RandomResizedCrop)):
                raise TypeError(f"pipeline steps are RandomCrop, CenterCrop, RandomHFlip, Normalize, Cast, Resize "
                                f"or RandomResizedCrop, not {type(step).__name__}")
            if isinstance(step, (Resize, RandomResizedCrop)) and i != 0:
                raise ValueError(f"{type(step).__name__} must be the first step of a Pipeline (it runs fused with "
                                 f"decoding), not step {i}")
        if self.steps and isinstance(self.steps[0], (Resize, RandomResizedCrop)) and layout != "HWC":
            raise ValueError(f"{type(self.steps[0]).__name__} takes HWC images, not layout={layout!r}")
        self.geometry, self._rest = self._split_geometry()

    def _split_geometry(self) -> tuple[tuple | None, tuple]:
        """(the fused first step's C spec or None, the steps after it)."""
        first = self.steps[0] if self.steps else None
        if isinstance(first, RandomResizedCrop):
            return first._geometry(), self.steps[1:]
        if not isinstance(first, Resize):
            return None, self.steps
        if isinstance(first.size, int) and len(self.steps) > 1 and isinstance(self.steps[1], CenterCrop):
            h, w = _size(self.steps[1].size)
            if h > first.size or w > first.size:
                raise ValueError(f"CenterCrop({self.steps[1].size}) is larger than Resize({first.size})'s shorter side")
            return ("resize", h, w, first.size, 0, first.reduced_decode), self.steps[2:]
        if isinstance(first.size, int):
            return ("resize", 0, 0, first.size, 0, first.reduced_decode), self.steps[1:]  # size varies per image
        rh, rw = _size(first.size)
        if len(self.steps) > 1 and isinstance(self.steps[1], CenterCrop):
            h, w = _size(self.steps[1].size)
            return ("resize", h, w, rh, rw, first.reduced_decode), self.steps[2:]
        return ("resize", rh, rw, rh, rw, first.reduced_decode), self.steps[1:]

    def fixed_size(self) -> tuple[int, int] | None:
        """The (h, w) every image has after the fused first step, or None when it varies."""
        if self.geometry is None or self.geometry[1] == 0:
            return None
        return self.geometry[1], self.geometry[2]

    def _core(self, channels: int) -> _Pipeline:
        """The C pipeline for images with `channels` channels (mean/std broadcast to them):
        the steps after a fused Resize/RandomResizedCrop."""
        if channels not in self._built:
            specs, current = [], self.layout
            for step in self._rest:
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

    def __call__(self, x: np.ndarray, seed: int | None = None, ids: Any = None, num_threads: int = 1) -> np.ndarray:
        """Run on one image or a batch. ids: the images' dataset indices for the random
        draws (default 0..n-1)."""
        x = as_array_if_tensor(x, "x")
        if not isinstance(x, np.ndarray) or x.ndim not in (3, 4):
            shape = f"shape {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
            raise ValueError(f"'x' must be an image or a batch of images (3 or 4 dimensions), not {shape}")
        if self.geometry is not None:
            x = self._apply_geometry(x, seed, ids)
        return self._core(self.channels_of(x.shape)).run(x, seed, ids, num_threads)

    def _apply_geometry(self, x: np.ndarray, seed: int | None, ids: Any) -> np.ndarray:
        """The fused first step on each image of an array (the Loader runs it on encoded files)."""
        if x.dtype != np.uint8:
            raise ValueError(f"{type(self.steps[0]).__name__} takes uint8 images, not {x.dtype}")
        batch = x if x.ndim == 4 else x[None]
        if self.fixed_size() is None and len(batch) > 1:
            raise ValueError(f"Resize({self.steps[0].size}) gives images of different sizes: {_GEOMETRY_HINT}")
        index = np.arange(len(batch)) if ids is None else np.asarray(ids, np.int64).reshape(-1)
        draw = int(np.random.SeedSequence().generate_state(1, np.uint64)[0]) if seed is None else seed
        spec = self.geometry
        if spec[1] == 0:  # Resize(int) alone: this image's size
            h, w = _resized_size(batch.shape[1], batch.shape[2], spec[3])
            spec = ("resize", h, w, h, w, spec[5])
        out = [_image_transform(spec, np.ascontiguousarray(image), draw, int(i)) for image, i in zip(batch, index)]
        return np.stack(out) if x.ndim == 4 else out[0]

    def __repr__(self) -> str:
        return f"Pipeline({list(self.steps)!r}, layout={self.layout!r})"
