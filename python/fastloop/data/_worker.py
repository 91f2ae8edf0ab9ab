"""Who the calling code is inside a Loader's workers, and the random generator of the sample
being fetched.

get_worker_info() is per thread: a worker thread (threads mode) and the one thread of a worker
process (processes mode) each see their own WorkerInfo; any other thread sees None. The
generators random, numpy.random and torch's default one are one state per process, shared by
every thread, so seeding them per worker cannot make threads reproducible. sample_rng() gives
instead a generator of the sample being fetched, seeded from (seed, epoch, the sample's
position in the epoch): its draws are the same whichever worker fetches the sample, for any
worker count and in every mode.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._torch_interop import import_torch_for_output, sample_seed

__all__ = ["WorkerInfo", "get_worker_info", "sample_rng"]

_local = threading.local()  # .info: this thread's WorkerInfo; .sample: (epoch seed, position); .drawn: generators


@dataclass(frozen=True)
class WorkerInfo:
    """Who this thread is inside a Loader's workers (see get_worker_info()). mode: "threads"
    (a worker thread of this process) or "processes" (a forked worker process).

    >>> fastloop.get_worker_info()   # in a worker: WorkerInfo(id=1, num_workers=2, seed=..., mode='threads')
    >>> fastloop.get_worker_info().rng.integers(10)   # this sample's generator (sample_rng())
    """

    id: int
    num_workers: int
    seed: int
    mode: str = "processes"

    @property
    def rng(self) -> np.random.Generator:
        """The numpy Generator of the sample being fetched: sample_rng()."""
        return sample_rng()

    @property
    def torch_generator(self) -> Any:
        """The torch.Generator of the sample being fetched: sample_rng("torch")."""
        return sample_rng("torch")


def get_worker_info() -> WorkerInfo | None:
    """In a Loader worker (a thread in threads mode, a process in processes mode), its
    WorkerInfo; elsewhere None, as torch.utils.data.get_worker_info (num_workers=0 included).

    >>> def transform(image): info = fastloop.get_worker_info(); ...
    """
    return getattr(_local, "info", None)


def set_worker_info(info: WorkerInfo | None) -> None:
    """Makes `info` what get_worker_info() returns on this thread (a worker's setup)."""
    _local.info = info


def begin_sample(epoch_seed: int, position: int) -> None:
    """The Loader is about to fetch the sample at `position` of the epoch on this thread."""
    _local.sample = (epoch_seed, position)
    _local.drawn = None


def end_sample() -> None:
    """The sample begun on this thread is fetched (a fetch in the main thread leaves nothing
    behind)."""
    _local.sample = _local.drawn = None


def sample_rng(kind: str = "numpy") -> Any:
    """A random generator for the sample being fetched, seeded from (seed, epoch, the sample's
    position): the same draws whichever worker fetches it, in threads, processes or num_workers=0.
    kind: "numpy" (a numpy.random.Generator) or "torch" (a torch.Generator on the CPU). Asked
    twice during one sample's fetch, it returns the same generator, drawing on.

    >>> def __getitem__(self, i): angle = fastloop.sample_rng().uniform(-10, 10); ...
    >>> torch.rand(3, generator=fastloop.sample_rng("torch"))
    """
    if kind not in ("numpy", "torch"):
        raise ValueError(f"'kind' must be 'numpy' or 'torch', not {kind!r}")
    sample = getattr(_local, "sample", None)
    if sample is None:
        raise RuntimeError("sample_rng() draws for the sample a Loader is fetching: call it in a dataset's "
                           "__getitem__ or a transform the Loader runs")
    drawn = _local.drawn
    if drawn is None:
        drawn = _local.drawn = {}
    generator = drawn.get(kind)
    if generator is None:
        seed = sample_seed(*sample)
        if kind == "numpy":  # Philox keyed directly: no SeedSequence hashing per sample
            generator = np.random.Generator(np.random.Philox(key=seed))
        else:
            generator = import_torch_for_output().Generator().manual_seed(seed)
        drawn[kind] = generator
    return generator
