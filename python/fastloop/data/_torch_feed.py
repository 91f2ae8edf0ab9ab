"""Loader batches as torch tensors on a GPU, or pinned on the host for the user's own copy.

TorchFeed (``Loader(device="cuda", output="torch")``): each batch's output tensors come from
torch's caching allocator on the loader's own stream; fastloop's kernel (or, without
fastloop's CUDA extension, torch ops) writes the normalized first field into them, torch
copies the other fields from the pinned slots, and at hand-out the consumer's current stream
waits for the loading stream and the tensors are marked as used on it (record_stream), so
`for x, y in loader: loss = model(x)` needs nothing more and memory is not reused early.

PinnedBatches (``pin_memory=True, output="torch"`` without a device): the slots are pinned
once and batches are tensors over them, ready for ``.to("cuda", non_blocking=True)``. A slot
goes back to the workers only after the copies queued from it are done: when a batch's
tensor is dropped, an event is recorded on the current stream (where such copies run), and
the slot is held until it completes.
"""

from __future__ import annotations

import collections
from typing import Any, Callable

import numpy as np

from ._device_feed import DeviceFeed, GpuFinish
from ._pinning import SlotPinner


def require_torch_cuda(device: int) -> Any:
    """torch, after checking it sees CUDA device `device` (CudaUnavailable saying why not)."""
    from ..errors import CudaUnavailable
    from ._torch_interop import import_torch_for_output

    torch = import_torch_for_output()
    if not torch.cuda.is_available():
        raise CudaUnavailable(f"device='cuda' with output='torch' needs torch with CUDA: torch {torch.__version__} "
                              "sees no CUDA device")
    if device >= torch.cuda.device_count():
        raise ValueError(f"'device' cuda:{device} does not exist: torch sees {torch.cuda.device_count()} device(s)")
    return torch


class TorchFeed(DeviceFeed):
    """output="torch" with a device: torch CUDA tensors ordered after the loading stream."""

    def __init__(self, device: int, finish: GpuFinish | None, pin: bool, batch_size: int,
                 memory_format: str) -> None:
        from .. import cuda

        self.torch = require_torch_cuda(device)
        self.kernel = cuda.is_available()  # fastloop's kernel; else the same math in torch ops
        super().__init__(device, finish, pin, batch_size)
        self.channels_last = memory_format == "channels_last"
        if self.channels_last and (finish is None or not finish.channels_first):
            raise ValueError("memory_format='channels_last' lays out (N, C, H, W) image batches: it needs a "
                             "Pipeline ending in Normalize to CHW (e.g. Normalize(mean, std, layout='HWC->CHW'))")
        self.in_flight: collections.deque = collections.deque()  # (event, host fields) until copied
        self.normalize = TorchNormalize(self.torch, finish) if finish is not None else None

    def _new_stream(self) -> Any:
        return self.torch.cuda.Stream(self.device)

    def release_copied(self) -> None:
        while self.in_flight and self.in_flight[0][0].query():
            self.in_flight.popleft()

    def held(self) -> int:
        return len(self.in_flight)

    def wait_oldest(self) -> None:
        event, _ = self.in_flight[0]
        event.synchronize()  # the loading stream's work up to that batch; not the consumer's steps
        self.in_flight.popleft()

    def _image_out(self, field: np.ndarray) -> Any:
        """The empty output tensor of the first field, in the finish's dtype and layout."""
        f, torch = self.finish, self.torch
        assert f is not None
        memory = torch.channels_last if self.channels_last else torch.contiguous_format
        return torch.empty(self.image_shape(field, f.channels_first), dtype=getattr(torch, f.dtype),
                           device=f"cuda:{self.device}", memory_format=memory)

    def _finish_image(self, field: np.ndarray) -> Any:
        from .. import cuda

        out = self._image_out(field)
        if self.kernel:
            cuda.preprocess(field, mean=self.finish.mean, std=self.finish.std, layout=self.finish.layout,
                            out=out, stream=self.stream, device=self.device)
        else:
            self.normalize(field, out)
        return out

    def _decode_images(self, field: np.ndarray) -> tuple[Any, np.ndarray]:
        """Staged images decoded by nvJPEG into a new output tensor; and the rows kept."""
        out = self._image_out(field)
        channels_first = self.finish.channels_first and not self.channels_last  # channels_last: NHWC memory
        keep = self.decode_images(field, out.data_ptr(), out.element_size(), self.finish.dtype, channels_first,
                                  self.stream)
        return out, keep

    def upload(self, fields: tuple) -> tuple:
        """Queues the batch on the loading stream; returns (tensors, the event after them)."""
        torch, out = self.torch, []
        with torch.cuda.stream(self.stream):
            keep = None
            for i, field in enumerate(fields):
                if i == 0 and self.jpeg is not None:
                    images, keep = self._decode_images(field)
                    out.append(images if keep.all() else images[torch.from_numpy(keep).to(images.device)])
                    continue
                if keep is not None and not keep.all():  # on_error="skip" dropped an image: its row everywhere
                    field = field[keep]
                self._pin(field)
                if i == 0 and self.finish is not None:
                    out.append(self._finish_image(field))
                else:
                    out.append(torch.from_numpy(field).to(f"cuda:{self.device}", non_blocking=True))
            event = torch.cuda.Event()
            event.record(self.stream)
        self.in_flight.append((event, fields))
        return tuple(out), event

    def hand_out(self, queued: tuple) -> tuple:
        batch, event = queued
        current = self.torch.cuda.current_stream(self.device)
        current.wait_event(event)  # this batch's copies and kernel, not the next one's queued since
        for tensor in batch:
            tensor.record_stream(current)  # its memory is not reused before the step using it ends
        return batch

    def synchronize(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
        self.in_flight.clear()


class TorchNormalize:
    """The kernel's math in torch ops on the current stream (without fastloop's CUDA
    extension): the uint8 copy, then x * (1/255/std) + (-mean/std) in float32 per channel,
    laid out and cast into `out`. The per-channel scale and shift are made once per device
    and dtype, not per batch (each would be a small upload and two kernels)."""

    def __init__(self, torch: Any, finish: GpuFinish) -> None:
        self.torch, self.finish = torch, finish
        self.constants: dict[tuple[str, Any], tuple[Any, Any]] = {}

    def scale_and_shift(self, device: Any, dtype: Any) -> tuple[Any, Any]:
        """(1/255/std, -mean/std) as (1, C, 1, 1) tensors of `dtype` on `device`."""
        key = (str(device), dtype)
        if key not in self.constants:
            torch, f = self.torch, self.finish
            mean = torch.tensor(f.mean, dtype=dtype, device=device).reshape(1, -1, 1, 1)
            std = torch.tensor(f.std, dtype=dtype, device=device).reshape(1, -1, 1, 1)
            self.constants[key] = ((1.0 / 255.0) / std, -mean / std)
        return self.constants[key]

    def __call__(self, field: np.ndarray, out: Any) -> None:
        torch, f = self.torch, self.finish
        x = torch.from_numpy(field).to(out.device, non_blocking=True)
        if f.source_layout == "HWC":
            x = x.permute(0, 3, 1, 2)  # logical (N, C, H, W)
        scale, shift = self.scale_and_shift(out.device, torch.float32)
        y = torch.addcmul(shift, x.float(), scale)
        out.copy_(y if f.channels_first else y.permute(0, 2, 3, 1))


class _ReleaseGuard:
    """Keeps one pinned batch field (and so its slot) until the copies from it are done:
    NumPy's base of the array torch wraps, so it dies with the last tensor over the field."""

    def __init__(self, field: np.ndarray, owner: "PinnedBatches") -> None:
        self.field, self.owner = field, owner
        self.__array_interface__ = field.__array_interface__

    def __del__(self) -> None:
        self.owner._dropped(self.field)


class PinnedBatches:
    """pin_memory=True, output="torch", no device: tensors over pinned slots, never a copy."""

    def __init__(self, batch_size: int, torch: Any = None, register: Any = None) -> None:
        if torch is None:
            import torch
        self.torch = torch
        self.pinner = SlotPinner(batch_size, register)
        self.held: collections.deque = collections.deque()  # (event, field) until copies from it end

    def _dropped(self, field: np.ndarray) -> None:
        """A batch field's last tensor is gone: hold it until what is queued on the current
        stream (the user's non_blocking copies) has passed."""
        try:
            event = self.torch.cuda.Event()
            event.record(self.torch.cuda.current_stream())
        except Exception:  # interpreter shutdown, no CUDA context any more: nothing to wait for
            return
        self.held.append((event, field))

    def release_copied(self) -> None:
        """Lets go of fields whose copies are done."""
        while self.held and self.held[0][0].query():
            self.held.popleft()

    def make_room(self, lent: Callable[[], int]) -> None:
        """Before the Loader takes a batch (`lent`: the loader's slots lent now): lets go of
        the fields already copied, then, while more than one slot is lent and some are held
        here, waits for the oldest copies. The loader lends two slots and copies a third
        batch out, into pageable memory that the user's non_blocking copy would then read
        synchronously: a GPU running behind should slow the loop instead."""
        self.release_copied()
        while self.held and lent() > 1:
            self.held[0][0].synchronize()
            self.held.popleft()

    def tensors(self, arrays: tuple) -> tuple:
        out = []
        for array in arrays:
            if self.pinner.pin(array):  # a slot view: pinned once, guarded until copied
                array = np.asarray(_ReleaseGuard(array, self))
            out.append(self.torch.from_numpy(array))
        return tuple(out)

    def close(self) -> None:
        """Waits for the held copies, then unpins the slots."""
        for event, _ in self.held:
            event.synchronize()
        self.held.clear()
        self.pinner.close()

