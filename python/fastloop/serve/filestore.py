"""FileStore: an InferenceService's jobs as files, one small folder per job, every file
written atomically.

Layout of ``directory``::

    .lock               held (flock) while a store is open: one service per directory
    <id>/record.json    the JobRecord as JSON
    <id>/input.npy      the input, while the job is queued or running (for a restart)
    <id>/result.npy     the result of a done job, until it expires

A file is written to a temporary name in ``directory``, fsynced, renamed into place and
the folder fsynced (``durable=False`` skips both fsyncs: still atomic when the process dies,
not when the machine loses power; a store in a temporary directory, removed when it closes,
skips them by default: nothing there outlives the process anyway). A new job's folder is filled under a temporary name and
renamed into place, so a job exists whole or not at all. Arrays are ``.npy`` files written
and read with ``allow_pickle=False``. Leftover temporary entries from a crash are removed
when the store opens; a record that cannot be parsed is reported (``problems`` and a
RuntimeWarning naming the path) and its id answers StoreError.

    >>> store = FileStore("jobs")          # the service's default is a FileStore in a temp dir
    >>> svc = InferenceService(model, store=store)

Closing a store in a temporary directory renames the directory aside and removes it on a
background thread: close() returns at once however many jobs it holds (removing 2,000 job
folders took 19.6 s on a loaded machine); the removal finishes before the interpreter exits.
"""

from __future__ import annotations

import copy
import errno
import fcntl
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
import warnings
from typing import Any, Callable

import numpy as np

from .. import _files, _lifecycle
from .jobs import EXPIRED, FINISHED, QUEUED, RUNNING, JobRecord, StoreError
from .stores import Store

__all__ = ["FileStore"]

RECORD, INPUT, RESULT = "record.json", "input.npy", "result.npy"
_TEMP_PREFIXES = (".new-", _files.TEMP_PREFIX, ".trash-")


class FileStore(Store):
    """Jobs as folders of atomically written files under ``directory`` (made if missing;
    None: a fresh temporary directory, removed by close()). ``durable``: fsync every write
    (default: yes for a directory you name, no for a temporary one).

    The records are also kept in memory (status polls read no file); results are read from
    disk. Only one open FileStore may use a directory at a time (StoreError otherwise).
    """

    keeps_inputs = True

    def __init__(self, directory: str | os.PathLike[str] | None = None, *, durable: bool | None = None) -> None:
        self._temporary = directory is None
        self.directory = tempfile.mkdtemp(prefix="fastloop-serve-") if directory is None else os.fspath(directory)
        self.durable = not self._temporary if durable is None else bool(durable)
        self._lock = threading.Lock()
        self._records: dict[str, JobRecord] = {}
        self._broken: dict[str, str] = {}  # id -> why its record cannot be read
        self._problems: list[str] = []
        os.makedirs(self.directory, exist_ok=True)
        self._lock_fd = self._take_directory()
        try:
            self._load()
        except BaseException:
            os.close(self._lock_fd)
            raise

    # ---- opening
    def _take_directory(self) -> int:
        path = os.path.join(self.directory, ".lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(f"FileStore: {self.directory!r} is in use by another open store "
                             "(another service, in this process or another)") from None
        return fd

    def _load(self) -> None:
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if name.startswith(_TEMP_PREFIXES):  # a write a dead process left half done
                _remove(path)
            elif not name.startswith(".") and os.path.isdir(path):
                self._load_job(name, path)

    def _load_job(self, job_id: str, path: str) -> None:
        record_path = os.path.join(path, RECORD)
        try:
            with open(record_path, "rb") as f:
                record = JobRecord.from_json(json.loads(f.read()))
            if record.id != job_id:
                raise ValueError(f"it holds the record of job {record.id!r}")
        except (OSError, ValueError, TypeError) as error:
            self._report(job_id, f"cannot read {record_path}: {error}")
            return
        self._records[job_id] = record

    def _report(self, job_id: str, message: str) -> None:
        self._broken[job_id] = message
        self._problems.append(message)
        warnings.warn(f"FileStore: {message}", RuntimeWarning, stacklevel=4)

    @property
    def problems(self) -> list[str]:
        return list(self._problems)

    # ---- writing
    def _job_dir(self, job_id: str) -> str:
        return os.path.join(self.directory, job_id)

    def _sync_dir(self, path: str) -> None:
        if self.durable:
            _files.sync_dir(path)

    def _write_file(self, path: str, write: Callable[[Any], None], sync_dir: bool = True) -> None:
        """Writes path atomically: a temporary file beside the jobs, fsync, rename."""
        try:
            _files.write_atomically(path, write, durable=self.durable, temp_dir=self.directory)
        except OSError as error:
            raise StoreError(f"FileStore: cannot write {path}: {error}") from error
        if sync_dir:
            self._sync_dir(os.path.dirname(path))

    def _write_record(self, folder: str, record: JobRecord, sync_dir: bool = True) -> None:
        data = json.dumps(record.to_json()).encode()
        self._write_file(os.path.join(folder, RECORD), lambda f: f.write(data), sync_dir)

    def _write_array(self, path: str, array: np.ndarray, sync_dir: bool = True) -> None:
        self._write_file(path, lambda f: np.save(f, array, allow_pickle=False), sync_dir)

    # ---- the Store interface
    def create(self, record: JobRecord, inputs: np.ndarray | None) -> bool:
        with self._lock:
            if record.id in self._records or record.id in self._broken:
                return False
        staging = os.path.join(self.directory, f".new-{uuid.uuid4().hex}")
        try:
            os.mkdir(staging)
            if inputs is not None:
                self._write_array(os.path.join(staging, INPUT), inputs, sync_dir=False)
            self._write_record(staging, record)
            os.rename(staging, self._job_dir(record.id))
        except OSError as error:
            _remove(staging)
            if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
                return False  # another create() of the same id won
            raise StoreError(f"FileStore: cannot create job {record.id!r} in {self.directory}: {error}") from error
        with self._lock:  # before the sync, which may fail: the job's folder exists either way
            self._records[record.id] = copy.copy(record)
        try:
            self._sync_dir(self.directory)
        except OSError as error:
            raise StoreError(f"FileStore: cannot sync {self.directory} after creating job {record.id!r}: "
                             f"{error}") from error
        return True

    def update(self, record: JobRecord) -> None:
        with self._lock:
            if record.id not in self._records:
                raise KeyError(record.id)
        self._write_record(self._job_dir(record.id), record)
        with self._lock:
            self._records[record.id] = copy.copy(record)

    def finish(self, record: JobRecord, result: np.ndarray | None) -> None:
        folder = self._job_dir(record.id)
        if result is not None:
            self._write_array(os.path.join(folder, RESULT), result, sync_dir=False)
        self._write_record(folder, record)  # its folder fsync also covers result.npy
        _remove(os.path.join(folder, INPUT))
        with self._lock:
            self._records[record.id] = copy.copy(record)

    def get(self, job_id: str) -> JobRecord:
        with self._lock:
            if job_id in self._broken:
                raise StoreError(f"FileStore: {self._broken[job_id]}")
            return copy.copy(self._records[job_id])

    def _read_array(self, job_id: str, name: str) -> np.ndarray:
        path = os.path.join(self._job_dir(job_id), name)
        try:
            return np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise KeyError(job_id) from None
        except (OSError, ValueError) as error:
            raise StoreError(f"FileStore: cannot read {path}: {error}") from error

    def get_input(self, job_id: str) -> np.ndarray | None:
        try:
            return self._read_array(job_id, INPUT)
        except KeyError:
            return None

    def get_result(self, job_id: str) -> np.ndarray:
        return self._read_array(job_id, RESULT)

    def delete(self, job_id: str) -> None:
        with self._lock:
            self._records.pop(job_id, None)
            self._broken.pop(job_id, None)
        folder = self._job_dir(job_id)
        trash = os.path.join(self.directory, f".trash-{uuid.uuid4().hex}")
        try:
            os.rename(folder, trash)  # never leave an empty job folder another create could take
        except FileNotFoundError:
            return
        _remove(trash)

    def expire(self, now: float, ttl_s: float, forget_after_s: float) -> list[str]:
        with self._lock:
            due = [copy.copy(r) for r in self._records.values()
                   if r.status in FINISHED and r.finished is not None and r.finished <= now - ttl_s]
            forget = [r.id for r in self._records.values()
                      if r.status == EXPIRED and (r.expired_at or 0.0) <= now - forget_after_s]
        for record in due:
            record.status, record.expired_at = EXPIRED, now
            folder = self._job_dir(record.id)
            self._write_record(folder, record)
            _remove(os.path.join(folder, RESULT))
            _remove(os.path.join(folder, INPUT))
            with self._lock:
                self._records[record.id] = record
        for job_id in forget:
            self.delete(job_id)
        return [r.id for r in due]

    def recover(self) -> list[JobRecord]:
        with self._lock:
            left = [copy.copy(r) for r in self._records.values() if r.status in (QUEUED, RUNNING)]
        return sorted(left, key=lambda r: r.submitted)

    def close(self) -> None:
        if self._lock_fd < 0:
            return
        os.close(self._lock_fd)
        self._lock_fd = -1
        if self._temporary:
            _remove_in_background(self.directory)

    def __repr__(self) -> str:
        return f"FileStore({self.directory!r}, {len(self._records)} jobs)"


class _Removal:
    """A directory being removed on a thread of its own; the interpreter's exit waits for it
    (fastloop's exit handling), so nothing is left behind."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.thread = threading.Thread(target=shutil.rmtree, args=(path, True), name="fastloop-filestore-removal",
                                       daemon=True)
        self.thread.start()
        _lifecycle.draining(self)

    def _close_at_exit(self, deadline: float) -> None:
        self.thread.join(timeout=max(0.0, deadline - time.monotonic()))


def _remove_in_background(directory: str) -> None:
    """Removes `directory` without walking it now: renamed aside at once (a new store never
    sees it), removed on a thread."""
    aside = f"{directory}.closed-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(directory, aside)
    except OSError:  # gone already, or another file system: remove it where it is
        aside = directory
    _Removal(aside)


def _remove(path: str) -> None:
    """Removes a file or folder if it is there."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass
