"""An MLP classifier trained with fastloop: 10 classes, 32 features, train/validation split.

The data is generated: ten interleaved spiral arms in the plane (one class per arm, with
angular noise), lifted to 32 features by fixed random sinusoids, ``sin(p @ P + phase)``,
plus a little noise. No linear model separates the classes; the MLP

    Sequential(Linear(32, 256), ReLU(), Linear(256, 256), ReLU(), Linear(256, 10))

reaches ~96% validation accuracy in the default run (a few seconds on 2 CPU cores).
Around the training step (one C call with the GIL released):

* ``fastloop.Loader`` shuffles and batches the training arrays on C threads;
* ``fastloop.Monitor`` writes ``train/loss`` every step and ``val/accuracy``, ``val/loss``,
  ``train/lr`` every epoch to TensorBoard and CSV from a C thread;
* ``fastloop.Checkpointer``: ``<out>/checkpoints`` gets model + optimizer + epoch after every
  epoch (the newest 3 are kept; ``--resume`` continues from the latest), and ``<out>/best``
  keeps the single checkpoint with the best validation accuracy so far.

    python examples/mlp_classifier.py                          # Adam, 20 epochs
    python examples/mlp_classifier.py --optimizer sgd          # SGD with Nesterov momentum 0.9
    python examples/mlp_classifier.py --epochs 30 --resume     # 10 more epochs
    tensorboard --logdir runs/mlp_classifier

The learning rate follows a cosine from ``--lr`` to 0 over ``--epochs`` (set through
``opt.lr`` between epochs). The last line printed is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

import numpy as np

import fastloop
import fastloop.nn as nn

CLASSES, FEATURES = 10, 32
DEFAULT_LR = {"adam": 3e-3, "sgd": 0.1}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--epochs", type=int, default=None, help="total epochs (default 20; 8 with --quick)")
    add("--samples", type=int, default=None, help="training samples (default 20000; 4000 with --quick)")
    add("--val-samples", type=int, default=None, help="validation samples (default 4000; 1000 with --quick)")
    add("--batch-size", type=int, default=128, help="default %(default)s")
    add("--optimizer", choices=("adam", "sgd"), default="adam",
        help="adam (default), or sgd: SGD with Nesterov momentum 0.9")
    add("--lr", type=float, default=None, help="peak learning rate (default 3e-3 Adam, 0.1 SGD)")
    add("--seed", type=int, default=0,
        help="seeds the data, the initialization and the shuffling (default %(default)s)")
    add("--num-workers", type=int, default=2, help="Loader worker threads (default %(default)s)")
    add("--out", default=os.path.join("runs", "mlp_classifier"),
        help="TensorBoard events, metrics.csv, checkpoints/ and best/ go here (default %(default)s)")
    add("--resume", action="store_true", help="continue from the latest checkpoint in <out>/checkpoints")
    add("--stop-after", type=int, default=None, metavar="EPOCH",
        help="stop after this epoch, as if interrupted (the schedule still spans --epochs)")
    add("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    add("--quick", action="store_true", help="a small, fast run (for tests)")
    args = parser.parse_args(argv)
    if args.epochs is None:
        args.epochs = 8 if args.quick else 20
    if args.samples is None:
        args.samples = 4000 if args.quick else 20000
    if args.val_samples is None:
        args.val_samples = 1000 if args.quick else 4000
    if args.lr is None:
        args.lr = DEFAULT_LR[args.optimizer]
    return args


def make_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """x (n, 32) float32 and labels (n,) int64: noisy spiral arms lifted by random sinusoids."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, n)
    radius = rng.uniform(0.15, 1.0, n)
    angle = 2 * np.pi * labels / CLASSES + 2 * np.pi * radius + rng.normal(0.0, 0.12, n)
    points = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1)
    lift = np.random.default_rng(1234)  # the same feature map for every seed
    projection, phase = lift.normal(0.0, 1.5, (2, FEATURES)), lift.uniform(0.0, 2 * np.pi, FEATURES)
    x = np.sin(points @ projection + phase) + rng.normal(0.0, 0.05, (n, FEATURES))
    return x.astype(np.float32), labels.astype(np.int64)


def fail(message: str) -> None:
    """Print `message` to stderr and exit with status 2 (as argparse does for bad arguments)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def check_device(device: str) -> None:
    """Exit with status 2 and the reason when `device` asks for CUDA that is not usable."""
    if device.startswith("cuda"):
        answer = fastloop.cuda.is_available()
        if not answer:
            fail(f"--device {device}: CUDA is not available: {answer.reason}")
    elif device != "cpu":
        fail(f"--device must be cpu, cuda or cuda:N, not {device!r}")


def to_numpy(array: Any) -> np.ndarray:
    """A model output on the host (a CUDA model returns a fastloop.cuda.DeviceArray)."""
    return array if isinstance(array, np.ndarray) else array.to_numpy()


# ---- training


def evaluate(model: nn.Sequential, x: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of the model on x."""
    logits = to_numpy(model(x)).astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = float(-log_probs[np.arange(len(labels)), labels].mean())
    return float((logits.argmax(axis=1) == labels).mean()), loss


def cosine_lr(peak: float, epoch: int, epochs: int) -> float:
    return 0.5 * peak * (1 + math.cos(math.pi * epoch / epochs))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_device(args.device)
    x, labels = make_data(args.samples + args.val_samples, args.seed)
    x_train, y_train = x[:args.samples], labels[:args.samples]
    x_val, y_val = x[args.samples:], labels[args.samples:]

    nn.manual_seed(args.seed)
    try:
        model = nn.Sequential(nn.Linear(FEATURES, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, CLASSES), device=args.device)
    except fastloop.CudaUnavailable as error:
        fail(f"--device {args.device}: {error}")
    if args.optimizer == "adam":
        opt: nn.Optimizer = nn.Adam(model, lr=args.lr)
    else:
        opt = nn.SGD(model, lr=args.lr, momentum=0.9, nesterov=True)

    ckpt_dir, best_dir = os.path.join(args.out, "checkpoints"), os.path.join(args.out, "best")
    ckpt, best_ckpt = fastloop.Checkpointer(ckpt_dir, keep=3), fastloop.Checkpointer(best_dir, keep=1)
    start_epoch, step, best_acc, best_epoch = 0, 0, -1.0, 0
    if args.resume:
        latest = ckpt.latest()
        if latest is None:
            print(f"no checkpoint in {ckpt_dir}: starting from scratch")
        else:
            state = nn.load_training_state(ckpt.load(), model, opt)
            start_epoch, step = int(state["epoch"]), int(state["step"])
            best_acc, best_epoch = float(state["best_val_accuracy"]), int(state["best_epoch"])
            print(f"resumed from {latest.path}: epoch {start_epoch}, step {step}, "
                  f"best validation accuracy {best_acc:.2%} (epoch {best_epoch})")

    loader = fastloop.Loader((x_train, y_train), batch_size=args.batch_size, shuffle=True, seed=args.seed,
                             num_workers=args.num_workers)
    sinks = [fastloop.TensorBoardSink(args.out), fastloop.CSVSink(os.path.join(args.out, "metrics.csv"))]
    mon = fastloop.Monitor(interval_s=5.0, sinks=sinks, gpu=args.device != "cpu")
    mon.attach(loader)  # its stats() every interval: loader/samples, loader/samples/per_s, ...

    print(f"MLP classifier: {args.samples} train / {args.val_samples} validation samples, {FEATURES} features, "
          f"{CLASSES} classes, {model.num_parameters():,} parameters, {args.optimizer} lr {args.lr}, "
          f"batch {args.batch_size}, epochs {start_epoch + 1}..{args.epochs} on {model.device}")
    samples, train_loss, val_acc, val_loss, end_epoch = 0, float("nan"), float("nan"), float("nan"), start_epoch
    started = time.perf_counter()
    with loader, mon, ckpt, best_ckpt:
        for epoch in range(start_epoch, min(args.epochs, args.stop_after or args.epochs)):
            opt.lr = cosine_lr(args.lr, epoch, args.epochs)
            loader.set_epoch(epoch)  # the same order as an uninterrupted run, also after --resume
            total, batches = 0.0, 0
            for xb, yb in loader:
                loss = model.train_step(xb, yb, loss="cross_entropy", opt=opt)  # one C call, GIL released
                mon.scalar("train/loss", loss, step)
                total, batches, step, samples = total + loss, batches + 1, step + 1, samples + len(xb)
            train_loss = total / batches
            val_acc, val_loss = evaluate(model, x_val, y_val)
            for name, value in (("train/epoch_loss", train_loss), ("train/lr", opt.lr),
                                ("val/accuracy", val_acc), ("val/loss", val_loss)):
                mon.scalar(name, value, step)
            done = end_epoch = epoch + 1
            if val_acc > best_acc:
                best_acc, best_epoch = val_acc, done
                best_ckpt.save({**{f"model.{k}": v for k, v in model.state_dict().items()},
                                "epoch": done, "step": step, "val_accuracy": val_acc}, step)
            ckpt.save(nn.training_state(model, opt, epoch=done, step=step, best_val_accuracy=best_acc,
                                     best_epoch=best_epoch), step)
            elapsed = time.perf_counter() - started
            print(f"epoch {done:3d}/{args.epochs}  train loss {train_loss:.4f}  val loss {val_loss:.4f}  "
                  f"val acc {val_acc:6.2%}  lr {opt.lr:.2e}  {samples / max(elapsed, 1e-9):,.0f} samples/s")
    elapsed = time.perf_counter() - started

    if end_epoch == start_epoch:  # nothing was trained: report the restored model
        val_acc, val_loss = evaluate(model, x_val, y_val)
    latest, best = ckpt.latest(), best_ckpt.latest()
    print(f"done: epochs {start_epoch + 1}..{end_epoch} of {args.epochs}, {step} steps in total, "
          f"{samples / max(elapsed, 1e-9):,.0f} samples/s")
    print(f"final validation accuracy {val_acc:.2%} (loss {val_loss:.4f}); "
          f"best {best_acc:.2%} at epoch {best_epoch}")
    print(f"logs: {args.out} (tensorboard --logdir {args.out}; metrics.csv); "
          f"checkpoints: {ckpt_dir}, best model: {best_dir}")
    result = {
        "example": "mlp_classifier", "device": args.device, "optimizer": args.optimizer,
        "start_epoch": start_epoch, "end_epoch": end_epoch, "epochs": args.epochs, "steps": step,
        "train_loss": train_loss, "val_accuracy": val_acc, "val_loss": val_loss,
        "best_val_accuracy": best_acc, "best_epoch": best_epoch,
        "samples_per_s": samples / max(elapsed, 1e-9), "out": args.out,
        "checkpoint": latest.path if latest else None, "best_checkpoint": best.path if best else None,
    }
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
