"""Data-parallel training with fastloop under torchrun: sharded Loader, all-reduced gradients.

Launch one process per rank with torchrun (it sets RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT, which torch.distributed and fastloop.Loader read):

    torchrun --nproc_per_node=2 examples/ddp_train.py                  # 10 epochs
    torchrun --nproc_per_node=2 examples/ddp_train.py --quick --out runs/ddp_quick
    tensorboard --logdir runs/ddp_train

Every rank generates the same data (same seed): a 4-class problem in 16 float32 features,
labelled by a fixed random teacher network, plus an int64 sample id per sample. Then:

* ``fastloop.Loader((x, y, ids), shuffle=True, seed=..., drop_last=True)`` takes rank and
  world size from RANK/WORLD_SIZE: every rank draws the same epoch order and keeps its
  strided, disjoint shard; ``loader.set_epoch(epoch)`` changes the order each epoch;
* the model, ``Sequential(Linear(16, 128), ReLU(), Linear(128, 128), ReLU(), Linear(128, 4))``,
  starts from rank 0's parameters (``torch.distributed.broadcast``);
* each step: ``model.backward()`` (forward + backward in C, no update), every gradient
  all-reduced and averaged in place through ``torch.from_numpy`` views, ``model.set_grads()``,
  ``opt.step()`` -- what DistributedDataParallel does, so every rank stays identical;
* rank 0 alone logs (``fastloop.Monitor``: TensorBoard + ``metrics.csv`` in ``--out``) and
  checkpoints (``fastloop.Checkpointer`` in ``<out>/checkpoints``, ``nn.training_state``).

At the end every rank checks that its parameters equal rank 0's bit for bit. Each rank writes
the sample ids it trained on to ``<out>/samples_rank<r>_epoch<e>.npy`` and its final
parameters to ``<out>/params_rank<r>.npz`` (tests/test_ddp.py checks them); rank 0 prints
``RESULT {json}`` last. The backend is gloo on CPU, NCCL when the model runs on CUDA.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from typing import Any

import numpy as np

import fastloop
import fastloop.nn as nn

CLASSES, FEATURES, HIDDEN = 4, 16, 128
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
HOW_TO_LAUNCH = """\
error: examples/ddp_train.py runs one process per rank and must be launched by torchrun,
which sets {missing}. For example, 2 ranks on this machine:

    torchrun --nproc_per_node=2 examples/ddp_train.py --quick
    python -m torch.distributed.run --nproc_per_node=2 examples/ddp_train.py --quick"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--epochs", type=int, default=None, help="epochs (default 10; 4 with --quick)")
    add("--samples", type=int, default=None,
        help="training samples (default 16384; 1024 with --quick); a multiple of world size x batch "
             "size covers the data exactly each epoch")
    add("--val-samples", type=int, default=None, help="validation samples (default 4096; 1024 with --quick)")
    add("--batch-size", type=int, default=None, help="per-rank batch size (default 128; 64 with --quick)")
    add("--lr", type=float, default=3e-3, help="Adam learning rate (default %(default)s)")
    add("--seed", type=int, default=0,
        help="seeds the data, the initialization and the shuffling (default %(default)s)")
    add("--num-workers", type=int, default=1, help="Loader worker threads per rank (default %(default)s)")
    add("--out", default=os.path.join("runs", "ddp_train"),
        help="logs, checkpoints/, sample ids and final parameters go here (default %(default)s)")
    add("--device", default="auto",
        help="auto (default: cuda when torch and fastloop see a GPU, else cpu), cpu, or cuda "
             "(each rank uses cuda:LOCAL_RANK)")
    add("--backend", choices=("auto", "gloo", "nccl"), default="auto",
        help="torch.distributed backend (default auto: nccl for cuda, gloo for cpu)")
    add("--timeout", type=float, default=300.0, help="seconds a collective may wait (default %(default)s)")
    add("--quick", action="store_true", help="a small run of a few seconds (for tests)")
    args = parser.parse_args(argv)
    defaults = {"epochs": (4, 10), "samples": (1024, 16384), "val_samples": (1024, 4096), "batch_size": (64, 128)}
    for name, (quick, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    return args


def fail(message: str) -> None:
    """Print `message` to stderr and exit with status 2 (as argparse does for bad arguments)."""
    print(message if message.startswith("error:") else f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def make_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (n, 16) float32, labels (n,) int64 from a fixed random teacher network, ids (n,) int64."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0.0, 1.0, (n, FEATURES))
    teacher = np.random.default_rng(4321)  # the same labelling function for every seed
    w1, w2 = teacher.normal(0.0, 0.25, (FEATURES, 8)), teacher.normal(0.0, 1.0, (8, CLASSES))
    labels = (np.tanh(x @ w1) @ w2).argmax(axis=1)
    return x.astype(np.float32), labels.astype(np.int64), np.arange(n, dtype=np.int64)


def pick_device(requested: str, local_rank: int) -> str:
    """The fastloop device of this rank: "cpu" or "cuda:<n>" (exit 2 when CUDA is not usable)."""
    import torch

    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() and fastloop.cuda.is_available() else "cpu"
    if requested == "cpu":
        return "cpu"
    if requested != "cuda" and not requested.startswith("cuda:"):
        fail(f"--device must be auto, cpu or cuda, not {requested!r}")
    answer = fastloop.cuda.is_available()
    if not answer:
        fail(f"--device {requested}: CUDA is not available to fastloop: {answer.reason}")
    if not torch.cuda.is_available():
        fail(f"--device {requested}: torch sees no CUDA device")
    if requested.startswith("cuda:"):
        return requested
    return f"cuda:{local_rank % torch.cuda.device_count()}"


# ---- the collective parts


def broadcast_parameters(model: nn.Sequential, comm: Any) -> None:
    """Every rank takes rank 0's parameters (as DistributedDataParallel does at construction)."""
    import torch
    import torch.distributed as dist

    state = model.state_dict()  # NumPy copies
    tensors = {name: torch.from_numpy(value).to(comm) for name, value in state.items()}
    for tensor in tensors.values():
        dist.broadcast(tensor, src=0)
    model.load_state_dict(tensors)


def average_gradients(model: nn.Sequential, loss: float, world_size: int, comm: Any) -> float:
    """All-reduces the gradients of the last backward() to their mean over the ranks and sets
    them back; returns the mean loss over the ranks. On the CPU the all-reduce works in place
    on the NumPy copies that grads() returns (torch.from_numpy shares their memory)."""
    import torch
    import torch.distributed as dist

    grads = model.grads()  # OrderedDict of NumPy copies, state_dict names
    tensors = [torch.from_numpy(g) for g in grads.values()] + [torch.tensor([loss], dtype=torch.float64)]
    if comm.type != "cpu":  # NCCL reduces device tensors
        tensors = [t.to(comm) for t in tensors]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]  # all in flight together
    for work in works:
        work.wait()
    for tensor in tensors:
        tensor.div_(world_size)
    if comm.type != "cpu":
        grads = {name: t.cpu().numpy() for name, t in zip(grads, tensors)}
    model.set_grads(grads)
    return float(tensors[-1].item())


def evaluate(model: nn.Sequential, x: np.ndarray, labels: np.ndarray, rank: int, world_size: int,
             comm: Any) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) over the whole validation set: each rank scores a strided
    share and the sums are all-reduced."""
    import torch
    import torch.distributed as dist

    xs, ys = x[rank::world_size], labels[rank::world_size]
    out = model(xs)
    logits = (out if isinstance(out, np.ndarray) else out.to_numpy()).astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    sums = torch.tensor([float((logits.argmax(axis=1) == ys).sum()), float(-log_probs[np.arange(len(ys)), ys].sum()),
                         float(len(ys))], dtype=torch.float64, device=comm)
    dist.all_reduce(sums)
    correct, loss, count = sums.tolist()
    return correct / count, loss / count


def max_difference_from_rank0(model: nn.Sequential, comm: Any) -> float:
    """The largest |parameter - rank 0's parameter| over every parameter and every rank."""
    import torch
    import torch.distributed as dist

    mine = torch.from_numpy(np.concatenate([v.ravel() for v in model.state_dict().values()])).to(comm)
    rank0 = mine.clone()
    dist.broadcast(rank0, src=0)
    difference = (mine - rank0).abs().max().reshape(1).double()
    dist.all_reduce(difference, op=dist.ReduceOp.MAX)
    return float(difference.item())


# ---- training


def train(args: argparse.Namespace, rank: int, world_size: int, device: str, comm: Any) -> dict[str, Any]:
    x, labels, ids = make_data(args.samples + args.val_samples, args.seed)  # the same on every rank
    x_train, y_train, id_train = x[:args.samples], labels[:args.samples], ids[:args.samples]
    x_val, y_val = x[args.samples:], labels[args.samples:]

    # rank and world_size come from RANK / WORLD_SIZE; drop_last so that no rank's last batch is short.
    loader = fastloop.Loader((x_train, y_train, id_train), batch_size=args.batch_size, shuffle=True,
                             seed=args.seed, num_workers=args.num_workers, drop_last=True)
    # The shards are equal in size (trimmed, with drop_last), so every rank runs the same
    # number of steps: none waits in an all-reduce the others never join.
    steps_per_epoch = len(loader)
    if steps_per_epoch == 0:
        fail(f"{args.samples} samples give rank {rank} no full batch of {args.batch_size}: "
             f"use more --samples or a smaller --batch-size")

    nn.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                          nn.Linear(HIDDEN, CLASSES), device=device)
    broadcast_parameters(model, comm)  # identical start even if the ranks' seeds differed
    opt = nn.Adam(model, lr=args.lr)

    mon = ckpt = None
    if rank == 0:  # one writer of logs and checkpoints
        mon = fastloop.Monitor(interval_s=5.0, gpu=device != "cpu", sinks=[
            fastloop.TensorBoardSink(args.out), fastloop.CSVSink(os.path.join(args.out, "metrics.csv"))])
        mon.attach(loader)
        ckpt = fastloop.Checkpointer(os.path.join(args.out, "checkpoints"), keep=3)
        print(f"DDP over {world_size} ranks ({comm.type} {args.backend}), model on {device}: "
              f"{args.samples} samples, {steps_per_epoch} steps of {args.batch_size} per rank per epoch, "
              f"{model.num_parameters():,} parameters, Adam lr {args.lr}", flush=True)

    step, epoch_losses, val_acc, val_loss = 0, [], float("nan"), float("nan")
    started = time.perf_counter()
    try:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)  # every rank the same epoch order, a new one each epoch
            seen, total = [], 0.0
            for xb, yb, idb in loader:
                loss = model.backward(xb, yb, loss="cross_entropy")  # forward + backward, no update
                loss = average_gradients(model, loss, world_size, comm)
                opt.step()
                seen.append(idb.copy())  # the batch is a view of a slot the loader reuses
                if mon is not None:
                    mon.scalar("train/loss", loss, step)
                total, step = total + loss, step + 1
            np.save(os.path.join(args.out, f"samples_rank{rank}_epoch{epoch}.npy"), np.concatenate(seen))
            epoch_losses.append(total / steps_per_epoch)
            val_acc, val_loss = evaluate(model, x_val, y_val, rank, world_size, comm)
            if rank == 0:
                for name, value in (("train/epoch_loss", epoch_losses[-1]), ("val/accuracy", val_acc),
                                    ("val/loss", val_loss)):
                    mon.scalar(name, value, step)
                ckpt.save(nn.training_state(model, opt, epoch=epoch + 1, step=step), step)
                print(f"epoch {epoch + 1:3d}/{args.epochs}  train loss {epoch_losses[-1]:.4f}  "
                      f"val loss {val_loss:.4f}  val acc {val_acc:6.2%}", flush=True)
    finally:
        loader.close()
        if mon is not None:
            mon.close()
        if ckpt is not None:
            ckpt.close()  # finishes the pending write
    elapsed = time.perf_counter() - started

    params = model.state_dict()
    np.savez(os.path.join(args.out, f"params_rank{rank}.npz"), **params)
    difference = max_difference_from_rank0(model, comm)
    if difference != 0.0:
        raise RuntimeError(f"rank {rank}: the ranks' parameters differ (max |difference| {difference})")
    latest = ckpt.latest() if ckpt is not None else None
    return {
        "example": "ddp_train", "world_size": world_size, "backend": args.backend, "device": device,
        "epochs": args.epochs, "steps": step, "steps_per_epoch": steps_per_epoch,
        "batch_size": args.batch_size, "samples": args.samples, "seed": args.seed,
        "epoch_losses": epoch_losses, "final_loss": epoch_losses[-1], "first_loss": epoch_losses[0],
        "val_accuracy": val_acc, "val_loss": val_loss, "max_param_difference": difference,
        "params_identical": difference == 0.0,
        "param_checksum": float(sum(float(np.abs(v).astype(np.float64).sum()) for v in params.values())),
        "samples_per_s": world_size * step * args.batch_size / max(elapsed, 1e-9),
        "out": args.out, "checkpoint": latest.path if latest else None,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = [name for name in LAUNCH_VARIABLES if not os.environ.get(name)]
    if missing:
        fail(HOW_TO_LAUNCH.format(missing=", ".join(missing)))
    try:
        import torch
        import torch.distributed as dist
    except ImportError as error:
        fail(f"this example needs torch (torch.distributed): {error}")
    if not dist.is_available():
        fail("this torch build has no torch.distributed")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = pick_device(args.device, int(os.environ.get("LOCAL_RANK", rank)))
    if args.backend == "auto":
        args.backend = "nccl" if device != "cpu" else "gloo"
    comm = torch.device(device if args.backend == "nccl" else "cpu")  # where collectives' tensors live
    if comm.type == "cuda":
        torch.cuda.set_device(comm)
    os.makedirs(args.out, exist_ok=True)

    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))  # env:// from torchrun
    try:
        result = train(args, rank, world_size, device, comm)
    except SystemExit:
        raise
    except BaseException:
        print(f"rank {rank} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        return 1  # torchrun stops the other ranks
    finally:
        dist.destroy_process_group()
    if rank == 0:
        print(f"done: {result['steps']} steps per rank, final train loss {result['final_loss']:.4f}, "
              f"val accuracy {result['val_accuracy']:.2%}, parameters identical on all {world_size} ranks")
        print(f"logs: {args.out} (tensorboard --logdir {args.out}; metrics.csv); "
              f"checkpoints: {os.path.join(args.out, 'checkpoints')}")
        print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
