"""A progress line for the demo: a bar redrawn in place on a terminal, plain lines (one
every few seconds and one per epoch) when the output is a file or a notebook."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds < 3600 else f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


class Progress:
    """Tracks steps and samples; `update()` after each step, `epoch_done()` after each epoch."""

    def __init__(self, total_steps: int, done_steps: int = 0, stream: TextIO | None = None,
                 plain_every_s: float = 5.0) -> None:
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.total, self.done = total_steps, done_steps
        self.start_done = done_steps
        self.start = self.last_plain = time.perf_counter()
        self.samples = 0
        self.plain_every_s = plain_every_s
        self._last_draw = 0.0

    def samples_per_s(self) -> float:
        return self.samples / max(time.perf_counter() - self.start, 1e-9)

    def eta_s(self) -> float:
        steps = self.done - self.start_done
        if steps <= 0:
            return float("nan")
        return (time.perf_counter() - self.start) / steps * (self.total - self.done)

    def line(self, epoch: int, epochs: int, loss: float) -> str:
        eta = self.eta_s()
        return (f"epoch {epoch + 1}/{epochs}  step {self.done}/{self.total}  loss {loss:.4f}  "
                f"{self.samples_per_s():,.0f} samples/s  ETA {'?' if eta != eta else _clock(eta)}")

    def update(self, samples: int, epoch: int, epochs: int, loss: float) -> None:
        self.done += 1
        self.samples += samples
        now = time.perf_counter()
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
