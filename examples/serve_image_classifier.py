"""An image classifier served over HTTP that takes JPEG bytes and answers its top-5 labels:
fastloop.serve's pre- and post-processing hooks.

The model names the dominant colour of a picture (10 colours). Its two hooks do what a
served image model needs around the network:

* ``preprocess(body) -> row``: the request's raw body (a JPEG or PNG) decoded with
  ``fastloop.images.decode`` (libjpeg-turbo, GIL released), shrunk to 8x8 by averaging and
  scaled to [0, 1]: 192 float32 numbers. The front calls it in its thread pool, never on the
  event loop, so a large image never stalls other requests.
* ``postprocess(output) -> JSON``: the logits of a done job as the 5 likeliest labels with
  their probabilities, what the answer's ``result`` holds.

Between them the rows batch as any other (``max_batch``), and the network is a fastloop.nn
MLP trained here in about a second on generated pictures. Serve it from the command line
(``build`` is the factory: the model and its declared input):

    cd examples && python -m fastloop serve --model serve_image_classifier:build
    curl --data-binary @cat.jpg http://127.0.0.1:8000/v1/predict

or run this file: it serves the model on a free port, posts a few JPEGs (made with Pillow)
to ``/v1/predict`` and prints the answers; the last line printed is ``RESULT {json}``.

    python examples/serve_image_classifier.py
"""

from __future__ import annotations

import argparse
import io
import json
import socket
import sys
import threading
import time
import urllib.request
from typing import Any

import numpy as np

import fastloop
import fastloop.nn as nn
from fastloop.serve import App, InferenceService, Input, MemoryStore

COLOURS = {"red": (220, 30, 30), "green": (30, 180, 40), "blue": (30, 50, 220), "yellow": (235, 220, 40),
           "cyan": (40, 210, 220), "magenta": (210, 40, 200), "white": (245, 245, 245), "black": (15, 15, 15),
           "orange": (245, 140, 20), "purple": (120, 40, 170)}
LABELS = list(COLOURS)
SIDE = 8  # pictures are shrunk to SIDE x SIDE before the network
FEATURES = SIDE * SIDE * 3


def shrink(image: np.ndarray) -> np.ndarray:
    """An (h, w, 3) uint8 picture as SIDE x SIDE x 3 block means in [0, 1], flattened (float32)."""
    h, w = (image.shape[0] // SIDE) * SIDE, (image.shape[1] // SIDE) * SIDE
    if h == 0 or w == 0:
        raise ValueError(f"the picture is {image.shape[0]}x{image.shape[1]}: at least {SIDE}x{SIDE} pixels, please")
    blocks = image[:h, :w].reshape(SIDE, h // SIDE, SIDE, w // SIDE, 3).mean(axis=(1, 3))
    return (blocks / 255.0).astype(np.float32).reshape(FEATURES)


def pictures(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n generated 32x32 pictures (a colour, shaded and noisy) and their labels."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(LABELS), n)
    base = np.array(list(COLOURS.values()), np.float64)[labels][:, None, None, :]
    shade = rng.uniform(0.7, 1.15, (n, 1, 1, 1)) * np.linspace(0.85, 1.1, 32)[None, :, None, None]
    images = np.clip(base * shade + rng.normal(0, 18, (n, 32, 32, 3)), 0, 255).astype(np.uint8)
    return images, labels


class ColourClassifier:
    """The served model: the network on a batch of rows, and the two hooks around it."""

    def __init__(self, seed: int = 0, steps: int = 300) -> None:
        nn.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, len(LABELS)))
        images, labels = pictures(4096, seed)
        x = np.stack([shrink(image) for image in images])
        opt = nn.Adam(self.net, lr=3e-3)
        rng = np.random.default_rng(seed)
        for _ in range(steps):
            batch = rng.integers(0, len(x), 128)
            self.net.train_step(x[batch], labels[batch], loss="cross_entropy", opt=opt)
        self.decoded_on: set[str] = set()  # the threads preprocess ran on (the example reports them)

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        return self.net(batch)  # a fastloop.nn model computes with the GIL released, thread-safely

    def preprocess(self, body: bytes) -> np.ndarray:
        """A JPEG or PNG body as one row; ValueError (a 400) for anything else."""
        self.decoded_on.add(threading.current_thread().name)
        return shrink(fastloop.images.decode(body))

    def postprocess(self, logits: np.ndarray) -> list[dict[str, Any]]:
        """One picture's logits as its 5 likeliest labels, likeliest first."""
        p = np.exp(logits - logits.max())
        p /= p.sum()
        return [{"label": LABELS[i], "p": round(float(p[i]), 4)} for i in np.argsort(-p)[:5]]


def build() -> tuple[ColourClassifier, Input]:
    """The factory of ``python -m fastloop serve --model serve_image_classifier:build``."""
    return ColourClassifier(), Input("float32", (FEATURES,))


def jpeg(colour: tuple[int, int, int], size: tuple[int, int] = (120, 160), seed: int = 0) -> bytes:
    """A noisy picture of `colour` as JPEG bytes (Pillow encodes it)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = np.clip(np.array(colour, np.float64) + rng.normal(0, 20, (*size, 3)), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="unused (the examples' common option)")
    parser.parse_args(argv)
    try:
        import uvicorn
        from PIL import Image  # noqa: F401 (encodes the example's pictures)
    except ImportError as error:
        print(f"this example needs the serve and images extras: pip install 'fastloop[serve,images]' ({error})",
              file=sys.stderr)
        return 2
    from fastloop.serve.http_limits import uvicorn_config

    model, inputs = build()
    service = InferenceService(model, inputs=inputs, store=MemoryStore())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(App(service), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.01)
    answers = {}
    try:
        for name in ("red", "blue", "yellow", "black"):
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/predict", data=jpeg(COLOURS[name]),
                                             headers={"content-type": "image/jpeg"}, method="POST")
            with urllib.request.urlopen(request, timeout=30) as response:
                answers[name] = json.loads(response.read())["result"]
            top = ", ".join(f"{entry['label']} {entry['p']:.2f}" for entry in answers[name])
            print(f"a {name} JPEG -> {top}")
    finally:
        server.should_exit = True
        thread.join(10)
        service.close()
    correct = sum(answer[0]["label"] == name for name, answer in answers.items())
    print(f"{correct} of {len(answers)} pictures named right; decoded on {sorted(model.decoded_on)} (the front's "
          "thread pool, not its event loop)")
    print("RESULT " + json.dumps({"example": "serve_image_classifier", "answers": answers, "correct": correct,
                                  "decoded_on": sorted(model.decoded_on)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
