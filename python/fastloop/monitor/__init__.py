"""fastloop.Monitor: background sampling of host and GPU metrics, and non-blocking logging
of your own scalars, histograms, images and text, written to CSV, JSON-lines, TensorBoard and
Python callbacks by a C writer thread -- so the training step never waits on I/O.

    with fastloop.Monitor(interval=30, sinks=[fastloop.CSVSink("m.csv"),
                                              fastloop.TensorBoardSink("runs/a")]) as mon:
        for step in range(steps):
            mon.scalar("loss", loss, step)      # ~0.2 us, no I/O, any thread
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Union

import numpy as np

from .. import _lifecycle
from .._core import Event, Metrics, Queue, _Monitor
from ..errors import SinkError

_log = logging.getLogger("fastloop")

__all__ = ["Monitor", "CSVSink", "JSONLSink", "TensorBoardSink", "CallbackSink"]

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class CSVSink:
    """Writes one CSV row per record (creating the file's directory), under the header
    ``wall_time,step,name,value,kind,source`` (written once; an existing file is appended to).

    >>> fastloop.Monitor(sinks=[fastloop.CSVSink("runs/a/metrics.csv")])
    """

    path: PathLike


@dataclass(frozen=True)
class JSONLSink:
    """Writes one JSON object per line (creating the file's directory): wall_time, step,
    name, value, kind, source (NaN/Infinity as Python's json writes them).

    >>> fastloop.Monitor(sinks=[fastloop.JSONLSink("runs/a/metrics.jsonl")])
    """

    path: PathLike


@dataclass(frozen=True)
class TensorBoardSink:
    """Writes a TensorBoard event file (events.out.tfevents.*) in `logdir`, which
    ``tensorboard --logdir`` and EventAccumulator read. Scalars become scalar summaries
    (float32); markers are not written.

    >>> fastloop.Monitor(sinks=[fastloop.TensorBoardSink("runs/a")])
    """

    logdir: PathLike


@dataclass(frozen=True)
class CallbackSink:
    """Calls ``fn(event)`` for every record, on a Python thread of its own, so a slow
    callback (an alert, a webhook) never holds up the writer. Records arrive through a
    fastloop.Queue of `maxsize`; when the callback falls that far behind, new records skip
    it (counted). An exception from fn is raised as SinkError by the next Monitor call.

    >>> fastloop.Monitor(sinks=[fastloop.CallbackSink(lambda e: e.value > 10 and alert(e))])
    """

    fn: Callable[[Event], Any]
    maxsize: int = 65536


Sink = Union[CSVSink, JSONLSink, TensorBoardSink, CallbackSink]

_gpu_notice_given = False
_MAX_BINS = 1 << 20  # the writer allocates two doubles a bucket: a bound far past any chart
_HISTOGRAM, _IMAGE, _TEXT = 1, 2, 3  # fl_summary_kind


def _check_tag(tag: Any) -> None:
    if not isinstance(tag, str):
        raise TypeError(f"'tag' must be str, not {type(tag).__name__}")


def _to_numpy(value: Any) -> Any:
    """A NumPy view of a torch tensor (detached, on the CPU), else the value itself."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return value.float().numpy() if value.dtype == torch.bfloat16 else value.numpy()
    return value


def _numbers(values: Any, arg: str) -> np.ndarray:
    """`values` as a NumPy array of real numbers; TypeError naming `arg` otherwise."""
    try:
        array = np.asarray(_to_numpy(values))
    except (TypeError, ValueError) as error:
        raise TypeError(f"'{arg}' must be an array or a sequence of numbers: {error}") from None
    if array.dtype.kind not in "biuf":
        raise TypeError(f"'{arg}' must hold real numbers, not dtype {array.dtype}")
    return array


def _image_hwc(image: Any, layout: str | None) -> np.ndarray:
    """A C-contiguous uint8 HWC array from an HW/HWC/CHW image of uint8 or float in [0, 1]."""
    array = _numbers(image, "image")
    if layout not in (None, "HWC", "CHW"):
        raise ValueError(f"'layout' must be 'HWC', 'CHW' or None, not {layout!r}")
    if array.ndim == 2:
        array = array[:, :, None]
    elif array.ndim != 3:
        raise ValueError(f"'image' must be HW, HWC or CHW, not of shape {array.shape}")
    elif layout == "CHW" or (layout is None and array.shape[0] in (1, 3, 4) and array.shape[2] not in (1, 3, 4)):
        array = array.transpose(1, 2, 0)
    if array.shape[2] not in (1, 3, 4):
        raise ValueError(f"'image' must have 1, 3 or 4 channels, not shape {array.shape} "
                         "(layout HWC or CHW)")
    if array.dtype.kind == "f":
        if not (np.isfinite(array).all() and array.min(initial=0) >= 0 and array.max(initial=0) <= 1):
            raise ValueError("'image' of floats must hold values in [0, 1] (no NaN)")
        array = np.rint(array * 255).astype(np.uint8)
    elif array.dtype != np.uint8:
        raise TypeError(f"'image' must be uint8 or float in [0, 1], not dtype {array.dtype}")
    return np.ascontiguousarray(array)


def _gpu_notice(reason: str) -> None:
    """One notice per process that GPU metrics are unavailable, with the reason: logged at
    INFO level on the "fastloop" logger (information, not a warning: a host without a GPU
    is a normal place to run; mon.gpu_reason says it too)."""
    global _gpu_notice_given
    if not _gpu_notice_given:
        _gpu_notice_given = True
        _log.info("fastloop.Monitor: %s", reason)


class _CallbackThread:
    """Runs a CallbackSink's fn on each record taken from its queue, until it is closed."""

    def __init__(self, sink: CallbackSink, report: Callable[[str], None]) -> None:
        self.queue: Queue = Queue(maxsize=sink.maxsize)
        self.fn = sink.fn
        self.report = report
        self.failed = False
        self.thread = threading.Thread(target=self._run, name="fastloop-callback", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for event in self.queue:  # ends when the queue is closed and drained
            try:
                self.fn(event)
            except Exception as error:
                if not self.failed:  # report the first failure; keep delivering
                    self.failed = True
                    self.report(f"callback {getattr(self.fn, '__qualname__', self.fn)!s} "
                                f"raised {type(error).__name__}: {error}")

    def stop(self, timeout: float | None) -> None:
        """Ends the stream and waits for fn to take the rest -- unless fn itself is closing
        the Monitor (or a __del__ the collector runs on this thread): it cannot wait for
        itself, and the thread ends once fn returns."""
        self.queue.close()
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout)


class Monitor:
    """Samples host metrics (RSS, CPU %, available memory), every GPU's memory and
    utilization (NVML, else nvidia-smi, else a one-time notice), and watched Metrics on a C
    thread -- once at start, then every `interval` seconds (0: never) -- and writes those and
    your own records (scalars; histograms, images and text for TensorBoard) to `sinks` from
    another C thread, flushing every `flush_interval` seconds and at close.

    Queue-full policy: sampled records that find the queue full are dropped; your scalar()
    and event() calls wait up to `record_wait` seconds (GIL released) and are then dropped.
    Both counts are in stats() and are written as the metric ``monitor/dropped``.
    Sampled records carry the step of your latest record; `start_step` is the step they
    carry before your first one (a resumed run passes the step it resumes from).
    A failing sink (disk full, permission denied, a callback raising) is reported as
    SinkError by the next scalar()/event()/flush() call or by close() -- never swallowed.

        with fastloop.Monitor(interval=10, sinks=[fastloop.CSVSink("m.csv")]) as mon:
            mon.scalar("loss", 0.37, step=100)
    """

    def __init__(
        self,
        interval: float = 30.0,
        sinks: Iterable[Sink] = (),
        *,
        flush_interval: float = 5.0,
        host: bool = True,
        gpu: bool = True,
        metrics: Metrics | None = None,
        queue_size: int = 65536,
        record_wait: float = 0.01,
        start_step: int = 0,
    ) -> None:
        sinks = list(sinks)
        self._callbacks: list[_CallbackThread] = []
        specs: list[tuple[str, Any]] = []
        for sink in sinks:
            if isinstance(sink, CSVSink):
                specs.append(("csv", os.fspath(sink.path)))
            elif isinstance(sink, JSONLSink):
                specs.append(("jsonl", os.fspath(sink.path)))
            elif isinstance(sink, TensorBoardSink):
                specs.append(("tensorboard", os.fspath(sink.logdir)))
            elif isinstance(sink, CallbackSink):
                callback = _CallbackThread(sink, self._report)
                self._callbacks.append(callback)
                specs.append(("queue", callback.queue))
            else:
                raise TypeError(f"sinks must be CSVSink, JSONLSink, TensorBoardSink or CallbackSink, "
                                f"not {type(sink).__name__}")
        if interval < 0:
            raise ValueError(f"'interval' must be >= 0 (0: no sampling), not {interval}")
        try:
            self._core = _Monitor(
                specs, interval=interval, flush_interval=flush_interval, queue_size=queue_size,
                host=host, gpu=gpu, nvml_library=os.environ.get("FASTLOOP_NVML_LIBRARY"),
                smi_command=os.environ.get("FASTLOOP_NVIDIA_SMI"), record_wait=record_wait,
                start_step=start_step,
            )
        except BaseException:
            for callback in self._callbacks:
                callback.stop(timeout=1.0)
            raise
        self._closed = False
        self.scalar = self._core.scalar  # the C methods directly: no Python frame per call
        self.event = self._core.event
        if gpu and interval > 0 and self._core.gpu_source == "none":
            _gpu_notice(self._core.gpu_reason)
        if metrics is not None:
            self.attach(metrics)
        _lifecycle.register(self)

    def scalar(self, name: str, value: float, step: int | None = None) -> None:  # replaced per instance
        """Queue a scalar record (no I/O; safe from any thread). step=None uses the latest
        step given to any record, so samples and scalars line up.

        >>> mon.scalar("loss", 0.37, step=100)
        """
        self._core.scalar(name, value, step)

    def scalars(self, values: Mapping[str, float], step: int | None = None) -> None:
        """Queue one scalar record per item of `values` (name -> number), all at `step`.

        >>> mon.scalars({"train/loss": 0.37, "train/lr": 1e-3}, step=100)
        """
        if not isinstance(values, Mapping):
            raise TypeError(f"'values' must be a mapping of names to numbers, not {type(values).__name__}")
        scalar = self._core.scalar
        for name, value in values.items():
            if not isinstance(name, str):
                raise TypeError(f"'values' keys must be str, not {type(name).__name__} ({name!r})")
            try:
                scalar(name, value, step)
            except TypeError as error:
                if "'value'" not in str(error):
                    raise
                raise TypeError(f"'values'[{name!r}] must be a real number, not {type(value).__name__}") from None

    def histogram(self, tag: str, values: Any, step: int | None = None, bins: int = 30) -> None:
        """Queue a histogram of `values` (an array, a tensor or a sequence of numbers; NaNs
        left out) in `bins` equal-width buckets; the writer thread bins and encodes it.
        TensorBoard sinks only.

        >>> mon.histogram("layer1/weight", model[0].weight, step=100)
        """
        _check_tag(tag)
        if isinstance(bins, bool) or not isinstance(bins, int):
            raise TypeError(f"'bins' must be an int, not {type(bins).__name__}")
        if not 1 <= bins <= _MAX_BINS:
            raise ValueError(f"'bins' must be >= 1 and <= {_MAX_BINS}, not {bins}")
        array = _numbers(values, "values")
        data = np.ascontiguousarray(array, dtype=np.float64).reshape(-1)
        if data.size == 0:
            raise ValueError(f"'values' of histogram {tag!r} is empty: a histogram needs at least one number "
                             f"(SummaryWriter.add_histogram raises too)")
        if np.isnan(data[0]) and np.isnan(data).all():  # the first value decides, but for a NaN
            raise ValueError(f"'values' of histogram {tag!r} are all NaN: a histogram needs at least one number "
                             f"(SummaryWriter.add_histogram raises too)")
        self._core.summary(_HISTOGRAM, tag, data, step, bins, 0, 0, 0)

    def image(self, tag: str, image: Any, step: int | None = None, layout: str | None = None) -> None:
        """Queue an image: uint8 (0-255) or float (0.0-1.0) values, HWC or CHW (1, 3 or 4
        channels; `layout` "HWC"/"CHW" when the shape is ambiguous) or HW (gray). It is
        PNG-encoded by the writer thread (zlib), off the training thread. TensorBoard sinks
        only.

        >>> mon.image("samples/0", batch[0], step=100)       # CHW float in [0, 1]
        """
        _check_tag(tag)
        hwc = _image_hwc(image, layout)
        self._core.summary(_IMAGE, tag, hwc, step, 0, *hwc.shape)

    def text(self, tag: str, text: str, step: int | None = None) -> None:
        """Queue a text record (TensorBoard's Text tab renders it as Markdown) under the tag
        ``<tag>/text_summary``, as torch's SummaryWriter.add_text writes it. TensorBoard sinks
        only.

        >>> mon.text("config", "lr=1e-3, batch=256", step=0)
        """
        _check_tag(tag)
        if not isinstance(text, str):
            raise TypeError(f"'text' must be str, not {type(text).__name__}")
        self._core.summary(_TEXT, tag, text.encode(), step, 0, 0, 0, 0)

    def event(self, name: str, step: int | None = None, value: float = 0.0) -> None:  # replaced per instance
        """Queue a marker record (epoch end, checkpoint written, ...); TensorBoard skips it.

        >>> mon.event("epoch_end", step=1000)
        """
        self._core.event(name, step, value)

    def attach(self, source: Metrics | Any) -> None:
        """Sample a fastloop.Metrics (or anything with a ``metrics`` attribute, such as a
        Loader) every interval, as ``<name>/per_s`` and ``<name>/mean``.

        >>> mon.attach(metrics)   # metrics.add("samples", 256) -> samples/per_s
        """
        metrics = source if isinstance(source, Metrics) else getattr(source, "metrics", None)
        if metrics is None:  # a Loader: its live counters (stats() is their snapshot)
            metrics = getattr(source, "_metrics", None)
        if not isinstance(metrics, Metrics):
            raise TypeError(f"attach() takes a fastloop.Metrics or an object with one in .metrics, "
                            f"not {type(source).__name__}")
        self._core.watch(metrics)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every record queued so far is written by every file sink (and handed
        to the callbacks). Returns False when `timeout` passed first.

        >>> mon.flush(timeout=5)
        True
        """
        return self._core.flush(timeout)

    def close(self, wait: bool = True) -> None:
        """Stop sampling, write what is queued, flush and close the sinks. With wait=False
        returns at once (the writer finishes in the background; exit still waits for it).
        Raises SinkError for a sink error not reported yet. Any number of threads may call
        it, at once too; each call with wait returns once everything is written.

        >>> mon.close()
        """
        self._closed = True
        if not wait:
            self._core.close(wait=False)
            _lifecycle.draining(self)
            return
        try:
            self._core.close(wait=True)
        finally:  # a SinkError from it still leaves the callbacks done when close() returns
            for callback in self._callbacks:
                callback.stop(timeout=None)
        error = self._core.take_error()
        if error is not None:
            raise SinkError(error)

    def _report(self, message: str) -> None:
        self._core.report_error(message)

    def _close_at_exit(self, deadline: float) -> None:
        import time

        self._core.close(wait=False)
        self._core.wait_closed(max(0.0, deadline - time.monotonic()))
        for callback in self._callbacks:
            callback.stop(timeout=max(0.0, deadline - time.monotonic()))

    def stats(self) -> dict[str, int]:
        """Records written; sampled and own records dropped; sampling rounds done.

        >>> mon.stats()["dropped_records"]
        0
        """
        return self._core.stats()

    @property
    def gpu_source(self) -> str:
        """How GPUs are read: 'nvml', 'nvidia-smi' or 'none' (see gpu_reason)."""
        return self._core.gpu_source

    @property
    def gpu_reason(self) -> str:
        """A sentence on how GPUs are read, or why they are not."""
        return self._core.gpu_reason

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<fastloop.Monitor {'closed' if self._closed else 'running'} gpu={self.gpu_source}>"
