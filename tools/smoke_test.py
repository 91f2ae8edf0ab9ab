"""Smoke test of an installed fastloop (a wheel or an sdist build in a fresh venv): what a
user does first with each part. Run it from outside the source tree so the installed copy is
the one imported:

    venv/bin/python tools/smoke_test.py

    venv/bin/python tools/smoke_test.py --wheel    # also: codecs linked in, CUDA built in

Checks: the import and how the copy was built; a Loader epoch in C threads (every sample
once, labels kept with their rows); a Monitor writing a TensorBoard event file (read back by
TensorBoard's EventAccumulator when tensorboard is installed, else by its record framing);
a Checkpointer round trip of nested state; an InferenceService job served in-process by a
fastloop.nn model; a JPEG (tools/smoke_data/) and a PNG (written here) decoded, and an
ImageFolder epoch of both through the Loader's C threads, with no Pillow needed. With
--wheel: the codecs must be the ones linked into fastloop and fastloop.cuda.is_built() true;
with --no-system-codecs, the system's libjpeg/libpng must fail to load (tools/wheels.py hides
them). Exits non-zero on the first failure, with the reason.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import shutil
import struct
import sys
import sysconfig
import tempfile
import zlib

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
    with fastloop.Loader((x, y), batch_size=64, shuffle=True, seed=0, num_workers=2) as loader:
        for xb, yb in loader:
            np.testing.assert_array_equal(xb[:, 0], yb.astype(np.float32) * 8)
            seen.extend(yb.tolist())
    assert sorted(seen) == list(range(1000)), "the epoch did not yield every sample exactly once"
    print(f"  Loader: one shuffled epoch, {len(seen)} samples in batches of 64, 2 C threads")
    with fastloop.Loader(SquaresDataset(), batch_size=8, num_workers=2, mode="threads") as python_loader:
        squares = sorted(int(v) for _, batch in python_loader for v in batch)
    assert squares == [i * i for i in range(40)], "worker threads running Python gave the wrong samples"
    print("  Loader: a Python dataset through 2 worker threads")


class SquaresDataset:
    """A Python map-style dataset: sample i is (i, i * i)."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> tuple[int, int]:
        return i, i * i


def check_gil_stays_off() -> None:
    """On a free-threaded interpreter (a cp313t wheel): nothing imported turned the GIL back on."""
    if not hasattr(sys, "_is_gil_enabled") or not sysconfig.get_config_var("Py_GIL_DISABLED"):
        return
    import fastloop.cuda
    import fastloop.nn
    import fastloop.serve  # noqa: F401

    fastloop.cuda.is_built()
    assert not sys._is_gil_enabled(), "importing fastloop turned the GIL back on"
    print("  free-threaded: the GIL stays off with fastloop, its extensions and serve imported")


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
    # A host without a GPU has no GPU metrics: the Monitor logs why at INFO level (no
    # warning); the report shows it as one line.
    with fastloop.Monitor(sinks=[fastloop.TensorBoardSink(logdir)]) as mon:
        for step in range(10):
            mon.scalar("train/loss", 1.0 / (step + 1), step)
    if mon.gpu_source == "none":
        print(f"  Monitor: {mon.gpu_reason}")
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
    with InferenceService(model, num_workers=2, max_batch=8, store=FileStore(os.path.join(tmp, "jobs"))) as svc:
        ids = [svc.submit(row) for row in inputs]
        results = np.stack([svc.result(job, timeout=30.0) for job in ids])
    np.testing.assert_allclose(results, model(inputs), rtol=1e-5, atol=1e-6)
    print(f"  serve: {len(ids)} jobs served in-process by a fastloop.nn MLP, results equal to model(x)")


HERE = os.path.dirname(os.path.abspath(__file__))
QUADRANTS = [((0, 0), (220, 30, 30)), ((0, 32), (30, 200, 40)), ((24, 0), (20, 40, 210)), ((24, 32), (240, 240, 240))]


def quadrants() -> np.ndarray:
    """The 48x64 picture tools/smoke_data/quadrants.jpg holds (JPEG quality 95)."""
    pixels = np.zeros((48, 64, 3), np.uint8)
    for (top, left), colour in QUADRANTS:
        pixels[top:top + 24, left:left + 32] = colour
    return pixels


def png_bytes(pixels: np.ndarray) -> bytes:
    """An 8-bit RGB PNG written with zlib alone (no Pillow)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    h, w, _ = pixels.shape
    rows = b"".join(b"\x00" + row.tobytes() for row in pixels)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def check_system_codecs_hidden() -> None:
    for name in ("libjpeg.so.62", "libpng16.so.16"):
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        raise AssertionError(f"the system's {name} still loads: the check was to run without it")
    print("  images: the system's libjpeg.so.62 and libpng16.so.16 do not load here")


def check_images(tmp: str, wheel: bool) -> None:
    import fastloop

    assert "PIL" not in sys.modules, "Pillow was imported"
    info = fastloop.images.info()
    for fmt in ("jpeg", "png"):
        assert info[fmt] is not None, f"no {fmt} decoder: {info.get(fmt + '_missing')}"
        assert not wheel or info[fmt]["origin"] == "linked into fastloop._core", info[fmt]
    expected = quadrants()
    jpeg_path = os.path.join(HERE, "smoke_data", "quadrants.jpg")
    decoded = fastloop.images.decode(jpeg_path)
    assert decoded.shape == (48, 64, 3) and decoded.dtype == np.uint8, (decoded.shape, decoded.dtype)
    assert np.abs(decoded.astype(int) - expected).mean() < 4, "the JPEG decoded to other colours"
    png = png_bytes(expected)
    np.testing.assert_array_equal(fastloop.images.decode(png), expected)
    print(f"  images: a JPEG ({info['jpeg']['decoder']}) and a PNG ({info['png']['decoder']}) decoded")
    root = os.path.join(tmp, "folder")
    for label, name in enumerate(("jpeg", "png")):
        os.makedirs(os.path.join(root, name))
        for i in range(6):
            target = os.path.join(root, name, f"{i}.{'jpg' if name == 'jpeg' else 'png'}")
            if name == "jpeg":
                shutil.copy(jpeg_path, target)
            else:
                with open(target, "wb") as f:
                    f.write(png)
    pipeline = fastloop.ops.Pipeline([fastloop.ops.Resize(32), fastloop.ops.CenterCrop(32),
                                      fastloop.ops.Normalize([0.5] * 3, [0.25] * 3, layout="HWC->CHW")])
    labels = []
    with fastloop.Loader(fastloop.ImageFolder(root), batch_size=4, shuffle=True, seed=0, num_workers=2,
                         transform=pipeline) as loader:
        for x, y in loader:
            assert x.shape[1:] == (3, 32, 32) and x.dtype == np.float32, (x.shape, x.dtype)
            labels.extend(np.asarray(y).tolist())
    assert sorted(labels) == [0] * 6 + [1] * 6, labels
    print(f"  images: an ImageFolder epoch of {len(labels)} JPEG and PNG files through the Loader's C threads")


def check_cuda_built() -> None:
    import fastloop

    answer = fastloop.cuda.is_built()
    assert answer, f"the wheel carries no CUDA extension: {answer.reason}"
    print(f"  CUDA: built in ({answer.reason}); here: {fastloop.cuda.is_available().reason}")


def check_no_test_hooks() -> None:
    """A wheel carries none of the tests' private hooks (FASTLOOP_TESTING=1 builds only)."""
    import fastloop
    from fastloop import _build_info, _core, _cuda

    assert not _build_info.TESTING_HOOKS, "built with FASTLOOP_TESTING=1"
    hooks = [f"{m.__name__}.{name}" for m in (_core, _cuda) for name in dir(m) if "testing" in name.lower()
             or name in ("_emit_events", "_queue_load", "_pool_workers", "_NNContext")]
    assert not hooks, f"the tests' hooks are in the wheel: {hooks}"
    print(f"  no test hooks in fastloop {fastloop.__version__}'s extensions")


def main() -> int:
    parser = argparse.ArgumentParser(description="Smoke test of an installed fastloop")
    parser.add_argument("--wheel", action="store_true", help="codecs linked in and CUDA built in, required")
    parser.add_argument("--no-system-codecs", action="store_true", help="the system's codecs must not load")
    args = parser.parse_args()
    check_import()
    with tempfile.TemporaryDirectory() as tmp:
        check_loader()
        check_monitor(tmp)
        check_checkpointer(tmp)
        check_serve(tmp)
        if args.no_system_codecs:
            check_system_codecs_hidden()
        check_images(tmp, args.wheel)
    check_gil_stays_off()
    if args.wheel:
        check_cuda_built()
        check_no_test_hooks()
    print("smoke test passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
