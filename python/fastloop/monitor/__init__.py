"""fastloop.Monitor: background sampling of host and GPU metrics, and non-blocking logging
of your own scalars, histograms, images and text, written to CSV, JSON-lines, TensorBoard and
Python callbacks by a C writer thread -- so the training step never waits on I/O.

    with fastloop.Monitor(interval_s=30, sinks=[fastloop.CSVSink("m.csv"),
                                              fastloop.TensorBoardSink("runs/a")]) as mon:
        for step in range(steps):
            mon.scalar("loss", loss, step)      # ~0.2 us, no I/O, any thread
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Union

import numpy as np

from .. import _lifecycle
from .._core import Event, Metrics, Queue, _Monitor
from ..errors import Closed, SinkError

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


def _check_name(name: Any) -> None:
    if not isinstance(name, str):
        raise TypeError(f"'name' must be str, not {type(name).__name__}")


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


def _flat_numbers(stats: Mapping[str, Any], prefix: str, out: dict[str, float | int]) -> dict[str, float | int]:
    """The numbers of a stats() dict by ``<prefix>/<key>`` (a nested dict's as
    ``<prefix>/<key>/<subkey>``); other values (strings, None) are left out."""
    for key, value in stats.items():
        name = f"{prefix}/{key}"
        if isinstance(value, Mapping):
            _flat_numbers(value, name, out)
        elif isinstance(value, (int, float, np.integer, np.floating)):
            out[name] = value
    return out


class _StatsSource:
    """An attached object with stats(): its numbers each round, and its integer counts' rates
    (the change per second since the previous round)."""

    def __init__(self, source: Any, name: str, first: Mapping[str, Any]) -> None:
        self.source = source
        self.name = name
        self.failed = False
        self.previous = _flat_numbers(first, name, {})
        self.previous_time = time.monotonic()

    def read(self) -> Mapping[str, Any]:
        stats = self.source.stats()
        if not isinstance(stats, Mapping):
            raise TypeError(f"stats() returned {type(stats).__name__}, not a dict")
        return stats

    def sample(self, stats: Mapping[str, Any], put: Callable[[str, float], None], rates: bool) -> None:
        now = time.monotonic()
        current = _flat_numbers(stats, self.name, {})
        elapsed = now - self.previous_time
        for name, value in current.items():
            put(name, float(value))
            before = self.previous.get(name)
            counts = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
            if rates and counts and before is not None and elapsed > 0:
                put(f"{name}/per_s", (value - before) / elapsed)
        self.previous, self.previous_time = current, now


class Monitor:
    """Samples host metrics (RSS, CPU %, available memory), every GPU's memory and
    utilization (NVML, else nvidia-smi, else a one-time notice), and watched Metrics on a C
    thread -- once at start, then every `interval_s` seconds (0: never) -- and writes those and
    your own records (scalars; histograms, images and text for TensorBoard) to `sinks` from
    another C thread, flushing every `flush_interval_s` seconds and at close. Objects with a
    stats() method (a Loader, a Checkpointer) are sampled too: see attach().

    Queue-full policy: sampled records that find the queue full are dropped; your scalar()
    and event() calls wait up to `record_wait_s` seconds (GIL released) and are then dropped.
    Both counts are in stats() and are written as the metric ``monitor/dropped``.
    Sampled records carry the step of your latest record; `start_step` is the step they
    carry before your first one (a resumed run passes the step it resumes from).
    A failing sink (disk full, permission denied, a callback raising) is reported as
    SinkError by the next scalar()/event()/flush() call or by close() -- never swallowed.

        with fastloop.Monitor(interval_s=10, sinks=[fastloop.CSVSink("m.csv")]) as mon:
            mon.scalar("loss", 0.37, step=100)
    """

    def __init__(
        self,
        interval_s: float = 30.0,
        sinks: Iterable[Sink] = (),
        *,
        flush_interval_s: float = 5.0,
        host: bool = True,
        gpu: bool = True,
        metrics: Metrics | Any = None,  # as attach(metrics): a Metrics or an object with stats()
        queue_size: int = 65536,
        record_wait_s: float = 0.01,
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
        if interval_s < 0:
            raise ValueError(f"'interval_s' must be >= 0 (0: no sampling), not {interval_s}")
        try:
            self._core = _Monitor(
                specs, interval_s=interval_s, flush_interval_s=flush_interval_s, queue_size=queue_size,
                host=host, gpu=gpu, nvml_library=os.environ.get("FASTLOOP_NVML_LIBRARY"),
                smi_command=os.environ.get("FASTLOOP_NVIDIA_SMI"), record_wait_s=record_wait_s,
                start_step=start_step,
            )
        except BaseException:
            for callback in self._callbacks:
                callback.stop(timeout=1.0)
            raise
        self._closed = False
        self._interval_s = interval_s
        self._stats_sources: list[_StatsSource] = []
        self._stats_lock = threading.Lock()  # guards _stats_sources and _stats_thread
        self._stats_thread: threading.Thread | None = None
        self._stop_sampling = threading.Event()
        self.scalar = self._core.scalar  # the C methods directly: no Python frame per call
        self.event = self._core.event
        if gpu and interval_s > 0 and self._core.gpu_source == "none":
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

    def histogram(self, name: str, values: Any, step: int | None = None, bins: int = 30) -> None:
        """Queue a histogram of `values` (an array, a tensor or a sequence of numbers; NaNs
        left out) in `bins` equal-width buckets; the writer thread bins and encodes it.
        TensorBoard sinks only.

        >>> mon.histogram("layer1/weight", model[0].weight, step=100)
        """
        _check_name(name)
        if isinstance(bins, bool) or not isinstance(bins, int):
            raise TypeError(f"'bins' must be an int, not {type(bins).__name__}")
        if not 1 <= bins <= _MAX_BINS:
            raise ValueError(f"'bins' must be >= 1 and <= {_MAX_BINS}, not {bins}")
        array = _numbers(values, "values")
        data = np.ascontiguousarray(array, dtype=np.float64).reshape(-1)
        if data.size == 0:
            raise ValueError(f"'values' of histogram {name!r} is empty: a histogram needs at least one number "
                             f"(SummaryWriter.add_histogram raises too)")
        if np.isnan(data[0]) and np.isnan(data).all():  # the first value decides, but for a NaN
            raise ValueError(f"'values' of histogram {name!r} are all NaN: a histogram needs at least one number "
                             f"(SummaryWriter.add_histogram raises too)")
        self._core.summary(_HISTOGRAM, name, data, step, bins, 0, 0, 0)

    def image(self, name: str, image: Any, step: int | None = None, layout: str | None = None) -> None:
        """Queue an image: uint8 (0-255) or float (0.0-1.0) values, HWC or CHW (1, 3 or 4
        channels; `layout` "HWC"/"CHW" when the shape is ambiguous) or HW (gray). It is
        PNG-encoded by the writer thread (zlib), off the training thread. TensorBoard sinks
        only.

        >>> mon.image("samples/0", batch[0], step=100)       # CHW float in [0, 1]
        """
        _check_name(name)
        hwc = _image_hwc(image, layout)
        self._core.summary(_IMAGE, name, hwc, step, 0, *hwc.shape)

    def text(self, name: str, text: str, step: int | None = None) -> None:
        """Queue a text record (TensorBoard's Text tab renders it as Markdown) under the tag
        ``<name>/text_summary``, as torch's SummaryWriter.add_text writes it. TensorBoard sinks
        only.

        >>> mon.text("config", "lr=1e-3, batch=256", step=0)
        """
        _check_name(name)
        if not isinstance(text, str):
            raise TypeError(f"'text' must be str, not {type(text).__name__}")
        self._core.summary(_TEXT, name, text.encode(), step, 0, 0, 0, 0)

    def event(self, name: str, value: float = 0.0, step: int | None = None) -> None:  # replaced per instance
        """Queue a marker record (epoch end, checkpoint written, ...) with an optional
        `value`; TensorBoard skips it. step=None uses the latest step, as scalar() does.

        >>> mon.event("epoch_end", step=1000)
        """
        self._core.event(name, value, step)

    def attach(self, source: Metrics | Any, name: str | None = None) -> None:
        """Sample `source` every `interval_s` (and once now), on the Monitor's sampling thread:

        * a fastloop.Metrics, as ``<metric>/per_s`` and ``<metric>/mean`` (written from C);
        * any object with a ``stats()`` method returning a dict of numbers (a Loader, a
          Checkpointer, an InferenceService), as ``<name>/<key>`` for each number (a nested
          dict's as ``<name>/<key>/<subkey>``; strings and None left out) and, for each int
          (a count), ``<name>/<key>/per_s``: its change per second since the last round.
          `name` defaults to the source's class name in lower case (``loader``). stats() is
          called from a Python thread of the Monitor's; an exception from it is raised as
          SinkError by the next Monitor call, and the source is read again next round.

        With interval_s=0 nothing is sampled. TypeError names a source that is neither.

        >>> mon.attach(loader)   # loader/samples, loader/samples/per_s, ... every interval
        """
        if isinstance(source, Metrics):
            if name is not None:
                raise TypeError("attach(): 'name' applies to a stats() source; a Metrics names its own metrics")
            self._core.watch(source)
            return
        if not callable(getattr(source, "stats", None)):
            raise TypeError(f"attach() takes a fastloop.Metrics or an object with a stats() method "
                            f"returning a dict of numbers, not {type(source).__name__}")
        if name is None:
            name = type(source).__name__.lower()
        elif not isinstance(name, str) or not name:
            raise TypeError(f"'name' must be a non-empty str, not {name!r}")
        first = source.stats()
        if not isinstance(first, Mapping):
            raise TypeError(f"attach(): {type(source).__name__}.stats() returned {type(first).__name__}, "
                            f"not a dict of numbers")
        attached = _StatsSource(source, name, first)
        if self._interval_s <= 0:
            return
        if self._closed:
            raise Closed("attach() on a closed Monitor")
        attached.sample(first, self._core.sample, rates=False)
        with self._stats_lock:
            self._stats_sources.append(attached)
            if self._stats_thread is None:
                self._stats_thread = threading.Thread(target=self._sample_stats, name="fastloop-monitor-stats",
                                                      daemon=True)
                self._stats_thread.start()

    def _sample_stats(self) -> None:
        """The sampling thread of stats() sources: a round every interval_s until close()."""
        while not self._stop_sampling.wait(self._interval_s):
            with self._stats_lock:
                sources = list(self._stats_sources)
            for attached in sources:
                try:
                    attached.sample(attached.read(), self._core.sample, rates=True)
                except Exception as error:
                    if not attached.failed:  # report the first failure; keep sampling
                        attached.failed = True
                        self._report(f"{type(attached.source).__name__}.stats() of attached "
                                     f"{attached.name!r} raised {type(error).__name__}: {error}")

    def _stop_stats(self, timeout: float | None) -> None:
        """Ends the stats() sampling thread, waiting up to `timeout` for a round in progress."""
        self._stop_sampling.set()
        with self._stats_lock:  # a thread that attach() starts after this sees the stop at once
            thread = self._stats_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every record queued so far is written by every file sink (and handed
        to the callbacks). Returns False when `timeout` passed first.

        >>> mon.flush(timeout=5)
        True
        """
        return self._core.flush(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Stop sampling, write what is queued, flush and close the sinks, waiting at most
        `timeout` seconds (None: until everything is written; 0: return at once). When the
        time runs out first, close() returns and the C writer thread goes on writing and
        closing the sinks in the background (as do the threads of CallbackSinks still
        delivering), and interpreter exit waits for it; a later close() waits again.
        Raises SinkError for a sink error not reported yet, once the writer has finished
        within the timeout. Any number of threads may call it, at once too; each call
        without a timeout returns once everything is written.

        >>> mon.close()
        """
        deadline = _lifecycle.close_deadline(timeout)
        self._closed = True
        self._stop_stats(_lifecycle.remaining(deadline))
        finished = False
        try:
            finished = self._core.close(_lifecycle.remaining(deadline))
        except SinkError:
            finished = True  # the writer is done; the error is raised below the callbacks' stop
            raise
        finally:  # a SinkError from it still leaves the callbacks done when close() returns
            if finished:
                for callback in self._callbacks:
                    callback.stop(timeout=_lifecycle.remaining(deadline))
        if not finished:
            _lifecycle.draining(self)
            return
        error = self._core.take_error()
        if error is not None:
            raise SinkError(error)

    def _report(self, message: str) -> None:
        self._core.report_error(message)

    def _close_at_exit(self, deadline: float) -> None:
        self._stop_stats(max(0.0, deadline - time.monotonic()))
        self._core.close(0)
        self._core.wait_closed(max(0.0, deadline - time.monotonic()))
        for callback in self._callbacks:
            callback.stop(timeout=max(0.0, deadline - time.monotonic()))

    def stats(self) -> dict[str, Any]:
        """Counts (ints): records written; sampled and own records dropped; sampling rounds done.

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
