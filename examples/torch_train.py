"""A PyTorch training script with fastloop doing the logistics: a small CNN (torch.nn) trained
on a folder of JPEG files, 10 classes, in torchvision's ImageFolder layout.

* data: ``fastloop.ImageFolder`` + ``fastloop.Loader`` with a ``Pipeline`` of
  RandomResizedCrop + RandomHFlip + Normalize: each image is read, decoded, cropped, resized,
  flipped and normalized in C threads straight into the batch (no Python per image, no worker
  process), and handed out as torch tensors (``output="torch"``) sharing the batch's memory;
* logging: a ``fastloop.Monitor`` writes TensorBoard event files and a CSV (``tensorboard
  --logdir runs``): the loss per step, validation accuracy per epoch, weight histograms, a
  few input images and the run's settings as text;
* checkpoints: a ``fastloop.Checkpointer`` saves the model's and the optimizer's state_dicts
  and the loader's position (no pickle; written in the background) at every epoch's end and
  when stopped; ``--resume`` continues from the latest with the very batches an uninterrupted
  run would have trained on next, to the same weights.

The JPEG files are the ones ``python -m fastloop demo`` trains on (generated once from a seed
into a cache folder; Pillow writes them).

    python examples/torch_train.py                   # 8 epochs
    python examples/torch_train.py --stop-after 50 && python examples/torch_train.py --resume

The last line printed is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from torch import nn

import fastloop
from fastloop.demo.data import CLASSES, IMAGE_SHAPE, image_folder
from fastloop.ops import CenterCrop, Normalize, Pipeline, RandomHFlip, RandomResizedCrop, Resize

CROP = 28  # the files are 32x32
MEAN, STD = 0.5, 0.25


def make_model() -> nn.Module:
    # the classes differ in where their patterns lie, so the head keeps a coarse 4x4 map
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(32 * 16, CLASSES))


def loaders(folder: str, batch_size: int, workers: int) -> tuple[fastloop.Loader, fastloop.Loader]:
    """(train, val) loaders: decode + augment fused per image in the Loader's C threads."""
    augment = Pipeline([RandomResizedCrop(CROP, scale=(0.5, 1.0)), RandomHFlip(),
                        Normalize(MEAN, STD, layout="HWC->CHW")])
    train = fastloop.Loader(fastloop.ImageFolder(os.path.join(folder, "train")), batch_size=batch_size,
                            shuffle=True, seed=0, drop_last=True, num_workers=workers, transform=augment,
                            output="torch")
    center = Pipeline([Resize(IMAGE_SHAPE[1]), CenterCrop(CROP), Normalize(MEAN, STD, layout="HWC->CHW")])
    val = fastloop.Loader(fastloop.ImageFolder(os.path.join(folder, "val")), batch_size=256, num_workers=workers,
                          transform=center, output="torch")
    return train, val


def evaluate(model: nn.Module, loader: fastloop.Loader) -> float:
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    model.train()
    return correct / total


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-workers", type=int, default=2, help="the Loader's C threads")
    parser.add_argument("--quick", action="store_true", help="a small run of a few seconds (tests)")
    parser.add_argument("--stop-after", type=int, default=0, help="stop (and save) after this many steps")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in <out>")
    parser.add_argument("--out", default="runs/torch_train")
    args = parser.parse_args(argv)
    (n_train, n_val), epochs = ((2048, 256), 3) if args.quick else ((10240, 1024), args.epochs)
    torch.manual_seed(0)
    torch.set_num_threads(1)  # deterministic float sums, so a resumed run matches exactly
    folder, _ = image_folder(n_train, n_val)
    loader, val_loader = loaders(folder, args.batch_size, args.num_workers)
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    ckpt = fastloop.Checkpointer(os.path.join(args.out, "checkpoints"), keep=3)
    step = 0
    if args.resume:
        state = ckpt.load()  # the latest; its tensors come back as torch tensors
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        loader.load_state_dict(state["loader"])
        step = state["step"]
        print(f"resumed at step {step}: epoch {state['loader']['epoch']}, batch {state['loader']['position']}")

    def save() -> None:  # between steps: the state is consistent; the file is written in the background
        ckpt.save({"model": model.state_dict(), "optim": opt.state_dict(), "loader": loader.state_dict(),
                   "step": step}, step)

    mon = fastloop.Monitor(interval_s=10.0, start_step=step, gpu=torch.cuda.is_available(), sinks=[
        fastloop.TensorBoardSink(args.out), fastloop.CSVSink(os.path.join(args.out, "metrics.csv"))])
    mon.text("settings", json.dumps(vars(args)), step)
    started, loss, stopped, val_accuracy = time.perf_counter(), float("nan"), False, float("nan")
    while loader.state_dict()["epoch"] < epochs and not stopped:
        for x, y in loader:
            loss_t = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss_t.backward()
            opt.step()
            step, loss = step + 1, loss_t.item()
            mon.scalar("train/loss", loss, step)
            if step == 1:  # what the model sees, back in [0, 1]
                mon.image("train/input", (x[0] * STD + MEAN).clamp(0, 1), step)
            if step == args.stop_after:
                stopped = True
                break
        if stopped:
            break
        epoch = loader.state_dict()["epoch"]
        val_accuracy = evaluate(model, val_loader)
        mon.scalar("val/accuracy", val_accuracy, step)
        for name, weight in model.named_parameters():
            if name.endswith("weight"):
                mon.histogram(f"weights/{name}", weight.detach(), step)
        print(f"epoch {epoch}/{epochs}: loss {loss:.3f}, val accuracy {val_accuracy:.3f}")
        save()
    if stopped:
        save()
    samples_per_s = (step - (state["step"] if args.resume else 0)) * args.batch_size / (time.perf_counter() - started)
    ckpt.close()  # waits for the last write
    mon.close()
    loader.close()
    if stopped:
        val_accuracy = evaluate(model, val_loader)
    val_loader.close()
    result = {"steps": step, "epochs": epochs, "stopped": stopped, "train_loss": loss,
              "val_accuracy": val_accuracy, "loader": loader.state_dict(), "samples_per_s": samples_per_s,
              "checkpoint": ckpt.latest().path}
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
