"""torch and the Loader, without importing torch unless the program did: tensors in as
zero-copy NumPy views, batches out as tensors sharing the slot memory, and torch set up in
worker processes as DataLoader's workers are (one intra-op thread, the generator seeded)."""

from __future__ import annotations

import random
import sys
import warnings
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

_MASK64 = (1 << 64) - 1


def loaded_torch() -> Any:
    """The torch module if this program imported it, else None (never imports it). Asked per
    sample: `in` and [] read sys.modules without locking it on a free-threaded interpreter,
    where .get() locks it against every other thread."""
    modules = sys.modules
    return modules["torch"] if "torch" in modules else None


def is_tensor(value: Any) -> bool:
    torch = loaded_torch()
    return torch is not None and isinstance(value, torch.Tensor)


def tensor_as_array(tensor: Any, what: Any) -> np.ndarray:
    """A CPU tensor as a NumPy array sharing its memory; a clear TypeError otherwise (what:
    the tensor's name in it, or a callable giving it, so the common case builds no string)."""
    try:  # the common case, once per sample field in workers: ~1.5 us against ~4 for the full path
        return tensor.numpy()  # refuses grad, conj/neg bits, other devices and dtypes NumPy lacks
    except (TypeError, RuntimeError):
        pass
    what = what() if callable(what) else what
    if tensor.device.type != "cpu":
        raise TypeError(f"{what} is a tensor on {tensor.device}: the Loader reads host memory, so pass "
                        f"{what}.cpu() (Loader(device='cuda') copies the batches to the GPU)")
    try:
        return tensor.detach().resolve_conj().resolve_neg().numpy()
    except (TypeError, RuntimeError) as e:
        raise TypeError(f"{what} is a {tensor.dtype} tensor, which NumPy cannot view ({e}); "
                        f"convert it first, e.g. {what}.float()") from None


def as_array_if_tensor(value: Any, what: str) -> Any:
    return tensor_as_array(value, what) if is_tensor(value) else value


def setup_worker_torch() -> None:
    """In a forked worker: torch's intra-op pool does not survive fork (a child of a parent
    that used it hangs in its first parallel op), so run torch ops on one thread, as
    DataLoader's workers do."""
    torch = loaded_torch()
    if torch is not None:
        torch.set_num_threads(1)


@contextmanager
def torch_single_threaded() -> Iterator[None]:
    """torch on one thread for a while (the layout probe), so this process does not start
    torch's intra-op pool before forking workers."""
    torch = loaded_torch()
    if torch is None:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def sample_seed(epoch_seed: int, index: int) -> int:
    """A 63-bit seed for sample `index` of the epoch (splitmix64 of both): the random draws
    of a sample depend on (seed, epoch, index) only, not on which worker fetches it."""
    x = (epoch_seed ^ ((index + 1) * 0x9E3779B97F4A7C15)) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) >> 1


def seed_generators(seed: int) -> None:
    """Seeds random, numpy's global generator and, if imported, torch's CPU generator."""
    random.seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    torch = loaded_torch()
    if torch is not None:
        torch.default_generator.manual_seed(seed)  # torch.manual_seed costs ~100x more (CUDA hooks)


def import_torch_for_output() -> Any:
    try:
        import torch
    except ImportError:
        raise ImportError("output='torch' needs PyTorch installed (pip install torch)") from None
    return torch


def pins_tensors(pin_memory: bool, output: str) -> bool:
    """Whether a Loader without device= pins its slots: torch tensors only, and only where
    torch sees CUDA. Otherwise it warns and pins nothing, as DataLoader does without an
    accelerator (pinned memory exists only for a device to copy from)."""
    if not pin_memory:
        return False
    if output != "torch":
        warnings.warn("pin_memory=True pins torch tensors (output='torch') or the slots of a Loader with "
                      "device='cuda'; these NumPy batches are not pinned", UserWarning, stacklevel=3)
        return False
    if not import_torch_for_output().cuda.is_available():
        warnings.warn("pin_memory=True, but torch finds no CUDA device: batches are not pinned (as "
                      "DataLoader does without an accelerator)", UserWarning, stacklevel=3)
        return False
    return True


def to_tensors(arrays: tuple) -> tuple:
    """Arrays as torch tensors sharing their memory (each tensor keeps its array, and so the
    batch slot, alive). Pinned batches are _torch_feed.PinnedBatches' work."""
    torch = import_torch_for_output()
    return tuple(torch.from_numpy(a) for a in arrays)
