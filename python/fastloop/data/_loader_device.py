"""Where a Loader's batches go (device, dtype, memory_format, decode, pin_memory): the
arguments, and the device feed that copies each host batch to the GPU (and finishes the
Pipeline there, or decodes JPEGs with nvJPEG)."""

from __future__ import annotations

from typing import Any

from .._args import one_of
from .._device import parse_device
from ._device_feed import dtype_name, memory_format_name
from ._torch_feed import PinnedBatches
from ._torch_interop import pins_tensors
from .ops import Pipeline


def init_device(loader: Any, device: Any, dtype: Any, memory_format: Any, decode: str | None,
                pin_memory: bool | None, batch_size: int) -> None:
    """Where batches go: device, dtype, memory_format, decode, pin_memory."""
    kind, index = parse_device(device)
    loader.device = index if kind == "cuda" else None
    loader._device_dtype, loader._memory_format = dtype_name(dtype), memory_format_name(memory_format)
    if loader.device is None and (dtype is not None or memory_format is not None):
        raise ValueError("'dtype' and 'memory_format' shape the batches on a GPU: pass device='cuda' too")
    if decode is not None:
        one_of("decode", decode, ("cpu", "gpu", "auto"))
    if decode == "gpu" and loader.device is None:
        raise ValueError("decode='gpu' decodes JPEGs on a CUDA device: pass device='cuda' too")
    loader.decode = decode or ("auto" if loader.device is not None else "cpu")
    loader._jpeg = None  # the nvJPEG decoder when decode="gpu" (or "auto") decodes on the GPU
    if loader.device is not None and loader.collate_fn is not None:
        raise ValueError("device='cuda' copies the batch's fields as the workers made them, which a collate_fn "
                         "would change: use device=None and move the collated batch yourself")
    if loader.device is not None and loader._unbatched:
        raise ValueError("device='cuda' copies batches: give a batch_size (batch_size=None hands out samples)")
    loader.pin_memory = loader.device is not None if pin_memory is None else bool(pin_memory)
    loader._pinned = None  # pin_memory=True, output="torch", no device
    if loader.device is None and pins_tensors(loader.pin_memory, loader.output):
        loader._pinned = PinnedBatches(batch_size)
    loader._feed = None  # the DeviceFeed of a CUDA loader (start_feed)


def start_feed(loader: Any, pipeline: Pipeline | None, field_dtype: Any, encoded: bool) -> Pipeline | None:
    """With a device: makes the feed (what the GPU finishes, and with decode="gpu" the
    nvJPEG decoder) and returns the part of `pipeline` the workers still run; without
    one, `pipeline` as it is."""
    if loader.device is None:
        return pipeline
    from . import _gpu_decode
    from ._device_feed import DeviceArrayFeed, split_for_device

    host, finish = split_for_device(pipeline, field_dtype, loader._device_dtype)
    if _gpu_decode.choose(loader.decode, loader.device, host, finish, encoded, workers=loader.num_workers):
        loader._jpeg = _gpu_decode.GpuJpeg(loader.device, host, finish, loader.seed, loader.on_error)
    if finish is None and loader._device_dtype is not None:
        raise ValueError("'dtype' is the type the GPU normalizes the images to: the transform must be a Pipeline "
                         "ending in Normalize (optionally Cast) on uint8 images")
    if loader.output == "torch":
        from ._torch_feed import TorchFeed

        loader._feed = TorchFeed(loader.device, finish, loader.pin_memory, loader.batch_size, loader._memory_format)
    elif loader._memory_format == "channels_last":
        raise ValueError("memory_format='channels_last' needs output='torch' (a DeviceArray is C-ordered)")
    else:
        loader._feed = DeviceArrayFeed(loader.device, finish, loader.pin_memory, loader.batch_size)
    loader._feed.jpeg = loader._jpeg
    return host
