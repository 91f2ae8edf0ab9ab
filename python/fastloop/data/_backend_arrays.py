"""The threads backend over arrays, Folders and image sources: C threads read each sample's
fields into the batch slots (and decode, crop and resize images, and run a Pipeline), no
Python code at all: the C loader (csrc/data/fl_loader.c) as a BatchSource (_backend.py)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .._core import _Loader
from ._backend import sampling
from ._folder import Folder
from .ops import Pipeline


def is_encoded(source: Any) -> bool:
    """An image source (ImageFolder, Images, TarShards): its samples are encoded JPEG/PNG bytes."""
    return hasattr(source, "_encoded_spec") and not isinstance(source, type)


def field_dtype(field: Any) -> Any:
    """The dtype of a source field's samples as the workers read them (decoded images: uint8)."""
    return np.uint8 if is_encoded(field) else field.dtype


def classify(source: Any) -> tuple[list, Any, bool]:
    """(fields, None, single) for arrays/Folders/image sources (single: one field, handed out
    alone), or ([], dataset, False) for a Python dataset."""
    if is_encoded(source):  # an image source alone: (images, labels from its targets)
        return [source, np.ascontiguousarray(np.asarray(source.targets, np.int64))], None, False
    if isinstance(source, (np.ndarray, Folder)):
        return [source], None, True
    if isinstance(source, (tuple, list)) and source and all(isinstance(s, (np.ndarray, Folder)) or is_encoded(s)
                                                            for s in source):
        return list(source), None, False
    if hasattr(source, "__len__") and hasattr(source, "__getitem__"):
        return [], source, False
    raise TypeError(f"'source' must be an array, a Folder, a tuple of them, or a map-style dataset "
                    f"(__len__ and __getitem__), not {type(source).__name__}")


def encoded_field(source: Any, pipeline: Pipeline | None, index: int, staged: bool = False) -> tuple:
    """The C loader's spec of an image source: where each sample's bytes are, and the fused
    decode -> crop -> resize that gives every image the same size; `staged`: the workers stage
    the images for the GPU decoder instead (_gpu_decode.py)."""
    from . import images

    size = pipeline.fixed_size() if pipeline is not None else None
    if size is None:
        raise ValueError(f"source[{index}] holds images of different sizes: give the Loader a "
                         f"transform=fastloop.ops.Pipeline whose first step fixes the size: "
                         f"RandomResizedCrop(224), Resize((h, w)), or Resize(256) then CenterCrop(224)")
    images.ensure_loaded()
    paths, file_index, offsets, lengths = source._encoded_spec()
    from ._gpu_decode import CAPACITY

    return ("encoded", [os.fsencode(p) for p in paths], np.ascontiguousarray(file_index, np.int32),
            np.ascontiguousarray(offsets, np.int64), np.ascontiguousarray(lengths, np.int64), pipeline.geometry,
            CAPACITY if staged else 0)


def arrays_source(loader: Any, fields: list, pipeline: Pipeline | None, num_workers: int,
                  prefetch_factor: int) -> _Loader:
    """The C loader reading `fields` (arrays, Folders, image sources) with `pipeline` (the
    part the workers run) for `loader`'s sampling, counting into its metrics."""
    specs = []
    for i, field in enumerate(fields):
        if is_encoded(field):
            specs.append(encoded_field(field, pipeline, i, loader._jpeg is not None and i == 0))
        elif isinstance(field, Folder):
            specs.append(field._field())
        else:
            if not field.flags.c_contiguous:
                raise ValueError(f"source[{i}] must be C-contiguous; pass numpy.ascontiguousarray(...)")
            specs.append(("array", field))
    core_pipeline = None
    if pipeline is not None and is_encoded(fields[0]):
        core_pipeline = pipeline._core(3) if pipeline._rest else None  # after the fused decode/resize
    elif pipeline is not None:
        if pipeline.geometry is not None:
            raise ValueError(f"{type(pipeline.steps[0]).__name__} runs fused with decoding on image sources "
                             "(ImageFolder, Images, TarShards); for arrays call the Pipeline on them")
        first = fields[0]
        shape = first.shape if isinstance(first, Folder) else first.shape[1:]
        core_pipeline = pipeline._core(pipeline.channels_of(shape))
    # `ahead` batches in flight besides the two the consumer may hold as views (the one in
    # use, the one being taken), as DataLoader's prefetch_factor * num_workers; 0 workers:
    # the consumer makes each batch when asked, into a third slot (with two, every other
    # batch of a `for` loop came as a copy: the loop variable still held the last one)
    ahead = num_workers * prefetch_factor
    return _Loader(specs, workers=num_workers, slots=ahead + 2 if num_workers else 3, ahead=ahead,
                   pipeline=core_pipeline, metrics=loader._metrics, skip_errors=loader.on_error == "skip",
                   **sampling(loader))
