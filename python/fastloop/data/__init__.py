"""Data loading: sources -> sampler -> workers -> batch slots -> NumPy, torch or a GPU.

    >>> loader = fastloop.data.Loader(fastloop.data.ImageFolder("train/"), batch_size=128, shuffle=True)
    >>> for x, y in loader: ...

Its parts: loader.py (the Loader: a facade over one BatchSource protocol, _backend.py, with
a backend each for C threads over arrays, Python code in threads, in processes and in the
calling thread, _backend_*.py; its arguments in _loader_args.py and _loader_device.py, its
epochs in _epoch.py), datasets.py (image folders, file lists, tar shards), images.py
(JPEG/PNG decode), ops.py (kernels and the Pipeline), the private helpers (samples, collate,
batches, sample codec, tar index, device feed, pinning, GPU decode, torch interop). `fastloop.Loader` and the rest are re-exported at the top level.
"""

from __future__ import annotations

from . import images, ops
from .datasets import ImageFolder, Images, TarShards
from .loader import Folder, Loader, WorkerInfo, get_worker_info, load_npy, sample_rng

__all__ = ["Loader", "Folder", "ImageFolder", "Images", "TarShards", "load_npy", "get_worker_info", "WorkerInfo",
           "sample_rng", "images", "ops"]
