"""fastloop.Monitor's histograms, images and text, read back by TensorBoard's own reader
(EventAccumulator); and the clear TypeErrors that name the argument."""

from __future__ import annotations

import csv
import io
import json
import struct
import zlib

import numpy as np
import pytest

import fastloop

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
tensor_util = pytest.importorskip("tensorboard.util.tensor_util")


def read_back(logdir) -> "event_accumulator.EventAccumulator":
    keep_all = {"images": 0, "histograms": 0, "tensors": 0, "scalars": 0}
    accumulator = event_accumulator.EventAccumulator(str(logdir), size_guidance=keep_all)
    accumulator.Reload()
    return accumulator


def decode_png(data: bytes) -> np.ndarray:
    """HWC uint8 pixels, by Pillow when installed, else by zlib from the chunks."""
    try:
        from PIL import Image
    except ImportError:
        Image = None
    if Image is not None:
        return np.array(Image.open(io.BytesIO(data)))
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0]
        header = body if kind == b"IHDR" else header
        idat += body if kind == b"IDAT" else b""
        pos += 12 + length
    width, height, _, color = struct.unpack(">IIBB", header[:10])
    channels = {0: 1, 2: 3, 6: 4}[color]
    rows = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(height, 1 + width * channels)
    assert (rows[:, 0] == 0).all()  # filter type 0 on every row
    return rows[:, 1:].reshape(height, width, channels).squeeze(-1 if channels == 1 else ())


def test_histograms_images_text_and_scalars_read_back_by_tensorboard(tmp_path):
    rng = np.random.default_rng(0)
    values = rng.standard_normal(10_000)
    rgb = rng.integers(0, 256, (12, 20, 3), dtype=np.uint8)
    chw = rng.random((3, 8, 5))
    with fastloop.Monitor(interval_s=0, gpu=False, sinks=[fastloop.TensorBoardSink(tmp_path)]) as mon:
        mon.scalars({"train/loss": 0.5, "train/lr": 1e-3}, step=1)
        mon.histogram("weights", values, step=2, bins=20)
        mon.histogram("with_nan", [1.0, float("nan"), 3.0], step=2, bins=2)
        mon.image("rgb", rgb, step=3)
        mon.image("chw", chw, step=3)
        mon.image("gray", rgb[:, :, 0], step=3)
        mon.text("notes", "lr **1e-3**, batch 256 — ünïcode", step=4)
    acc = read_back(tmp_path)
    assert [e.value for e in acc.Scalars("train/loss")] == [0.5] and acc.Scalars("train/lr")[0].step == 1

    histogram = acc.Histograms("weights")[0]
    h = histogram.histogram_value
    assert histogram.step == 2 and h.num == 10_000 and sum(h.bucket) == 10_000
    assert h.min == values.min() and h.max == values.max() and h.sum == pytest.approx(values.sum())
    counts, _ = np.histogram(values, bins=20)
    assert h.bucket == counts.tolist() and len(h.bucket_limit) == 20
    assert acc.Histograms("with_nan")[0].histogram_value.num == 2  # NaN left out

    images = {tag: acc.Images(tag)[0] for tag in ("rgb", "chw", "gray")}
    assert (images["rgb"].width, images["rgb"].height, images["rgb"].step) == (20, 12, 3)
    np.testing.assert_array_equal(decode_png(images["rgb"].encoded_image_string), rgb)
    np.testing.assert_array_equal(decode_png(images["chw"].encoded_image_string),
                                  np.rint(chw.transpose(1, 2, 0) * 255).astype(np.uint8))
    np.testing.assert_array_equal(decode_png(images["gray"].encoded_image_string), rgb[:, :, 0])

    assert acc.Tags()["tensors"] == ["notes/text_summary"]  # the tag SummaryWriter.add_text("notes", ...) writes
    text = acc.Tensors("notes/text_summary")[0]
    assert text.step == 4
    assert tensor_util.make_ndarray(text.tensor_proto).item().decode() == "lr **1e-3**, batch 256 — ünïcode"
    assert acc.SummaryMetadata("notes/text_summary").plugin_data.plugin_name == "text"  # the Text tab's


def test_text_is_written_under_the_tag_summary_writer_gives_it(tmp_path):
    tensorboard = pytest.importorskip("torch.utils.tensorboard")
    with tensorboard.SummaryWriter(str(tmp_path / "torch")) as writer:
        writer.add_text("notes", "same", 1)
    with fastloop.Monitor(interval_s=0, gpu=False, sinks=[fastloop.TensorBoardSink(tmp_path / "fastloop")]) as mon:
        mon.text("notes", "same", step=1)
    theirs, ours = read_back(tmp_path / "torch"), read_back(tmp_path / "fastloop")
    assert ours.Tags()["tensors"] == theirs.Tags()["tensors"] == ["notes/text_summary"]
    assert [tensor_util.make_ndarray(acc.Tensors("notes/text_summary")[0].tensor_proto).ravel()[0]
            for acc in (ours, theirs)] == [b"same", b"same"]


def test_torch_tensors_are_accepted_for_histograms_and_images(tmp_path):
    torch = pytest.importorskip("torch")
    weight = torch.nn.Linear(8, 4).weight  # requires grad
    with fastloop.Monitor(interval_s=0, gpu=False, sinks=[fastloop.TensorBoardSink(tmp_path)]) as mon:
        mon.histogram("w", weight, step=1)
        mon.histogram("bf16", torch.ones(5, dtype=torch.bfloat16), step=1)
        mon.image("img", torch.zeros(3, 4, 6), step=1)
    acc = read_back(tmp_path)
    assert acc.Histograms("w")[0].histogram_value.num == 32
    assert acc.Histograms("bf16")[0].histogram_value.sum == 5
    assert decode_png(acc.Images("img")[0].encoded_image_string).shape == (4, 6, 3)


def test_other_sinks_skip_summaries_and_scalars_stay_in_order(tmp_path):
    with fastloop.Monitor(interval_s=0, gpu=False, sinks=[fastloop.CSVSink(tmp_path / "m.csv")]) as mon:
        mon.scalar("a", 1.0, 1)
        mon.text("t", "x", 2)
        mon.scalars({"b": 2.0}, 3)
    rows = (tmp_path / "m.csv").read_text().splitlines()
    assert [row.split(",")[2] for row in rows[1:]] == ["a", "b"]


def test_bad_arguments_raise_type_errors_naming_the_argument(tmp_path):
    with fastloop.Monitor(interval_s=0, gpu=False, sinks=[fastloop.TensorBoardSink(tmp_path)]) as mon:
        with pytest.raises(TypeError, match=r"'name' must be str, not int"):
            mon.scalar(5, 0.5)
        with pytest.raises(TypeError, match=r"'value' must be a real number, not str"):
            mon.scalar("loss", "high")
        with pytest.raises(TypeError, match=r"'step' must be an int or None, not float"):
            mon.scalar("loss", 0.5, 1.5)
        with pytest.raises(TypeError, match=r"'value' must be a real number, not list"):
            mon.event("epoch", [1], step=1)
        with pytest.raises(TypeError, match=r"'values' must be a mapping"):
            mon.scalars([("a", 1.0)], 1)
        with pytest.raises(TypeError, match=r"'values'\['a'\] must be a real number, not str"):
            mon.scalars({"a": "x"}, 1)
        with pytest.raises(TypeError, match=r"'values' keys must be str, not int"):
            mon.scalars({1: 1.0}, 1)
        with pytest.raises(TypeError, match=r"'name' must be str, not int"):
            mon.histogram(3, [1.0])
        with pytest.raises(TypeError, match=r"'values' must hold real numbers, not dtype <U1"):
            mon.histogram("h", ["a"])
        with pytest.raises(TypeError, match=r"'bins' must be an int, not float"):
            mon.histogram("h", [1.0], bins=2.5)
        with pytest.raises(ValueError, match=r"'bins' must be >= 1"):
            mon.histogram("h", [1.0], bins=0)
        for bins in (2**20 + 1, 2**31, 2**70):  # two doubles a bucket in the writer: bounded, never an overflow
            with pytest.raises(ValueError, match=r"'bins' must be >= 1 and <= 1048576"):
                mon.histogram("h", [1.0], bins=bins)
        for dims in ((2**31 - 1, 2**31 - 1, 4), (-1, -1, 1), (0, 1, 1)):  # the private call: dimensions that wrap
            with pytest.raises(ValueError, match="does not match"):
                mon._core.summary(2, "i", b"\0", None, 0, *dims)
        with pytest.raises(TypeError, match=r"'image' must be uint8 or float in \[0, 1\], not dtype int64"):
            mon.image("i", np.zeros((2, 2, 3), np.int64))
        with pytest.raises(ValueError, match=r"'image' of floats must hold values in \[0, 1\]"):
            mon.image("i", np.full((2, 2, 3), 1.5))
        with pytest.raises(ValueError, match=r"'image' must have 1, 3 or 4 channels"):
            mon.image("i", np.zeros((5, 5, 2), np.uint8))
        with pytest.raises(ValueError, match=r"'image' must be HW, HWC or CHW"):
            mon.image("i", np.zeros(5, np.uint8))
        with pytest.raises(ValueError, match=r"'layout' must be"):
            mon.image("i", np.zeros((2, 2, 3), np.uint8), layout="NHWC")
        with pytest.raises(TypeError, match=r"'text' must be str, not bytes"):
            mon.text("t", b"x")
        with pytest.raises(ValueError, match=r"'name' must be 1 to 255 bytes"):
            mon.text("", "x")
        with pytest.raises(ValueError, match=r"'step' must be >= 0"):
            mon.text("t", "x", step=-2)
    with pytest.raises(fastloop.Closed):
        mon.text("t", "x")


NONFINITE = [float("nan"), float("inf"), float("-inf"), 1e300, -1e300]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # TensorBoard's reader on inf
def test_nan_inf_and_1e300_scalars_reach_every_sink(tmp_path):
    """A NaN loss (or an overflowed one) is written as itself by every sink: no undefined
    cast in the formatting (the ASan/UBSan build checks that), nothing dropped."""
    seen = []
    sinks = [fastloop.CSVSink(tmp_path / "m.csv"), fastloop.JSONLSink(tmp_path / "m.jsonl"),
             fastloop.TensorBoardSink(tmp_path / "tb"), fastloop.CallbackSink(seen.append)]
    with fastloop.Monitor(interval_s=0, gpu=False, sinks=sinks) as mon:
        for step, value in enumerate(NONFINITE):
            mon.scalar("loss", value, step)
        mon.histogram("weights", [1.0, float("inf"), float("-inf"), float("nan"), 1e300, 2.0], step=9, bins=3)
    with open(tmp_path / "m.csv", newline="") as f:
        csv_values = [float(r["value"]) for r in csv.DictReader(f) if r["name"] == "loss"]
    json_values = [json.loads(line)["value"] for line in open(tmp_path / "m.jsonl")]
    callback_values = [e.value for e in seen if e.name == "loss"]
    for values in (csv_values, json_values, callback_values):
        np.testing.assert_array_equal(values, NONFINITE)  # NaN == NaN here; 1e300 exact
    acc = read_back(tmp_path / "tb")
    stored = [e.value for e in acc.Scalars("loss")]  # float32: 1e300 overflows to inf
    np.testing.assert_array_equal(stored, [float("nan"), float("inf"), float("-inf"), float("inf"), float("-inf")])
    h = acc.Histograms("weights")[0].histogram_value
    assert h.num == 5 and sum(h.bucket) == 5  # NaN left out; the infinities in the end buckets
    assert (h.min, h.max) == (float("-inf"), float("inf"))
    assert h.bucket == [3.0, 0.0, 2.0]  # -inf, 1, 2 | nothing | 1e300, inf: buckets span 1..1e300


@pytest.mark.parametrize("values, why", [([], "is empty"), (np.zeros((0, 3)), "is empty"),
                                         ([float("nan")] * 3, "are all NaN")])
def test_an_empty_or_all_nan_histogram_raises_as_summarywriter_does(tmp_path, values, why):
    with fastloop.Monitor(interval_s=0, sinks=[fastloop.TensorBoardSink(tmp_path)]) as mon:
        with pytest.raises(ValueError, match=f"'values' of histogram 'w' {why}"):
            mon.histogram("w", values, step=1)
        mon.histogram("w", [float("nan"), 2.0], step=2)  # one number is enough
