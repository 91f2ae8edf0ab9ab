"""torch DataLoader's keywords that have no fastloop name of their own (generator,
multiprocessing_context, pin_memory_device, in_order), and the argument checks DataLoader
makes, for fastloop.Loader: each accepted with torch's meaning, or refused with a message
saying what to use instead (docs/torch.md lists every DataLoader keyword)."""

from __future__ import annotations

import numbers
import re
from typing import Any

from ._torch_interop import loaded_torch


def seed_of(seed: Any, generator: Any) -> Any:
    """The Loader's seed: `seed`, or one draw from a torch.Generator, as DataLoader draws its
    base seed from `generator` (torch draws again every epoch; fastloop draws once, then each
    epoch's order and augmentations follow from (seed, epoch), so one generator state gives
    one reproducible run)."""
    if generator is None:
        return seed
    torch = loaded_torch()
    if torch is None or not isinstance(generator, torch.Generator):
        raise TypeError(f"'generator' must be a torch.Generator, not {type(generator).__name__}: fastloop's own "
                        f"is seed=<int>")
    if seed != 0:
        raise ValueError("pass 'seed' or 'generator', not both: both seed the shuffle and the augmentations")
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def check_multiprocessing_context(context: Any) -> None:
    """fastloop's worker processes are forked: None and "fork" (or a fork context) are taken."""
    if context is None:
        return
    method = context if isinstance(context, str) else getattr(context, "get_start_method", lambda: None)()
    if not isinstance(method, str):
        raise TypeError(f"'multiprocessing_context' must be a start method name or a multiprocessing context, "
                        f"not {type(context).__name__}")
    if method != "fork":
        raise ValueError(f"multiprocessing_context={method!r}: fastloop's worker processes are always forked "
                         f"(DataLoader's default on Linux). Pass None or 'fork'; where forking is unsafe in your "
                         f"program (threads started, CUDA used before the Loader), use mode='threads', whose "
                         f"workers are threads of this process")


def check_pin_memory_device(device: Any) -> str:
    """DataLoader's pin_memory_device: fastloop pins for CUDA, which serves every CUDA device."""
    if not isinstance(device, str):
        raise TypeError(f"'pin_memory_device' must be a str, not {type(device).__name__}")
    if device not in ("", "cuda") and re.fullmatch(r"cuda:\d+", device) is None:
        raise ValueError(f"pin_memory_device={device!r}: fastloop pins host memory for CUDA only: pass '' "
                         f"or 'cuda' (pinned memory serves every CUDA device), or device='cuda:N' to have the "
                         f"Loader copy the batches there itself")
    return device


def check_in_order(in_order: Any) -> bool:
    """in_order=True is fastloop's only behaviour; in_order=False (DataLoader may then hand out
    a batch ready early before a slower one) is taken too: batches still come in order."""
    if not isinstance(in_order, bool):
        raise TypeError(f"'in_order' must be a bool, not {type(in_order).__name__}")
    return in_order


def check_timeout(timeout: Any) -> float | None:
    """DataLoader's timeout, in seconds: 0 and None wait as long as it takes."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"'timeout' must be a number of seconds or None, not {type(timeout).__name__}")
    if not timeout >= 0:  # also NaN
        raise ValueError(f"'timeout' must be >= 0 seconds (0 or None: wait as long as it takes, as in "
                         f"DataLoader), not {timeout}")
    return float(timeout) if timeout > 0 else None


def check_worker_options(num_workers: int, prefetch_factor: Any, persistent_workers: Any) -> bool:
    """DataLoader's checks of the options that only mean something with workers; returns
    persistent_workers as the Loader keeps it (None: True with workers, fastloop's default)."""
    if num_workers == 0 and prefetch_factor is not None:
        raise ValueError("'prefetch_factor' is the batches in flight per worker: it needs num_workers > 0 "
                         "(as in DataLoader); leave it None with num_workers=0")
    if persistent_workers is None:
        return num_workers > 0
    if not isinstance(persistent_workers, bool):
        raise TypeError(f"'persistent_workers' must be a bool, not {type(persistent_workers).__name__}")
    if num_workers == 0 and persistent_workers:
        raise ValueError("'persistent_workers' keeps the workers between epochs: it needs num_workers > 0 "
                         "(as in DataLoader)")
    return persistent_workers


def check_batch_sampler(batch_sampler: Any, batch_size: Any, drop_last: bool) -> None:
    """A batch_sampler decides the batches: DataLoader refuses batch_size (but its default 1)
    and drop_last beside it."""
    if batch_sampler is None:
        return
    if batch_size is None or isinstance(batch_size, bool) or batch_size != 1 or drop_last:
        given = f"batch_size={batch_size!r}" if batch_size != 1 or batch_size is None else "drop_last=True"
        raise ValueError(f"'batch_sampler' gives the batches, so it cannot go with {given} (as in DataLoader: "
                         f"batch_sampler is mutually exclusive with batch_size, shuffle, sampler and drop_last)")
