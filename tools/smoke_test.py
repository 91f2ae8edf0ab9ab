"""Smoke test of an installed fastloop (a wheel or an sdist build in a fresh venv): what a
user does first with each part. Run it from outside the source tree so the installed copy is
the one imported:

    venv/bin/python tools/smoke_test.py

Checks: the import and how the copy was built; a Loader epoch in C threads (every sample
once, labels kept with their rows); a Monitor writing a TensorBoard event file (read back by
TensorBoard's EventAccumulator when tensorboard is installed, else by its record framing);
a Checkpointer round trip of nested state; an InferenceService job served in-process by a
fastloop.nn model; JPEG decoding when Pillow is installed. Exits non-zero on the first
failure, with the reason.
"""

from __future__ import annotations

import glob
import io
import os
import struct
import sys
import tempfile
import warnings

import numpy as np


def check_import() -> None:
    import fastloop

    here = os.path.dirname(os.path.abspath(__file__))
    source = os.path.join(os.path.dirname(here), "python")
    assert not fastloop.__file__.startswith(source), f"imported the source tree, not an install: {fastloop.__file__}"
    print(f"fastloop {fastloop.__version__} from {os.path.dirname(fastloop.__file__)}")
    print(f"  Python {sys.version.split()[0]}, NumPy {np.__version__}; CUDA: {fastloop.cuda.is_built().reason}")


def check_loader() -> None:
    import fastloop

    x = np.arange(1000 * 8, dtype=np.float32).reshape(1000, 8)
    y = np.arange(1000, dtype=np.int64)
    seen = []
    with fastloop.Loader((x, y), batch_size=64, shuffle=True, seed=0, workers=2) as loader:
        for xb, yb in loader:
            np.testing.assert_array_equal(xb[:, 0], yb.astype(np.float32) * 8)
            seen.extend(yb.tolist())
    assert sorted(seen) == list(range(1000)), "the epoch did not yield every sample exactly once"
    print(f"  Loader: one shuffled epoch, {len(seen)} samples in batches of 64, 2 C threads")


def tfrecords(data: bytes) -> list[bytes]:
    """The payloads of a TFRecord file (length, masked CRC, payload, masked CRC each)."""
    records, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        records.append(data[pos + 12:pos + 12 + length])
        pos += 12 + length + 4
    assert pos == len(data), "the event file ends inside a record"
    return records


def check_monitor(tmp: str) -> None:
    import fastloop

    logdir = os.path.join(tmp, "runs", "smoke")
    # A host without a GPU gets a RuntimeWarning saying why there are no GPU metrics: expected
    # here, so it is shown as one line of the report rather than as a warning.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        with fastloop.Monitor(sinks=[fastloop.TensorBoardSink(logdir)]) as mon:
            for step in range(10):
                mon.scalar("train/loss", 1.0 / (step + 1), step)
    for warning in caught:
        if "no GPU metrics" not in str(warning.message):
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        else:
            print(f"  Monitor: {str(warning.message).split(': ', 1)[1]}")
    files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    assert len(files) == 1, f"expected one event file in {logdir}, found {files}"
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError:
        with open(files[0], "rb") as f:
            records = tfrecords(f.read())
        assert sum(b"train/loss" in r for r in records) == 10, "not ten train/loss records"
        print(f"  Monitor: {len(records)} TFRecords in {os.path.basename(files[0])} (tensorboard not installed)")
        return
    acc = event_accumulator.EventAccumulator(logdir)
    acc.Reload()
    steps = [(e.step, round(e.value, 6)) for e in acc.Scalars("train/loss")]
    assert steps == [(s, round(1.0 / (s + 1), 6)) for s in range(10)], steps
    print("  Monitor: 10 scalars read back by TensorBoard's EventAccumulator")


def check_checkpointer(tmp: str) -> None:
    import fastloop

    rng = np.random.default_rng(0)
    state = {"model": {"w": rng.standard_normal((64, 32)).astype(np.float32), "b": np.zeros(32)},
             "step": 7, "name": "smoke", "history": [0.5, 0.25]}
    with fastloop.Checkpointer(os.path.join(tmp, "ckpts"), keep=2) as ckpt:
        for step in (1, 2, 3):
            ckpt.save(state, step)
        back = ckpt.load()
        kept = [c.step for c in ckpt.checkpoints()]
    np.testing.assert_array_equal(back["model"]["w"], state["model"]["w"])
    np.testing.assert_array_equal(back["model"]["b"], state["model"]["b"])
    assert (back["step"], back["name"], list(back["history"])) == (7, "smoke", [0.5, 0.25]), back
    assert kept == [2, 3], f"keep=2 kept {kept}"
    print("  Checkpointer: nested state saved three times, newest two kept, read back equal")


def check_serve(tmp: str) -> None:
    import fastloop
    from fastloop.serve import FileStore, InferenceService

    fastloop.nn.manual_seed(0)
    model = fastloop.nn.Sequential(fastloop.nn.Linear(16, 32), fastloop.nn.ReLU(), fastloop.nn.Linear(32, 4))
    inputs = np.random.default_rng(1).standard_normal((5, 16)).astype(np.float32)
    with InferenceService(model, workers=2, max_batch=8, store=FileStore(os.path.join(tmp, "jobs"))) as svc:
        ids = [svc.submit(row) for row in inputs]
        results = np.stack([svc.result(job, timeout=30.0) for job in ids])
    np.testing.assert_allclose(results, model(inputs), rtol=1e-5, atol=1e-6)
    print(f"  serve: {len(ids)} jobs served in-process by a fastloop.nn MLP, results equal to model(x)")


def check_images() -> None:
    import fastloop

    try:
        from PIL import Image
    except ImportError:
        print("  images: skipped (Pillow, which brings libjpeg-turbo, is not installed)")
        return
    pixels = np.zeros((24, 32, 3), np.uint8)
    pixels[:, 16:] = (200, 40, 10)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=95)
    decoded = fastloop.images.decode(buf.getvalue())
    assert decoded.shape == (24, 32, 3) and decoded.dtype == np.uint8, (decoded.shape, decoded.dtype)
    assert np.abs(decoded.astype(int) - pixels).mean() < 8, "the JPEG decoded to other colours"
    print("  images: a JPEG decoded by the libjpeg-turbo Pillow ships")


def main() -> int:
    check_import()
    with tempfile.TemporaryDirectory() as tmp:
        check_loader()
        check_monitor(tmp)
        check_checkpointer(tmp)
        check_serve(tmp)
        check_images()
    print("smoke test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
