"""Loader(decode="gpu"): JPEGs decoded by nvJPEG on the GPU, the workers only reading files.

The C workers stage every image (csrc/data/fl_gpu_stage.h): the JPEG bytes with the crop
drawn and the resampling tables computed as the CPU path would, or, for an image nvJPEG
cannot take (progressive, CMYK, 12-bit, PNG, a bad header, too big for its entry), the CPU
path's finished pixels. On the consumer's side the CUDA decoder (fastloop._cuda.JpegDecoder)
decodes each batch's JPEG rectangles with nvJPEG (the hardware engine of A100/H100/H200
where the image suits it, asked per image; its fallback backend otherwise), resizes them with the CPU path's
antialiased bilinear arithmetic, flips, normalizes, lays out and casts in one kernel on the
loader's stream. An image nvJPEG refuses there is decoded on the CPU here instead, so one
image never fails a batch; its errors are the CPU path's (on_error respected).
"""

from __future__ import annotations

import functools
import os
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
# decode="auto" on a GPU without the hardware engine (cuda/fl_jpeg_plan.h, fl_jpeg_auto_gpu):
# nvJPEG's fallback backend runs its Huffman decoding on one host thread, so the GPU is picked
# only where FALLBACK_RATE > workers * CPU_RATE_PER_WORKER. Both are RandomResizedCrop(224)
# images/s on ImageNet-sized JPEGs: estimates, not yet measured (each can be set by the
# environment variable of the same name with a FASTLOOP_JPEG_ prefix).
CPU_RATE_PER_WORKER = 400.0
FALLBACK_RATE = 1500.0


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


def _rate(name: str, default: float) -> float:
    value = os.environ.get(f"FASTLOOP_JPEG_{name}")
    if value is None:
        return default
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"FASTLOOP_JPEG_{name} must be a number (images/s), not {value!r}") from None


@functools.lru_cache(maxsize=None)
def has_engine(device: int) -> bool:
    """Whether nvJPEG's hardware engine decodes on `device` (a decoder made once per device)."""
    from .. import cuda

    return bool(cuda.require().JpegDecoder(device).hardware)


def auto_prefers_gpu(engine: bool, workers: int | None) -> bool:
    """decode="auto"'s rule where the GPU can decode: the engine always; without it nvJPEG's
    fallback backend only where it outruns the workers (fl_jpeg_auto_gpu, FALLBACK_RATE >
    workers * CPU_RATE_PER_WORKER). workers None: as many as this machine has cores."""
    from .. import cuda

    count = (os.cpu_count() or 1) if workers is None else workers
    return bool(cuda._module()._jpeg_auto_gpu(engine, count, _rate("CPU_RATE_PER_WORKER", CPU_RATE_PER_WORKER),
                                               _rate("FALLBACK_RATE", FALLBACK_RATE)))


def choose(decode: str, device: int | None, pipeline: Any, finish: Any, encoded: bool,
           workers: int | None = None) -> bool:
    """True to decode on the GPU: always for "gpu" (ValueError saying why it cannot); for
    "auto" where it can and the engine is there, or nvJPEG's fallback backend outruns the
    `workers` (auto_prefers_gpu); never for "cpu"."""
    if decode not in DECODES:
        raise ValueError(f"'decode' must be 'cpu', 'gpu' or 'auto', not {decode!r}")
    if decode == "cpu":
        return False
    why = unavailable_reason(device, pipeline, finish, encoded)
    if why is not None and decode == "gpu":
        from ..errors import CudaUnavailable

        error = CudaUnavailable if "nvJPEG" in why or "CUDA" in why else ValueError
        raise error(why)
    if why is not None:
        return False
    assert device is not None
    return decode == "gpu" or auto_prefers_gpu(has_engine(device), workers)


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
        self.cpu_main = 0  # images nvJPEG refused in a batch, decoded here on the CPU

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
        self.cpu_main += 1
        layout = "HWC->CHW" if channels_first else "HWC"
        self.module.preprocess(np.ascontiguousarray(pixels[None]), mean=self.finish.mean, std=self.finish.std,
                               layout=layout, stream=stream, device=self.device, dtype=dtype,
                               _out_ptr=row_ptr, _out_nbytes=row_bytes)
        return True

    @property
    def decoded(self) -> dict:
        """Images decoded so far: {'hardware', 'fallback', 'cpu'} (cpu: by the workers)."""
        return self.decoder.decoded

    @property
    def decode_stats(self) -> dict:
        """Which decoder ran, for this loader so far (``loader._jpeg.decode_stats``):

        - hardware, fallback: images decoded by nvJPEG's hardware engine, by its fallback
          backend (hybrid/CUDA); cpu_workers: decoded by the workers (what nvJPEG cannot
          take), cpu_main: refused by nvJPEG in a batch and decoded here; cpu: both;
        - regions: engine images decoded as their crop's region only; refused: engine images
          nvjpegDecodeBatchedSupportedEx sent to the fallback; engine_errors, demotions;
        - has_engine, engine_on, regions_on; hardware_flags, fallback_flags (32: interpolated
          chroma upsampling), interpolation (both handles have it), nvjpeg_version.
        """
        stats = dict(self.decoder.stats)
        stats["cpu_main"] = self.cpu_main
        stats["cpu"] = stats["cpu_workers"] + self.cpu_main
        flags = [stats["fallback_flags"]] + ([stats["hardware_flags"]] if stats["has_engine"] else [])
        stats["interpolation"] = all(f & 32 for f in flags)
        return stats
