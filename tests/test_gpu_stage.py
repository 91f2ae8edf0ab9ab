"""Loader(decode="gpu") on the host side, where no GPU is needed: the C workers stage each
image (csrc/data/fl_gpu_stage.h) and this file checks what they stage against the CPU path:
the routes and their reasons, the CPU path's own pixels for what nvJPEG cannot take, and for
JPEGs the bytes, the rectangle, the flip and the resampling tables, by running fl_gpu_decode's
kernels' own per-pixel code (cuda/fl_resample_math.cuh, built on the host by
FASTLOOP_TESTING=1) on the CPU decoder's pixels and comparing with the CPU path's normalized
output, bit for bit, in every output type and layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fastloop
from fastloop.data import _gpu_decode
from fastloop import _core
from fastloop._core import _Loader, _epoch_seed, _image_decode
from fastloop.data._backend_arrays import encoded_field
from fastloop.ops import CenterCrop, Normalize, Pipeline, RandomHFlip, RandomResizedCrop, Resize
from rounding import assert_normalized_like_cpu, cpu_normalize_fuses
from synthetic import natural_image

Image = pytest.importorskip("PIL.Image")
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Baseline JPEGs of several sizes and subsamplings, a progressive JPEG, a grayscale
    JPEG, a PNG and a JPEG too big for its entry."""
    root = tmp_path_factory.mktemp("staged")
    (root / "a").mkdir()
    for i in range(10):
        image = Image.fromarray(natural_image(90 + 23 * i, 130 - 7 * i, i))
        image.save(root / "a" / f"{i:02d}.jpg", quality=90, subsampling=[0, 1, 2][i % 3])
    Image.fromarray(natural_image(120, 100, 20)).save(root / "a" / "20_progressive.jpg", quality=85, progressive=True)
    Image.fromarray(natural_image(80, 96, 21)[:, :, 0]).save(root / "a" / "21_gray.jpg", quality=90)
    Image.fromarray(natural_image(70, 90, 22)).save(root / "a" / "22.png")
    noise = np.random.default_rng(23).integers(0, 256, (700, 700, 3), dtype=np.uint8)
    Image.fromarray(noise).save(root / "a" / "23_big.jpg", quality=100, subsampling=0)
    assert (root / "a" / "23_big.jpg").stat().st_size > _gpu_decode.CAPACITY
    return root


def _staged(source, pipeline: Pipeline, seed: int = 3, workers: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(entries, labels) of the whole source in one batch, staged by the C workers."""
    rest = pipeline._core(3) if pipeline._rest else None
    core = _Loader([encoded_field(source, pipeline, 0, staged=True),
                    ("array", np.ascontiguousarray(np.asarray(source.targets, np.int64)))],
                   batch_size=len(source), seed=seed, workers=workers, slots=3, ahead=1, pipeline=rest)
    core.start_epoch(0)
    entries, labels = core.next(30)
    return np.array(entries), np.array(labels)


def _cpu(source, pipeline: Pipeline, seed: int = 3) -> np.ndarray:
    """The CPU path's uint8 images, every one in dataset order."""
    loader = fastloop.Loader(source, batch_size=len(source), transform=pipeline, seed=seed, num_workers=2)
    images, _ = next(iter(loader))
    return np.array(images)


F32, F16, BF16 = 0, 1, 2
DTYPES = {F32: "float32", F16: "float16", BF16: "bfloat16"}


def _coefficients() -> tuple[np.ndarray, np.ndarray]:
    """fl_cuda_preprocess_coefficients's a and b for MEAN and STD, in float32 as the C does."""
    mean, std = np.float32(MEAN), np.float32(STD)
    return (np.float32(1.0) / np.float32(255.0)) / std, -mean / std


def _gpu_kernels(entry: np.ndarray, out_h: int, out_w: int, region: bool, dtype: int = F32,
                 chw: bool = True) -> np.ndarray:
    """What fl_gpu_decode's two kernels make of one staged entry: their own per-pixel code
    (cuda/fl_resample_math.cuh) built on the host (FASTLOOP_TESTING=1), fed the CPU decoder's
    pixels: the rectangle alone (region: as a region decode gives it) or the whole image."""
    record = _gpu_decode.records(entry[None])[0]
    x0, y0, rect_h, rect_w = int(record["x0"]), int(record["y0"]), int(record["rect_h"]), int(record["rect_w"])
    if record["route"] == 2:  # the CPU's pixels: the second kernel reads them
        image = np.zeros((1, 1, 3), np.uint8)
    else:
        image = _image_decode(_gpu_decode.payload(entry[None], 0)[:int(record["length"])].tobytes())
        assert image.shape[:2] == (record["image_h"], record["image_w"])
        if region:
            image, x0, y0 = np.ascontiguousarray(image[y0:y0 + rect_h, x0:x0 + rect_w]), 0, 0
    a, b = _coefficients()
    raw = _core._gpu_resample(np.ascontiguousarray(entry), np.ascontiguousarray(image), image.shape[0], image.shape[1],
                              x0, y0, out_h, out_w, a, b, dtype, int(chw))
    shape = (3, out_h, out_w) if chw else (out_h, out_w, 3)
    return np.frombuffer(raw, np.float32 if dtype == F32 else np.uint16).reshape(shape)


@pytest.mark.parametrize("pipeline", [
    Pipeline([RandomResizedCrop(32, reduced_decode=False), RandomHFlip()]),
    Pipeline([Resize(40, reduced_decode=False), CenterCrop(32)]),
    Pipeline([RandomResizedCrop((24, 40), scale=(0.5, 1.0), reduced_decode=False)]),
])
def test_staged_jpegs_resampled_as_the_gpu_does_match_the_cpu_path(folder: Path, pipeline: Pipeline):
    source = fastloop.ImageFolder(folder)
    entries, labels = _staged(source, pipeline)
    cpu = _cpu(source, pipeline)
    out_h, out_w = pipeline.fixed_size()
    records = _gpu_decode.records(entries)
    np.testing.assert_array_equal(records["id"], np.arange(len(source)))
    np.testing.assert_array_equal(labels, source.targets)
    routes = [_gpu_decode.ROUTES[r] for r in records["route"]]
    assert routes[:10] == ["hardware"] * 10  # baseline 4:4:4, 4:2:2, 4:2:0
    assert routes[source.samples.index(next(s for s in source.samples if "gray" in s[0]))] == "hardware"
    normalized = _cpu(source, Pipeline([*pipeline.steps, Normalize(MEAN, STD, layout="HWC->CHW")]))
    channels_last = _cpu(source, Pipeline([*pipeline.steps, Normalize(MEAN, STD, layout="HWC")]))
    # bit-exact where the CPU path fuses x * a + b as the kernels do (tests/rounding.py)
    fuses = {layout: cpu_normalize_fuses(layout, 3) for layout in ("HWC->CHW", "HWC")}
    product = 255.0 * float(np.abs(_coefficients()[0]).max())
    for i, path in enumerate(p for p, _ in source.samples):
        r = records[i]
        if r["route"] == 2:  # the CPU path's own pixels, flips applied
            pixels = entries[i, 64:64 + out_h * out_w * 3].reshape(out_h, out_w, 3)
            np.testing.assert_array_equal(pixels, cpu[i], err_msg=path)
        else:
            assert bytes(entries[i, 64:64 + int(r["length"])]) == Path(path).read_bytes()
        if not hasattr(_core, "_gpu_resample"):
            continue  # a wheel: the kernels' host build is not there
        # the kernels' own code: resampled, mirrored, normalized, laid out and cast as the CPU path
        for region in (True, False):
            for dtype in (F32, F16, BF16):
                assert_normalized_like_cpu(_gpu_kernels(entries[i], out_h, out_w, region, dtype), normalized[i],
                                           DTYPES[dtype], fuses["HWC->CHW"], product, f"{path} region={region} dtype={dtype}")
        assert_normalized_like_cpu(_gpu_kernels(entries[i], out_h, out_w, True, F32, chw=False), channels_last[i],
                                   "float32", fuses["HWC"], product, f"{path} channels last")


def test_what_nvjpeg_cannot_take_is_decoded_by_the_worker_and_says_why(folder: Path):
    source = fastloop.ImageFolder(folder)
    pipeline = Pipeline([RandomResizedCrop(32), RandomHFlip()])
    entries, _ = _staged(source, pipeline)
    records = _gpu_decode.records(entries)
    why = {Path(p).name: (_gpu_decode.ROUTES[r["route"]], _gpu_decode.REASONS[r["reason"]])
           for (p, _), r in zip(source.samples, records)}
    assert why["20_progressive.jpg"] == ("cpu", "progressive, CMYK, 12-bit or the like")
    assert why["22.png"] == ("cpu", "not a JPEG")
    assert why["23_big.jpg"] == ("cpu", "too big for its entry")
    assert why["00.jpg"] == ("hardware", "")
    cpu = _cpu(source, pipeline)
    size = 32 * 32 * 3
    for i, r in enumerate(records):
        if r["route"] == 2:  # with the CPU's DCT scaling and all: exactly the CPU path's image
            np.testing.assert_array_equal(entries[i, 64:64 + size].reshape(32, 32, 3), cpu[i])


def test_flips_are_drawn_per_sample_as_the_cpu_path_draws_them(folder: Path):
    source = fastloop.ImageFolder(folder)
    flip = Pipeline([Resize((32, 32), reduced_decode=False), RandomHFlip(0.5)])
    entries, _ = _staged(source, flip, seed=11)
    records = _gpu_decode.records(entries)
    unflipped = _cpu(source, Pipeline([Resize((32, 32), reduced_decode=False)]), seed=11)
    flipped = _cpu(source, flip, seed=11)
    for i, r in enumerate(records):
        if r["route"] != 2:
            expected = np.array_equal(flipped[i], unflipped[i][:, ::-1]) and not np.array_equal(flipped[i], unflipped[i])
            assert bool(r["flip"]) == expected
    assert 0 < records["flip"][records["route"] != 2].sum() < (records["route"] != 2).sum()


def test_a_corrupt_file_fails_as_on_the_cpu_path_and_skip_drops_it(folder: Path, tmp_path: Path):
    (tmp_path / "a").mkdir()
    good = (folder / "a" / "00.jpg").read_bytes()
    (tmp_path / "a" / "0.jpg").write_bytes(good)
    (tmp_path / "a" / "1.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    source = fastloop.ImageFolder(tmp_path)
    pipeline = Pipeline([RandomResizedCrop(16)])
    with pytest.raises(ValueError, match=r"sample 1: .*1\.jpg"):
        _staged(source, pipeline)
    with pytest.raises(ValueError, match=r"sample 1: .*1\.jpg"):
        next(iter(fastloop.Loader(source, batch_size=2, transform=pipeline)))


def test_the_staged_field_and_its_records_are_laid_out_for_the_decoder(folder: Path):
    source = fastloop.ImageFolder(folder)
    entries, _ = _staged(source, Pipeline([RandomResizedCrop(224)]))
    assert entries.dtype == np.uint8 and entries.shape == (len(source), _gpu_decode.CAPACITY + 64)
    assert _gpu_decode.RECORD.itemsize == _gpu_decode.RECORD_BYTES
    records = _gpu_decode.records(entries)
    jpeg = records[records["route"] != 2]
    assert (jpeg["tables_at"] % 4 == 0).all() and (jpeg["tables_at"] >= jpeg["length"]).all()
    assert (jpeg["x0"] + jpeg["rect_w"] <= jpeg["image_w"]).all() and (jpeg["y0"] + jpeg["rect_h"] <= jpeg["image_h"]).all()


def test_decode_argument_is_checked_and_auto_falls_back_to_the_cpu(folder: Path):
    source = fastloop.ImageFolder(folder)
    aug = Pipeline([RandomResizedCrop(32), RandomHFlip(), Normalize(MEAN, STD, layout="HWC->CHW")])
    with pytest.raises(ValueError, match="'decode' must be 'cpu', 'gpu' or 'auto'"):
        fastloop.Loader(source, batch_size=4, transform=aug, decode="nvjpeg")
    with pytest.raises(ValueError, match="decode='gpu' decodes JPEGs on a CUDA device: pass device='cuda'"):
        fastloop.Loader(source, batch_size=4, transform=aug, decode="gpu")
    assert fastloop.Loader(source, batch_size=4, transform=aug).decode == "cpu"
    assert _gpu_decode.unavailable_reason(None, aug, None, True).startswith("decode='gpu' decodes on a CUDA device")
    host = Pipeline(aug.steps[:2])
    finish = object()
    assert "image sources" in _gpu_decode.unavailable_reason(0, host, finish, False)
    assert "Normalize" in _gpu_decode.unavailable_reason(0, host, None, True)
    crop_after = Pipeline([RandomResizedCrop(32), CenterCrop(16)])
    assert "not CenterCrop" in _gpu_decode.unavailable_reason(0, crop_after, finish, True)
    if not fastloop.cuda.is_available():
        assert "CUDA" in _gpu_decode.unavailable_reason(0, host, finish, True)
        assert _gpu_decode.choose("auto", 0, host, finish, True) is False
        with pytest.raises(fastloop.CudaUnavailable, match="CUDA"):
            _gpu_decode.choose("gpu", 0, host, finish, True)


# ---------------------------------------------------------------- the CUDA side's checks, no GPU needed

built = pytest.mark.skipif(not fastloop.cuda.is_built(), reason=f"CUDA extension not built: {fastloop.cuda.is_built().reason}")


@built
def test_the_decoder_refuses_entries_that_would_read_outside_them(folder: Path):
    from fastloop import _cuda

    source = fastloop.ImageFolder(folder)
    entries, _ = _staged(source, Pipeline([RandomResizedCrop(32)]))
    _cuda._check_staged(entries, 32, 32)  # the workers' entries pass
    jpeg = int(np.flatnonzero(_gpu_decode.records(entries)["route"] == 0)[0])

    def broken(field: str, value: int) -> np.ndarray:
        bad = entries.copy()
        record = bad[jpeg, :64].view(_gpu_decode.RECORD)
        record[field] = value
        return bad

    for field, value in [("length", entries.shape[1]), ("tables_at", 3), ("x0", 10_000), ("rect_w", 0),
                         ("taps_x", 0), ("route", 7), ("tables_at", entries.shape[1] - 70)]:
        with pytest.raises(ValueError, match=f"staged entry {jpeg} is inconsistent"):
            _cuda._check_staged(broken(field, value), 32, 32)
    bad = entries.copy()  # a table index past the rectangle
    record = _gpu_decode.records(bad[jpeg:jpeg + 1])[0]
    bad[jpeg, 64 + int(record["tables_at"]):][:4].view(np.int32)[0] = int(record["rect_w"])
    with pytest.raises(ValueError, match="inconsistent"):
        _cuda._check_staged(bad, 32, 32)
    with pytest.raises(ValueError, match="inconsistent"):
        _cuda._check_staged(entries, 64, 64)  # tables made for another output size
    with pytest.raises(TypeError, match="'entries' must be a C-contiguous"):
        _cuda._check_staged(entries[:, ::2], 32, 32)


FAKE_NVJPEG = r"""
int nvjpegCreateEx(void) { return 7; }
int nvjpegDestroy(void) { return 0; }
int nvjpegGetProperty(int type, int *value) { *value = type == 0 ? 12 : 0; return 0; }
"""
ALL_SYMBOLS = ["nvjpegJpegStateCreate", "nvjpegJpegStateDestroy", "nvjpegDecodeBatchedInitialize",
               "nvjpegDecodeBatched", "nvjpegDecodeBatchedEx", "nvjpegDecodeBatchedSupportedEx",
               "nvjpegJpegStreamCreate", "nvjpegJpegStreamDestroy", "nvjpegJpegStreamParseHeader",
               "nvjpegDecodeParamsCreate", "nvjpegDecodeParamsDestroy", "nvjpegDecodeParamsSetOutputFormat",
               "nvjpegDecodeParamsSetROI"]


def _fake_library(tmp_path: Path, name: str, symbols: list[str]) -> Path:
    import shutil
    import subprocess

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build a fake libnvjpeg")
    source = tmp_path / f"{name}.c"
    source.write_text(FAKE_NVJPEG + "".join(f"int {s}(void) {{ return 9; }}\n" for s in symbols))
    library = tmp_path / f"{name}.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


@built
def test_a_missing_or_incomplete_libnvjpeg_is_named_with_the_fix(tmp_path: Path, monkeypatch):
    import subprocess
    import sys

    partial = _fake_library(tmp_path, "libnvjpeg_partial", ALL_SYMBOLS[:3])
    complete = _fake_library(tmp_path, "libnvjpeg_fake", ALL_SYMBOLS)
    script = ("import fastloop.cuda as c, fastloop._cuda as m\n"
              "try:\n    m.nvjpeg_load(%r)\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
              "print('loaded', m.nvjpeg_load(%r))\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "FASTLOOP_NVJPEG"}
    out = subprocess.run([sys.executable, "-c", script % (str(partial), str(complete))], capture_output=True,
                         text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("CudaUnavailable nvJPEG could not be loaded:")
    assert f"{partial} has no symbol nvjpegDecodeBatched (" in lines[0]
    assert "libnvjpeg.so.12" in lines[0]  # every candidate tried is named
    assert lines[1] == f"loaded {complete}"
    if not fastloop.cuda.is_available():  # the Python entry point: what was tried, and the fix
        monkeypatch.setenv("FASTLOOP_NVJPEG", str(tmp_path / "nowhere" / "libnvjpeg.so.12"))
        with pytest.raises(fastloop.CudaUnavailable, match="CUDA is not available"):
            fastloop.cuda.load_nvjpeg()
