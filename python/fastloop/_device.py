"""Parsing a `device=` argument ("cpu", "cuda", "cuda:N" or a CUDA index), in one place for
fastloop.nn and fastloop.Loader."""

from __future__ import annotations


def parse_device(device: str | int | None, arg: str = "device") -> tuple[str, int]:
    """("cpu", 0) for None or "cpu"; ("cuda", N) for "cuda" (N = 0), "cuda:N" or N >= 0.
    Anything else raises ValueError naming `arg`."""
    if device is None or device == "cpu":
        return "cpu", 0
    if isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        return "cuda", device
    text = str(device)
    if text == "cuda":
        return "cuda", 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return "cuda", int(text[5:])
    raise ValueError(f"'{arg}' must be 'cpu', 'cuda', 'cuda:N' or a CUDA device index, not {device!r}")
