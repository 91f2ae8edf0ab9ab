"""A job table's persistence where the store fails: final records a store outage held back
(``_unsaved``: the janitor writes them again), creates that raised and may have been applied
(``_in_doubt``: removed once the store answers, unless a retry adopts them), and the jobs a
previous process left in the store (``_recover`` at start).
"""

from __future__ import annotations

import time

import numpy as np

from .jobs import DONE, FAILED, QUEUED, RUNNING, JobRecord
from .redisstore import StoreUnavailable
from ._job_table import _Job

__all__ = ["RESTARTED_RUNNING", "RESTARTED_NO_INPUT"]

_IN_DOUBT = (StoreUnavailable, ConnectionError, TimeoutError)  # a create that may have been applied
RESTARTED_RUNNING = "server restarted while the job was running"
RESTARTED_NO_INPUT = "server restarted before the job ran, and the store kept no input to run it"


class _Persistence:
    """Store writes that must survive a store outage (a part of InferenceService)."""

    def _create(self, job: _Job, x: np.ndarray) -> bool:
        return self.store.create(job.record, x if self.store.keeps_inputs else None) or self._adopt_lost_create(job)

    def _resolve_in_doubt(self) -> None:
        """The janitor's: removes from the store each in-doubt create (a submit that raised)
        still queued there and not adopted by a retry, keeping "an error means not
        accepted" true; ids the store cannot answer for yet stay for the next round."""
        for job_id in list(self._in_doubt):
            with self._doubt_lock:
                if job_id not in self._in_doubt:
                    continue
                with self._lock:
                    retried = job_id in self._jobs  # a retry reserved it: it decides
                if not retried:
                    try:
                        if self.store.get(job_id).status == QUEUED:
                            self.store.delete(job_id)
                            self._stats.count("in_doubt_removed")
                    except KeyError:  # the create never reached the store
                        pass
                    except _IN_DOUBT:  # still unreachable: try again later
                        continue
                    except Exception:  # the store refuses to read that id: not this submit's job
                        pass
                del self._in_doubt[job_id]

    def _adopt_lost_create(self, job: _Job) -> bool:
        """For a submit whose id the store knows: True when the store holds it queued, which
        means an earlier submit of that id here was written but answered with an error (Redis
        went down before its reply came): no worker holds that job, so this submit queues it,
        with the stored record and input. A queued job of a previous process is already in
        memory (recovered at start), so it cannot be mistaken for one."""
        try:
            stored = self.store.get(job.record.id)
            if stored.status != QUEUED:
                return False
            kept = self.store.get_input(stored.id) if self.store.keeps_inputs else None
        except KeyError:  # deleted meanwhile
            return False
        job.record = stored
        if kept is not None:
            job.inputs = kept
        self._stats.count("submits_adopted")
        return True

    def _store_final(self, record: JobRecord, result: np.ndarray | None) -> JobRecord | None:
        """Stores a finished job: the record stored (failed "could not store the result"
        when only the result was refused, e.g. a full disk), or None when the store took
        neither (it is down)."""
        try:
            self.store.finish(record, result)
            return record
        except _IN_DOUBT:  # unreachable, not a refusal: kept as it is for the janitor to write
            self._stats.count("store_errors")  # (a failed record written once Redis is back
            return None  # would turn a done job into "could not store the result")
        except Exception as store_error:
            error = store_error
        self._stats.count("store_errors")
        failed = JobRecord(**vars(record))
        if record.status == DONE:
            failed.status, failed.error = FAILED, f"could not store the result: {error}"
        try:
            self.store.finish(failed, None)
            return failed
        except Exception:
            return None

    def _save_unsaved(self) -> bool:
        """Stores the jobs that ended while the store was down, in the order they ended;
        stops at the first the store does not take. True when none is left."""
        with self._lock:
            jobs = list(self._unsaved.values())
        for job in jobs:
            stored = self._store_final(job.record, job.result)
            if stored is None:
                return False
            changed = stored.status != job.record.status
            job.record, job.result = stored, None
            with self._lock:
                del self._unsaved[stored.id]
                if self._jobs.get(stored.id) is job:
                    del self._jobs[stored.id]
            if changed:
                self._notify(stored.id, stored.status)
        return True

    def _recover(self) -> None:
        """Jobs a previous process left behind: queued ones with a stored input run again
        (oldest first, up to max_queue); running ones fail (their input may be what brought
        the process down); the rest fail with the reason."""
        for record in self.store.recover():
            reason = RESTARTED_RUNNING if record.status == RUNNING else None
            x = None
            if reason is None:
                x = self.store.get_input(record.id) if self.store.keeps_inputs else None
                reason = RESTARTED_NO_INPUT if x is None else None
            if x is not None:
                try:
                    x, rows = self._spec.check_rows(x)
                    if rows != record.rows:
                        raise ValueError(f"it has {rows or 1} rows, the job {record.rows or 1}")
                except (TypeError, ValueError) as error:
                    reason = f"server restarted, and the model no longer takes the stored input: {error}"
            if reason is None and self._queued + (record.rows or 1) > self.max_queue:
                reason = f"server restarted with more than max_queue={self.max_queue} jobs queued"
            if reason is not None:
                record.status, record.finished, record.error = FAILED, time.time(), reason
                self.store.finish(record, None)
                self._stats.count("failed_at_start")
                continue
            job = _Job(record, x)  # type: ignore[arg-type]
            job.t0 -= max(0.0, time.time() - record.submitted)  # its waits count from the first submit
            if record.deadline is not None:  # stored at submit: it holds across the restart
                job.deadline = time.monotonic() + (record.deadline - time.time())
                self._any_deadline = True
                self._add_deadline(job)
            job.visible = True
            self._jobs[record.id] = job
            for item in job.items():
                self._queued += 1
                self._queue.put_nowait(item)
            self._stats.count("requeued_at_start")
