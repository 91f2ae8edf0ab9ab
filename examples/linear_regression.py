"""Linear regression trained with fastloop: the smallest complete training loop.

A generated dataset (x ~ N(0, 1), shape (N, 10); y = x @ w_true + b_true + noise) is fitted
by ``fastloop.nn.Linear(10, 1)`` with MSE and SGD. Around the training step:

* ``fastloop.Loader`` shuffles and batches the arrays on C threads (batches are zero-copy
  views of loader-owned slots);
* ``fastloop.Monitor`` writes every step's loss to TensorBoard and CSV from a C thread;
* ``fastloop.Checkpointer`` saves model, optimizer and epoch every ``--checkpoint-every``
  epochs (a memcpy; a C thread writes the safetensors file), and ``--resume`` continues from the latest.

    python examples/linear_regression.py                 # 100 epochs, logs in runs/linear_regression
    python examples/linear_regression.py --epochs 150 --resume   # 50 more epochs from the checkpoint
    tensorboard --logdir runs/linear_regression

The last line printed is ``RESULT {json}`` (final MSE, weight error, samples/s, paths) for
scripts and tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

import fastloop
import fastloop.nn as nn


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--epochs", type=int, default=None, help="total epochs (default 100; 40 with --quick)")
    add("--samples", type=int, default=None, help="dataset size N (default 1024; 512 with --quick)")
    add("--batch-size", type=int, default=64, help="default %(default)s")
    add("--lr", type=float, default=0.01,
        help="SGD learning rate (default %(default)s; --resume keeps the checkpoint's)")
    add("--noise", type=float, default=0.1, help="standard deviation of the noise on y (default %(default)s)")
    add("--seed", type=int, default=0,
        help="seeds the data, the initialization and the shuffling (default %(default)s)")
    add("--num-workers", type=int, default=2, help="Loader worker threads (default %(default)s)")
    add("--checkpoint-every", type=int, default=10, help="epochs between checkpoints (default %(default)s)")
    add("--out", default=os.path.join("runs", "linear_regression"),
        help="TensorBoard events, metrics.csv and checkpoints/ go here (default %(default)s)")
    add("--resume", action="store_true", help="continue from the latest checkpoint in <out>/checkpoints")
    add("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    add("--quick", action="store_true", help="a small, fast run (for tests)")
    args = parser.parse_args(argv)
    if args.epochs is None:
        args.epochs = 40 if args.quick else 100
    if args.samples is None:
        args.samples = 512 if args.quick else 1024
    return args


def make_data(n: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """x (n, 10), y (n, 1) float32, and the true weights (10,) and bias."""
    rng = np.random.default_rng(seed)
    w_true = rng.standard_normal(10).astype(np.float32)
    b_true = float(rng.standard_normal())
    x = rng.standard_normal((n, 10), dtype=np.float32)
    y = x @ w_true[:, None] + np.float32(b_true) + rng.normal(0.0, noise, (n, 1)).astype(np.float32)
    return x, y.astype(np.float32), w_true, b_true


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


# ---- training


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check_device(args.device)
    x, y, w_true, b_true = make_data(args.samples, args.noise, args.seed)

    nn.manual_seed(args.seed)
    try:
        model = nn.Linear(10, 1).to(args.device)
    except fastloop.CudaUnavailable as error:
        fail(f"--device {args.device}: {error}")
    opt = nn.SGD(model, lr=args.lr)  # after .to(): the optimizer's state lives on the model's device

    ckpt_dir = os.path.join(args.out, "checkpoints")
    ckpt = fastloop.Checkpointer(ckpt_dir, keep=3)
    start_epoch, step = 0, 0
    if args.resume:
        latest = ckpt.latest()
        if latest is None:
            print(f"no checkpoint in {ckpt_dir}: starting from scratch")
        else:
            progress = nn.load_training_state(ckpt.load(), model, opt)
            start_epoch, step = int(progress["epoch"]), int(progress["step"])
            print(f"resumed from {latest.path}: epoch {start_epoch}, step {step}")

    loader = fastloop.Loader((x, y), batch_size=args.batch_size, shuffle=True, seed=args.seed,
                             num_workers=args.num_workers)
    sinks = [fastloop.TensorBoardSink(args.out), fastloop.CSVSink(os.path.join(args.out, "metrics.csv"))]
    mon = fastloop.Monitor(interval_s=5.0, sinks=sinks, gpu=args.device != "cpu")
    mon.attach(loader)  # its stats() every interval: loader/samples, loader/samples/per_s, ...

    print(f"linear regression: {args.samples} samples, batch {args.batch_size}, SGD lr {args.lr}, "
          f"epochs {start_epoch + 1}..{args.epochs} on {args.device} ({nn.blas_info()})")
    report_every = max(1, args.epochs // 10)
    samples, epoch_loss = 0, float("nan")
    started = time.perf_counter()
    with loader, mon, ckpt:
        for epoch in range(start_epoch, args.epochs):
            loader.set_epoch(epoch)  # the same order as an uninterrupted run, also after --resume
            total, batches = 0.0, 0
            for xb, yb in loader:
                loss = model.train_step(xb, yb, loss="mse", opt=opt)  # one C call, GIL released
                mon.scalar("train/loss", loss, step)
                total, batches, step, samples = total + loss, batches + 1, step + 1, samples + len(xb)
            epoch_loss = total / batches
            mon.scalar("train/epoch_loss", epoch_loss, step)
            done = epoch + 1
            if done % args.checkpoint_every == 0 or done == args.epochs:
                ckpt.save(nn.training_state(model, opt, epoch=done, step=step), step)
            if done % report_every == 0 or done == args.epochs or epoch == start_epoch:
                elapsed = time.perf_counter() - started
                print(f"epoch {done:4d}/{args.epochs}  loss {epoch_loss:.5f}  step {step}  "
                      f"{samples / max(elapsed, 1e-9):,.0f} samples/s")
    elapsed = time.perf_counter() - started

    prediction = model(x)
    prediction = prediction if isinstance(prediction, np.ndarray) else prediction.to_numpy()  # from CUDA
    mse = float(np.mean((prediction - y) ** 2))
    w_learned, b_learned = model.weight.reshape(-1), float(model.bias[0])
    w_error = float(np.max(np.abs(w_learned - w_true)))
    latest = ckpt.latest()  # listing the directory works after close()
    print(f"done: {args.epochs - start_epoch} epochs, {step} steps in total, "
          f"{samples / max(elapsed, 1e-9):,.0f} samples/s")
    print(f"final MSE on all data {mse:.5f} (noise variance {args.noise ** 2:.5f}); "
          f"max |w - w_true| {w_error:.4f}, |b - b_true| {abs(b_learned - b_true):.4f}")
    print(f"logs: {args.out} (tensorboard --logdir {args.out}; metrics.csv); checkpoints: {ckpt_dir}")
    result = {
        "example": "linear_regression", "device": args.device, "start_epoch": start_epoch,
        "end_epoch": max(start_epoch, args.epochs), "epochs": args.epochs, "steps": step,
        "final_epoch_loss": epoch_loss, "mse": mse, "noise_variance": args.noise ** 2,
        "w_max_abs_error": w_error, "b_abs_error": abs(b_learned - b_true), "w_true": w_true.tolist(),
        "b_true": b_true, "samples_per_s": samples / max(elapsed, 1e-9), "out": args.out,
        "checkpoint": latest.path if latest else None,
    }
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
