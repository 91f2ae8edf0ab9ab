"""One pass of a Loader over its BatchSource (_backend.py): the iterator `for batch in
loader` runs, and where the loader's position (state_dict()) moves."""

from __future__ import annotations

import threading
from typing import Any

from ._failures import naming_member


class Epoch:
    """One pass over the loader: the iterator `for batch in loader` runs. Abandoning it
    (break, an exception, Ctrl-C, garbage collection) stops the workers at once."""

    def __init__(self, loader: Any, epoch: int, position: int, counts_taken: bool = True) -> None:
        """counts_taken: each batch counts as handed out when next() takes it; False for a
        device feed, which takes a batch before it hands out the previous one and says when
        it hands one out (handed_out) and when the epoch's last one went (finished)."""
        self.loader, self.epoch, self.position = loader, epoch, position
        self.counts_taken = counts_taken
        self.done = False  # no batch left to take: the end reached, or abandoned
        self.abandoned = False
        self._handing = threading.Lock()  # a batch is handed out (and counted) or the epoch abandoned, not both

    def __iter__(self) -> "Epoch":
        return self

    def __next__(self) -> Any:
        if self.done:
            raise StopIteration
        if self.loader._pinned is not None:  # slots whose copies are done go back before the next batch
            core = self.loader._core
            self.loader._pinned.make_room(lambda: getattr(core, "lent", 0))  # InProcess lends no slots
        try:
            batch = self.loader._core.next(self.loader.timeout)
        except BaseException as error:
            self.abandon()
            named = naming_member(self.loader._source, error)
            if named is not None:
                raise named from None
            raise
        if batch is None:
            if self.done:  # abandoned meanwhile (close() on another thread): the position stays
                raise StopIteration
            self.done = True
            if self.counts_taken:  # else the feed still holds the last batch: finished() says when it went
                self.loader._progress = None
            if not self.loader.persistent_workers:
                self.loader._core.stop()
            raise StopIteration
        if self.loader.on_error == "skip" and not self.loader._skips_logged:
            self.loader._log_first_skip()
        if self.counts_taken and not self.hand_out():  # close() on another thread took the epoch meanwhile
            raise StopIteration
        return self.loader._deliver(batch)

    def _current(self) -> bool:
        """Whether this epoch is the loader's pass now: an abandoned one (or one a later
        iteration replaced) no longer moves the loader's position."""
        active = self.loader._active
        return not self.abandoned and active is not None and active() is self

    def hand_out(self) -> bool:
        """Counts one more batch of the epoch as the user's (state_dict() resumes after it);
        False, counting nothing, once the epoch is abandoned: that batch is dropped, so the
        position always names the batches the user got."""
        with self._handing:
            if self.abandoned:
                return False
            self.position += 1
            if self._current():
                self.loader._progress = (self.epoch, self.position)
            return True

    def finished(self) -> None:
        """The epoch's last batch reached the user (a device feed's): state_dict() names the next epoch."""
        if self._current():
            self.loader._progress = None

    def abandon(self, wait: bool = True) -> None:
        """Stops the epoch's workers (wait=False: asks them to, as a finalizer must)."""
        with self._handing:
            if self.done:
                return
            self.done = self.abandoned = True
        self.loader._core.stop(wait=wait)

    def __del__(self) -> None:
        if not self.done:
            self.abandon(wait=False)
