"""A PyTorch training script with fastloop.Loader in place of DataLoader: a small CNN on
generated 3x20x20 images of four textures (horizontal stripes, vertical stripes, a checker
board, a blob), 4 classes.

* training data: a torch ``Dataset`` whose ``__getitem__`` augments with torch ops (random
  16x16 crop, horizontal flip, normalize); ``fastloop.Loader(..., num_workers=2,
  output="torch")`` runs it in forked worker processes (torch held to one thread there and its
  generator seeded per batch, so augmentations repeat run to run) and hands out tensors;
* validation data: a tuple of tensors (fields, not samples) through a C ``Pipeline``
  (center crop + normalize) on the Loader's threads;
* ``--stop-after N`` stops mid-epoch and saves ``torch.save({"model", "optim", "loader":
  loader.state_dict()})``; ``--resume`` continues with the very batches an uninterrupted run
  would have trained on next.

    python examples/torch_train.py                  # 6 epochs
    python examples/torch_train.py --stop-after 50 && python examples/torch_train.py --resume

The last line printed is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
from torch import nn

import fastloop
from fastloop.ops import CenterCrop, Normalize, Pipeline

SIZE, CROP, CLASSES = 20, 16, 4


def make_images(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n uint8 images (n, 3, 20, 20) of the four textures at random phases and colours."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, n)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    images = np.empty((n, 3, SIZE, SIZE), np.uint8)
    for i, label in enumerate(labels):
        period, phase = rng.integers(3, 6), rng.integers(0, 6)
        pattern = [((yy + phase) // period) % 2, ((xx + phase) // period) % 2,
                   (((yy + phase) // period) + ((xx + phase) // period)) % 2,
                   ((yy - 10) ** 2 + (xx - 10) ** 2 < rng.integers(16, 50)).astype(int)][label]
        colour = rng.uniform(0.4, 1.0, 3)[:, None, None]
        pixels = pattern[None] * colour * 200 + rng.normal(0, 20, (3, SIZE, SIZE)) + 30
        images[i] = np.clip(pixels, 0, 255)
    return torch.from_numpy(images), torch.from_numpy(labels)


class AugmentedImages(torch.utils.data.Dataset):
    """A torch Dataset as a PyTorch user writes one: augmentation with torch ops per sample."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        top, left = torch.randint(0, SIZE - CROP + 1, (2,)).tolist()
        image = self.images[i, :, top:top + CROP, left:left + CROP].float() / 255
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        return (image - 0.5) / 0.25, self.labels[i]


def make_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(32, CLASSES))


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
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a small run (tests)")
    parser.add_argument("--stop-after", type=int, default=0, help="stop (and save) after this many steps")
    parser.add_argument("--resume", action="store_true", help="continue from <out>/checkpoint.pt")
    parser.add_argument("--out", default="runs/torch_train")
    args = parser.parse_args(argv)
    n_train, epochs = (1536, 3) if args.quick else (8192, args.epochs)
    torch.manual_seed(0)
    torch.set_num_threads(1)  # deterministic float sums, so a resumed run matches exactly
    train_x, train_y = make_images(n_train, seed=0)
    val_x, val_y = make_images(512, seed=1)

    loader = fastloop.Loader(AugmentedImages(train_x, train_y), batch_size=64, shuffle=True, seed=0,
                             num_workers=args.workers, output="torch", drop_last=True, timeout=60)
    val_loader = fastloop.Loader((val_x, val_y), batch_size=256, output="torch",
                                 transform=Pipeline([CenterCrop(CROP), Normalize(0.5, 0.25)], layout="CHW"))
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    os.makedirs(args.out, exist_ok=True)
    checkpoint = os.path.join(args.out, "checkpoint.pt")
    step = 0
    if args.resume:
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        loader.load_state_dict(state["loader"])
        step = state["step"]
        print(f"resumed at step {step}: epoch {state['loader']['epoch']}, batch {state['loader']['position']}")

    started, loss, stopped = time.perf_counter(), float("nan"), False
    while loader.state_dict()["epoch"] < epochs and not stopped:
        for x, y in loader:
            loss_t = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss_t.backward()
            opt.step()
            step, loss = step + 1, float(loss_t.detach())
            if step == args.stop_after:
                stopped = True
                break
        if not stopped:
            print(f"epoch {loader.state_dict()['epoch']}/{epochs}: loss {loss:.3f}, "
                  f"val accuracy {evaluate(model, val_loader):.3f}")
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "loader": loader.state_dict(),
                "step": step}, checkpoint)
    loader.close()
    result = {"steps": step, "epochs": epochs, "stopped": stopped, "train_loss": loss,
              "val_accuracy": evaluate(model, val_loader), "loader": loader.state_dict(),
              "samples_per_s": step * 64 / (time.perf_counter() - started), "checkpoint": checkpoint}
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
