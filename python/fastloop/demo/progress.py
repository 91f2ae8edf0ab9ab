"""A progress line for the demo: a bar redrawn in place on a terminal, plain lines (one
every few seconds and one per epoch) when the output is a file or a notebook."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds < 3600 else f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


# A rate over less time than this is mostly start-up and clock noise: it is not shown.
MIN_TIMED_S = 1.0


class Progress:
    """Tracks steps and samples; `update()` after each step, `epoch_done()` after each epoch."""

    def __init__(self, total_steps: int, done_steps: int = 0, stream: TextIO | None = None,
                 plain_every_s: float = 5.0) -> None:
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.total, self.done = total_steps, done_steps
        self.start_done = done_steps
        self.start = self.last_plain = self.last_step = time.perf_counter()
        self.samples = 0
        self.plain_every_s = plain_every_s
        self._last_draw = 0.0

    def steps_s(self) -> float:
        """Seconds from the start to the end of the last step."""
        return self.last_step - self.start

    def samples_per_s(self) -> float | None:
        """Samples a second over the steps so far; None while they took under MIN_TIMED_S."""
        seconds = self.steps_s()
        return self.samples / seconds if seconds >= MIN_TIMED_S else None

    def rate(self) -> str:
        """The rate as shown: "1,234 samples/s", or why there is none yet."""
        rate = self.samples_per_s()
        if rate is not None:
            return f"{rate:,.0f} samples/s"
        return "too short to time" if self.done == self.total else "timing ..."

    def eta_s(self) -> float:
        steps = self.done - self.start_done
        if steps <= 0:
            return float("nan")
        return (time.perf_counter() - self.start) / steps * (self.total - self.done)

    def line(self, epoch: int, epochs: int, loss: float) -> str:
        eta = self.eta_s()
        return (f"epoch {epoch + 1}/{epochs}  step {self.done}/{self.total}  loss {loss:.4f}  "
                f"{self.rate()}  ETA {'?' if eta != eta else _clock(eta)}")

    def update(self, samples: int, epoch: int, epochs: int, loss: float) -> None:
        self.done += 1
        self.samples += samples
        now = self.last_step = time.perf_counter()
        if self.tty:
            if now - self._last_draw >= 0.1 or self.done == self.total:  # ~10 redraws a second
                width = 24
                filled = int(width * self.done / max(self.total, 1))
                bar = "#" * filled + "." * (width - filled)
                self.stream.write(f"\r[{bar}] {self.line(epoch, epochs, loss)}\x1b[K")
                self.stream.flush()
                self._last_draw = now
        elif now - self.last_plain >= self.plain_every_s:
            self.stream.write(self.line(epoch, epochs, loss) + "\n")
            self.stream.flush()
            self.last_plain = now

    def message(self, text: str) -> None:
        """A line of its own (the bar is redrawn after it on a terminal)."""
        if self.tty:
            self.stream.write("\r\x1b[K")
        self.stream.write(text + "\n")
        self.stream.flush()
        self.last_plain = time.perf_counter()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
