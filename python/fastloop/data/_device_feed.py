"""Loader batches onto a CUDA device: what the GPU finishes, and the feed that moves batches.

With ``Loader(..., device="cuda")`` the C workers stop at uint8: a Pipeline ending in
Normalize (and maybe Cast) runs everything before the Normalize in the workers (the fused
decode/crop/resize of image sources, crops, flips: the same code and the same random draws
as without a device), and the GPU normalizes, lays out and casts after the copy, so a
quarter of float32's bytes cross the bus and no CPU time goes to normalizing.

The feed pins each slot once (never a copy per batch), queues each batch's copy and kernel
on a loading stream of its own one batch ahead of the consumer (the copy of batch i+1
overlaps the step on batch i), and hands out fastloop.cuda.DeviceArrays (output="numpy")
or torch CUDA tensors (output="torch", _torch_feed.py) ordered after that stream.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from ..cuda._dtypes import DTYPES, dtype_name
from ._pinning import SlotPinner
from .ops import Cast, Normalize, Pipeline

MEMORY_FORMATS = ("contiguous", "channels_last")


@dataclass(frozen=True)
class GpuFinish:
    """What the GPU does to the first field after the copy: (x/255 - mean)/std per channel,
    the layout change of the Pipeline's Normalize, the cast to `dtype`."""

    mean: tuple[float, ...]  # one value, or one per channel
    std: tuple[float, ...]
    layout: str  # fastloop.cuda.preprocess's: "HWC->CHW", "CHW", "HWC", "CHW->HWC"
    dtype: str  # one of DTYPES

    @property
    def source_layout(self) -> str:
        return self.layout.split("->")[0]

    @property
    def channels_first(self) -> bool:
        """The batch comes out (N, C, H, W)."""
        return self.layout.endswith("CHW")


def memory_format_name(value: Any) -> str:
    """'contiguous' or 'channels_last' from a name or a torch memory format (None: contiguous)."""
    if value is None:
        return "contiguous"
    text = str(value).replace("torch.", "").replace("contiguous_format", "contiguous")
    if text not in MEMORY_FORMATS:
        raise ValueError(f"'memory_format' must be 'contiguous' or 'channels_last' (or torch's), not {value!r}")
    return text


def _values(v: Any) -> tuple[float, ...]:
    return tuple(float(x) for x in np.ravel(np.asarray(v, np.float64)))


def split_for_device(pipeline: Pipeline | None, field_dtype: Any,
                     dtype: str | None) -> tuple[Pipeline | None, GpuFinish | None]:
    """(what the C workers still run, what the GPU finishes) for `pipeline` on a first field
    of `field_dtype`: the trailing Normalize (and Cast to float16/float32) go to the GPU when
    everything before them keeps uint8; otherwise (None or no Normalize at the end, other
    dtypes) all of it stays on the CPU and its output is copied as it is. `dtype` (the
    Loader's) sets the GPU's output dtype; it must agree with a trailing Cast."""
    if pipeline is None or np.dtype(field_dtype) != np.uint8:
        return pipeline, None
    steps = list(pipeline.steps)
    cast = steps.pop() if steps and isinstance(steps[-1], Cast) else None
    if not steps or not isinstance(steps[-1], Normalize) or any(isinstance(s, (Normalize, Cast)) for s in steps[:-1]):
        return pipeline, None
    cast_dtype = dtype_name(np.dtype(cast.dtype).name, "Cast") if cast is not None and \
        np.dtype(cast.dtype) in (np.float16, np.float32) else None
    if cast is not None and cast_dtype is None:
        return pipeline, None  # a Cast to an integer type: the CPU's saturating cast
    if dtype is not None and cast_dtype is not None and dtype != cast_dtype:
        raise ValueError(f"the Pipeline casts to {cast_dtype} but the Loader was given dtype={dtype!r}")
    normalize = steps.pop()
    source = pipeline.layout
    layout = source
    if normalize.layout is not None:
        start, _, end = normalize.layout.rpartition("->")
        if start and start != source:
            raise ValueError(f"Normalize(layout={normalize.layout!r}) follows a step that yields {source} images")
        layout = source if end == source else f"{source}->{end}"
    finish = GpuFinish(_values(normalize.mean), _values(normalize.std), layout, dtype or cast_dtype or "float32")
    return (Pipeline(steps, layout=pipeline.layout) if steps else None), finish


class DeviceFeed:
    """Turns host batches (tuples of slot views) into device batches, one batch ahead; the
    subclasses say how a batch is uploaded and handed out."""

    def __init__(self, device: int, finish: GpuFinish | None, pin: bool, batch_size: int) -> None:
        self.device, self.finish, self.pin = device, finish, pin
        self.pinner = SlotPinner(batch_size, device=device) if pin else None
        self._stream: Any = None
        self.jpeg: Any = None  # _gpu_decode.GpuJpeg when field 0 holds staged images (decode="gpu")

    @property
    def stream(self) -> Any:
        """The loading stream, made on first use: worker processes fork at the first
        iteration, before this process has a CUDA context they could inherit."""
        if self._stream is None:
            self._stream = self._new_stream()
        return self._stream

    def _new_stream(self) -> Any:
        raise NotImplementedError

    def _pin(self, array: np.ndarray) -> None:
        if self.pinner is not None:
            self.pinner.pin(array)

    def upload(self, fields: tuple) -> tuple:
        raise NotImplementedError

    def hand_out(self, batch: tuple) -> tuple:
        return batch

    def image_shape(self, field: np.ndarray, channels_first: bool) -> tuple[int, int, int, int]:
        """The (n, c, h, w) or (n, h, w, c) shape of field 0 on the device: staged images
        (decode="gpu") have the pipeline's fixed size; others their own, in the finish's layout."""
        assert self.finish is not None
        if self.jpeg is not None:
            n, c, h, w = len(field), 3, self.jpeg.out_h, self.jpeg.out_w
        else:
            n, a, b, c_or_w = field.shape
            h, w, c = (a, b, c_or_w) if self.finish.source_layout == "HWC" else (b, c_or_w, a)
        return (n, c, h, w) if channels_first else (n, h, w, c)

    def decode_images(self, field: np.ndarray, out_ptr: int, itemsize: int, dtype: str, channels_first: bool,
                      stream: Any) -> np.ndarray:
        """Staged images decoded on the GPU into out_ptr; returns the rows kept (see GpuJpeg)."""
        self._pin(field)
        row_bytes = 3 * self.jpeg.out_h * self.jpeg.out_w * itemsize
        return self.jpeg.decode(field, out_ptr, row_bytes, dtype, channels_first, stream)

    # Host batches the feed may still hold when it takes the next one: the loader lends two
    # batches' slots and copies a third out (py_batch.h, fl_copy_out), so with the one taken
    # that makes two. The one held is the batch just queued, which is handed out next.
    MAX_HELD = 1

    def release_copied(self) -> None:
        """Lets go of the host batches whose copies are done, so their slots go back to the
        workers before the next batch is taken (a slot still held then would make the loader
        hand out a copy: it keeps slots for at most two lent batches)."""
        raise NotImplementedError

    def held(self) -> int:
        """Host batches whose copies may still read their slots."""
        raise NotImplementedError

    def wait_oldest(self) -> None:
        """Blocks until the oldest held batch's copies are done, and lets go of it."""
        raise NotImplementedError

    def make_room(self) -> None:
        """Before the next host batch is taken: lets go of the batches already copied, then,
        when the GPU is more than a batch behind, waits for the oldest copies rather than
        leave the loader to hand the next batch out as a copy into pageable memory (a memcpy
        of the whole batch in this thread, then an unpinned upload)."""
        self.release_copied()
        while self.held() > self.MAX_HELD:
            self.wait_oldest()

    def iterate(self, host_batches: Iterator[tuple], epoch: int = 0) -> Iterator[tuple]:
        """Yields device batches, the next one's copy queued before the current is handed out."""
        if self.jpeg is not None:
            self.jpeg.start_epoch(epoch)
        batches, pending = iter(host_batches), None
        while True:
            self.make_room()
            host = next(batches, None)
            if host is None:
                break
            queued = self.upload(tuple(host))
            del host  # the feed holds the host fields only until their copies are done
            if pending is not None:
                yield self.hand_out(pending)
            pending = queued
        if pending is not None:
            yield self.hand_out(pending)

    def synchronize(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Waits for queued copies, then unpins the slots."""
        self.synchronize()
        if self.pinner is not None:
            self.pinner.close()


class DeviceArrayFeed(DeviceFeed):
    """output="numpy": fastloop.cuda.DeviceArrays, each carrying the loading stream in
    __cuda_array_interface__/__dlpack__ (consumers wait for it on their own stream) and
    keeping its slot lent until its copy is done."""

    def __init__(self, device: int, finish: GpuFinish | None, pin: bool, batch_size: int) -> None:
        from .. import cuda

        self.cuda = cuda
        cuda.require()
        if finish is not None and finish.dtype == "bfloat16":
            raise ValueError("dtype='bfloat16' needs output='torch' (a DeviceArray holds NumPy dtypes)")
        super().__init__(device, finish, pin, batch_size)
        self.in_flight: collections.deque = collections.deque()  # batches whose arrays still read their slot

    def _new_stream(self) -> Any:
        return self.cuda.Stream(self.device)

    def release_copied(self) -> None:
        # ready() settles an array whose write is done: it drops the slot view it kept
        while self.in_flight and all(array.ready() for array in self.in_flight[0]):
            self.in_flight.popleft()

    def held(self) -> int:
        return len(self.in_flight)

    def wait_oldest(self) -> None:
        for array in self.in_flight.popleft():
            array.synchronize()  # settles it: the slot view it kept goes

    def upload(self, fields: tuple) -> tuple:
        out = []
        for i, field in enumerate(fields):
            if i == 0 and self.jpeg is not None:
                out.append(self._decode(field))
                continue
            self._pin(field)
            if i == 0 and self.finish is not None:
                f = self.finish
                out.append(self.cuda.preprocess(field, mean=f.mean, std=f.std, layout=f.layout, dtype=f.dtype,
                                                stream=self.stream, device=self.device))
            else:
                out.append(self.cuda.to_device(field, self.device, stream=self.stream))
        self.in_flight.append(tuple(out))
        return tuple(out)

    def _decode(self, field: np.ndarray) -> Any:
        f = self.finish
        out = self.cuda.empty(self.image_shape(field, f.channels_first), f.dtype, self.device)
        keep = self.decode_images(field, out.ptr, out.dtype.itemsize, f.dtype, f.channels_first, self.stream)
        if not keep.all():
            raise ValueError("on_error='skip' drops undecodable images from torch batches only (output='torch'); "
                             "with DeviceArrays the batch keeps its size: use on_error='raise'")
        # the staged entries are read by queued work: the array keeps them until it is settled
        return out._queued(self.stream, field)

    def synchronize(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
        self.in_flight.clear()

    def close(self) -> None:
        super().close()
        self.cuda._empty_cache(self.device)  # the device blocks its dropped batches left for reuse
