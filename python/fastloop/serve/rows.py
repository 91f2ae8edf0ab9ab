"""Jobs of several rows: a request whose input has a leading batch axis is one job whose rows
queue and batch one by one, beside other jobs' rows, and come back in order.

Each row is a queue item of its own (``Row``: the job and the row's index), so a worker's batch
of ``max_batch`` items holds ``max_batch`` rows whichever jobs they come from, and the queue's
bound counts rows. A job of one row is its own queue item, as before. When a job's last row
has run, ``assemble`` turns the rows' outcomes into the job's: done with every row's output
stacked in order; done with ``row_errors`` when some rows failed (a failed row's output is
zero-filled); failed when every row failed.

    >>> items = [Row(job, i) for i in range(job.record.rows)]
    >>> result, error, row_errors = assemble([(row0, None), (None, "ValueError: bad"), (row2, None)])
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["Row", "assemble", "row_errors_of"]

Outcome = tuple["np.ndarray | None", "str | None"]  # (row, None) or (None, error) for one row


class Row:
    """Row `index` of a job of several rows, as a queue item: ``job`` and ``x`` (its input)."""

    __slots__ = ("job", "index", "x")

    def __init__(self, job: Any, index: int) -> None:
        self.job, self.index, self.x = job, index, job.inputs[index]

    @property
    def key(self) -> tuple[tuple[int, ...], Any]:
        return self.x.shape, self.x.dtype


def assemble(outs: list[Outcome]) -> tuple[np.ndarray | None, str | None, list[list[Any]] | None]:
    """(result, error, row_errors) of a job from its rows' outcomes, in row order: the stacked
    rows (a failed row's zero-filled) and [[index, reason], ...] for the failed rows (None
    when none failed); error when every row failed (or the rows' outputs cannot be stacked)."""
    failed = [[i, error] for i, (_, error) in enumerate(outs) if error is not None]
    done = [row for row, error in outs if error is None]
    if not done:
        first = failed[0][1]
        return None, f"every one of the {len(outs)} rows failed (row 0: {first})", failed
    like = done[0]
    try:
        result = np.stack([np.zeros_like(like) if error is not None else row for row, error in outs])
    except ValueError as error:  # rows whose outputs differ in shape or dtype
        return None, f"the rows' outputs cannot be stacked into one result: {error}", None
    return result, None, failed or None


def row_errors_of(record: Any) -> dict[int, str]:
    """{row index: reason} of a job's failed rows (empty when none failed, or one row)."""
    return {int(i): str(reason) for i, reason in (record.row_errors or ())}
