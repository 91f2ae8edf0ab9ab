"""The demo's training run: Loader -> fastloop.nn train_step -> Monitor -> Checkpointer.

Two tasks on embedded generated data: "classification" (JPEG files in ImageFolder layout,
written once into a cache folder, decoded, cropped, resized, flipped and normalized in Loader
threads; an MLP, cross-entropy, Adam) and "regression"
(the seed's Linear(10, 1), MSE, SGD lr 0.01). Everything a run writes lands in one folder:
the TensorBoard event file, metrics.csv, checkpoints/, plot.png and summary.json.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .. import cuda, nn
from ..data import images
from ..checkpoint import Checkpointer
from ..data.datasets import ImageFolder
from ..errors import CodecUnavailable
from ..data.loader import Loader
from ..monitor import CSVSink, Monitor, TensorBoardSink
from ..data.ops import CenterCrop, Normalize, Pipeline, RandomCrop, RandomHFlip, RandomResizedCrop, Resize
from .data import CLASSES, IMAGE_SHAPE, image_folder, make_images, make_regression
from .plot import write_plot
from .progress import Progress

CROP = 28


@dataclass
class Task:
    """What differs between the two tasks; the loop is shared."""

    loader: Loader
    model: nn.Sequential
    opt: nn.Optimizer
    loss: str
    evaluate: Callable[[], dict[str, float]]  # validation metrics, logged per epoch
    epochs: int
    info: dict[str, Any] = field(default_factory=dict)


def to_host(array: Any) -> np.ndarray:
    return array.to_numpy() if hasattr(array, "to_numpy") else np.asarray(array)


def classification(args: Any, device: str) -> Task:
    n_train, n_val = (4096, 1024) if args.quick else (10240, 1024)
    batch_size, target = args.batch_size or 256, None if device == "cpu" else device
    try:  # JPEG files on disk, decoded and augmented in the Loader's C threads
        folder, reused = image_folder(n_train, n_val, seed=args.seed)
        images.ensure_loaded()
    except (ImportError, CodecUnavailable) as error:
        return classification_in_memory(args, device, n_train, n_val, why=str(error))
    augment = Pipeline([RandomResizedCrop(CROP, scale=(0.5, 1.0)), RandomHFlip(), Normalize(0.5, 0.25, layout="HWC->CHW")])
    loader = Loader(ImageFolder(os.path.join(folder, "train")), batch_size=batch_size, shuffle=True, seed=args.seed,
                    num_workers=args.num_workers, transform=augment, drop_last=True, device=target)
    center = Pipeline([Resize(IMAGE_SHAPE[1]), CenterCrop(CROP), Normalize(0.5, 0.25, layout="HWC->CHW")])
    with Loader(ImageFolder(os.path.join(folder, "val")), batch_size=512, num_workers=args.num_workers,
                transform=center) as val_loader:  # decoded once, kept in memory
        val_x, val_y = (np.concatenate(parts) for parts in zip(*[(x.copy(), y.copy()) for x, y in val_loader]))
    info = {"data": f"{n_train} JPEG files {IMAGE_SHAPE[1]}x{IMAGE_SHAPE[2]} in ImageFolder layout, {CLASSES} classes "
                    f"(+{n_val} validation), {'reused from' if reused else 'written to'} {folder}",
            "pipeline": f"decode + RandomResizedCrop({CROP}) + RandomHFlip + Normalize, fused in Loader threads"}
    return mlp_task(args, device, loader, val_x, val_y, info)


def classification_in_memory(args: Any, device: str, n_train: int, n_val: int, why: str) -> Task:
    """Without Pillow or a JPEG decoder: the same images as arrays in memory."""
    data, labels = make_images(n_train + n_val, seed=args.seed)
    augment = Pipeline([RandomCrop(CROP), RandomHFlip(), Normalize(0.5, 0.25)], layout="CHW")
    loader = Loader((data[:n_train], labels[:n_train]), batch_size=args.batch_size or 256, shuffle=True,
                    seed=args.seed, num_workers=args.num_workers, transform=augment, drop_last=True,
                    device=None if device == "cpu" else device)
    val_x = Pipeline([CenterCrop(CROP), Normalize(0.5, 0.25)], layout="CHW")(data[n_train:])
    info = {"data": f"{n_train} generated images {IMAGE_SHAPE} uint8 in memory, {CLASSES} classes (+{n_val} "
                    f"validation); JPEG files need Pillow and a decoder ({why})",
            "pipeline": "RandomCrop(28) + RandomHFlip + Normalize, in Loader threads"}
    return mlp_task(args, device, loader, val_x, labels[n_train:], info)


def mlp_task(args: Any, device: str, loader: Loader, val_x: np.ndarray, val_y: np.ndarray,
             info: dict[str, Any]) -> Task:
    """The MLP, its optimizer and its validation on (CROP x CROP) normalized CHW inputs."""
    nn.manual_seed(args.seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(IMAGE_SHAPE[0] * CROP * CROP, 512), nn.ReLU(),
                          nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, CLASSES), device=device)
    opt = nn.Adam(model, lr=args.lr or 1e-3)
    n_val = len(val_y)

    def evaluate() -> dict[str, float]:
        logits = np.concatenate([to_host(model(val_x[i:i + 512])) for i in range(0, n_val, 512)])
        shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        return {"val/accuracy": float((logits.argmax(axis=1) == val_y).mean()),
                "val/loss": float(-log_probs[np.arange(n_val), val_y].mean())}

    info["model"] = "MLP 2352-512-256-10, cross-entropy, Adam"
    return Task(loader, model, opt, "cross_entropy", evaluate, args.epochs or (3 if args.quick else 20), info)


def regression(args: Any, device: str) -> Task:
    x, y, w_true, b_true = make_regression(1024 + 256, seed=args.seed)
    loader = Loader((x[:1024], y[:1024]), batch_size=args.batch_size or 64, shuffle=True, seed=args.seed,
                    device=None if device == "cpu" else device)
    nn.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(10, 1), device=device)
    opt = nn.SGD(model, lr=args.lr or 0.01)

    def evaluate() -> dict[str, float]:
        mse = float(np.mean((to_host(model(x[1024:])) - y[1024:]) ** 2))
        weight = model.state_dict()["0.weight"][0]
        return {"val/mse": mse, "val/weight_error": float(np.abs(weight - w_true).max())}

    info = {"data": "1024 samples x (10,) float32, y = x @ w + b + noise (+256 validation)",
            "model": "Linear(10, 1), MSE, SGD lr 0.01 (the seed's example)"}
    return Task(loader, model, opt, "mse", evaluate, args.epochs or (20 if args.quick else 100), info)


TASKS = {"classification": classification, "regression": regression}


def pick_device(requested: str) -> tuple[str, str]:
    """(device, why) for --device auto|cpu|cuda|cuda:N."""
    if requested == "auto":
        answer = cuda.is_available()
        return ("cuda", answer.reason) if answer else ("cpu", f"CUDA not used: {answer.reason}")
    return requested, ""


def run_dir(root: str, name: str, resume: bool) -> str:
    """runs/<name> for a resume (it must hold checkpoints); for a new run, runs/<name>, or
    runs/<name>-2, -3... when that already holds a run."""
    path = os.path.join(root, name)
    if resume:
        return path
    n = 1
    while os.path.exists(path) and os.listdir(path):
        n += 1
        path = os.path.join(root, f"{name}-{n}")
    return path


def train(args: Any, log: Callable[[str], None] = print) -> int:
    device, why = pick_device(args.device)
    folder = run_dir(args.out, args.name or args.task, args.resume)
    ckpt_dir = os.path.join(folder, "checkpoints")
    if args.resume and not os.path.isdir(ckpt_dir):
        log(f"error: --resume: no checkpoints in {ckpt_dir} (run the demo once without --resume first)")
        return 2
    os.makedirs(folder, exist_ok=True)
    task = TASKS[args.task](args, device)
    steps_per_epoch = len(task.loader)
    log(f"fastloop demo: {args.task} on {device}{f' ({why})' if why else ''}; BLAS: "
        f"{nn.blas_info() if device == 'cpu' else 'cuBLAS'}")
    for key, value in task.info.items():
        log(f"  {key}: {value}")
    log(f"  output: {folder}")

    ckpt = Checkpointer(ckpt_dir, keep=3)
    epoch, batch_in_epoch, step = 0, 0, 0
    if args.resume:
        progress = nn.load_training_state(ckpt.load(), task.model, task.opt)
        epoch, batch_in_epoch, step = int(progress["epoch"]), int(progress["batch"]), int(progress["step"])
        if "loader.epoch" in progress:  # the loader resumes at the batch after the last one trained
            task.loader.load_state_dict({k[len("loader."):]: v for k, v in progress.items() if k.startswith("loader.")})
        else:  # a checkpoint from before loader states
            task.loader.load_state_dict({"epoch": epoch, "position": batch_in_epoch, "seed": task.loader.seed})
        if epoch >= task.epochs:  # nothing to train: the run's files stay as they are
            log(f"  the run is complete: {step} steps, {epoch} epochs; its summary: "
                f"{os.path.join(folder, 'summary.json')} (ask for more with --epochs N, N > {epoch})")
            task.loader.close()
            ckpt.close()
            return 0
        log(f"  resumed from step {step} (epoch {epoch + 1}, batch {batch_in_epoch})")
    mon = Monitor(interval_s=1.0, sinks=[CSVSink(os.path.join(folder, "metrics.csv")), TensorBoardSink(folder)],
                  metrics=task.loader, gpu=device != "cpu", start_step=step)
    bar = Progress(task.epochs * steps_per_epoch, done_steps=step)
    loss, started, window = float("nan"), time.perf_counter(), (time.perf_counter(), 0)
    val: dict[str, float] = {}

    def save() -> None:
        loader_state = {f"loader.{k}": v for k, v in task.loader.state_dict().items()}
        state = nn.training_state(task.model, task.opt, epoch=epoch, batch=batch_in_epoch, step=step, **loader_state)
        ckpt.save(state, step)

    interrupted = False
    stop_requested = False

    def on_sigint(signum: int, frame: Any) -> None:
        """The first Ctrl-C stops after the step in flight (the checkpoint then matches the
        step count exactly); a second one stops at once."""
        nonlocal stop_requested
        if stop_requested:
            raise KeyboardInterrupt
        stop_requested = True
        bar.message("Ctrl-C: stopping after this step (Ctrl-C again to stop at once)")

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, on_sigint) if in_main else None
    try:
        while epoch < task.epochs:
            if batch_in_epoch == 0:  # else load_state_dict set where this resumed epoch starts
                task.loader.set_epoch(epoch)
            for x, y in task.loader:
                loss = task.model.train_step(x, y, loss=task.loss, opt=task.opt)
                step += 1
                batch_in_epoch += 1
                rows = y.shape[0]
                mon.scalar("train/loss", loss, step)
                bar.update(rows, epoch, task.epochs, loss)
                if step % 20 == 0:
                    now = time.perf_counter()
                    mon.scalar("train/samples_per_s", (step - window[1]) * rows / (now - window[0]), step)
                    window = (now, step)
                if args.checkpoint_every and step % args.checkpoint_every == 0:
                    save()
                if stop_requested or step == args.stop_after:
                    raise KeyboardInterrupt
            epoch, batch_in_epoch = epoch + 1, 0
            val = task.evaluate()
            for name, value in val.items():
                mon.scalar(name, value, step)
            rate = bar.samples_per_s()
            bar.message(f"epoch {epoch}/{task.epochs}: loss {loss:.4f}, "
                        + ", ".join(f"{k} {v:.4f}" for k, v in val.items())
                        + (f", {rate:,.0f} samples/s" if rate is not None else ""))
        save()
    except KeyboardInterrupt:
        interrupted = True
        bar.message(f"interrupted at step {step}: saving a checkpoint ...")
        save()
    finally:
        if in_main:
            signal.signal(signal.SIGINT, previous)
        bar.close()
        ckpt.wait()
        task.loader.close()
        mon.close()
        ckpt.close()
    elapsed = time.perf_counter() - started
    return summarize(args, folder, task, step, loss, val, elapsed, bar, device, interrupted, log)


def summarize(args: Any, folder: str, task: Task, step: int, loss: float, val: dict[str, float], elapsed: float,
              bar: Progress, device: str, interrupted: bool, log: Callable[[str], None]) -> int:
    """summary.json and the closing lines. The rate is over the steps this run trained (the
    bar's clock), and left out when they took under a second (start-up would dominate it)."""
    samples_per_s = bar.samples_per_s()
    csv_path = os.path.join(folder, "metrics.csv")
    plot_path = os.path.join(folder, "plot.png")
    why_no_plot = write_plot(csv_path, plot_path, "train/loss", "train/samples_per_s")
    events = sorted(f for f in os.listdir(folder) if f.startswith("events.out.tfevents"))
    summary = {"task": args.task, "device": device, "steps": step, "epochs": task.epochs, "final_loss": loss,
               **val, "seconds": round(elapsed, 3), "samples_per_s": None if samples_per_s is None else
               round(samples_per_s, 1), "interrupted": interrupted, "folder": folder}
    summary_path = os.path.join(folder, "summary.json")
    with open(summary_path, "w") as f:
        json.dump(summary, f, indent=2)
    rate = (f"{samples_per_s:,.0f} samples/s" if samples_per_s is not None else
            f"too short to time a rate ({bar.steps_s():.3f} s of steps)")
    this_run = f" ({step - bar.start_done} this run)" if bar.start_done else ""
    log("")
    log(f"{'interrupted' if interrupted else 'done'}: {step} steps{this_run} in {elapsed:.{1 if elapsed >= 1 else 2}f} s, "
        f"{rate}, "
        f"final loss {loss:.4f}" + "".join(f", {k} {v:.4f}" for k, v in val.items()))
    log(f"  TensorBoard: tensorboard --logdir {folder}   ({len(events)} event file(s))")
    log(f"  metrics:     {csv_path}")
    log(f"  checkpoints: {os.path.join(folder, 'checkpoints')}  (resume: python -m fastloop demo --task {args.task} "
        f"--resume{f' --name {os.path.basename(folder)}' if os.path.basename(folder) != args.task else ''})")
    log(f"  plot:        {plot_path}" if why_no_plot is None else f"  plot:        none ({why_no_plot})")
    log(f"  summary:     {summary_path}")
    return 130 if interrupted else 0
