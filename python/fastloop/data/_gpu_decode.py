"""Loader(decode="gpu"): JPEGs decoded by nvJPEG on the GPU, the workers only reading files.

The C workers stage every image (csrc/data/fl_gpu_stage.h): the JPEG bytes with the crop
drawn and the resampling tables computed as the CPU path would, or, for an image nvJPEG
cannot take (progressive, CMYK, 12-bit, PNG, a bad header, too big for its entry), the CPU
path's finished pixels. On the consumer's side the CUDA decoder (fastloop._cuda.JpegDecoder)
decodes each batch's JPEG rectangles with nvJPEG (the hardware engine of A100/H100/H200
where the image suits it, its CUDA decoder otherwise), resizes them with the CPU path's
antialiased bilinear arithmetic, flips, normalizes, lays out and casts in one kernel on the
loader's stream. An image nvJPEG refuses there is decoded on the CPU here instead, so one
image never fails a batch; its errors are the CPU path's (on_error respected).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# One staged entry's head (fl_gpu_record): routes, reasons and the rectangle to decode.
RECORD = np.dtype([("route", "<i4"), ("reason", "<i4"), ("flip", "<i4"), ("image_h", "<u4"), ("image_w", "<u4"),
                   ("x0", "<u4"), ("y0", "<u4"), ("rect_w", "<u4"), ("rect_h", "<u4"), ("taps_x", "<u4"),
                   ("taps_y", "<u4"), ("length", "<u4"), ("tables_at", "<u4"), ("reserved", "<u4"), ("id", "<i8")])
RECORD_BYTES = 64
ROUTES = ("hardware", "cuda", "cpu")  # fl_gpu_route
REASONS = ("", "not a JPEG", "header did not parse", "progressive, CMYK, 12-bit or the like",
           "subsampling the engine cannot take", "too big for its entry")  # fl_gpu_reason
# Payload bytes per staged image: the JPEG plus its tables (an ImageNet JPEG is ~110 KB on
# average); a bigger one is decoded by the worker on the CPU instead. Raised to hold the
# decoded output where that is larger.
CAPACITY = 256 << 10
DECODES = ("cpu", "gpu", "auto")


def records(entries: np.ndarray) -> np.ndarray:
    """The records of a batch of staged entries ((n, entry_bytes) uint8): a structured view."""
    return np.ascontiguousarray(entries[:, :RECORD_BYTES]).view(RECORD).reshape(len(entries))


def payload(entries: np.ndarray, i: int) -> np.ndarray:
    """Entry i's payload bytes (a view)."""
    return entries[i, RECORD_BYTES:]


def unavailable_reason(device: int | None, pipeline: Any, finish: Any, encoded: bool) -> str | None:
    """Why decode="gpu" cannot run for this Loader, or None when it can."""
    if device is None:
        return "decode='gpu' decodes on a CUDA device: pass device='cuda'"
    if not encoded:
        return "decode='gpu' decodes image sources (ImageFolder, Images, TarShards)"
    if pipeline is None or pipeline.geometry is None:
        return ("decode='gpu' needs a Pipeline starting with RandomResizedCrop(size), Resize((h, w)) or "
                "Resize(size) + CenterCrop(size)")
    from .ops import RandomHFlip

    others = [type(step).__name__ for step in pipeline._rest if not isinstance(step, RandomHFlip)]
    if others:  # pipeline: the workers' part, without the Normalize the GPU runs
        return f"decode='gpu' runs RandomHFlip and Normalize after the resize on the GPU, not {', '.join(others)}"
    if finish is None:
        return "decode='gpu' needs the Pipeline to end in Normalize (the GPU normalizes what it decodes)"
    from .. import cuda

    answer = cuda.is_available()
    if not answer:
        return f"decode='gpu' needs fastloop's CUDA extension: {answer.reason}"
    try:
        cuda.load_nvjpeg()
    except Exception as error:  # CudaUnavailable naming every file tried and the fix
        return str(error)
    return None


def choose(decode: str, device: int | None, pipeline: Any, finish: Any, encoded: bool) -> bool:
    """True to decode on the GPU: always for "gpu" (ValueError saying why it cannot), where
    it can for "auto", never for "cpu"."""
    if decode not in DECODES:
        raise ValueError(f"'decode' must be 'cpu', 'gpu' or 'auto', not {decode!r}")
    if decode == "cpu":
        return False
    why = unavailable_reason(device, pipeline, finish, encoded)
    if why is not None and decode == "gpu":
        from ..errors import CudaUnavailable

        error = CudaUnavailable if "nvJPEG" in why or "CUDA" in why else ValueError
        raise error(why)
    return why is None


class GpuJpeg:
    """A loader's nvJPEG decoder: one staged batch into an output batch on the device, and
    the CPU path for the images nvJPEG refused there."""

    def __init__(self, device: int, pipeline: Any, finish: Any, seed: int, on_error: str) -> None:
        from .. import cuda

        self.module = cuda.require()
        self.decoder = self.module.JpegDecoder(device)
        self.device, self.finish, self.on_error = device, finish, on_error
        self.out_h, self.out_w = pipeline.fixed_size()
        self.geometry = pipeline.geometry
        self.flips = pipeline._core(3) if pipeline._rest else None
        self.seed = seed
        self.epoch_seed = 0

    def start_epoch(self, epoch: int) -> None:
        from .._core import _epoch_seed

        self.epoch_seed = _epoch_seed(self.seed, epoch)

    def decode(self, entries: np.ndarray, out_ptr: int, row_bytes: int, dtype: str, channels_first: bool,
               stream: Any) -> np.ndarray:
        """Queues the batch into out_ptr (rows of row_bytes); returns the rows to keep (all,
        unless on_error="skip" dropped an image neither nvJPEG nor the CPU could decode)."""
        f = self.finish
        failed = self.decoder.decode(entries, out_ptr=out_ptr, out_nbytes=row_bytes * len(entries), out_h=self.out_h,
                                     out_w=self.out_w, mean=f.mean, std=f.std, dtype=dtype,
                                     channels_first=channels_first, stream=stream)
        keep = np.ones(len(entries), bool)
        for i in np.flatnonzero(failed):
            keep[i] = self._decode_on_cpu(entries, int(i), out_ptr + int(i) * row_bytes, row_bytes, dtype,
                                          channels_first, stream)
        return keep

    def _decode_on_cpu(self, entries: np.ndarray, i: int, row_ptr: int, row_bytes: int, dtype: str,
                       channels_first: bool, stream: Any) -> bool:
        """The CPU path for image i (its decode, crop/resize, flips), normalized into its row;
        False when on_error="skip" drops it."""
        from .._core import _image_decode, _image_transform

        record = records(entries[i:i + 1])[0]
        data = payload(entries, i)[:int(record["length"])].tobytes()
        try:
            pixels = _image_transform(self.geometry, _image_decode(data), self.epoch_seed, int(record["id"]))
        except ValueError as error:
            if self.on_error == "skip":
                return False
            raise ValueError(f"sample {int(record['id'])}: {error}") from None
        if self.flips is not None:
            pixels = self.flips.run(pixels[None], self.epoch_seed, np.array([record["id"]], np.int64), 1)[0]
        layout = "HWC->CHW" if channels_first else "HWC"
        self.module.preprocess(np.ascontiguousarray(pixels[None]), mean=self.finish.mean, std=self.finish.std,
                               layout=layout, stream=stream, device=self.device, dtype=dtype,
                               _out_ptr=row_ptr, _out_nbytes=row_bytes)
        return True

    @property
    def decoded(self) -> dict:
        """Images decoded so far: {'hardware', 'cuda', 'cpu'} (cpu: by the workers)."""
        return self.decoder.decoded
