"""`python -m fastloop demo`: the main job on an embedded default, end to end.

A generated image-classification dataset, written once as JPEG files in torchvision's
ImageFolder layout into a cache folder ($FASTLOOP_CACHE, else ~/.cache/fastloop) and reused
(or, with ``--task regression``, the seed's Linear(10, 1) problem), goes through
fastloop.ImageFolder and fastloop.Loader (C threads decoding, cropping, resizing, flipping and
normalizing each image) into fastloop.nn's train_step (CUDA when available, else the CPU), logged by a
Monitor to metrics.csv and a TensorBoard event file and checkpointed every N steps, all in
``runs/<name>/`` with a plot and a summary. Ctrl-C stops it cleanly, keeping a checkpoint;
``--resume`` continues from it.

    $ python -m fastloop demo                 # a few minutes on 2 cores
    $ python -m fastloop demo --task regression
    $ python -m fastloop demo --resume
"""

from __future__ import annotations

import argparse

from .._cli import DefaultsFormatter
from .train import TASKS, train

__all__ = ["main", "parser"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fastloop demo", description=__doc__.split("\n\n")[0],
                                formatter_class=DefaultsFormatter)
    p.add_argument("--task", choices=sorted(TASKS), default="classification", help="what to train")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda or cuda:N")
    p.add_argument("--out", default="runs", help="folder of run folders")
    p.add_argument("--name", help="run folder name (default: the task; -2, -3... when taken)")
    p.add_argument("--resume", action="store_true", help="continue runs/<name> from its latest checkpoint")
    p.add_argument("--epochs", type=int, help="epochs (default: 20 classification, 100 regression; with --quick 3 "
                                              "and 20)")
    p.add_argument("--batch-size", type=int, help="batch size (default: 256 classification, 64 regression)")
    p.add_argument("--lr", type=float, help="learning rate (default: Adam 1e-3 / SGD 0.01)")
    p.add_argument("--num-workers", type=int, default=2, help="Loader worker threads")
    p.add_argument("--checkpoint-every", type=int, default=200, help="steps between checkpoints (0: at the end only)")
    p.add_argument("--seed", type=int, default=0, help="data, shuffle and initialization seed")
    p.add_argument("--quick", action="store_true",
                   help="a small run: classification 48 steps on 4,096 images (6-9 s on 2 quiet cores, 30-40 s on 2 "
                        "busy ones, the images written once included), regression 320 steps (under a second)")
    p.add_argument("--stop-after", type=int, help=argparse.SUPPRESS)  # acts as a Ctrl-C after that step (tests)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    for name in ("epochs", "batch_size", "num_workers"):
        value = getattr(args, name)
        if value is not None and value < (0 if name == "num_workers" else 1):
            parser().error(f"--{name.replace('_', '-')} must be positive, not {value}")
    return train(args)
