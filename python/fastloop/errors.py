"""The exceptions fastloop raises, rooted at :class:`fastloop.Error`.

Each also subclasses the built-in (or standard-library) exception that fits, so code
written for ``queue.Queue`` (``except queue.Empty``) keeps working with ``fastloop.Queue``.
"""

from __future__ import annotations

import queue as _queue

__all__ = [
    "Error",
    "Closed",
    "Empty",
    "QueueFull",
    "SinkError",
    "WorkerError",
    "CheckpointError",
    "CudaError",
    "CudaUnavailable",
    "CodecUnavailable",
    "DecodeError",
]


class Error(Exception):
    """Base class of every fastloop exception. ``code`` is the C core's error code behind it
    (a negative number, 0 when none); ``cuda_code`` the CUDA error number, where there is one.

    >>> try: fastloop.Queue().get_nowait()
    ... except fastloop.Error as e: print(type(e).__name__)
    """

    code: int = 0
    cuda_code: int | None = None


class Closed(Error, RuntimeError):
    """The object was closed: a put() on a closed Queue, or get() once it is also empty.

    >>> q = fastloop.Queue(); q.close()
    >>> q.put(1)  # raises fastloop.Closed
    """


class Empty(Error, _queue.Empty):
    """get() found no item (at once with block=False, or within its timeout).

    >>> fastloop.Queue().get(timeout=0.1)  # raises fastloop.Empty (also a queue.Empty)
    """


class QueueFull(Error, _queue.Full):
    """put() found no free slot (at once with block=False, or within its timeout).

    >>> q = fastloop.Queue(maxsize=1); q.put(1)
    >>> q.put_nowait(2)  # raises fastloop.QueueFull (also a queue.Full)
    """


class WorkerError(Error, RuntimeError):
    """A Loader worker failed: a process died (``pid`` and ``signal`` say how) or raised
    where its exception could not be re-created in the main process. ``index`` is the
    sample being fetched, when known.

    >>> for batch in loader: ...   # raises WorkerError: worker 1 (pid 4242) died of signal 9 (Killed), ...
    """

    def __init__(self, message: str, *, pid: int | None = None, signal: int | None = None,
                 worker: int | None = None, index: int | None = None) -> None:
        super().__init__(message)
        self.pid, self.signal, self.worker, self.index = pid, signal, worker, index


class SinkError(Error, OSError):
    """A monitor sink failed (disk full, permission denied, a callback raised); the message
    names the file or callback. Raised by the next Monitor call, or by close().

    >>> mon = fastloop.Monitor(sinks=[fastloop.CSVSink("/dev/full")])
    >>> mon.scalar("loss", 1.0, 0); mon.flush()  # raises SinkError naming /dev/full
    """


class CheckpointError(Error, OSError):
    """A checkpoint could not be written or read; the message names the file and step.
    A background write's error is raised by the next save() or by close().

    >>> ckpt.load(7)  # raises CheckpointError: no checkpoint for step 7 in 'ckpts'
    """


class CudaError(Error, RuntimeError):
    """A CUDA runtime, cuBLAS or nvJPEG call failed; ``cuda_code`` holds the cudaError_t
    number (nvJPEG: its status plus 100000) when the raising side knows it (``fastloop.cuda``
    calls do; a Model's backend names the error in the message only), and ``code`` the
    library code (``FL_ECUDA``), the same from either extension.

    >>> try: fastloop.cuda.devices()
    ... except fastloop.CudaError as e: print(e.cuda_code, e)
    """

    def __init__(self, message: str, code: int = 0, cuda_code: int | None = None) -> None:
        super().__init__(message)
        self.code, self.cuda_code = code, cuda_code


class CudaUnavailable(Error, RuntimeError):
    """CUDA was asked for where it cannot work; the message says why.

    >>> fastloop.cuda.require()  # raises CudaUnavailable on a machine without a GPU
    """


class CodecUnavailable(Error, RuntimeError):
    """An image needs a decoder (libjpeg-turbo, libpng) that this copy of fastloop lacks (the
    wheels link both in; a source build links or loads them only where their -dev packages
    were); the message says what was tried and what to install.

    >>> fastloop.images.decode(b"\\xff\\xd8\\xff...")  # raises CodecUnavailable without libjpeg
    """


class DecodeError(Error, ValueError):
    """Bytes that should be an image are not a valid one: not a JPEG or PNG, a corrupt or
    truncated file. The message has the codec's words, and the path and sample index where
    the bytes came from a file; ``code`` is ``FL_EDECODE``. It is a ValueError, so code that
    caught one before this class existed still does. A Loader with ``on_error="skip"``
    drops such samples instead of raising.

    >>> try: fastloop.images.decode(b"\\xff\\xd8 not really a JPEG")
    ... except fastloop.DecodeError as e: print(e)
    """


def retold(error: Exception, message: str) -> Exception:
    """The error again with a fuller message (naming the file or sample it came from): a
    fastloop error keeps its class and codes, any other becomes a plain ValueError."""
    if not isinstance(error, Error):
        return ValueError(message)
    told = type(error)(message)
    told.code, told.cuda_code = error.code, error.cuda_code
    return told
