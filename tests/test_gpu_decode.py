"""Loader(decode="gpu") on a GPU: nvJPEG's batches against the CPU path, the images it cannot
take, a file it refuses mid-batch, every output form. Skipped (with the reason) where there
is no GPU or no nvJPEG; the host side is tests/test_gpu_stage.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fastloop
from fastloop.ops import Normalize, Pipeline, RandomHFlip, RandomResizedCrop, Resize, CenterCrop
from synthetic import natural_image

Image = pytest.importorskip("PIL.Image")
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _nvjpeg_reason() -> str | None:
    if not fastloop.cuda.is_available():
        return f"no usable GPU: {fastloop.cuda.is_available().reason}"
    try:
        fastloop.cuda.load_nvjpeg()
    except fastloop.CudaUnavailable as error:
        return str(error)
    return None


pytestmark = pytest.mark.skipif(_nvjpeg_reason() is not None, reason=str(_nvjpeg_reason()))


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("jpegs")
    for c in range(2):
        (root / f"c{c}").mkdir()
    for i in range(40):
        image = Image.fromarray(natural_image(200 + 7 * i, 300 - 3 * i, i))
        image.save(root / f"c{i % 2}" / f"{i:02d}.jpg", quality=90, subsampling=[0, 1, 2][i % 3])
    Image.fromarray(natural_image(150, 120, 50)).save(root / "c0" / "50_progressive.jpg", progressive=True, quality=85)
    Image.fromarray(natural_image(90, 110, 51)).save(root / "c1" / "51.png")
    return root


def _pair(source, steps, **gpu_kwargs):
    aug = Pipeline([*steps, Normalize(MEAN, STD, layout="HWC->CHW")])
    cpu = fastloop.Loader(source, batch_size=14, transform=aug, seed=2, workers=2)
    gpu = fastloop.Loader(source, batch_size=14, transform=aug, seed=2, workers=2, device="cuda", decode="gpu",
                          **gpu_kwargs)
    return cpu, gpu


@pytest.mark.parametrize("steps", [
    [RandomResizedCrop(64, reduced_decode=False), RandomHFlip()],
    [Resize(72, reduced_decode=False), CenterCrop(64)],
])
def test_gpu_decoded_batches_match_the_cpu_path_up_to_the_idct(folder: Path, steps):
    torch = pytest.importorskip("torch")
    source = fastloop.ImageFolder(folder)
    cpu, gpu = _pair(source, steps, output="torch")
    assert gpu._jpeg is not None
    diffs = []
    for (x, y), (dx, dy) in zip(cpu, gpu):
        assert dx.is_cuda and dx.dtype == torch.float32 and tuple(dx.shape) == x.shape
        assert dy.cpu().tolist() == y.tolist()
        diffs.append(np.abs(dx.cpu().numpy() - x))
    diff = np.concatenate(diffs)
    assert diff.mean() < 0.02 and diff.max() < 0.5  # a few levels of 255 where the IDCTs differ
    decoded = gpu._jpeg.decoded
    assert decoded["hardware"] + decoded["cuda"] == 40 and decoded["cpu"] == 2  # progressive and PNG: the CPU's
    gpu.close()


def test_what_the_cpu_decodes_is_exactly_the_cpu_paths(folder: Path):
    pytest.importorskip("torch")
    source = fastloop.ImageFolder(folder)
    cpu, gpu = _pair(source, [RandomResizedCrop(32), RandomHFlip()], output="torch")
    names = [Path(p).name for p, _ in source.samples]
    on_cpu = [i for i, n in enumerate(names) if n.endswith(("progressive.jpg", ".png"))]
    x = np.concatenate([b for b, _ in cpu])
    dx = np.concatenate([b.cpu().numpy() for b, _ in gpu])
    np.testing.assert_allclose(dx[on_cpu], x[on_cpu], rtol=0, atol=2e-6)


@pytest.mark.parametrize("dtype, memory_format", [("bfloat16", "channels_last"), ("float16", None)])
def test_gpu_decode_into_bf16_channels_last_and_fp16(folder: Path, dtype, memory_format):
    torch = pytest.importorskip("torch")
    source = fastloop.ImageFolder(folder)
    cpu, gpu = _pair(source, [RandomResizedCrop(48, reduced_decode=False)], output="torch", dtype=dtype,
                     memory_format=memory_format)
    for (x, _), (dx, _) in zip(cpu, gpu):
        assert dx.dtype == getattr(torch, dtype)
        if memory_format:
            assert dx.is_contiguous(memory_format=torch.channels_last)
        assert np.abs(dx.float().cpu().numpy() - x).mean() < 0.03


def test_gpu_decode_into_device_arrays(folder: Path):
    source = fastloop.ImageFolder(folder)
    cpu, gpu = _pair(source, [RandomResizedCrop(40, reduced_decode=False)])
    for (x, y), (dx, dy) in zip(cpu, gpu):
        assert isinstance(dx, fastloop.cuda.DeviceArray) and dx.shape == x.shape
        assert np.abs(dx.to_numpy() - x).mean() < 0.02
        np.testing.assert_array_equal(dy.to_numpy(), y)


def test_a_jpeg_nvjpeg_refuses_is_decoded_by_the_cpu_path_or_fails_as_it_does(folder: Path, tmp_path: Path):
    """Valid headers, corrupt entropy-coded data: nvJPEG refuses it mid-batch; the image then
    takes the CPU path, which decodes it (libjpeg's warnings) or raises naming the sample."""
    pytest.importorskip("torch")
    (tmp_path / "a").mkdir()
    for i in range(6):
        data = (folder / "c0" / f"{2 * i:02d}.jpg").read_bytes()
        if i == 3:
            sos = data.index(b"\xff\xda")
            data = data[:sos + 40] + bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8)) + b"\xff\xd9"
        (tmp_path / "a" / f"{i}.jpg").write_bytes(data)
    source = fastloop.ImageFolder(tmp_path)
    steps = [RandomResizedCrop(32, reduced_decode=False)]
    cpu, gpu = _pair(source, steps, output="torch")
    try:
        expected = next(iter(cpu))[0]
    except ValueError as error:
        with pytest.raises(ValueError, match="sample 3"):
            next(iter(gpu))
        skipping = _pair(source, steps, output="torch", on_error="skip")[1]
        assert len(next(iter(skipping))[0]) == 5, error
        return
    got = next(iter(gpu))[0].cpu().numpy()
    assert np.abs(got - expected).mean() < 0.05
